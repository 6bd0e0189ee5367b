//! Bounded waits on streams: record an event, poll it against a deadline.
//!
//! No call here ever blocks in the driver: `cuStreamSynchronize` on a stream holding a wait
//! for an absent peer would never return (seed 002), so completion is polled with
//! `cuEventQuery` — spinning for the first moments, where most waits end, then sleeping in
//! short steps so a finished stream is noticed within about 100 µs.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::CudaError;

/// Spin this long before sleeping between polls.
const SPIN: Duration = Duration::from_micros(200);
/// Longest sleep between polls.
const MAX_NAP: Duration = Duration::from_micros(100);

/// An event recorded on a stream now.
pub(crate) fn mark(stream: &CudaStream) -> Result<CudaEvent, CudaError> {
    stream
        .record_event(None)
        .map_err(|e| CudaError::driver("cuEventRecord", e))
}

/// Wait until every event has completed, or fail with a timeout naming `what`.
pub(crate) fn wait_all(
    events: &[CudaEvent],
    timeout: Duration,
    what: &str,
) -> Result<(), CudaError> {
    wait_all_unless(events, timeout, what, &|| false)
}

/// [`wait_all`], abandoned (with [`CudaError::Abandoned`]) as soon as `abandon` says so; it
/// is asked between polls, so it must be cheap (an atomic load).
pub(crate) fn wait_all_unless(
    events: &[CudaEvent],
    timeout: Duration,
    what: &str,
    abandon: &dyn Fn() -> bool,
) -> Result<(), CudaError> {
    let start = Instant::now();
    let mut done = vec![false; events.len()];
    let mut nap = Duration::from_micros(5);
    loop {
        for (e, d) in events.iter().zip(done.iter_mut()) {
            if !*d {
                *d = e
                    .try_is_complete()
                    .map_err(|err| CudaError::driver("cuEventQuery", err))?;
            }
        }
        if done.iter().all(|&d| d) {
            return Ok(());
        }
        if abandon() {
            return Err(CudaError::Abandoned {
                what: what.to_string(),
            });
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(CudaError::Timeout {
                what: what.to_string(),
                waited,
            });
        }
        if waited < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap.min(timeout.saturating_sub(waited)));
            nap = (nap * 2).min(MAX_NAP);
        }
    }
}

/// Wait for everything queued on `streams` so far.
pub(crate) fn drain(
    streams: &[&CudaStream],
    timeout: Duration,
    what: &str,
) -> Result<(), CudaError> {
    let events = streams
        .iter()
        .map(|s| mark(s))
        .collect::<Result<Vec<_>, _>>()?;
    wait_all(&events, timeout, what)
}
