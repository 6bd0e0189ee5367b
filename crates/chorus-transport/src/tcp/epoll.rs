//! The epoll backend: a reader task and a writer task per connection on the progress
//! thread's tokio runtime. Same semantics as the io_uring backend; the shared test suite
//! runs against both, and both carry out the close sequence that `teardown.rs` decides.
//!
//! The socket is registered with tokio's epoll for output only, so arriving data never
//! wakes the progress thread by itself. A `recv` reads the socket on its own thread before
//! it parks (see `reader.rs`); only a `recv` about to park asks the reader task to watch for
//! input, which it does through a duplicate descriptor registered for input (epoll reports
//! data already there at registration, so nothing is missed) and drops again once nobody
//! waits: the io_uring ring's one-shot poll, in epoll terms.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::reader::{Pumped, Reader};
use super::socket;
use super::teardown::{Action, Event, Teardown};
use crate::inbound;
use crate::matcher::Matcher;
use crate::outbound::{self, Next, OutFrame, Outbound};

/// The link's handle on its connection's tasks.
#[derive(Debug)]
pub(crate) struct EpollConn {
    fd: Arc<OwnedFd>,
    wake: Arc<Notify>,
    watch: Arc<Watch>,
}

/// Between callers and the reader task: requests to watch for input, and the end.
#[derive(Debug, Default)]
struct Watch {
    asked: Notify,
    /// One-way: the connection is shut; the reader task ends.
    ended: AtomicBool,
}

impl Watch {
    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.asked.notify_one();
    }

    fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

impl EpollConn {
    /// Starts the connection's tasks; call inside the progress runtime (`Handle::enter`).
    pub(crate) fn start(
        handle: &Handle,
        fd: Arc<OwnedFd>,
        reader: Arc<Reader>,
        outbound: Arc<Mutex<Outbound>>,
        depart_timeout: Duration,
    ) -> io::Result<Self> {
        let wake = Arc::new(Notify::new());
        let watch = Arc::new(Watch::default());
        // SAFETY: the `Arc<OwnedFd>` keeps the descriptor open, and it names the same socket,
        // for as long as the `AsyncFd` (the writer task) holds it.
        let out = unsafe { AsyncFd::register_with_interest(fd.clone(), Interest::WRITABLE) }?;
        let input = fd.try_clone()?;
        // Watch until the first reading, so an early departure is seen.
        reader.set_watching(true);
        handle.spawn(read_loop(
            input,
            reader.clone(),
            outbound.clone(),
            wake.clone(),
            watch.clone(),
        ));
        handle.spawn(write_loop(
            out,
            outbound,
            wake.clone(),
            watch.clone(),
            reader,
            depart_timeout,
        ));
        Ok(Self { fd, wake, watch })
    }

    /// Wakes the writer (frames queued or a close requested). `notify_one` stores a permit
    /// if the writer is not waiting yet, so no wake-up is lost.
    pub(crate) fn kick(&self) {
        self.wake.notify_one();
    }

    /// Asks the reader task to watch for input, for a `recv` about to park (a stored
    /// permit if the task is busy, so no request is lost).
    pub(crate) fn watch(&self) {
        self.watch.asked.notify_one();
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Requests the close (first request wins) and wakes the writer to carry it out.
fn close(
    outbound: &Mutex<Outbound>,
    matcher: &Matcher,
    wake: &Notify,
    depart: Option<chorus_protocol::message::Depart>,
) {
    if outbound::request_close(outbound, matcher, depart) {
        wake.notify_one();
    }
}

/// Watches for input while some `recv` waits (and once at the start), reading through the
/// shared [`Reader`]; between watches the input descriptor is not registered at all.
async fn read_loop(
    input: OwnedFd,
    reader: Arc<Reader>,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
    watch: Arc<Watch>,
) {
    let matcher = reader.matcher().clone();
    // Bytes read past the handshake may already hold whole frames.
    if let Pumped::Close(depart) = reader.decode_buffered() {
        close(&outbound, &matcher, &wake, depart);
        return;
    }
    let mut input = Some(input);
    let mut first = true;
    while !watch.is_ended() {
        if !first {
            watch.asked.notified().await;
            if watch.is_ended() {
                return;
            }
        }
        first = false;
        let Some(fd) = input.take() else { return };
        // SAFETY: the `AsyncFd` owns the `OwnedFd`, which stays open and names the same
        // socket until `into_inner` hands it back (or the `AsyncFd` is dropped).
        let registered = match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
            Ok(r) => r,
            Err(e) => {
                let e = io::Error::from(e);
                inbound::on_lost(&matcher, format!("watch input: {e}"));
                close(&outbound, &matcher, &wake, None);
                return;
            }
        };
        reader.set_watching(true);
        let pumped = watch_input(&registered, &reader, &watch).await;
        reader.set_watching(false);
        // Deregisters; the descriptor is kept for the next watch.
        input = Some(registered.into_inner());
        match pumped {
            Ok(Pumped::Close(depart)) => {
                close(&outbound, &matcher, &wake, depart);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                inbound::on_lost(&matcher, format!("read: {e}"));
                close(&outbound, &matcher, &wake, None);
                return;
            }
        }
    }
}

/// Reads whenever input is ready until nobody waits any more (`Drained`), the stream ends
/// (`Close`) or the connection is shut.
async fn watch_input(
    registered: &AsyncFd<OwnedFd>,
    reader: &Reader,
    watch: &Watch,
) -> io::Result<Pumped> {
    loop {
        let mut ready = tokio::select! {
            r = registered.readable() => r?,
            () = watch.asked.notified() => {
                // A request while watching is already served; an end request ends this.
                if watch.is_ended() {
                    return Ok(Pumped::Drained);
                }
                continue;
            }
        };
        // Stop watching before looking for waiters, so that a `recv` registering now
        // either is seen below or sees that it must ask again (see `Reader::wants_watch`).
        reader.set_watching(false);
        // `try_io` clears tokio's readiness only when the pass ends in `WouldBlock`, and
        // never a readiness a newer event set.
        // A pass that stopped after a large frame (`More`) keeps the readiness: the rest is
        // read on the next turn, if someone still waits.
        let pumped = ready.try_io(|_| match reader.pump() {
            Pumped::Drained | Pumped::Busy => Err(io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        if let Ok(Ok(Pumped::Close(depart))) = pumped {
            return Ok(Pumped::Close(depart));
        }
        if !reader.matcher().has_waiters() {
            return Ok(Pumped::Drained);
        }
        reader.set_watching(true);
    }
}

async fn write_loop(
    stream: AsyncFd<Arc<OwnedFd>>,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
    watch: Arc<Watch>,
    reader: Arc<Reader>,
    depart_timeout: Duration,
) {
    let matcher = reader.matcher().clone();
    // Begun when the writer first sees the close requested.
    let mut teardown: Option<Teardown<Instant>> = None;
    let event = loop {
        let next = outbound.lock().next();
        let mut frame = match next {
            Next::Frame(frame) => frame,
            Next::Wait => {
                wake.notified().await;
                continue;
            }
            Next::Close => break None,
        };
        let result = write_frame(
            &stream,
            &mut frame,
            &outbound,
            &wake,
            &mut teardown,
            depart_timeout,
        )
        .await;
        frame.release(&matcher);
        match result {
            Ok(()) => {}
            Err(Stop::Budget) => break Some(Event::Tick),
            Err(Stop::Io(e)) => {
                reader.write_failed(format!("write: {e}"));
                close(&outbound, &matcher, &wake, None);
                break Some(Event::WriteFailed);
            }
        }
    };
    // Frames queued behind a torn one are dropped with the link (credit returned).
    loop {
        let Some(frame) = outbound.lock().pop() else {
            break;
        };
        frame.release(&matcher);
    }
    let teardown = teardown.get_or_insert_with(|| Teardown::new(Instant::now(), depart_timeout));
    let depart = outbound.lock().departure();
    let event = event.unwrap_or(Event::Boundary {
        departure: depart.is_some(),
    });
    if teardown.handle(Instant::now(), event) == Action::Depart
        && let (Some(mut depart), Some(deadline)) = (depart, teardown.deadline())
    {
        let written = tokio::time::timeout_at(deadline, async {
            while !depart.is_done() {
                let n = write_some(&stream, &depart).await?;
                depart.off += n;
            }
            Ok::<_, io::Error>(())
        })
        .await;
        let event = match written {
            Ok(Ok(())) => Event::Departed,
            Ok(Err(_)) => Event::WriteFailed,
            Err(_) => Event::Tick,
        };
        if teardown.handle(Instant::now(), event) == Action::HalfClose {
            flush(stream.get_ref().as_fd(), teardown).await;
        }
    }
    // Principle 1: shutdown before close, so a forked duplicate cannot hide the close.
    socket::shutdown_of(stream.get_ref());
    // The reader task holds a duplicate descriptor; it ends now too.
    watch.end();
}

/// The teardown's flush: half-closes, then looks at what the peer has not acknowledged
/// when the teardown says, until it says shut (nothing left, or its deadline).
async fn flush(fd: BorrowedFd<'_>, teardown: &mut Teardown<Instant>) {
    socket::shutdown_write(fd);
    loop {
        let left = socket::unacknowledged(fd);
        if teardown.handle(Instant::now(), Event::Unacked(left)) != Action::Continue {
            return;
        }
        let Some(at) = teardown.deadline() else {
            return;
        };
        tokio::time::sleep_until(at).await;
    }
}

enum Stop {
    /// A close was requested and the frame did not finish by the teardown's deadline.
    Budget,
    Io(io::Error),
}

/// Writes the rest of `frame`. Once a close is requested, the teardown begins and the frame
/// gets until its deadline to finish (so the departure can start on a boundary) and no more.
async fn write_frame(
    stream: &AsyncFd<Arc<OwnedFd>>,
    frame: &mut OutFrame,
    outbound: &Mutex<Outbound>,
    wake: &Notify,
    teardown: &mut Option<Teardown<Instant>>,
    depart_timeout: Duration,
) -> Result<(), Stop> {
    while !frame.is_done() {
        if teardown.is_none() && outbound.lock().is_closing() {
            *teardown = Some(Teardown::new(Instant::now(), depart_timeout));
        }
        let n = match teardown.as_ref().and_then(Teardown::deadline) {
            Some(d) => match tokio::time::timeout_at(d, write_some(stream, frame)).await {
                Ok(r) => r.map_err(Stop::Io)?,
                Err(_) => return Err(Stop::Budget),
            },
            None => tokio::select! {
                r = write_some(stream, frame) => r.map_err(Stop::Io)?,
                // A wake-up may be a close request: re-check (queued frames wait anyway).
                () = wake.notified() => continue,
            },
        };
        frame.off += n;
    }
    Ok(())
}

/// One `sendmsg` of what is left of `frame` once the socket is writable.
async fn write_some(stream: &AsyncFd<Arc<OwnedFd>>, frame: &OutFrame) -> io::Result<usize> {
    let (head, payload) = frame.rest();
    stream
        .async_io(Interest::WRITABLE, |fd| {
            socket::send_vectored(fd.as_fd(), head, payload)
        })
        .await
}
