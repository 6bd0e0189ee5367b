//! Waits the interpreter can interrupt: the GIL released, in slices of at most 20 ms, with
//! Python's signal handlers run between slices, so Ctrl-C during a blocked call raises
//! `KeyboardInterrupt` well within 100 ms. A slice ends early when what it waits for is
//! there, so the slices cost nothing on the way to a result.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::drive::Running;

/// The longest the GIL stays released between two signal checks.
const SLICE: Duration = Duration::from_millis(20);

/// A value one thread sets once and others wait for.
pub(crate) struct Slot<T> {
    value: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Slot {
            value: Mutex::new(None),
            ready: Condvar::new(),
        })
    }

    /// Sets the value (the first one wins) and wakes every waiter.
    pub(crate) fn set(&self, value: T) {
        let mut slot = self.lock();
        if slot.is_none() {
            *slot = Some(value);
        }
        self.ready.notify_all();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.lock().is_some()
    }

    /// Reads the value, if set.
    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        f(self.lock().as_ref())
    }

    pub(crate) fn take(&self) -> Option<T> {
        self.lock().take()
    }

    /// Blocks until the value is set or `until` passes (`None`: until it is set); true
    /// when set.
    pub(crate) fn wait_until(&self, until: impl Into<Option<Instant>>) -> bool {
        let until = until.into();
        let mut slot = self.lock();
        while slot.is_none() {
            slot = match until {
                None => self.ready.wait(slot).unwrap_or_else(|e| e.into_inner()),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        return false;
                    }
                    match self.ready.wait_timeout(slot, until - now) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            };
        }
        true
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        // Every critical section is a single store or read: a poisoned lock still holds a
        // consistent value.
        self.value.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Waits for `slot` for at most `timeout` (`None`: until it is set) with the GIL released.
/// A signal handler that raises (Ctrl-C's `KeyboardInterrupt`) ends the wait: `interrupted`
/// runs (it aborts the operation) and the handler's exception is returned. Ok(false) when
/// the timeout passed first.
pub(crate) fn wait<T: Send>(
    py: Python<'_>,
    slot: &Slot<T>,
    timeout: Option<Duration>,
    interrupted: impl FnOnce(),
) -> PyResult<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let now = Instant::now();
        let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
        if py.detach(|| slot.wait_until(until)) {
            return Ok(true);
        }
        if let Err(e) = py.check_signals() {
            interrupted();
            return Err(e);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
    }
}

/// Runs `running` to its end on this thread with the GIL released, as [`wait`] waits. A
/// signal handler that raises ends the call: `interrupted` runs (it aborts the
/// communicator, so the operation ends at once), the operation is still run to its end
/// (it uses the caller's memory), and the handler's exception is returned.
pub(crate) fn run(
    py: Python<'_>,
    mut running: Running<'_>,
    interrupted: impl FnOnce(),
) -> PyResult<chorus::Result<()>> {
    loop {
        if let Some(result) = py.detach(|| running.slice(SLICE)) {
            return Ok(result);
        }
        if let Err(e) = py.check_signals() {
            interrupted();
            py.detach(|| drop(running.finish()));
            return Err(e);
        }
    }
}

/// Runs `f` (a bounded chorus call) on its own thread and waits for it as [`wait`] does.
/// If interrupted, `f` still finishes on its thread and its result is dropped there.
pub(crate) fn call<T: Send + 'static>(
    py: Python<'_>,
    interrupted: impl FnOnce(),
    f: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let slot = Slot::new();
    let filled = slot.clone();
    std::thread::Builder::new()
        .name("chorus-py-call".into())
        .spawn(move || filled.set(f()))
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    wait(py, &slot, None, interrupted)?;
    slot.take()
        .ok_or_else(|| PyRuntimeError::new_err("[chorus:internal] a finished call left no result"))
}

/// `seconds` as a duration: a finite, non-negative number of seconds.
pub(crate) fn seconds(name: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "{name}: expected a non-negative number of seconds, got {seconds}"
        ))
    })
}
