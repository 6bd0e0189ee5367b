//! Revocation: one member declares the communicator at the current epoch unusable, and
//! every member learns it.
//!
//! Revoking is idempotent and one-way for the epoch (the first origin is kept, later ones
//! change nothing) and spreads by the same flood as notices, skipping ranks known absent and
//! tolerating undetected ones, plus anti-entropy (the revocation is folded into the
//! heartbeat digest). A new epoch starts unrevoked: the agreement that follows a revocation
//! is what builds the next, usable communicator.

use chorus_protocol::Rank;
use chorus_protocol::message::{Revoke, RevokeCause};

/// The revocation state of one epoch.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub(crate) struct Revocation {
    origin: Option<Rank>,
    cause: Option<RevokeCause>,
}

impl Revocation {
    /// Records a revocation from `origin`, for `cause`. Returns true the first time only:
    /// the first revocation's origin and cause are the ones kept and forwarded.
    pub(crate) fn revoke(&mut self, origin: Rank, cause: Option<RevokeCause>) -> bool {
        if self.origin.is_some() {
            return false;
        }
        self.origin = Some(origin);
        self.cause = cause;
        true
    }

    /// The revocation as sent by its origin (`hops` 0), if the epoch was revoked.
    pub(crate) fn message(&self) -> Option<Revoke> {
        self.origin.map(|origin| Revoke {
            origin,
            hops: 0,
            cause: self.cause,
        })
    }

    pub(crate) fn origin(&self) -> Option<Rank> {
        self.origin
    }

    pub(crate) fn is_revoked(&self) -> bool {
        self.origin.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_protocol::CloseCode;
    use chorus_protocol::message::Evidence;

    #[test]
    fn first_origin_wins_and_repeats_are_no_ops() {
        let mut r = Revocation::default();
        assert!(!r.is_revoked());
        let cause = RevokeCause {
            subject: Rank(2),
            evidence: Evidence::Departed {
                code: CloseCode::NORMAL,
            },
        };
        assert!(r.revoke(Rank(3), Some(cause)));
        assert!(!r.revoke(Rank(1), None));
        assert_eq!(r.origin(), Some(Rank(3)));
        assert_eq!(r.message().and_then(|m| m.cause), Some(cause));
    }
}
