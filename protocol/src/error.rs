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
    BadMagic { found: [u8; 4] },
    /// The header's version is not the one this connection speaks.
    #[error("unsupported version {version} (this connection speaks {expected})")]
    UnsupportedVersion { version: u8, expected: u8 },
    /// The header's kind byte names no frame kind.
    #[error("unknown frame kind 0x{code:02x}")]
    UnknownKind { code: u8 },
    /// Reserved flag bits were set.
    #[error("reserved flags set: 0x{flags:04x}")]
    ReservedFlags { flags: u16 },
    /// A kind that this side of the connection may not receive at this point.
    #[error("{kind} frame not allowed here ({phase})")]
    Unexpected { kind: Kind, phase: &'static str },
    /// The body length exceeds the receiver's limit for the kind.
    #[error("{kind} body of {len} bytes exceeds the limit of {limit}")]
    Oversize { kind: Kind, len: u32, limit: u32 },
    /// A fixed-size body with the wrong length.
    #[error("{kind} body of {len} bytes, expected {expected}")]
    BadLength { kind: Kind, len: u32, expected: u32 },
    /// The body failed structural validation (bytecheck).
    #[error("malformed {kind} body: {detail}")]
    Malformed { kind: Kind, detail: String },
    /// The body decoded, but is not the canonical encoding of its value (trailing bytes,
    /// non-zero padding).
    #[error("{kind} body has trailing or non-canonical bytes")]
    NonCanonical { kind: Kind },
    /// The body decoded but breaks a rule of SPEC.md (a bound, an ordering, a code).
    #[error("invalid {kind}: {reason}")]
    Invalid { kind: Kind, reason: Invalid },
    /// The header names a communicator other than the one this stream serves.
    #[error("frame for communicator {found}, this stream serves {expected}")]
    WrongComm { expected: CommId, found: CommId },
    /// The header's sender is not the rank the handshake authenticated.
    #[error("frame from {found}, this stream's peer is {expected}")]
    WrongSender { expected: Rank, found: Rank },
    /// The header's sequence number is not the next one on this stream.
    #[error("sequence gap: expected frame {expected}, got {found}")]
    SequenceGap { expected: u64, found: u64 },
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
    Invalid { kind: Kind, reason: Invalid },
    /// The body would exceed this encoder's limit for the kind.
    #[error("{kind} body of {len} bytes exceeds the limit of {limit}")]
    Oversize { kind: Kind, len: u64, limit: u32 },
    /// The serializer failed (out of memory, or a bug).
    #[error("cannot serialize {kind}: {detail}")]
    Serialize { kind: Kind, detail: String },
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
