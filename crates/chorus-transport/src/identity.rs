//! A member's QUIC identity: a self-signed certificate (rcgen) and the SHA-256 fingerprint
//! of its DER encoding, which the peer table carries (`PeerInfo::fingerprint`) and peers pin.
//! There is no CA: the fingerprint is the trust.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

use crate::error::TransportError;

/// SHA-256 of a certificate's DER encoding.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// "Any certificate": for a bootstrap root whose certificate nobody could know in
    /// advance (a launch environment without a token, such as torchrun's `MASTER_ADDR`).
    /// TLS still checks that the handshake is signed by the presented certificate's key,
    /// and the protocol's handshake proof, bound to this TLS session (SPEC 5.4), is what
    /// authenticates the peer: a machine-in-the-middle without the job secret cannot answer
    /// it, and cannot relay it either, since each TLS session exports different bytes.
    pub const ANY: Fingerprint = Fingerprint([0; 32]);

    /// The fingerprint of `der`.
    pub fn of(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..")
    }
}

/// A certificate with its private key; cheap to clone.
#[derive(Clone)]
pub struct Identity {
    cert: CertificateDer<'static>,
    key: Arc<PrivatePkcs8KeyDer<'static>>,
    fingerprint: Fingerprint,
}

impl Identity {
    /// A fresh self-signed certificate for this member (ECDSA P-256, subject `chorus`).
    pub fn generate() -> Result<Self, TransportError> {
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])
            .map_err(|e| TransportError::Identity(e.to_string()))?;
        let cert = certified.cert.der().clone();
        let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
        Ok(Self {
            fingerprint: Fingerprint::of(&cert),
            cert,
            key: Arc::new(key),
        })
    }

    /// What peers pin.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub(crate) fn cert(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    pub(crate) fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// The TLS server name every member presents; identity comes from the pin, not the name.
pub(crate) const SERVER_NAME: &str = "chorus";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_differ_per_member_and_match_the_der() {
        let a = Identity::generate().unwrap();
        let b = Identity::generate().unwrap();
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), Fingerprint::of(&a.cert()));
    }
}
