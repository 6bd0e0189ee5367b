//! The membership ledger: what one member believes about each peer at the current epoch.
//!
//! States: `Joining → Alive → Suspect → Dead`, and `Departed`. Dead and Departed are
//! absorbing for the epoch (the first verdict and its evidence are kept) and together make
//! the **absent** set; `Suspect` is a local, reversible state and is never absent (seed
//! `001`: treating "not serving" as "gone" aborts a run on one missed probe).
//!
//! The ledger is sparse: it keeps a record only for peers this member watches, has heard
//! from through the detector, or has a verdict about, so a member of a 100 000-rank world
//! holds a few dozen records. Peers without a record read as `Alive`: nobody has reported
//! anything against them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chorus_protocol::Rank;
use chorus_protocol::message::{Evidence, Notice, PeerState, PeerStatus, Verdict};

use crate::broadcast::Digest;
use crate::time::{Instant, millis};

/// One peer as the ledger holds it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PeerRecord {
    pub state: PeerState,
    /// When this member last heard from the peer (only tracked for watched peers).
    pub last_heard: Option<Instant>,
    /// Why the peer is absent (or suspect: the silence so far), if it is.
    pub evidence: Option<Evidence>,
    /// The member that reached the verdict (this member's own rank if it did).
    pub reported_by: Option<Rank>,
    /// When the peer entered its current state.
    pub since: Instant,
    /// The notice as this member first learned it, kept for forwarding and repair.
    notice: Option<Notice>,
}

impl PeerRecord {
    fn new(state: PeerState, now: Instant) -> PeerRecord {
        PeerRecord {
            state,
            last_heard: None,
            evidence: None,
            reported_by: None,
            since: now,
            notice: None,
        }
    }
}

/// Every peer's state at one epoch, as one member believes it.
#[derive(Clone, Debug)]
pub struct Ledger {
    world: u32,
    records: BTreeMap<Rank, PeerRecord>,
    absent: BTreeSet<Rank>,
    /// One bit per rank modulo 64, set for every absent rank: answers "not absent" for
    /// most ranks without touching the set (the hot path of every frame).
    absent_bits: u64,
    digest: Digest,
}

impl Ledger {
    /// A ledger for a world of `world` members with nothing known yet.
    pub(crate) fn new(world: u32) -> Ledger {
        Ledger {
            world,
            records: BTreeMap::new(),
            absent: BTreeSet::new(),
            absent_bits: 0,
            digest: Digest::default(),
        }
    }

    /// The ranks known absent (dead or departed) at this epoch.
    pub fn absent(&self) -> &BTreeSet<Rank> {
        &self.absent
    }

    /// Whether `rank` is known dead or departed.
    pub fn is_absent(&self, rank: Rank) -> bool {
        self.absent_bits & bit(rank) != 0 && self.absent.contains(&rank)
    }

    /// The record for `rank`, if this member keeps one.
    pub fn record(&self, rank: Rank) -> Option<&PeerRecord> {
        self.records.get(&rank)
    }

    /// The state of `rank`: its record's, or `Alive` when nothing is known against it.
    pub fn state(&self, rank: Rank) -> PeerState {
        self.records
            .get(&rank)
            .map_or(PeerState::Alive, |r| r.state)
    }

    /// The digest of the absent set (see [`Digest`]).
    pub(crate) fn digest(&self) -> Digest {
        self.digest
    }

    /// The notice behind `rank`'s absence, if it is absent.
    pub(crate) fn notice(&self, rank: Rank) -> Option<Notice> {
        self.records.get(&rank).and_then(|r| r.notice)
    }

    /// The notices behind every absence, to push to a peer whose digest differs.
    pub(crate) fn notices(&self) -> impl Iterator<Item = Notice> + '_ {
        self.absent
            .iter()
            .filter_map(|r| self.records.get(r).and_then(|rec| rec.notice))
    }

    /// The row `chorus status` shows for `rank`.
    pub fn status(&self, rank: Rank, now: Instant) -> PeerStatus {
        match self.records.get(&rank) {
            Some(rec) => PeerStatus {
                rank,
                state: rec.state,
                last_heard_ms: rec
                    .last_heard
                    .map_or(u64::MAX, |t| millis(now.saturating_since(t))),
                evidence: rec.evidence,
            },
            None => PeerStatus {
                rank,
                state: PeerState::Alive,
                last_heard_ms: u64::MAX,
                evidence: None,
            },
        }
    }

    /// Starts tracking a peer this member will watch (`Joining` until first heard).
    pub(crate) fn watch(&mut self, rank: Rank, now: Instant) {
        self.records
            .entry(rank)
            .or_insert_with(|| PeerRecord::new(PeerState::Joining, now));
    }

    /// Starts tracking a member admitted in this epoch.
    pub(crate) fn joining(&mut self, rank: Rank, now: Instant) {
        self.watch(rank, now);
    }

    /// Records a sign of life from `rank`. Returns true if it was `Suspect` and is `Alive`
    /// again. Absent peers stay absent.
    pub(crate) fn heard(&mut self, rank: Rank, now: Instant) -> bool {
        let Some(rec) = self.records.get_mut(&rank) else {
            return false;
        };
        rec.last_heard = Some(now);
        match rec.state {
            PeerState::Joining => {
                rec.state = PeerState::Alive;
                rec.since = now;
                false
            }
            PeerState::Suspect => {
                rec.state = PeerState::Alive;
                rec.evidence = None;
                rec.since = now;
                true
            }
            PeerState::Alive | PeerState::Dead | PeerState::Departed => false,
        }
    }

    /// Marks a watched peer `Suspect` after `silent` without a word. Returns true if it
    /// changed state.
    pub(crate) fn suspect(
        &mut self,
        rank: Rank,
        silent: Duration,
        deadline: Duration,
        now: Instant,
    ) -> bool {
        let rec = self
            .records
            .entry(rank)
            .or_insert_with(|| PeerRecord::new(PeerState::Alive, now));
        if !matches!(rec.state, PeerState::Alive | PeerState::Joining) {
            return false;
        }
        rec.state = PeerState::Suspect;
        rec.evidence = Some(Evidence::MissedDeadline {
            silent_ms: millis(silent),
            deadline_ms: millis(deadline),
        });
        rec.since = now;
        true
    }

    /// Records the verdict of `notice` about its subject. Returns false (and changes
    /// nothing) if the subject was already absent or the verdict is not an absence.
    pub(crate) fn mark_absent(&mut self, notice: Notice, now: Instant) -> bool {
        let state = match notice.verdict {
            Verdict::Dead => PeerState::Dead,
            Verdict::Departed => PeerState::Departed,
            Verdict::Suspect => return false,
        };
        let subject = notice.subject;
        if subject.get() >= self.world || self.absent.contains(&subject) {
            return false;
        }
        let rec = self
            .records
            .entry(subject)
            .or_insert_with(|| PeerRecord::new(state, now));
        rec.state = state;
        rec.evidence = Some(notice.evidence);
        rec.reported_by = Some(notice.origin);
        rec.since = now;
        rec.notice = Some(notice);
        self.absent.insert(subject);
        self.absent_bits |= bit(subject);
        self.digest.toggle_rank(subject);
        true
    }

    /// The ledger of the next epoch: records of ranks kept by `new_rank` move to their new
    /// numbers (absences carry over: a member still dead after the change stays dead),
    /// records of removed ranks are dropped, and `joiners` start `Joining`.
    pub(crate) fn remap(
        &self,
        world: u32,
        me: Rank,
        new_rank: impl Fn(Rank) -> Option<Rank>,
        joiners: impl Iterator<Item = Rank>,
        now: Instant,
    ) -> Ledger {
        let mut next = Ledger::new(world);
        for (rank, rec) in &self.records {
            let Some(to) = new_rank(*rank) else { continue };
            let mut rec = rec.clone();
            if let Some(n) = rec.notice.as_mut() {
                n.subject = to;
                n.hops = 0;
                // An origin that left keeps the verdict alive through this member (never
                // the subject itself: a notice's origin and subject differ); a launcher
                // witness keeps its rankless origin.
                if n.origin != Rank(u32::MAX) {
                    n.origin = new_rank(n.origin).unwrap_or(me);
                }
            }
            rec.reported_by = rec.reported_by.and_then(&new_rank);
            if matches!(rec.state, PeerState::Dead | PeerState::Departed) {
                next.absent.insert(to);
                next.absent_bits |= bit(to);
                next.digest.toggle_rank(to);
            }
            next.records.insert(to, rec);
        }
        for r in joiners {
            next.joining(r, now);
        }
        next
    }
}

fn bit(rank: Rank) -> u64 {
    1 << (rank.get() % 64)
}

#[cfg(test)]
mod tests {
    use chorus_protocol::CloseCode;

    use super::*;

    fn dead(origin: u32, subject: u32) -> Notice {
        Notice {
            origin: Rank(origin),
            subject: Rank(subject),
            verdict: Verdict::Dead,
            evidence: Evidence::ConnectionLost {
                code: CloseCode::INTERNAL,
            },
            hops: 0,
        }
    }

    #[test]
    fn suspect_is_never_absent_and_recovers() {
        let mut l = Ledger::new(4);
        l.watch(Rank(1), Instant::ZERO);
        assert_eq!(l.state(Rank(1)), PeerState::Joining);
        assert!(!l.heard(Rank(1), Instant::from_micros(10)));
        assert_eq!(l.state(Rank(1)), PeerState::Alive);
        assert!(l.suspect(
            Rank(1),
            Duration::from_secs(1),
            Duration::from_secs(2),
            Instant::from_micros(20)
        ));
        assert_eq!(l.state(Rank(1)), PeerState::Suspect);
        assert!(l.absent().is_empty(), "suspect must not count as absent");
        assert!(l.heard(Rank(1), Instant::from_micros(30)));
        assert_eq!(l.state(Rank(1)), PeerState::Alive);
        assert_eq!(
            l.status(Rank(1), Instant::from_micros(2_030)).last_heard_ms,
            2
        );
    }

    #[test]
    fn first_verdict_wins_and_absence_is_absorbing() {
        let mut l = Ledger::new(4);
        let before = l.digest();
        assert!(l.mark_absent(dead(0, 2), Instant::from_micros(5)));
        let departed = Notice {
            verdict: Verdict::Departed,
            ..dead(1, 2)
        };
        assert!(!l.mark_absent(departed, Instant::from_micros(6)));
        assert_eq!(l.state(Rank(2)), PeerState::Dead);
        assert_eq!(l.record(Rank(2)).and_then(|r| r.reported_by), Some(Rank(0)));
        assert!(!l.heard(Rank(2), Instant::from_micros(7)));
        assert_eq!(l.state(Rank(2)), PeerState::Dead);
        assert_ne!(l.digest(), before);
        assert!(
            !l.mark_absent(dead(0, 9), Instant::from_micros(8)),
            "out of range"
        );
        assert!(!l.mark_absent(
            Notice {
                verdict: Verdict::Suspect,
                ..dead(0, 3)
            },
            Instant::ZERO
        ));
        assert_eq!(l.notices().count(), 1);
    }

    #[test]
    fn remap_moves_carried_over_absences_to_new_ranks() {
        let mut l = Ledger::new(5);
        l.mark_absent(dead(0, 1), Instant::ZERO);
        l.mark_absent(dead(0, 3), Instant::ZERO);
        // Epoch change removes rank 1 only; rank 3 becomes rank 2 and stays dead.
        let next = l.remap(
            5,
            Rank(0),
            |r| match r.get() {
                1 => None,
                n if n > 1 => Some(Rank(n - 1)),
                n => Some(Rank(n)),
            },
            [Rank(4)].into_iter(),
            Instant::from_micros(1),
        );
        assert_eq!(
            next.absent().iter().copied().collect::<Vec<_>>(),
            vec![Rank(2)]
        );
        assert_eq!(next.state(Rank(4)), PeerState::Joining);
        assert_eq!(next.notices().next().map(|n| n.subject), Some(Rank(2)));
    }
}
