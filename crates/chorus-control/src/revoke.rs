//! Revocation: one member declares the communicator at the current epoch unusable, and
//! every member learns it.
//!
//! Revoking is idempotent and one-way for the epoch (the first origin is kept, later ones
//! change nothing) and spreads by the same flood as notices, skipping ranks known absent and
//! tolerating undetected ones, plus anti-entropy (the revocation is folded into the
//! heartbeat digest). A new epoch starts unrevoked: the agreement that follows a revocation
//! is what builds the next, usable communicator.

use chorus_protocol::Rank;

/// The revocation state of one epoch.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub(crate) struct Revocation {
    origin: Option<Rank>,
}

impl Revocation {
    /// Records a revocation from `origin`. Returns true the first time only.
    pub(crate) fn revoke(&mut self, origin: Rank) -> bool {
        if self.origin.is_some() {
            return false;
        }
        self.origin = Some(origin);
        true
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

    #[test]
    fn first_origin_wins_and_repeats_are_no_ops() {
        let mut r = Revocation::default();
        assert!(!r.is_revoked());
        assert!(r.revoke(Rank(3)));
        assert!(!r.revoke(Rank(1)));
        assert_eq!(r.origin(), Some(Rank(3)));
    }
}
