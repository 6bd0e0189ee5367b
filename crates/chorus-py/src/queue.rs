//! The submission thread: one per communicator, running the operations queued to it one
//! after another in the order they were submitted, as a CUDA stream runs NCCL's, so an
//! operation submitted later never overtakes one submitted earlier (ranks must issue
//! collectives in the same order), whichever `Work` the caller waits on first.
//!
//! A blocking call made while nothing is queued or running skips the queue and runs on its
//! caller's thread instead ([`Queue::inline`]); [`Order`] is what keeps both paths in
//! call order. A caller that waits for the one unfinished job before the submission thread
//! has started it takes it and runs it itself ([`Lane::steal`]): torch's blocking
//! collectives submit, then wait at once, and would otherwise pay two thread wake-ups.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::ThreadId;
use std::time::Duration;

use chorus::Comm;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::done::Done;
use crate::drive::Running;
use crate::op::Spec;
use crate::order::Order;
use crate::wait::Slot;

/// One submission: an operation or a group, and the objects owning its memory.
pub(crate) struct Payload {
    pub(crate) specs: Vec<Spec>,
    pub(crate) group: bool,
    pub(crate) timeout: Option<Duration>,
    /// The Python objects that own the memory `specs` name, held until the operation has
    /// finished whatever happens to the `Work` (dropped here without the GIL, the
    /// reference count falls the next time the interpreter runs).
    pub(crate) keep: Py<PyAny>,
}

/// A submission's payload until whoever runs it (the submission thread, or a waiter
/// through [`Lane::steal`]) takes it.
pub(crate) type Claim = Arc<Mutex<Option<Payload>>>;

/// What travels to the submission thread.
pub(crate) struct Job {
    pub(crate) claim: Claim,
    pub(crate) done: Arc<Done>,
}

/// The submission side of the thread.
pub(crate) struct Queue {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    lane: Arc<Lane>,
    thread: ThreadId,
    /// Set when the thread has run its last job and let go of the communicator.
    pub(crate) exited: Arc<Slot<()>>,
}

/// [`Order`] under a lock, with the condition the submission thread waits on.
pub(crate) struct Lane {
    order: Mutex<Order>,
    turn: Condvar,
    /// Jobs a waiter ran itself, for tests and benchmarks.
    stolen: AtomicU64,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, Order> {
        // Every critical section is a counter update: a poisoned lock is still consistent.
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The payload of the job `claim` belongs to, for a waiter to run on its own thread,
    /// when the submission thread has not taken it yet and it may run now (see
    /// [`Order::may_steal`]). The waiter then runs it and calls [`Lane::stolen_done`].
    pub(crate) fn steal(&self, claim: &Claim) -> Option<Payload> {
        let order = self.lock();
        if !order.may_steal() {
            return None;
        }
        let payload = take(claim);
        drop(order);
        if payload.is_some() {
            self.stolen.fetch_add(1, Ordering::Relaxed);
        }
        payload
    }

    /// A stolen job has finished: what [`run`] does after running one, but for the done
    /// callbacks, which the submission thread runs as for any job.
    pub(crate) fn stolen_done(&self, done: &Done, result: chorus::Result<()>) {
        self.lock().job_done();
        done.outcome.set(result);
    }
}

fn take(claim: &Claim) -> Option<Payload> {
    // A single take: a poisoned lock still holds a consistent value.
    claim.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The turn of a blocking call running on its caller's thread; given back on drop.
pub(crate) struct Inline<'a>(&'a Lane);

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        self.0.lock().inline_done();
        self.0.turn.notify_all();
    }
}

impl Queue {
    /// Starts the thread for `comm`.
    pub(crate) fn start(comm: Arc<Comm>) -> PyResult<Queue> {
        let (tx, rx) = mpsc::channel::<Job>();
        let exited = Slot::new();
        let lane = Arc::new(Lane {
            order: Mutex::new(Order::default()),
            turn: Condvar::new(),
            stolen: AtomicU64::new(0),
        });
        let (thread_exited, thread_lane) = (exited.clone(), lane.clone());
        let handle = std::thread::Builder::new()
            .name(format!("chorus-py-r{}", comm.rank()))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    run(&comm, &thread_lane, job);
                }
                drop(comm);
                thread_exited.set(());
            })
            .map_err(|e| {
                PyRuntimeError::new_err(format!("cannot start the submission thread: {e}"))
            })?;
        Ok(Queue {
            tx: Mutex::new(Some(tx)),
            lane,
            thread: handle.thread().id(),
            exited,
        })
    }

    /// Queues `job` behind everything submitted before it; gives it back if the queue is
    /// closed (the communicator was destroyed).
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else {
            return Err(job);
        };
        // Counted before it is sent, under the lane's lock: no blocking call can slip
        // inline between the two.
        let mut order = self.lane.lock();
        order.queued();
        tx.send(job).map_err(|e| {
            order.job_done();
            e.0
        })
    }

    /// The turn to run a blocking call on the caller's thread, if nothing submitted before
    /// is unfinished (see [`Order`]).
    pub(crate) fn inline(&self) -> Option<Inline<'_>> {
        // The guard goes before the turn exists: dropping a turn takes the lock.
        let granted = self.lane.lock().try_inline();
        granted.then(|| Inline(&self.lane))
    }

    /// Whether the caller is this queue's submission thread (a done callback): it must not
    /// wait for its own queue.
    pub(crate) fn is_own_thread(&self) -> bool {
        std::thread::current().id() == self.thread
    }

    /// The submission thread's id.
    pub(crate) fn thread(&self) -> ThreadId {
        self.thread
    }

    /// How many jobs waiters ran themselves.
    pub(crate) fn stolen(&self) -> u64 {
        self.lane.stolen.load(Ordering::Relaxed)
    }

    /// The order both paths keep (for a `Work` to steal its job).
    pub(crate) fn lane(&self) -> Arc<Lane> {
        self.lane.clone()
    }

    /// Accepts no more jobs: the thread runs what is queued, then exits.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Runs one job once no inline call holds the turn, unless a waiter took it.
fn run(comm: &Comm, lane: &Lane, job: Job) {
    let Job { claim, done } = job;
    {
        let mut order = lane.lock();
        // Bounded: the inline call holding the turn is a chorus operation, which ends by
        // the operation timeout, failure detection or an abort.
        while !order.may_start() {
            order = lane.turn.wait(order).unwrap_or_else(|e| e.into_inner());
        }
    }
    let Some(Payload {
        specs,
        group,
        timeout,
        keep,
    }) = take(&claim)
    else {
        // A waiter took it and runs it on its thread: the next job starts after it ends
        // and its callbacks have run here. Bounded as above: it is a chorus operation,
        // run to its end by that waiter.
        done.outcome.wait_until(None);
        done.run_callbacks();
        return;
    };
    // SAFETY: `keep` holds the objects owning the memory of every spec until after the
    // operation has finished (it is dropped below); `op::parse` checked the overlaps.
    let result = unsafe { Running::start(comm, &specs, group, timeout) }.finish();
    // Only now may the memory go.
    drop(specs);
    drop(keep);
    lane.lock().job_done();
    done.set(result);
}
