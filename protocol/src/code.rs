//! Close and departure codes: one numbering shared by QUIC `CONNECTION_CLOSE` application
//! codes, TCP departure frames, `Depart`, `Reject` and notices (SPEC.md, "Codes").

use std::fmt;

/// Why a connection closed or a member left. Unknown values are kept, not rejected, so a
/// newer peer's code survives to the error message.
#[derive(Copy, Clone, PartialEq, Eq, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// Graceful destroy: the member finished and left the communicator.
    pub const NORMAL: CloseCode = CloseCode(0x00);
    /// The member left the job (process shutting down, e.g. a caught SIGTERM).
    pub const LEFT: CloseCode = CloseCode(0x01);
    /// The communicator was aborted locally on the sender.
    pub const ABORTED: CloseCode = CloseCode(0x02);
    /// The communicator was revoked; no further operations at this epoch.
    pub const REVOKED: CloseCode = CloseCode(0x03);
    /// The receiver was declared dead by the others and must not act in the new epoch.
    pub const EVICTED: CloseCode = CloseCode(0x04);
    /// A deadline expired (handshake, heartbeat, operation).
    pub const DEADLINE: CloseCode = CloseCode(0x05);
    /// A frame failed validation.
    pub const PROTOCOL_VIOLATION: CloseCode = CloseCode(0x06);
    /// The peer could not prove the job secret.
    pub const AUTH_FAILED: CloseCode = CloseCode(0x07);
    /// No protocol version in common.
    pub const VERSION_MISMATCH: CloseCode = CloseCode(0x08);
    /// Bootstrap: a second `Join` claimed a rank that is taken.
    pub const DUPLICATE_RANK: CloseCode = CloseCode(0x09);
    /// Bootstrap: the joiner's world size differs from the root's.
    pub const WORLD_MISMATCH: CloseCode = CloseCode(0x0a);
    /// A frame carried an epoch older than the receiver's current one.
    pub const STALE_EPOCH: CloseCode = CloseCode(0x0b);
    /// The frame named a communicator this endpoint does not serve.
    pub const UNKNOWN_COMM: CloseCode = CloseCode(0x0c);
    /// The endpoint hit an internal error (a bug, or a resource limit).
    pub const INTERNAL: CloseCode = CloseCode(0x0f);

    /// The code's stable lowercase name (`"unknown"` for values this version does not know).
    pub const fn name(self) -> &'static str {
        match self.0 {
            0x00 => "normal",
            0x01 => "left",
            0x02 => "aborted",
            0x03 => "revoked",
            0x04 => "evicted",
            0x05 => "deadline",
            0x06 => "protocol-violation",
            0x07 => "auth-failed",
            0x08 => "version-mismatch",
            0x09 => "duplicate-rank",
            0x0a => "world-mismatch",
            0x0b => "stale-epoch",
            0x0c => "unknown-comm",
            0x0f => "internal",
            _ => "unknown",
        }
    }

    /// True for the codes that mean the sender chose to leave (as opposed to failing).
    pub const fn is_departure(self) -> bool {
        matches!(self.0, 0x00..=0x03)
    }

    /// True for a graceful end, `NORMAL` or `LEFT`: the member finished or its process is
    /// shutting down. Nothing failed, so a survivor need not abort anything it shares.
    pub const fn is_graceful(self) -> bool {
        matches!(self, CloseCode::NORMAL | CloseCode::LEFT)
    }
}

impl fmt::Debug for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::CloseCode;

    #[test]
    fn only_normal_and_left_are_graceful() {
        let graceful: Vec<u16> = (0..=u16::from(u8::MAX))
            .filter(|&c| CloseCode(c).is_graceful())
            .collect();
        assert_eq!(graceful, [CloseCode::NORMAL.0, CloseCode::LEFT.0]);
        assert!(CloseCode::NORMAL.is_departure() && CloseCode::LEFT.is_departure());
        assert!(!CloseCode::ABORTED.is_graceful());
    }
}
