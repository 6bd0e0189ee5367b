//! The handshake every stream starts with, over TCP and QUIC alike (SPEC.md, "Handshake").
//!
//! Sans-IO: the caller moves bytes, decodes frames with a [`crate::Decoder`] and reads the
//! clock; these state machines take frames (and `now`) in and write frames out.
//!
//! ```text
//! connector                                   acceptor
//!   Connector::new  ── Hello{range, nonce_c, proof_c} ──▶  Acceptor::handle → PeerHello
//!                                                          (caller's policy: comm known?
//!                                                           rank free? epoch current?)
//!   Connector::handle ◀── HelloAck{version, nonce_a, proof_a}   Acceptor::accept
//!                     ◀── or Reject{code, detail}               Acceptor::reject / timeout
//! ```
//!
//! Both ends then call [`Established::apply`] on their decoder and take the encoder from
//! the state machine (`into_encoder`), whose sequence numbers continue after the handshake.

mod acceptor;
mod connector;
pub(crate) mod proof;
mod version;

pub use acceptor::AcceptorConfig;
pub use acceptor::{Acceptor, PeerHello};
pub use connector::{Connector, ConnectorConfig};
pub use proof::{ChannelBinding, JobSecret, Nonce};
pub use version::VersionRange;

use crate::code::CloseCode;
use crate::decoder::Decoder;
use crate::gate::Side;
use crate::ids::{CommId, Epoch, Rank};
use crate::message::{Kind, Role};

/// A completed handshake, as one end sees it.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Established {
    /// The version both ends speak from now on.
    pub version: u8,
    /// What the stream is for, as the connector's `Hello` chose it.
    pub role: Role,
    /// The communicator the stream serves.
    pub comm: CommId,
    /// The other end's epoch as its handshake frame stated it.
    pub peer_epoch: Epoch,
    /// The other end's rank (`Rank::NONE` for a status client, launcher or grow joiner).
    pub peer: Rank,
    /// This end of the stream.
    pub local: Side,
}

impl Established {
    /// Switches `decoder` out of the handshake phase: the negotiated version, the role's
    /// kinds from the peer's side, and only this communicator and peer rank.
    pub fn apply(&self, decoder: &mut Decoder) {
        decoder.establish(self.version, self.role, self.local, self.comm, self.peer);
    }
}

/// Why a handshake did not complete. [`HandshakeError::code`] is the code the stream is
/// closed with.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other end refused with a `Reject` (unauthenticated: only this attempt ends).
    #[error("rejected by peer ({code}): {detail}")]
    Rejected {
        /// The code of the peer's `Reject`, which it closes the stream with.
        code: CloseCode,
        /// The peer's reason, as it wrote it (untrusted text).
        detail: String,
    },
    /// This end refused the peer and wrote a `Reject` with this code.
    #[error("refused ({code}): {detail}")]
    Refused {
        /// The code written in the `Reject`; close the stream with it.
        code: CloseCode,
        /// Why this end refused.
        detail: String,
    },
    /// The peer's proof did not verify: it does not know the job secret.
    #[error("peer failed to prove the job secret")]
    AuthFailed,
    /// No version in common, or the acceptor chose one outside the connector's range.
    #[error("no common protocol version (ours {ours_min}..={ours_max}, theirs {theirs})")]
    VersionMismatch {
        /// The lowest version this end speaks.
        ours_min: u16,
        /// The highest version this end speaks.
        ours_max: u16,
        /// What the peer offered or chose, as text (a range from a `Hello`, one version from a
        /// `HelloAck`).
        theirs: String,
    },
    /// The answer came from a rank other than the one dialled.
    #[error("answered by {found}, expected {expected}")]
    WrongPeer {
        /// The rank this end dialled.
        expected: Rank,
        /// The rank the answer's header names.
        found: Rank,
    },
    /// The answer named another communicator.
    #[error("answer for communicator {found}, expected {expected}")]
    WrongComm {
        /// The communicator this end asked for.
        expected: CommId,
        /// The communicator the answer's header names.
        found: CommId,
    },
    /// A frame of a kind the handshake does not expect.
    #[error("unexpected {kind} frame during the handshake")]
    Unexpected {
        /// The kind that arrived.
        kind: Kind,
    },
    /// The handshake did not finish by the caller's deadline.
    #[error("handshake deadline expired")]
    Deadline,
    /// The state machine was used after it finished (a caller bug).
    #[error("handshake already finished")]
    Finished,
}

impl HandshakeError {
    /// The code the stream is closed with.
    pub fn code(&self) -> CloseCode {
        match self {
            HandshakeError::Rejected { code, .. } | HandshakeError::Refused { code, .. } => *code,
            HandshakeError::AuthFailed => CloseCode::AUTH_FAILED,
            HandshakeError::VersionMismatch { .. } => CloseCode::VERSION_MISMATCH,
            HandshakeError::WrongComm { .. } => CloseCode::UNKNOWN_COMM,
            HandshakeError::WrongPeer { .. } | HandshakeError::Unexpected { .. } => {
                CloseCode::PROTOCOL_VIOLATION
            }
            HandshakeError::Deadline => CloseCode::DEADLINE,
            HandshakeError::Finished => CloseCode::INTERNAL,
        }
    }
}

#[cfg(test)]
mod tests;
