//! Reliable broadcast of notices, revocations and commits.
//!
//! Two mechanisms, one fast and one certain:
//!
//! - **Flood over fingers.** The first time a member learns an item it forwards it to its
//!   fingers (first present ranks at distances 1, 2, 4, ... ahead, see
//!   [`crate::overlay`]); later copies are recognised and dropped (an absence is absorbing,
//!   a revocation is a flag, a commit is an epoch). Every member is reached within
//!   ⌈log2 N⌉ hops, and receives the item from up to log2 N predecessors, so a forwarder
//!   that died undetected, or a lost frame, rarely matters. Cost: log2 N frames per member
//!   per item, only when something happens.
//! - **Anti-entropy on heartbeats.** Every heartbeat carries a [`Digest`] of the sender's
//!   knowledge at its epoch. A receiver whose digest differs and whose own knowledge has
//!   been stable for a heartbeat interval pushes every notice it holds (and the revocation)
//!   to the sender and answers with its own heartbeat, so the sender can push back; a new
//!   item then floods from there. This repairs what the flood missed (loss, a partition that
//!   healed) within a heartbeat interval of the two being able to talk, without any
//!   per-item acknowledgement.

use chorus_protocol::Rank;

use crate::overlay::Ring;

/// An order-independent summary of a member's knowledge at one epoch: the XOR of a 64-bit
/// mix of each absent rank, with one more constant folded in once the epoch is revoked.
/// Equal sets give equal digests; different sets collide with probability about 2^-64.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Digest(u64);

impl Digest {
    /// The digest's wire value (`Heartbeat::digest`).
    pub fn get(self) -> u64 {
        self.0
    }

    /// Adds or removes `rank` (XOR is its own inverse).
    pub(crate) fn toggle_rank(&mut self, rank: Rank) {
        self.0 ^= mix(u64::from(rank.get()));
    }

    /// The digest with the revocation folded in.
    pub(crate) fn with_revoked(self, revoked: bool) -> Digest {
        if revoked {
            Digest(self.0 ^ mix(u64::MAX))
        } else {
            self
        }
    }
}

/// SplitMix64's finaliser: a bijection on u64 that spreads every input bit.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The flood targets of one member at its current view.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fingers {
    targets: Vec<Rank>,
}

impl Fingers {
    /// Recomputes the targets for `me` on `ring`.
    pub(crate) fn reset(&mut self, ring: &Ring<'_>, me: Rank) {
        self.targets = ring.fingers(me);
    }

    /// Where to forward an item that arrived from `from` (`None`: originated here). The
    /// sender already has it, so it is skipped.
    pub(crate) fn targets(&self, from: Option<Rank>) -> impl Iterator<Item = Rank> + '_ {
        self.targets
            .iter()
            .copied()
            .filter(move |t| Some(*t) != from)
    }

    pub(crate) fn all(&self) -> &[Rank] {
        &self.targets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_order_independent_and_tells_sets_apart() {
        let mut a = Digest::default();
        let mut b = Digest::default();
        for r in [3, 9, 12] {
            a.toggle_rank(Rank(r));
        }
        for r in [12, 3, 9] {
            b.toggle_rank(Rank(r));
        }
        assert_eq!(a, b);
        b.toggle_rank(Rank(9));
        assert_ne!(a, b);
        assert_ne!(a.with_revoked(true), a);
        assert_eq!(a.with_revoked(false), a);
        assert_ne!(Digest::default().with_revoked(true), Digest::default());
    }
}
