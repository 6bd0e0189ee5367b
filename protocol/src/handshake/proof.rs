//! Proof of the job secret: HMAC-SHA256 over a transcript that binds the stream's
//! communicator, epoch, sender, role, version range, both nonces and (on QUIC) the TLS
//! session (SPEC.md, "Handshake"). Verification is constant-time.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::header::Envelope;
use crate::message::{Hello, HelloAck, PROOF_LEN};

type HmacSha256 = Hmac<Sha256>;

/// Domain labels: a proof made for one message can never verify as the other.
const HELLO_LABEL: &[u8] = b"chorus/1 hello\0";
const ACK_LABEL: &[u8] = b"chorus/1 hello-ack\0";

/// The per-job secret (32 random bytes from the `UniqueId`). Its `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; 32]);

impl JobSecret {
    /// A secret from its bytes. They must come from a CSPRNG (or a token made from one): the
    /// secret is all that keeps strangers out of the job.
    pub const fn new(bytes: [u8; 32]) -> Self {
        JobSecret(bytes)
    }

    /// The raw bytes, for writing the secret into a `UniqueId` token.
    pub const fn to_bytes(&self) -> [u8; 32] {
        self.0
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

/// Fresh random bytes from the caller (this crate has no random source).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Nonce(pub [u8; PROOF_LEN]);

/// What ties a handshake to the secure channel under it, so a `Hello` cannot be replayed
/// into another session.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub enum ChannelBinding {
    /// A plain TCP stream: nothing to bind to.
    #[default]
    None,
    /// QUIC: 32 bytes exported from the TLS session with label `EXPORTER-chorus-hello` and
    /// an empty context (RFC 5705 / RFC 8446 section 7.5), identical on both ends.
    Tls([u8; 32]),
}

/// The proof a connector puts in its `Hello` (whose `proof` field is ignored here).
pub(crate) fn hello_proof(
    secret: &JobSecret,
    route: &Envelope,
    hello: &Hello,
    binding: &ChannelBinding,
) -> [u8; PROOF_LEN] {
    hello_mac(secret, route, hello, binding)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a received `Hello`'s proof.
pub(crate) fn verify_hello(
    secret: &JobSecret,
    route: &Envelope,
    hello: &Hello,
    binding: &ChannelBinding,
) -> bool {
    hello_mac(secret, route, hello, binding)
        .verify_slice(&hello.proof)
        .is_ok()
}

/// The proof an acceptor puts in its `HelloAck` (whose `proof` field is ignored here). It
/// covers the `Hello`'s proof, and through it everything the `Hello` bound, including the
/// connector's fresh nonce: a recorded `HelloAck` never verifies for a new `Hello`.
pub(crate) fn ack_proof(
    secret: &JobSecret,
    hello: &Hello,
    route: &Envelope,
    ack: &HelloAck,
    binding: &ChannelBinding,
) -> [u8; PROOF_LEN] {
    ack_mac(secret, hello, route, ack, binding)
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a received `HelloAck`'s proof.
pub(crate) fn verify_ack(
    secret: &JobSecret,
    hello: &Hello,
    route: &Envelope,
    ack: &HelloAck,
    binding: &ChannelBinding,
) -> bool {
    ack_mac(secret, hello, route, ack, binding)
        .verify_slice(&ack.proof)
        .is_ok()
}

fn hello_mac(
    secret: &JobSecret,
    route: &Envelope,
    hello: &Hello,
    binding: &ChannelBinding,
) -> HmacSha256 {
    let mut mac = keyed(secret);
    mac.update(HELLO_LABEL);
    bind_route(&mut mac, route);
    mac.update(&[hello.role as u8]);
    mac.update(&hello.version_min.to_le_bytes());
    mac.update(&hello.version_max.to_le_bytes());
    mac.update(&hello.nonce);
    bind(&mut mac, binding);
    mac
}

fn ack_mac(
    secret: &JobSecret,
    hello: &Hello,
    route: &Envelope,
    ack: &HelloAck,
    binding: &ChannelBinding,
) -> HmacSha256 {
    let mut mac = keyed(secret);
    mac.update(ACK_LABEL);
    mac.update(&hello.proof);
    bind_route(&mut mac, route);
    mac.update(&ack.version.to_le_bytes());
    mac.update(&ack.nonce);
    bind(&mut mac, binding);
    mac
}

fn keyed(secret: &JobSecret) -> HmacSha256 {
    // HMAC takes keys of any length; a 32-byte key cannot be refused.
    match HmacSha256::new_from_slice(&secret.0) {
        Ok(mac) => mac,
        Err(_) => unreachable!("hmac accepts every key length"),
    }
}

/// The header fields a proof binds: communicator, epoch and sender.
fn bind_route(mac: &mut HmacSha256, route: &Envelope) {
    mac.update(&route.comm.0.to_le_bytes());
    mac.update(&route.epoch.0.to_le_bytes());
    mac.update(&route.sender.0.to_le_bytes());
}

fn bind(mac: &mut HmacSha256, binding: &ChannelBinding) {
    match binding {
        ChannelBinding::None => mac.update(&[0]),
        ChannelBinding::Tls(b) => {
            mac.update(&[1]);
            mac.update(b);
        }
    }
}
