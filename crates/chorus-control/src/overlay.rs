//! The overlay: who watches whom and who forwards to whom, as pure functions of one member's
//! view (the world size and the ranks it knows absent).
//!
//! Members sit on a ring in rank order, absent ranks skipped. A rank's **observers** are its
//! `k` next present successors: it heartbeats to them, they declare it dead when it falls
//! silent. When a rank becomes absent, the ring closes over it and the ranks it observed
//! get a new observer without any agreement (each member recomputes from its own view,
//! which the notice broadcast keeps converging). A rank's **fingers** are the first present
//! ranks at distances 1, 2, 4, 8, ... ahead of it: flooding a notice over fingers reaches
//! every present member in at most ⌈log2 N⌉ hops, and each member receives it from up to
//! log2 N different predecessors, so an undetected dead forwarder does not cut anyone off.

use std::collections::BTreeSet;

use chorus_protocol::Rank;

/// One member's view of the ring: the world size and the ranks it knows absent.
#[derive(Copy, Clone, Debug)]
pub struct Ring<'a> {
    world: u32,
    absent: &'a BTreeSet<Rank>,
}

impl<'a> Ring<'a> {
    /// The ring of `world` ranks without `absent` (ranks ≥ `world` in `absent` are ignored).
    pub fn new(world: u32, absent: &'a BTreeSet<Rank>) -> Ring<'a> {
        Ring { world, absent }
    }

    /// Whether `rank` is a member not known absent.
    pub fn is_present(&self, rank: Rank) -> bool {
        rank.get() < self.world && !self.absent.contains(&rank)
    }

    /// How many ranks are present.
    pub fn present_count(&self) -> u32 {
        let absent_here = self.absent.range(..Rank(self.world)).count();
        self.world
            .saturating_sub(u32::try_from(absent_here).unwrap_or(u32::MAX))
    }

    /// The `k` nearest present ranks after `me`, nearest first (fewer if the ring is small).
    pub fn observers(&self, me: Rank, k: u32) -> Vec<Rank> {
        self.walk(me, k, 1)
    }

    /// The `k` nearest present ranks before `me`, nearest first: the ranks `me` observes.
    pub fn observed(&self, me: Rank, k: u32) -> Vec<Rank> {
        self.walk(me, k, self.world.saturating_sub(1))
    }

    /// The first present ranks at distances 1, 2, 4, ... ahead of `me`, deduplicated,
    /// without `me`.
    pub fn fingers(&self, me: Rank) -> Vec<Rank> {
        let mut out = Vec::new();
        if self.world < 2 {
            return out;
        }
        let mut distance: u64 = 1;
        while distance < u64::from(self.world) {
            let start = (u64::from(me.get()) + distance) % u64::from(self.world);
            // `start` < world, which is a u32.
            let start = u32::try_from(start).unwrap_or(0);
            if let Some(target) = self.present_from(start, 1)
                && target != me
                && !out.contains(&target)
            {
                out.push(target);
            }
            distance *= 2;
        }
        out
    }

    /// The lowest-numbered present rank: the default agreement coordinator.
    pub fn lowest(&self) -> Option<Rank> {
        if self.world == 0 {
            return None;
        }
        self.present_from(0, 1)
    }

    /// How many present ranks are numbered below `me`.
    pub fn position(&self, me: Rank) -> u32 {
        let below = self.absent.range(..me).count();
        me.get()
            .saturating_sub(u32::try_from(below).unwrap_or(u32::MAX))
    }

    /// Up to `k` distinct present ranks other than `me`, stepping by `step` (1 forward,
    /// world-1 backward) from `me`.
    fn walk(&self, me: Rank, k: u32, step: u32) -> Vec<Rank> {
        let mut out = Vec::new();
        if self.world < 2 {
            return out;
        }
        let mut at = me.get() % self.world;
        for _ in 1..self.world {
            if out.len() >= k as usize {
                break;
            }
            at = step_by(at, step, self.world);
            let r = Rank(at);
            if r == me {
                break;
            }
            if !self.absent.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// The first present rank at or after `start`, walking by `step`.
    fn present_from(&self, start: u32, step: u32) -> Option<Rank> {
        let mut at = start % self.world;
        for _ in 0..self.world {
            if !self.absent.contains(&Rank(at)) {
                return Some(Rank(at));
            }
            at = step_by(at, step, self.world);
        }
        None
    }
}

fn step_by(at: u32, step: u32, world: u32) -> u32 {
    let next = (u64::from(at) + u64::from(step)) % u64::from(world);
    // The remainder is below `world`, a u32.
    u32::try_from(next).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranks: &[u32]) -> BTreeSet<Rank> {
        ranks.iter().map(|&r| Rank(r)).collect()
    }

    fn ranks(v: &[Rank]) -> Vec<u32> {
        v.iter().map(|r| r.get()).collect()
    }

    #[test]
    fn observers_are_successors_skipping_absent_ranks() {
        let absent = set(&[5, 6]);
        let ring = Ring::new(10, &absent);
        assert_eq!(ranks(&ring.observers(Rank(4), 2)), vec![7, 8]);
        assert_eq!(ranks(&ring.observers(Rank(9), 2)), vec![0, 1]);
        assert_eq!(ranks(&ring.observed(Rank(7), 2)), vec![4, 3]);
        assert_eq!(ranks(&ring.observed(Rank(0), 3)), vec![9, 8, 7]);
        assert_eq!(ring.present_count(), 8);
        assert_eq!(ring.position(Rank(7)), 5);
    }

    #[test]
    fn observe_relation_is_the_inverse_of_observers() {
        let absent = set(&[2, 3, 11]);
        let ring = Ring::new(13, &absent);
        for me in (0..13).map(Rank).filter(|r| ring.is_present(*r)) {
            for o in ring.observers(me, 2) {
                assert!(ring.observed(o, 2).contains(&me), "{me} -> {o}");
            }
        }
    }

    #[test]
    fn small_rings_never_list_self_or_duplicates() {
        let none = BTreeSet::new();
        let ring = Ring::new(2, &none);
        assert_eq!(ranks(&ring.observers(Rank(0), 5)), vec![1]);
        assert_eq!(ranks(&ring.fingers(Rank(1))), vec![0]);
        let ring = Ring::new(1, &none);
        assert!(ring.observers(Rank(0), 2).is_empty());
        assert!(ring.fingers(Rank(0)).is_empty());
        let all = set(&[0, 1, 2]);
        let ring = Ring::new(3, &all);
        assert!(ring.observers(Rank(0), 2).is_empty());
        assert_eq!(ring.lowest(), None);
    }

    #[test]
    fn flooding_over_fingers_reaches_everyone_in_log_hops() {
        for world in [2u32, 3, 7, 8, 100, 1000] {
            let absent: BTreeSet<Rank> = (0..world).filter(|r| r % 7 == 3).map(Rank).collect();
            let ring = Ring::new(world, &absent);
            let origin = ring.lowest().unwrap_or(Rank(0));
            let mut hops = vec![u32::MAX; world as usize];
            hops[origin.index()] = 0;
            let mut frontier = vec![origin];
            let mut depth = 0;
            while !frontier.is_empty() {
                depth += 1;
                let mut next = Vec::new();
                for r in frontier {
                    for f in ring.fingers(r) {
                        if hops[f.index()] == u32::MAX {
                            hops[f.index()] = depth;
                            next.push(f);
                        }
                    }
                }
                frontier = next;
            }
            let bound = 32 - world.leading_zeros();
            for r in (0..world).map(Rank).filter(|r| ring.is_present(*r)) {
                assert!(
                    hops[r.index()] <= bound,
                    "world {world}: {r} at {} hops",
                    hops[r.index()]
                );
            }
        }
    }
}
