//! The submission thread: one per communicator, running the operations queued to it one
//! after another in the order they were submitted, as a CUDA stream runs NCCL's, so an
//! operation submitted later never overtakes one submitted earlier (ranks must issue
//! collectives in the same order), whichever `Work` the caller waits on first.
//!
//! A blocking call made while nothing is queued or running skips the queue and runs on its
//! caller's thread instead ([`Queue::inline`]); [`Order`] is what keeps both paths in
//! call order.

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
pub(crate) struct Job {
    pub(crate) specs: Vec<Spec>,
    pub(crate) group: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) done: Arc<Done>,
    /// The Python objects that own the memory `specs` name, held until the operation has
    /// finished whatever happens to the `Work` (dropped here without the GIL, the
    /// reference count falls the next time the interpreter runs).
    pub(crate) keep: Py<PyAny>,
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
struct Lane {
    order: Mutex<Order>,
    turn: Condvar,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, Order> {
        // Every critical section is a counter update: a poisoned lock is still consistent.
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }
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

    /// Accepts no more jobs: the thread runs what is queued, then exits.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Runs one job once no inline call holds the turn.
fn run(comm: &Comm, lane: &Lane, job: Job) {
    let Job {
        specs,
        group,
        timeout,
        done,
        keep,
    } = job;
    {
        let mut order = lane.lock();
        // Bounded: the inline call holding the turn is a chorus operation, which ends by
        // the operation timeout, failure detection or an abort.
        while !order.may_start() {
            order = lane.turn.wait(order).unwrap_or_else(|e| e.into_inner());
        }
    }
    // SAFETY: `keep` holds the objects owning the memory of every spec until after the
    // operation has finished (it is dropped below); `op::parse` checked the overlaps.
    let result = unsafe { Running::start(comm, &specs, group, timeout) }.finish();
    // Only now may the memory go.
    drop(specs);
    drop(keep);
    lane.lock().job_done();
    done.set(result);
}
