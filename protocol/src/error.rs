//! Codec errors. Every decode error maps to the close code SPEC.md assigns it; the receiver
//! closes the connection with that code and never resynchronises the stream.

use crate::code::CloseCode;
use crate::ids::{CommId, Rank};
use crate::message::Kind;
use crate::validation::Invalid;

/// Why a byte stream stopped decoding. After one of these the decoder is poisoned: every
/// later call returns the same error, because a stream is never resynchronised.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DecodeError {
    /// The frame did not start with `CHRS` (the bytes seen so far, zero-padded).
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// The first four bytes of the frame (zero-padded if fewer arrived).
        found: [u8; 4],
    },
    /// The header's version is not the one this connection speaks.
    #[error("unsupported version {version} (this connection speaks {expected})")]
    UnsupportedVersion {
        /// The version byte of the header.
        version: u8,
        /// The version this stream negotiated (or the only one before it).
        expected: u8,
    },
    /// The header's kind byte names no frame kind.
    #[error("unknown frame kind 0x{code:02x}")]
    UnknownKind {
        /// The kind byte as received.
        code: u8,
    },
    /// Reserved flag bits were set.
    #[error("reserved flags set: 0x{flags:04x}")]
    ReservedFlags {
        /// The header's flags word, reserved bits included.
        flags: u16,
    },
    /// A kind that this side of the connection may not receive at this point.
    #[error("{kind} frame not allowed here ({phase})")]
    Unexpected {
        /// The kind that arrived.
        kind: Kind,
        /// Where the stream is: `during the handshake`, `on a data stream`, `after depart`, ...
        phase: &'static str,
    },
    /// The body length exceeds the receiver's limit for the kind.
    #[error("{kind} body of {len} bytes exceeds the limit of {limit}")]
    Oversize {
        /// The frame's kind.
        kind: Kind,
        /// The body length the header claims, in bytes (nothing was allocated for it).
        len: u32,
        /// The receiver's limit for that kind, in bytes.
        limit: u32,
    },
    /// A fixed-size body with the wrong length.
    #[error("{kind} body of {len} bytes, expected {expected}")]
    BadLength {
        /// The frame's kind.
        kind: Kind,
        /// The body length the header claims, in bytes.
        len: u32,
        /// The kind's fixed body length, in bytes.
        expected: u32,
    },
    /// The body failed structural validation (bytecheck).
    #[error("malformed {kind} body: {detail}")]
    Malformed {
        /// The frame's kind.
        kind: Kind,
        /// What bytecheck found.
        detail: String,
    },
    /// The body decoded, but is not the canonical encoding of its value (trailing bytes,
    /// non-zero padding).
    #[error("{kind} body has trailing or non-canonical bytes")]
    NonCanonical {
        /// The frame's kind.
        kind: Kind,
    },
    /// The body decoded but breaks a rule of SPEC.md (a bound, an ordering, a code).
    #[error("invalid {kind}: {reason}")]
    Invalid {
        /// The frame's kind.
        kind: Kind,
        /// The rule it breaks.
        reason: Invalid,
    },
    /// The header names a communicator other than the one this stream serves.
    #[error("frame for communicator {found}, this stream serves {expected}")]
    WrongComm {
        /// The communicator the handshake bound this stream to.
        expected: CommId,
        /// The communicator the header names.
        found: CommId,
    },
    /// The header's sender is not the rank the handshake authenticated.
    #[error("frame from {found}, this stream's peer is {expected}")]
    WrongSender {
        /// The rank the handshake authenticated.
        expected: Rank,
        /// The sender the header names.
        found: Rank,
    },
    /// The header's sequence number is not the next one on this stream.
    #[error("sequence gap: expected frame {expected}, got {found}")]
    SequenceGap {
        /// The next sequence number this stream expects.
        expected: u64,
        /// The header's sequence number.
        found: u64,
    },
}

impl DecodeError {
    /// The close code SPEC.md assigns to this error.
    pub fn code(&self) -> CloseCode {
        match self {
            DecodeError::UnsupportedVersion { .. } => CloseCode::VERSION_MISMATCH,
            DecodeError::WrongComm { .. } => CloseCode::UNKNOWN_COMM,
            _ => CloseCode::PROTOCOL_VIOLATION,
        }
    }
}

/// Why a message could not be encoded. Nothing is appended to the output on error.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum EncodeError {
    /// The message breaks a rule of SPEC.md; a peer would reject it.
    #[error("invalid {kind}: {reason}")]
    Invalid {
        /// The message's kind.
        kind: Kind,
        /// The rule it breaks.
        reason: Invalid,
    },
    /// The body would exceed this encoder's limit for the kind.
    #[error("{kind} body of {len} bytes exceeds the limit of {limit}")]
    Oversize {
        /// The message's kind.
        kind: Kind,
        /// The encoded body length, in bytes.
        len: u64,
        /// This encoder's limit for the kind, in bytes.
        limit: u32,
    },
    /// The serializer failed (out of memory, or a bug).
    #[error("cannot serialize {kind}: {detail}")]
    Serialize {
        /// The message's kind.
        kind: Kind,
        /// The serializer's error.
        detail: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_errors_close_with_version_mismatch_everything_else_with_violation() {
        let v = DecodeError::UnsupportedVersion {
            version: 9,
            expected: 1,
        };
        assert_eq!(v.code(), CloseCode::VERSION_MISMATCH);
        for e in [
            DecodeError::BadMagic { found: *b"GET " },
            DecodeError::UnknownKind { code: 0xff },
            DecodeError::ReservedFlags { flags: 1 },
            DecodeError::Oversize {
                kind: Kind::Heartbeat,
                len: 9,
                limit: 8,
            },
            DecodeError::NonCanonical { kind: Kind::Join },
            DecodeError::SequenceGap {
                expected: 1,
                found: 3,
            },
        ] {
            assert_eq!(e.code(), CloseCode::PROTOCOL_VIOLATION, "{e}");
        }
    }

    #[test]
    fn messages_are_short_and_lowercase() {
        let e = DecodeError::SequenceGap {
            expected: 1,
            found: 3,
        };
        assert_eq!(e.to_string(), "sequence gap: expected frame 1, got 3");
    }
}
