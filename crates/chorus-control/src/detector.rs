//! The liveness detector: when to heartbeat, whom to heartbeat, whom to watch, and when a
//! watched peer's silence becomes a suspicion or a verdict.
//!
//! Each member heartbeats to its `k` observers (its successors on the ring of present
//! members) and watches its `k` predecessors. A watched peer's silence is measured from a
//! **baseline**: the last time it was heard, or the time this member started watching it,
//! whichever is later, pushed forward by any stall of this member itself (a frozen observer
//! that resumes must not condemn the peers it could not hear while it was stopped). At
//! `suspect_after` the ledger shows it `Suspect`; at `deadline` it is declared dead.

use std::time::Duration;

use chorus_protocol::Rank;

use crate::config::Config;
use crate::lateness::Lateness;
use crate::overlay::Ring;
use crate::time::Instant;

/// One watched peer.
#[derive(Copy, Clone, Debug)]
struct Watch {
    rank: Rank,
    baseline: Instant,
    suspected: bool,
    /// When its last heartbeat arrived (for [`Lateness`]).
    last_beat: Option<Instant>,
}

/// What the detector found overdue.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Expiry {
    Suspect { rank: Rank, silent: Duration },
    Dead { rank: Rank, silent: Duration },
}

/// Heartbeat schedule and watches of one member.
#[derive(Clone, Debug)]
pub(crate) struct Detector {
    interval: Duration,
    deadline: Duration,
    suspect_after: Duration,
    k: u32,
    seq: u64,
    next_heartbeat: Instant,
    observers: Vec<Rank>,
    watches: Vec<Watch>,
    /// How late watched peers' heartbeats arrived, over this member's life.
    lateness: Lateness,
}

impl Detector {
    pub(crate) fn new(config: &Config, now: Instant) -> Detector {
        Detector {
            interval: config.heartbeat_interval,
            deadline: config.deadline,
            suspect_after: config.suspect_after,
            k: config.observers,
            seq: 0,
            next_heartbeat: now,
            observers: Vec::new(),
            watches: Vec::new(),
            lateness: Lateness::default(),
        }
    }

    /// Recomputes observers and watches for `me` on `ring`. Peers already watched keep their
    /// baseline; newly watched ones get a full deadline from `now`. Returns the ranks newly
    /// watched and the observers newly gained (to open connections to).
    pub(crate) fn reset(
        &mut self,
        ring: &Ring<'_>,
        me: Rank,
        now: Instant,
    ) -> (Vec<Rank>, Vec<Rank>) {
        let observers = ring.observers(me, self.k);
        let gained: Vec<Rank> = observers
            .iter()
            .copied()
            .filter(|o| !self.observers.contains(o))
            .collect();
        self.observers = observers;
        let mut fresh = Vec::new();
        let watches = ring
            .observed(me, self.k)
            .into_iter()
            .map(|rank| match self.watches.iter().find(|w| w.rank == rank) {
                Some(w) => *w,
                None => {
                    fresh.push(rank);
                    Watch {
                        rank,
                        baseline: now,
                        suspected: false,
                        last_beat: None,
                    }
                }
            })
            .collect();
        self.watches = watches;
        (fresh, gained)
    }

    /// Renumbers watches and observers for a new epoch, dropping removed ranks. A peer
    /// watched before and after keeps its baseline: an epoch change must not give a peer
    /// that fell silent just before it a fresh deadline.
    pub(crate) fn renumber(&mut self, new_rank: impl Fn(Rank) -> Option<Rank>) {
        self.observers = self.observers.iter().filter_map(|r| new_rank(*r)).collect();
        self.watches = self
            .watches
            .iter()
            .filter_map(|w| new_rank(w.rank).map(|rank| Watch { rank, ..*w }))
            .collect();
    }

    /// The ranks this member heartbeats to.
    pub(crate) fn observers(&self) -> &[Rank] {
        &self.observers
    }

    /// The ranks this member watches.
    pub(crate) fn watched(&self) -> impl Iterator<Item = Rank> + '_ {
        self.watches.iter().map(|w| w.rank)
    }

    /// Records a sign of life from `rank`.
    pub(crate) fn heard(&mut self, rank: Rank, now: Instant) {
        if let Some(w) = self.watches.iter_mut().find(|w| w.rank == rank) {
            w.baseline = w.baseline.max(now);
            w.suspected = false;
        }
    }

    /// Records a heartbeat from `rank` (after [`Detector::heard`]): if it is watched, how
    /// much more than one interval passed since its previous one.
    pub(crate) fn heartbeat_from(&mut self, rank: Rank, now: Instant) {
        let Some(w) = self.watches.iter_mut().find(|w| w.rank == rank) else {
            return;
        };
        if let Some(prev) = w.last_beat {
            let gap = now.saturating_since(prev);
            self.lateness.record(gap.saturating_sub(self.interval));
        }
        w.last_beat = Some(w.last_beat.map_or(now, |p| p.max(now)));
    }

    /// How late watched peers' heartbeats arrived.
    pub(crate) fn lateness(&self) -> &Lateness {
        &self.lateness
    }

    /// Credits a stall of this member (it was not running for `stall`) to every watched
    /// peer: silence that this member could not have heard does not count against them.
    pub(crate) fn credit_stall(&mut self, stall: Duration, now: Instant) {
        for w in &mut self.watches {
            w.baseline = (w.baseline + stall).min(now);
        }
    }

    /// The sequence number of the last heartbeat round.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// If a heartbeat round is due, schedules the next one and returns its sequence number.
    pub(crate) fn heartbeat_due(&mut self, now: Instant) -> Option<u64> {
        if now < self.next_heartbeat {
            return None;
        }
        // Schedule from now, not from the missed slot: a late round is not followed by a burst.
        self.next_heartbeat = now + self.interval;
        self.seq += 1;
        Some(self.seq)
    }

    /// Makes the next heartbeat round due at once (a new epoch, a new observer).
    pub(crate) fn heartbeat_now(&mut self, now: Instant) {
        self.next_heartbeat = self.next_heartbeat.min(now);
    }

    /// Watches that crossed a threshold by `now`. A peer declared dead stops being watched.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<Expiry> {
        let mut out = Vec::new();
        self.watches.retain_mut(|w| {
            let silent = now.saturating_since(w.baseline);
            if silent >= self.deadline {
                out.push(Expiry::Dead {
                    rank: w.rank,
                    silent,
                });
                return false;
            }
            if silent >= self.suspect_after && !w.suspected {
                w.suspected = true;
                out.push(Expiry::Suspect {
                    rank: w.rank,
                    silent,
                });
            }
            true
        });
        out
    }

    /// The earliest moment something here needs attention.
    pub(crate) fn next_deadline(&self) -> Instant {
        let mut next = self.next_heartbeat;
        for w in &self.watches {
            let at = if w.suspected {
                w.baseline + self.deadline
            } else {
                w.baseline + self.suspect_after
            };
            next = next.min(at);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    fn detector() -> (Detector, Config) {
        let config = Config::from_timing(Duration::from_millis(100), Duration::from_millis(1000));
        (Detector::new(&config, ms(0)), config)
    }

    #[test]
    fn silence_becomes_suspect_then_dead_at_the_deadline() {
        let (mut d, _) = detector();
        let none = BTreeSet::new();
        d.reset(&Ring::new(4, &none), Rank(1), ms(0));
        assert_eq!(d.observers(), &[Rank(2), Rank(3)]);
        assert_eq!(d.watched().collect::<Vec<_>>(), vec![Rank(0), Rank(3)]);
        d.heard(Rank(0), ms(100));
        d.heard(Rank(3), ms(100));
        assert!(d.expired(ms(599)).is_empty());
        assert_eq!(d.next_deadline(), ms(0), "first heartbeat is due at once");
        assert_eq!(d.heartbeat_due(ms(0)), Some(1));
        assert_eq!(d.heartbeat_due(ms(50)), None);
        let e = d.expired(ms(600));
        assert_eq!(e.len(), 2);
        assert!(matches!(e[0], Expiry::Suspect { rank: Rank(0), .. }));
        d.heard(Rank(3), ms(700));
        let e = d.expired(ms(1100));
        assert_eq!(
            e,
            vec![Expiry::Dead {
                rank: Rank(0),
                silent: Duration::from_millis(1000)
            }]
        );
        assert_eq!(
            d.watched().collect::<Vec<_>>(),
            vec![Rank(3)],
            "a dead peer is no longer watched"
        );
    }

    #[test]
    fn heartbeat_lateness_is_the_gap_past_one_interval_from_watched_peers() {
        let (mut d, _) = detector();
        let none = BTreeSet::new();
        d.reset(&Ring::new(4, &none), Rank(1), ms(0));
        for (rank, at) in [(0, 100), (0, 200), (0, 450), (3, 100), (3, 1300), (2, 900)] {
            d.heartbeat_from(Rank(rank), ms(at));
        }
        // Rank 2 is not watched; each watched peer's first heartbeat starts its count.
        let l = d.lateness();
        assert_eq!(l.count(), 3);
        assert_eq!(l.max(), Duration::from_millis(1100));
        assert_eq!(l.quantile(0.0), Duration::ZERO, "on time");
        let mid = l.quantile(0.5);
        assert!(
            mid >= Duration::from_millis(150) && mid <= Duration::from_millis(170),
            "{mid:?}"
        );
    }

    #[test]
    fn own_stall_is_not_counted_against_watched_peers() {
        let (mut d, _) = detector();
        let none = BTreeSet::new();
        d.reset(&Ring::new(3, &none), Rank(0), ms(0));
        d.heard(Rank(1), ms(100));
        d.heard(Rank(2), ms(100));
        // This member was frozen from 150 ms to 5 s.
        d.credit_stall(Duration::from_millis(4850), ms(5000));
        assert!(
            d.expired(ms(5000))
                .iter()
                .all(|e| !matches!(e, Expiry::Dead { .. }))
        );
        assert!(
            !d.expired(ms(5900))
                .iter()
                .any(|e| matches!(e, Expiry::Dead { .. }))
        );
        assert!(
            d.expired(ms(6001))
                .iter()
                .any(|e| matches!(e, Expiry::Dead { .. }))
        );
    }

    #[test]
    fn renumbering_keeps_baselines_of_peers_still_watched() {
        let (mut d, _) = detector();
        let none = BTreeSet::new();
        d.reset(&Ring::new(6, &none), Rank(3), ms(0));
        d.heard(Rank(2), ms(900));
        // Rank 0 is removed: old ranks 1..6 become 0..5; we are now rank 2, watching 1 and 0.
        d.renumber(|r| r.get().checked_sub(1).map(Rank));
        let (fresh, _) = d.reset(&Ring::new(5, &none), Rank(2), ms(1000));
        assert!(fresh.is_empty(), "both watched peers were watched before");
        let dead: Vec<_> = d
            .expired(ms(1050))
            .into_iter()
            .filter(|e| matches!(e, Expiry::Dead { .. }))
            .collect();
        assert_eq!(
            dead,
            vec![Expiry::Dead {
                rank: Rank(0),
                silent: Duration::from_millis(1050)
            }]
        );
    }

    #[test]
    fn newly_watched_peers_get_a_full_deadline() {
        let (mut d, _) = detector();
        let none = BTreeSet::new();
        d.reset(&Ring::new(5, &none), Rank(2), ms(0));
        d.heard(Rank(1), ms(900));
        d.heard(Rank(0), ms(900));
        // Rank 1 dies; the ring closes over it and rank 2's predecessors become 0 and 4.
        let absent: BTreeSet<Rank> = [Rank(1)].into_iter().collect();
        let (fresh, _) = d.reset(&Ring::new(5, &absent), Rank(2), ms(1000));
        assert_eq!(fresh, vec![Rank(4)]);
        assert!(
            !d.expired(ms(1899))
                .iter()
                .any(|e| matches!(e, Expiry::Dead { .. }))
        );
        let dead: Vec<_> = d
            .expired(ms(2000))
            .into_iter()
            .filter(|e| matches!(e, Expiry::Dead { .. }))
            .collect();
        assert_eq!(dead.len(), 2);
    }
}
