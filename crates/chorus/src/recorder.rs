//! The flight recorder: the last operations of a communicator, what each was doing and whom
//! it was waiting on, kept cheaply while everything works so that a hang or a failure can
//! be explained (seed `000_…` spent hours finding which rank a job waited on).
//!
//! It is the engine's [`OpObserver`]: the engine tells it when an operation starts and ends,
//! and the live step and awaited peer are read from the engine's [`OpProgress`] atomics only
//! when someone asks (an error, `chorus status`, the deadline watchdog).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chorus_engine::context::AbortReason;
use chorus_engine::error::OpError;
use chorus_engine::progress::{OpObserver, OpProgress};
use chorus_protocol::message::{OpRecord, OpState};
#[cfg(test)]
use chorus_protocol::{OpSeq, Rank};
use parking_lot::{Mutex, MutexGuard};

/// A bounded history of operations (the running ones and the most recent finished ones).
#[derive(Debug)]
pub(crate) struct Recorder {
    capacity: usize,
    log: Mutex<Log>,
}

/// The entries, oldest first, and how many of them have finished (kept so that trimming
/// on every operation's start and end costs O(1), not a scan).
#[derive(Debug, Default)]
struct Log {
    entries: VecDeque<Entry>,
    finished: usize,
}

impl std::ops::Deref for Log {
    type Target = VecDeque<Entry>;

    fn deref(&self) -> &VecDeque<Entry> {
        &self.entries
    }
}

#[derive(Debug)]
struct Entry {
    op: Arc<OpProgress>,
    started: Instant,
    ended: Option<Instant>,
}

impl Recorder {
    /// A recorder keeping up to `capacity` finished operations besides the running ones.
    pub(crate) fn new(capacity: usize) -> Self {
        Recorder {
            capacity: capacity.max(1),
            log: Mutex::new(Log::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock()
    }

    /// The newest `max` entries, oldest first, as the protocol's `OpRecord`s.
    pub(crate) fn records(&self, max: usize, now: Instant) -> Vec<OpRecord> {
        let entries = self.lock();
        let skip = entries.len().saturating_sub(max);
        entries.iter().skip(skip).map(|e| e.record(now)).collect()
    }

    /// The peer the oldest still-running operation is blocked on, if any: the answer to
    /// "whom is this rank waiting for".
    #[cfg(test)]
    pub(crate) fn waiting_on(&self) -> Option<Rank> {
        self.lock()
            .iter()
            .filter(|e| e.ended.is_none())
            .find_map(|e| e.op.snapshot().waiting_on)
    }

    /// Aborts every running operation that started before `now - timeout` with a timeout
    /// reason naming its wait; returns how many it aborted. Called by the runtime's
    /// watchdog, the owner of the clock (the engine has none).
    pub(crate) fn abort_overdue(&self, now: Instant, timeout: Duration) -> usize {
        let overdue: Vec<Arc<OpProgress>> = self
            .lock()
            .iter()
            .filter(|e| e.ended.is_none() && now.saturating_duration_since(e.started) >= timeout)
            .map(|e| e.op.clone())
            .collect();
        let mut aborted = 0;
        for op in overdue {
            let s = op.snapshot();
            let wait = match s.waiting_on {
                Some(peer) => format!("{} {} step {} on {peer}", s.collective, s.seq, s.step),
                None => format!("{} {} step {}", s.collective, s.seq, s.step),
            };
            if op
                .context()
                .abort(AbortReason::timeout(wait, timeout.as_millis() as u64))
            {
                aborted += 1;
            }
        }
        aborted
    }

    /// The earliest instant at which a running operation passes `timeout`; `None` when none
    /// runs, or when `timeout` reaches past what the clock can represent (never overdue).
    #[cfg(test)]
    pub(crate) fn next_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.lock()
            .iter()
            .filter(|e| e.ended.is_none())
            .filter_map(|e| e.started.checked_add(timeout))
            .min()
    }

    /// Sequence numbers of the running operations.
    #[cfg(test)]
    pub(crate) fn running(&self) -> Vec<OpSeq> {
        self.lock()
            .iter()
            .filter(|e| e.ended.is_none())
            .map(|e| e.op.snapshot().seq)
            .collect()
    }

    fn trim(&self, log: &mut Log) {
        // Drop the oldest finished entries past capacity; running ones always stay. The
        // oldest entry is almost always finished, so this is a pop, not a search.
        while log.finished > self.capacity {
            let oldest_finished = if log.entries.front().is_some_and(|e| e.ended.is_some()) {
                Some(0)
            } else {
                log.entries.iter().position(|e| e.ended.is_some())
            };
            match oldest_finished.and_then(|i| log.entries.remove(i)) {
                Some(_) => log.finished -= 1,
                None => break,
            }
        }
    }
}

impl Entry {
    fn record(&self, now: Instant) -> OpRecord {
        let s = self.op.snapshot();
        let end = self.ended.unwrap_or(now);
        OpRecord {
            seq: s.seq,
            collective: s.collective.code(),
            bytes: s.bytes,
            algorithm: s.algorithm.to_owned(),
            state: s.state,
            step: s.step,
            waiting_on: if s.state == OpState::Running {
                s.waiting_on
            } else {
                None
            },
            age_ms: millis(now.saturating_duration_since(self.started)),
            elapsed_ms: millis(end.saturating_duration_since(self.started)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl OpObserver for Recorder {
    fn started(&self, op: &Arc<OpProgress>) {
        // A running entry never makes the log trim: only finished ones count.
        self.lock().entries.push_back(Entry {
            op: op.clone(),
            started: coarse_now(),
            ended: None,
        });
    }

    fn finished(&self, op: &Arc<OpProgress>, _result: Result<(), &OpError>) {
        let mut log = self.lock();
        let ended = log
            .entries
            .iter_mut()
            .rev()
            .find(|e| Arc::ptr_eq(&e.op, op) && e.ended.is_none())
            .map(|e| e.ended = Some(coarse_now()))
            .is_some();
        if ended {
            log.finished += 1;
            self.trim(&mut log);
        }
    }
}

/// Now, read from the kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the last
/// scheduler tick, no timestamp-counter read), as an `Instant` of the process clock. The
/// recorder stamps every operation twice, and a small operation takes about a microsecond:
/// the fine clock cost a few percent of it. What the stamps are read for tolerates the lag
/// of at most one tick (1 to 10 ms): ages and durations shown in milliseconds, and
/// operation timeouts of seconds, which fire at most a tick late. A stamp may also read up
/// to a tick later than `Instant::now()`; every reader saturates such a difference to zero.
/// Where the coarse clock cannot be read, the fine one is used.
fn coarse_now() -> Instant {
    // The coarse reading first: the fine one taken after it is never earlier.
    static ORIGIN: OnceLock<Option<(Duration, Instant)>> = OnceLock::new();
    let origin = ORIGIN.get_or_init(|| coarse_since_boot().map(|c| (c, Instant::now())));
    match (origin, coarse_since_boot()) {
        (Some((coarse0, fine0)), Some(coarse)) => fine0
            .checked_add(coarse.saturating_sub(*coarse0))
            .unwrap_or_else(Instant::now),
        _ => Instant::now(),
    }
}

/// `CLOCK_MONOTONIC_COARSE`, through libc (whose vDSO call tools such as valgrind know).
fn coarse_since_boot() -> Option<Duration> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the whole call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec)
        .ok()
        .filter(|&n| n < 1_000_000_000)?;
    (rc == 0).then(|| Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_engine::local::mesh;
    use chorus_engine::{
        Buffer, Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink, Reduction,
    };
    use chorus_protocol::{Collective, DType};
    use futures::executor::block_on;
    use std::thread;

    type Eng = Engine<HostDevice, LocalLink<Bytes>>;

    fn pair(recorder: &Arc<Recorder>) -> (Eng, Eng) {
        let root = Context::root();
        let mut links = mesh::<Bytes>(2, HeldLimit::default()).into_iter();
        let mk = |r: u32, l| {
            Engine::new(
                Rank(r),
                2,
                l,
                Arc::new(HostDevice),
                &root,
                EngineConfig::default(),
            )
            .unwrap()
        };
        let a = mk(0, links.next().unwrap()).with_observer(recorder.clone());
        let b = mk(1, links.next().unwrap());
        (a, b)
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{what} never happened"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_coarse_clock_keeps_to_the_process_clock() {
        let mut last = coarse_now();
        for _ in 0..1000 {
            let stamp = coarse_now();
            assert!(stamp >= last, "the stamps never go back");
            let fine = Instant::now();
            let apart = stamp
                .saturating_duration_since(fine)
                .max(fine.saturating_duration_since(stamp));
            assert!(
                apart < Duration::from_millis(100),
                "a stamp is within a tick of the process clock, not {apart:?}"
            );
            last = stamp;
        }
        thread::sleep(Duration::from_millis(50));
        assert!(
            coarse_now() >= last + Duration::from_millis(20),
            "the stamps advance with time"
        );
    }

    #[test]
    fn names_the_peer_a_blocked_operation_waits_on_and_times_it_out() {
        let recorder = Arc::new(Recorder::new(8));
        let (a, _silent) = pair(&recorder);
        thread::scope(|s| {
            let h = s.spawn(|| {
                let mut buf = [0u8; 64];
                block_on(a.all_reduce(
                    Buffer::InPlace(&mut buf[..]),
                    16,
                    DType::F32,
                    Reduction::Sum,
                ))
            });
            wait_until("blocking on r1", || recorder.waiting_on() == Some(Rank(1)));
            let records = recorder.records(10, Instant::now());
            assert_eq!(records.len(), 1);
            assert_eq!(records[0].collective, Collective::AllReduce.code());
            assert_eq!(records[0].state, OpState::Running);
            assert_eq!(records[0].waiting_on, Some(Rank(1)));
            assert!(recorder.next_deadline(Duration::from_secs(60)).is_some());
            // A timeout past the clock's range is no deadline, not a panic.
            assert_eq!(recorder.next_deadline(Duration::MAX), None);
            // Not overdue yet under a long timeout; overdue under a zero one.
            assert_eq!(
                recorder.abort_overdue(Instant::now(), Duration::from_secs(60)),
                0
            );
            assert_eq!(recorder.abort_overdue(Instant::now(), Duration::ZERO), 1);
            let err = h.join().unwrap().unwrap_err();
            let reason = err
                .abort_reason()
                .expect("aborted by the watchdog")
                .to_string();
            assert!(reason.contains("timed out"), "{reason}");
            assert!(reason.contains("on r1"), "names the awaited peer: {reason}");
        });
        let records = recorder.records(10, Instant::now());
        assert_eq!(records[0].state, OpState::Aborted);
        assert_eq!(recorder.waiting_on(), None);
        assert!(recorder.running().is_empty());
        assert_eq!(recorder.next_deadline(Duration::ZERO), None);
    }

    #[test]
    fn keeps_a_bounded_history() {
        let recorder = Arc::new(Recorder::new(3));
        let (a, b) = pair(&recorder);
        for _ in 0..10 {
            thread::scope(|s| {
                s.spawn(|| block_on(b.barrier()).unwrap());
                block_on(a.barrier()).unwrap();
            });
        }
        let records = recorder.records(100, Instant::now());
        assert_eq!(records.len(), 3, "only the newest finished operations stay");
        assert!(records.iter().all(|r| r.state == OpState::Done));
        assert!(
            records.windows(2).all(|w| w[0].seq < w[1].seq),
            "oldest first"
        );
        assert_eq!(recorder.records(1, Instant::now()).len(), 1);
    }

    #[test]
    fn a_running_operation_outlives_any_number_of_finished_ones() {
        let recorder = Arc::new(Recorder::new(3));
        let (a, b) = pair(&recorder);
        let (slow_a, slow_b) = pair(&recorder);
        thread::scope(|s| {
            // Started first, finished last: rank 1 of the second pair joins at the end.
            let blocked = s.spawn(|| block_on(slow_a.barrier()));
            let deadline = Instant::now() + Duration::from_secs(10);
            while recorder.running().is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "the blocked barrier never started"
                );
                thread::yield_now();
            }
            for _ in 0..10 {
                thread::scope(|s| {
                    s.spawn(|| block_on(b.barrier()).unwrap());
                    block_on(a.barrier()).unwrap();
                });
            }
            let records = recorder.records(100, Instant::now());
            assert_eq!(
                records.len(),
                4,
                "the running one and the newest 3 finished"
            );
            assert_eq!(records[0].state, OpState::Running);
            assert!(records[1..].iter().all(|r| r.state == OpState::Done));
            block_on(slow_b.barrier()).unwrap();
            blocked.join().unwrap().unwrap();
        });
        let records = recorder.records(100, Instant::now());
        assert_eq!(
            records.len(),
            3,
            "once it finished, it is trimmed like the rest"
        );
        assert!(records.iter().all(|r| r.state == OpState::Done));
    }
}
