//! What a finished operation leaves for its `Work`: the outcome, which waiters block on,
//! and the callbacks to run once it is there (`Work.add_done_callback`, what torch's
//! `Work.get_future()` needs).

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;

use crate::wait::Slot;

/// The outcome of one submission and who to tell.
pub(crate) struct Done {
    pub(crate) outcome: Arc<Slot<chorus::Result<()>>>,
    /// `None` once the callbacks have run: a callback added later runs at once.
    callbacks: Mutex<Option<Vec<Py<PyAny>>>>,
}

impl Done {
    pub(crate) fn new() -> Arc<Done> {
        Arc::new(Done {
            outcome: Slot::new(),
            callbacks: Mutex::new(Some(Vec::new())),
        })
    }

    /// Records the outcome, wakes every waiter, then runs the callbacks (on this thread,
    /// holding the GIL).
    pub(crate) fn set(&self, result: chorus::Result<()>) {
        self.outcome.set(result);
        self.run_callbacks();
    }

    /// Runs the callbacks added so far (on this thread, holding the GIL); later ones run
    /// as they are added. For the submission thread once the outcome is there.
    pub(crate) fn run_callbacks(&self) {
        let callbacks = self.lock().take().unwrap_or_default();
        if callbacks.is_empty() {
            return;
        }
        // `None`: the interpreter is shutting down; nobody is left to tell.
        let _ = Python::try_attach(|py| {
            for cb in callbacks {
                run(py, &cb);
            }
        });
    }

    /// Runs `cb` once the outcome is there: now (on this thread) if it already is.
    pub(crate) fn add_callback(&self, py: Python<'_>, cb: Py<PyAny>) {
        let mut callbacks = self.lock();
        match callbacks.as_mut() {
            Some(list) => list.push(cb),
            None => {
                drop(callbacks);
                run(py, &cb);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Vec<Py<PyAny>>>> {
        // Every critical section is a single push or take: a poisoned lock still holds a
        // consistent list.
        self.callbacks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A callback that raises is reported through `sys.unraisablehook`, as asyncio reports
/// its callbacks' errors; the others still run.
fn run(py: Python<'_>, cb: &Py<PyAny>) {
    if let Err(e) = cb.call0(py) {
        e.write_unraisable(py, Some(cb.bind(py)));
    }
}
