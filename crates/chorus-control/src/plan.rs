//! Shrink and grow planning: pure functions from one epoch's membership and its changes to
//! the next epoch's layout.
//!
//! Survivors are compacted to a contiguous prefix `0..n` in their old order (seed `001`: a
//! hole in the layout silently misaligns everything addressed by rank), joiners are
//! appended after them, and the epoch goes up by one. The control plane agrees on the
//! changes (`removed`, `joiners`); every member then computes the same layout from them.

use std::collections::BTreeSet;

use chorus_protocol::message::{PeerInfo, Proposal};
use chorus_protocol::{Epoch, Rank};
use thiserror::Error;

/// The change from one epoch to the next, validated: `removed` is strictly ascending and
/// inside the old world, something is left, and the epoch is the one after.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Plan {
    old_world: u32,
    epoch: Epoch,
    removed: Vec<Rank>,
    joiners: u32,
}

impl Plan {
    /// The plan that removes `absent` from a world of `old_world` at `epoch` and appends
    /// `joiners` new members.
    pub fn new(
        old_world: u32,
        epoch: Epoch,
        absent: &BTreeSet<Rank>,
        joiners: u32,
    ) -> Result<Plan, PlanError> {
        let removed: Vec<Rank> = absent.iter().copied().collect();
        Plan::from_parts(old_world, epoch, removed, joiners)
    }

    /// The plan a proposal describes, for members at `epoch` of a world of `old_world`.
    pub fn from_proposal(
        old_world: u32,
        epoch: Epoch,
        proposal: &Proposal,
    ) -> Result<Plan, PlanError> {
        if proposal.epoch != next_epoch(epoch)? {
            return Err(PlanError::EpochNotNext {
                current: epoch,
                proposed: proposal.epoch,
            });
        }
        if !proposal.removed.windows(2).all(|w| w[0] < w[1]) {
            return Err(PlanError::NotAscending);
        }
        let joiners = u32::try_from(proposal.joiners.len()).map_err(|_| PlanError::TooLarge)?;
        let plan = Plan::from_parts(old_world, epoch, proposal.removed.clone(), joiners)?;
        for (i, peer) in proposal.joiners.iter().enumerate() {
            let expected = plan.joiner_rank(i);
            if Some(peer.rank) != expected {
                return Err(PlanError::JoinerRank {
                    rank: peer.rank,
                    expected,
                });
            }
        }
        Ok(plan)
    }

    fn from_parts(
        old_world: u32,
        epoch: Epoch,
        removed: Vec<Rank>,
        joiners: u32,
    ) -> Result<Plan, PlanError> {
        if let Some(bad) = removed.iter().find(|r| r.get() >= old_world) {
            return Err(PlanError::RankOutOfRange {
                rank: *bad,
                world: old_world,
            });
        }
        let plan = Plan {
            old_world,
            epoch: next_epoch(epoch)?,
            removed,
            joiners,
        };
        let kept = plan.kept();
        if kept.checked_add(joiners).is_none() {
            return Err(PlanError::TooLarge);
        }
        if kept + joiners == 0 {
            return Err(PlanError::Empty);
        }
        Ok(plan)
    }

    /// The new epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The old epoch's world size.
    pub fn old_world(&self) -> u32 {
        self.old_world
    }

    /// The new world size.
    pub fn world(&self) -> u32 {
        self.kept() + self.joiners
    }

    /// Old ranks removed, ascending.
    pub fn removed(&self) -> &[Rank] {
        &self.removed
    }

    /// How many members are appended.
    pub fn joiners(&self) -> u32 {
        self.joiners
    }

    /// The new rank of old rank `old`, or `None` if it is removed or was never a member.
    pub fn new_rank(&self, old: Rank) -> Option<Rank> {
        if old.get() >= self.old_world {
            return None;
        }
        match self.removed.binary_search(&old) {
            Ok(_) => None,
            Err(below) => Some(Rank(old.get() - u32::try_from(below).ok()?)),
        }
    }

    /// The old rank of new rank `new`, or `None` for a joiner or a rank past the world.
    pub fn old_rank(&self, new: Rank) -> Option<Rank> {
        if new.get() >= self.kept() {
            return None;
        }
        // The answer is `new` plus the number of removed ranks at or below the answer.
        let mut old = new.get();
        for r in &self.removed {
            if r.get() <= old {
                old += 1;
            } else {
                break;
            }
        }
        Some(Rank(old))
    }

    /// The new rank of the `i`-th joiner.
    pub fn joiner_rank(&self, i: usize) -> Option<Rank> {
        let i = u32::try_from(i).ok()?;
        (i < self.joiners).then(|| Rank(self.kept() + i))
    }

    /// The next epoch's table: `old` without the removed entries, compacted, then
    /// `joiners`; every entry's `rank` field set to its new rank.
    pub fn apply(
        &self,
        old: &[PeerInfo],
        joiners: &[PeerInfo],
    ) -> Result<Vec<PeerInfo>, PlanError> {
        if old.len() != self.old_world as usize {
            return Err(PlanError::TableSize {
                len: old.len(),
                world: self.old_world,
            });
        }
        if joiners.len() != self.joiners as usize {
            return Err(PlanError::JoinerCount {
                len: joiners.len(),
                planned: self.joiners,
            });
        }
        let mut out = Vec::with_capacity(self.world() as usize);
        for (i, peer) in old.iter().enumerate() {
            if peer.rank.index() != i {
                return Err(PlanError::TableOrder {
                    index: i,
                    rank: peer.rank,
                });
            }
            if let Some(rank) = self.new_rank(peer.rank) {
                out.push(PeerInfo {
                    rank,
                    ..peer.clone()
                });
            }
        }
        for (i, peer) in joiners.iter().enumerate() {
            let rank = self.joiner_rank(i).ok_or(PlanError::TooLarge)?;
            out.push(PeerInfo {
                rank,
                ..peer.clone()
            });
        }
        Ok(out)
    }

    fn kept(&self) -> u32 {
        // `removed` is deduplicated and inside the world, so it is no longer than the world.
        self.old_world - u32::try_from(self.removed.len()).unwrap_or(self.old_world)
    }
}

/// The shrink plan of seed `001`: survivors of `old` (absent ranks removed) compacted in
/// old order, and the epoch after `epoch`.
pub fn shrink(
    old: &[PeerInfo],
    epoch: Epoch,
    absent: &BTreeSet<Rank>,
) -> Result<(Epoch, Vec<PeerInfo>), PlanError> {
    let world = u32::try_from(old.len()).map_err(|_| PlanError::TooLarge)?;
    let plan = Plan::new(world, epoch, absent, 0)?;
    Ok((plan.epoch(), plan.apply(old, &[])?))
}

fn next_epoch(epoch: Epoch) -> Result<Epoch, PlanError> {
    epoch
        .get()
        .checked_add(1)
        .map(Epoch)
        .ok_or(PlanError::EpochExhausted)
}

/// A change that cannot be planned.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("{rank} is outside the old world of {world}")]
    RankOutOfRange { rank: Rank, world: u32 },
    #[error("removed ranks are not strictly ascending")]
    NotAscending,
    #[error("no members would be left")]
    Empty,
    #[error("the world would exceed 2^32 members")]
    TooLarge,
    #[error("epoch counter exhausted")]
    EpochExhausted,
    #[error("proposal for {proposed} does not follow {current}")]
    EpochNotNext { current: Epoch, proposed: Epoch },
    #[error("joiner claims {rank}, expected {expected:?}")]
    JoinerRank { rank: Rank, expected: Option<Rank> },
    #[error("old table has {len} entries for a world of {world}")]
    TableSize { len: usize, world: u32 },
    #[error("{len} joiner entries for {planned} planned joiners")]
    JoinerCount { len: usize, planned: u32 },
    #[error("table entry {index} holds {rank}; entries must be ordered by rank")]
    TableOrder { index: usize, rank: Rank },
}

#[cfg(test)]
mod tests {
    use chorus_protocol::CommId;
    use chorus_protocol::message::WireAddr;
    use proptest::prelude::*;

    use super::*;

    fn peer(rank: u32) -> PeerInfo {
        PeerInfo {
            rank: Rank(rank),
            host: format!("h{rank}"),
            pid: 100 + rank,
            control: WireAddr {
                ip: [0; 16],
                port: 1,
            },
            data: WireAddr {
                ip: [0; 16],
                port: 2,
            },
            fingerprint: [0; 32],
            caps: 0,
            incarnation: 0,
        }
    }

    fn set(r: &[u32]) -> BTreeSet<Rank> {
        r.iter().map(|&x| Rank(x)).collect()
    }

    #[test]
    fn seed_001_layout_five_to_four() {
        // World 5, rank 2 (a generation shard) dies: [0 1 2 3 4] -> [0 1 3 4] renumbered 0..4.
        let table: Vec<PeerInfo> = (0..5).map(peer).collect();
        let (epoch, next) = shrink(&table, Epoch(7), &set(&[2])).unwrap();
        assert_eq!(epoch, Epoch(8));
        let hosts: Vec<&str> = next.iter().map(|p| p.host.as_str()).collect();
        assert_eq!(hosts, ["h0", "h1", "h3", "h4"]);
        assert!(next.iter().enumerate().all(|(i, p)| p.rank.index() == i));
    }

    #[test]
    fn grow_appends_joiners_after_survivors() {
        let plan = Plan::new(4, Epoch(0), &set(&[0]), 2).unwrap();
        assert_eq!(plan.world(), 5);
        assert_eq!(plan.joiner_rank(0), Some(Rank(3)));
        assert_eq!(plan.joiner_rank(2), None);
        let table: Vec<PeerInfo> = (0..4).map(peer).collect();
        let next = plan.apply(&table, &[peer(90), peer(91)]).unwrap();
        assert_eq!(next[3].host, "h90");
        assert_eq!(next[4].rank, Rank(4));
    }

    #[test]
    fn rejects_bad_changes() {
        assert_eq!(
            Plan::new(3, Epoch(0), &set(&[0, 1, 2]), 0),
            Err(PlanError::Empty)
        );
        assert_eq!(
            Plan::new(3, Epoch(0), &set(&[3]), 0),
            Err(PlanError::RankOutOfRange {
                rank: Rank(3),
                world: 3
            })
        );
        assert_eq!(
            Plan::new(3, Epoch(u64::MAX), &set(&[]), 0),
            Err(PlanError::EpochExhausted)
        );
        let proposal = Proposal {
            comm: CommId(1),
            epoch: Epoch(2),
            removed: vec![Rank(2), Rank(1)],
            joiners: vec![],
        };
        assert_eq!(
            Plan::from_proposal(4, Epoch(1), &proposal),
            Err(PlanError::NotAscending)
        );
        let proposal = Proposal {
            epoch: Epoch(5),
            removed: vec![],
            ..proposal
        };
        assert!(matches!(
            Plan::from_proposal(4, Epoch(1), &proposal),
            Err(PlanError::EpochNotNext { .. })
        ));
        let proposal = Proposal {
            epoch: Epoch(2),
            joiners: vec![peer(0)],
            ..proposal
        };
        assert!(matches!(
            Plan::from_proposal(4, Epoch(1), &proposal),
            Err(PlanError::JoinerRank { .. })
        ));
        let plan = Plan::new(3, Epoch(0), &set(&[]), 0).unwrap();
        let shuffled = vec![peer(1), peer(0), peer(2)];
        assert!(matches!(
            plan.apply(&shuffled, &[]),
            Err(PlanError::TableOrder { .. })
        ));
    }

    proptest! {
        #[test]
        fn compaction_is_contiguous_and_order_preserving(
            world in 1u32..300,
            picks in proptest::collection::vec(any::<u32>(), 0..40),
            joiners in 0u32..4,
        ) {
            let absent: BTreeSet<Rank> = picks.iter().map(|p| Rank(p % world)).collect();
            let Ok(plan) = Plan::new(world, Epoch(3), &absent, joiners) else {
                prop_assert!(absent.len() as u32 == world && joiners == 0);
                return Ok(());
            };
            prop_assert_eq!(plan.world(), world - absent.len() as u32 + joiners);
            let mut next_expected = 0u32;
            for old in 0..world {
                let old = Rank(old);
                match plan.new_rank(old) {
                    None => prop_assert!(absent.contains(&old)),
                    Some(new) => {
                        prop_assert_eq!(new.get(), next_expected);
                        prop_assert_eq!(plan.old_rank(new), Some(old));
                        next_expected += 1;
                    }
                }
            }
            prop_assert_eq!(plan.old_rank(Rank(next_expected)), None);
        }
    }
}
