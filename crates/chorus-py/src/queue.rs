//! The submission thread: one per communicator, running its operations one after another
//! in the order they were submitted, as a CUDA stream runs NCCL's. Every collective goes
//! through it, blocking or not, so an operation submitted later never overtakes one
//! submitted earlier (ranks must issue collectives in the same order), whichever `Work`
//! the caller waits on first.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use chorus::Comm;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::op::Spec;
use crate::wait::Slot;

/// What a finished operation leaves for its `Work`.
pub(crate) type Outcome = Slot<Result<(), chorus::Error>>;

/// One submission: an operation or a group, and the objects owning its memory.
pub(crate) struct Job {
    pub(crate) specs: Vec<Spec>,
    pub(crate) group: bool,
    pub(crate) done: Arc<Outcome>,
    /// The Python objects that own the memory `specs` name, held until the operation has
    /// finished whatever happens to the `Work` (dropped here without the GIL, the
    /// reference count falls the next time the interpreter runs).
    pub(crate) keep: Py<PyAny>,
}

/// The submission side of the thread.
pub(crate) struct Queue {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    /// Set when the thread has run its last job and let go of the communicator.
    pub(crate) exited: Arc<Slot<()>>,
}

impl Queue {
    /// Starts the thread for `comm`.
    pub(crate) fn start(comm: Arc<Comm>) -> PyResult<Queue> {
        let (tx, rx) = mpsc::channel::<Job>();
        let exited = Slot::new();
        let done = exited.clone();
        std::thread::Builder::new()
            .name(format!("chorus-py-r{}", comm.rank()))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let Job {
                        specs,
                        group,
                        done,
                        keep,
                    } = job;
                    done.set(run(&comm, &specs, group));
                    // Only now may the memory go.
                    drop(specs);
                    drop(keep);
                }
                drop(comm);
                done.set(());
            })
            .map_err(|e| {
                PyRuntimeError::new_err(format!("cannot start the submission thread: {e}"))
            })?;
        Ok(Queue {
            tx: Mutex::new(Some(tx)),
            exited,
        })
    }

    /// Queues `job` behind everything submitted before it; gives it back if the queue is
    /// closed (the communicator was destroyed).
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Accepts no more jobs: the thread runs what is queued, then exits.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

fn run(comm: &Comm, specs: &[Spec], group: bool) -> Result<(), chorus::Error> {
    // SAFETY: the job's `keep` holds the objects owning the memory of every spec until
    // after this returns (the loop above drops it last); `op::parse` checked that no
    // written range overlaps another.
    let mut ops: Vec<_> = specs.iter().map(|s| unsafe { s.op() }).collect();
    if group {
        comm.blocking().group(ops)
    } else {
        match ops.pop() {
            Some(op) if ops.is_empty() => comm.blocking().run(op),
            _ => comm.blocking().group(ops),
        }
    }
}
