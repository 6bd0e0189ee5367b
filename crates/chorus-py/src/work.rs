//! `Work`: the handle of a submitted operation (torch's `Work`, an NCCL stream's event).
//!
//! Dropping an unfinished `Work` neither cancels nor detaches anything unsafe: the
//! operation still runs to its end on the submission thread, which holds the buffers until
//! then, and later operations queue behind it as usual. Its outcome is simply not
//! observed (a failure still shows in `Comm.async_error()`).

use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::done::Done;
use crate::drive::Running;
use crate::error;
use crate::queue::{Claim, Lane, Payload};
use crate::wait;

#[pyclass(frozen, module = "chorus._chorus")]
pub(crate) struct Work {
    pub(crate) done: Arc<Done>,
    /// The communicator to abort when Ctrl-C interrupts a wait (weak: a `Work` kept
    /// around must not keep the communicator alive).
    pub(crate) comm: Weak<chorus::Comm>,
    /// The submission thread that runs it, which must never wait for its own queue.
    pub(crate) thread: ThreadId,
    /// How a waiter may run the operation itself (host operations; `None` on a device).
    pub(crate) steal: Option<Steal>,
}

/// What a waiter needs to take its operation from the queue and run it on its own thread,
/// saving the two thread wake-ups of a submit-then-wait (torch's blocking collectives):
/// allowed only while the submission thread has not started it and nothing is before it
/// ([`Lane::steal`]), and only for a wait long enough for the operation to end in it.
pub(crate) struct Steal {
    pub(crate) claim: Claim,
    pub(crate) lane: Arc<Lane>,
    pub(crate) op_timeout: Duration,
}

#[pymethods]
impl Work {
    /// Waits until the operation has finished, at most `timeout` seconds (`None`: as long
    /// as it takes, which is bounded by the operation timeout and failure detection).
    /// True when it finished, False when the timeout passed first; raises the operation's
    /// error if it failed. Ctrl-C aborts the communicator and raises `KeyboardInterrupt`.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout.map(|t| wait::seconds("timeout", t)).transpose()?;
        let outcome = &self.done.outcome;
        if !outcome.is_set() && std::thread::current().id() == self.thread {
            return Err(own_thread("wait"));
        }
        if !outcome.is_set()
            && timeout.is_none_or(|t| self.steal.as_ref().is_some_and(|s| t >= s.op_timeout))
        {
            self.run_here(py)?;
        }
        let comm = self.comm.clone();
        let finished = wait::wait(py, outcome, timeout, move || interrupt(&comm))?;
        if !finished {
            return Ok(false);
        }
        outcome.with(|r| match r {
            Some(Err(e)) => Err(error::to_py(py, e)),
            _ => Ok(true),
        })
    }

    /// True once the operation has finished (succeeded or failed).
    fn is_completed(&self) -> bool {
        self.done.outcome.is_set()
    }

    /// The operation's error once it has failed; None while running or after success.
    fn exception<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.done.outcome.with(|r| match r {
            Some(Err(e)) => Some(error::instance(py, e)),
            _ => None,
        })
    }

    /// Calls `callback()` once the operation has finished (succeeded or failed): at once
    /// on this thread if it already has, else on the communicator's submission thread.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) {
        self.done.add_callback(py, callback);
    }
}

impl Work {
    /// Runs the operation on this thread if it may be taken from the queue (see
    /// [`Steal`]); otherwise leaves it to the submission thread. Either way its outcome is
    /// in `done` once the operation has ended, except when Ctrl-C interrupted the run
    /// (the error returned; the outcome is then `Aborted`).
    fn run_here(&self, py: Python<'_>) -> PyResult<()> {
        let Some(steal) = &self.steal else {
            return Ok(());
        };
        let Some(comm) = self.comm.upgrade() else {
            return Ok(());
        };
        let Some(Payload {
            specs,
            group,
            timeout,
            keep,
        }) = steal.lane.steal(&steal.claim)
        else {
            return Ok(());
        };
        let weak = Arc::downgrade(&comm);
        // SAFETY: `keep` holds the objects owning the memory of every spec until after the
        // operation has finished (dropped below, after `running`); `op::parse` checked the
        // overlaps.
        let running = unsafe { Running::start(&comm, &specs, group, timeout) };
        let ran = wait::run(py, running, || interrupt(&weak));
        drop(specs);
        drop(keep);
        let (result, raised) = match ran {
            Ok(result) => (result, Ok(())),
            Err(e) => (
                Err(chorus::Error::new(
                    chorus::ErrorKind::Aborted,
                    "interrupted: a signal handler raised (KeyboardInterrupt) during a wait",
                )),
                Err(e),
            ),
        };
        steal.lane.stolen_done(&self.done, result);
        raised
    }
}

/// Ctrl-C during a wait: abort the communicator, which ends the operation (and every other
/// one on it) with `Aborted`; the communicator is unusable afterwards (shrink or destroy).
pub(crate) fn interrupt(comm: &Weak<chorus::Comm>) {
    if let Some(comm) = comm.upgrade() {
        comm.abort("interrupted: a signal handler raised (KeyboardInterrupt) during a wait");
    }
}

/// A blocking call from a done callback, which runs on the submission thread: the thread
/// would wait for itself.
pub(crate) fn own_thread(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{what}: called from a done callback, which runs on the communicator's submission \
         thread and would wait for itself (submit with async_op=True instead)"
    ))
}
