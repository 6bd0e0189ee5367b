//! Knocking: a member whose own view has lost its quorum keeps asking, one member at a
//! time, whether the members it holds dead are there after all.
//!
//! A partitioned minority declares the majority dead and stops talking to it; the majority
//! agrees an epoch without it and stops talking to it too. When the cut heals nobody speaks,
//! and the minority would never learn that it was removed. So while a member cannot reach a
//! quorum it sends a heartbeat of its epoch to one member it holds dead every heartbeat
//! interval, in turn. A member that removed it answers with an eviction (SPEC 14: a stale
//! frame from a removed rank is answered `Depart{evicted}` and a close with `evicted`; a
//! stale handshake from one with `Reject{evicted}`). Knocking costs one frame per interval,
//! as one heartbeat does, and a member that still has its quorum never knocks: the majority
//! side of a partition, or the survivors of a crash, send nothing to the dead.

use std::collections::BTreeSet;
use std::time::Duration;

use chorus_protocol::Rank;

use crate::time::Instant;

/// Whom to knock on next, and when.
#[derive(Debug, Default)]
pub(crate) struct Knock {
    /// When the next knock is due, while knocking.
    next: Option<Instant>,
    /// The last rank knocked on: the next knock goes to the first dead rank above it.
    last: Option<Rank>,
}

impl Knock {
    /// The dead member to knock on at `now`, if a knock is due: one every `every`, in rank
    /// order round the ring of `dead`. An empty `dead` stops knocking.
    pub(crate) fn due(
        &mut self,
        now: Instant,
        every: Duration,
        dead: &BTreeSet<Rank>,
    ) -> Option<Rank> {
        if dead.is_empty() {
            self.stop();
            return None;
        }
        if self.next.is_some_and(|at| now < at) {
            return None;
        }
        let after = self.last.map_or(0, |r| r.get().saturating_add(1));
        let target = dead
            .range(Rank(after)..)
            .next()
            .or_else(|| dead.iter().next())
            .copied();
        self.last = target;
        self.next = Some(now + every);
        target
    }

    /// Stop knocking (the quorum is back, or the member left the epoch).
    pub(crate) fn stop(&mut self) {
        *self = Knock::default();
    }

    /// When the next knock is due, while knocking.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    #[test]
    fn knocks_go_round_the_dead_one_per_interval() {
        let every = Duration::from_millis(100);
        let dead: BTreeSet<Rank> = [Rank(0), Rank(2), Rank(3)].into();
        let mut k = Knock::default();
        assert_eq!(k.due(ms(0), every, &dead), Some(Rank(0)));
        assert_eq!(k.due(ms(50), every, &dead), None, "one per interval");
        assert_eq!(k.next_deadline(), Some(ms(100)));
        let order: Vec<Option<Rank>> = (1..=4).map(|i| k.due(ms(100 * i), every, &dead)).collect();
        assert_eq!(
            order,
            [Some(Rank(2)), Some(Rank(3)), Some(Rank(0)), Some(Rank(2))]
        );
    }

    #[test]
    fn nobody_dead_means_no_knocking() {
        let every = Duration::from_millis(100);
        let mut k = Knock::default();
        assert_eq!(k.due(ms(0), every, &[Rank(1)].into()), Some(Rank(1)));
        assert_eq!(k.due(ms(100), every, &BTreeSet::new()), None);
        assert_eq!(k.next_deadline(), None);
    }
}
