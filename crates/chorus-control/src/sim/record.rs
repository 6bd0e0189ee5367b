//! What the simulator observes during a run, with the checks that can be made on the spot.

use std::collections::BTreeMap;
use std::time::Duration;

use chorus_protocol::Epoch;

use crate::time::Instant;

/// Sentinel for "never".
pub(crate) const NEVER: u64 = u64::MAX;

/// The fault history of one process.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProcFaults {
    /// Crashed, killed, or crashed as a coordinator.
    pub(crate) crashed: Option<Instant>,
    /// Departed or aborted.
    pub(crate) departed: Option<Instant>,
    /// Freeze windows.
    pub(crate) freezes: Vec<(Instant, Instant)>,
    /// Evicted by its node.
    pub(crate) evicted: Option<(Instant, Epoch)>,
    /// Joined (welcomed) at; `None` for initial members.
    pub(crate) joined: Option<Instant>,
    /// A joiner whose admission may fail (not welcomed yet).
    pub(crate) joiner: bool,
}

/// One revocation issued by the scenario.
#[derive(Clone, Debug)]
pub(crate) struct RevokeRecord {
    pub(crate) at: Instant,
    pub(crate) epoch: Epoch,
    pub(crate) learned: Vec<u64>,
}

/// Observations of one run.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub(crate) violations: Vec<String>,
    pub(crate) faults: Vec<ProcFaults>,
    /// First time each process learned each subject absent, in µs (`NEVER`).
    pub(crate) learned: BTreeMap<u32, Vec<u64>>,
    /// Hops of each first learning by notice.
    pub(crate) hops: Vec<f64>,
    /// Epochs each process installed, in order, with the time.
    pub(crate) installs: Vec<Vec<(Epoch, Instant)>>,
    pub(crate) revokes: Vec<RevokeRecord>,
    /// Procs some member declared absent (dead or departed), with the first time.
    pub(crate) declared: BTreeMap<u32, Instant>,
    pub(crate) frames: u64,
    pub(crate) lost: u64,
    pub(crate) window_frames: u64,
    pub(crate) events: u64,
    pub(crate) stalls: u64,
    pub(crate) evictions: u64,
    /// When each process first asked to shrink at each epoch.
    pub(crate) asked: BTreeMap<(u32, Epoch), Instant>,
    /// Shrink requests the nodes gave up.
    pub(crate) gave_up: Vec<super::report::GaveUp>,
    /// A long partition happened: verdicts about anyone are justified from then on.
    pub(crate) long_partition_from: Option<Instant>,
    pub(crate) tolerated_freeze: Duration,
}

impl Record {
    pub(crate) fn new(procs: usize, tolerated_freeze: Duration) -> Record {
        Record {
            faults: vec![ProcFaults::default(); procs],
            installs: vec![vec![(Epoch(0), Instant::ZERO)]; procs],
            tolerated_freeze,
            ..Record::default()
        }
    }

    pub(crate) fn add_proc(&mut self, joiner: bool) {
        self.faults.push(ProcFaults {
            joiner,
            ..ProcFaults::default()
        });
        self.installs.push(Vec::new());
    }

    pub(crate) fn violation(&mut self, text: String) {
        if self.violations.len() < 200 {
            self.violations.push(text);
        }
    }

    /// Whether a verdict of absence about `proc` at `at` is justified by what happened to it.
    pub(crate) fn may_be_absent(&self, proc: u32, at: Instant) -> bool {
        if self.long_partition_from.is_some_and(|t| t <= at) {
            return true;
        }
        let Some(f) = self.faults.get(proc as usize) else {
            return false;
        };
        f.crashed.is_some_and(|t| t <= at)
            || f.departed.is_some_and(|t| t <= at)
            || f.evicted.is_some_and(|(t, _)| t <= at)
            || f.joiner && f.joined.is_none()
            || f.freezes.iter().any(|(from, until)| {
                *from <= at && until.saturating_since(*from) > self.tolerated_freeze
            })
    }

    /// A process learned `subject` is absent (by verdict or by an agreed removal).
    pub(crate) fn learn(&mut self, observer: u32, subject: u32, at: Instant, procs: usize) {
        let row = self
            .learned
            .entry(subject)
            .or_insert_with(|| vec![NEVER; procs]);
        if row.len() < procs {
            row.resize(procs, NEVER);
        }
        if let Some(slot) = row.get_mut(observer as usize) {
            *slot = (*slot).min(at.as_micros());
        }
        self.declared.entry(subject).or_insert(at);
    }

    /// Whether `proc` suffered any fault at all (such processes are not "healthy").
    pub(crate) fn faulted(&self, proc: u32) -> bool {
        let Some(f) = self.faults.get(proc as usize) else {
            return true;
        };
        f.crashed.is_some()
            || f.departed.is_some()
            || !f.freezes.is_empty()
            || f.evicted.is_some()
            || f.joiner
    }

    /// Whether `proc` must be gone from the final membership: it crashed, left, was
    /// evicted, was never welcomed, or froze past the tolerated stall and was declared dead
    /// for it (a frozen process whose observers were dead themselves may resume before
    /// anyone watches it long enough; it then stays, legitimately).
    pub(crate) fn must_go(&self, proc: u32) -> bool {
        let Some(f) = self.faults.get(proc as usize) else {
            return false;
        };
        f.crashed.is_some()
            || f.departed.is_some()
            || f.evicted.is_some()
            || f.joiner && f.joined.is_none()
            || self.declared.contains_key(&proc)
                && f.freezes
                    .iter()
                    .any(|(from, until)| until.saturating_since(*from) > self.tolerated_freeze)
    }

    /// The epoch `proc` was at, at time `at`.
    pub(crate) fn epoch_at(&self, proc: u32, at: Instant) -> Epoch {
        self.installs
            .get(proc as usize)
            .and_then(|v| v.iter().rev().find(|(_, t)| *t <= at))
            .map_or(Epoch(0), |(e, _)| *e)
    }
}
