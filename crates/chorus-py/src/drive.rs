//! Running one submission (an operation or a group) to its end on the current thread, in
//! slices: the thread parks between polls until the operation's waker wakes it, as
//! `futures::executor::block_on` does, but gives control back at the end of each slice so
//! that its caller can run Python's signal handlers (the inline path) or simply go on (the
//! submission thread). Both paths share it, so a call's `timeout` means the same on both.
//!
//! A `timeout` that passes aborts the communicator, as torch's watchdog aborts an NCCL
//! communicator whose operation overran: an operation cannot be cancelled alone, since the
//! peers are inside it too. The operation then ends promptly and fails with `Timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use chorus::{Comm, ErrorKind};

use crate::op::Spec;

type OpFuture<'a> = Pin<Box<dyn Future<Output = chorus::Result<()>> + Send + 'a>>;

/// One submission in progress.
pub(crate) struct Running<'a> {
    comm: &'a Comm,
    fut: OpFuture<'a>,
    waker: Waker,
    /// The call's `timeout`, and when it passes.
    timeout: Option<(Duration, Instant)>,
    timed_out: bool,
}

impl<'a> Running<'a> {
    /// Starts `specs` (`group`: as one NCCL group) on `comm`.
    ///
    /// # Safety
    /// The memory the specs name must stay valid and otherwise untouched until the
    /// returned value is dropped (see [`Spec::op`]); `op::parse` has checked that no
    /// written range overlaps another.
    pub(crate) unsafe fn start(
        comm: &'a Comm,
        specs: &'a [Spec],
        group: bool,
        timeout: Option<Duration>,
    ) -> Self {
        // SAFETY: forwarded to this function's caller.
        let mut ops: Vec<_> = specs.iter().map(|s| unsafe { s.op() }).collect();
        let fut: OpFuture<'a> = match ops.pop() {
            Some(op) if ops.is_empty() && !group => Box::pin(comm.run(op)),
            Some(op) => {
                ops.push(op);
                Box::pin(comm.group(ops))
            }
            None => Box::pin(comm.group(ops)),
        };
        Running {
            comm,
            fut,
            waker: Waker::from(Arc::new(Unpark(std::thread::current()))),
            timeout: timeout.map(|t| (t, Instant::now().checked_add(t).unwrap_or_else(far))),
            timed_out: false,
        }
    }

    /// Polls for at most `slice` (on the thread that started it, whose waker it holds):
    /// the outcome once the submission has finished.
    pub(crate) fn slice(&mut self, slice: Duration) -> Option<chorus::Result<()>> {
        let now = Instant::now();
        let mut until = now.checked_add(slice).unwrap_or_else(far);
        if let Some((_, deadline)) = self.timeout.filter(|_| !self.timed_out) {
            until = until.min(deadline);
        }
        let mut cx = Context::from_waker(&self.waker);
        loop {
            if let Poll::Ready(result) = self.fut.as_mut().poll(&mut cx) {
                return Some(self.outcome(result));
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::park_timeout(until - now);
        }
        if let Some((timeout, deadline)) = self.timeout
            && !self.timed_out
            && Instant::now() >= deadline
        {
            self.timed_out = true;
            self.comm.abort(&format!(
                "operation timeout: no completion within {timeout:?} (the call's timeout)"
            ));
        }
        None
    }

    /// Polls until the submission has finished. It ends: the operation is bounded by the
    /// operation timeout and failure detection, and ends at once when aborted.
    pub(crate) fn finish(mut self) -> chorus::Result<()> {
        loop {
            if let Some(result) = self.slice(Duration::from_secs(1)) {
                return result;
            }
        }
    }

    fn outcome(&self, result: chorus::Result<()>) -> chorus::Result<()> {
        match (result, self.timeout) {
            (Err(mut e), Some((timeout, _))) if self.timed_out => {
                // The abort it failed with was this call's timeout; say so.
                e.kind = ErrorKind::Timeout;
                e.detail = format!(
                    "no completion within {timeout:?} (the call's timeout); \
                     the communicator was aborted"
                );
                Err(e)
            }
            (result, _) => result,
        }
    }
}

/// Wakes the thread that polls the operation.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// An instant no wait reaches (for deadlines past what `Instant` can hold).
fn far() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}
