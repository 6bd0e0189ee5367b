//! `Work`: the handle of a submitted operation (torch's `Work`, an NCCL stream's event).
//!
//! Dropping an unfinished `Work` neither cancels nor detaches anything unsafe: the
//! operation still runs to its end on the submission thread, which holds the buffers until
//! then, and later operations queue behind it as usual. Its outcome is simply not
//! observed (a failure still shows in `Comm.async_error()`).

use std::sync::{Arc, Weak};

use pyo3::prelude::*;

use crate::error;
use crate::queue::Outcome;
use crate::wait;

#[pyclass(frozen, module = "chorus._chorus")]
pub(crate) struct Work {
    pub(crate) done: Arc<Outcome>,
    /// The communicator to abort when Ctrl-C interrupts a wait (weak: a `Work` kept
    /// around must not keep the communicator alive).
    pub(crate) comm: Weak<chorus::Comm>,
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
        let comm = self.comm.clone();
        let finished = wait::wait(py, &self.done, timeout, move || interrupt(&comm))?;
        if !finished {
            return Ok(false);
        }
        self.done.with(|r| match r {
            Some(Err(e)) => Err(error::to_py(py, e)),
            _ => Ok(true),
        })
    }

    /// True once the operation has finished (succeeded or failed).
    fn is_completed(&self) -> bool {
        self.done.is_set()
    }

    /// The operation's error once it has failed; None while running or after success.
    fn exception<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.done.with(|r| match r {
            Some(Err(e)) => Some(error::instance(py, e)),
            _ => None,
        })
    }
}

/// Ctrl-C during a wait: abort the communicator, which ends the operation (and every other
/// one on it) with `Aborted`; the communicator is unusable afterwards (shrink or destroy).
pub(crate) fn interrupt(comm: &Weak<chorus::Comm>) {
    if let Some(comm) = comm.upgrade() {
        comm.abort("interrupted: a signal handler raised (KeyboardInterrupt) during a wait");
    }
}
