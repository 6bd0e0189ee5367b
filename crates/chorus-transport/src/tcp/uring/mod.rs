//! The io_uring backend: one ring per progress thread, driven with the `io-uring` crate.
//!
//! Every buffer an in-flight submission points to is owned by the ring thread — the
//! registered slot pool, a connection's current frame, or a payload clone kept in the
//! operation table — never by a caller's future. Dropping a `send` or
//! `recv` future therefore cannot free memory the kernel is writing to: the future only
//! waits on the link's matcher. The ring's hold on a connection's descriptor ends only
//! after every operation that names it has completed; cancellation goes through
//! `IORING_OP_ASYNC_CANCEL` plus `shutdown(SHUT_RDWR)`, which makes those completions
//! prompt. If the ring is stopped with operations still in flight past a bounded wait, the
//! ring and every buffer are leaked rather than freed under the kernel.
//!
//! Receives are readiness-driven and shared with the link's callers (see `reader.rs`): a
//! `recv` reads the socket itself before it parks, and only then asks the ring to watch the
//! socket (a one-shot `POLL_ADD`). When the poll fires, the ring reads what is there with a
//! non-blocking `recv` straight into the decoder's buffer, and watches again only while
//! some `recv` still waits; so while callers keep up, arriving data never wakes this
//! thread. Sends: a caller that finds the stream idle writes its frame itself (see
//! `link.rs`); the ring writes what is queued behind it, small frames copied into a
//! registered slot, payloads at or above the zero-copy threshold with `SEND_ZC` from the
//! caller's own buffer, kept alive until the kernel's notification.
//!
//! Before it sleeps in the kernel, the ring thread spins on its completion queue for the
//! configured `busy_poll`, so a completion (a parked receive's poll) that lands within that
//! window skips the wake-up of a sleeping thread.
//!
//! This file is the callers' side (`Ring`, `UringConn`); the progress thread's loop is in
//! `thread.rs`, its registered buffers in `slots.rs`, its sends in `send.rs`, and its part
//! in a close, which [`super::teardown::Teardown`] decides, in `close.rs`.

mod close;
mod send;
mod slots;
mod thread;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{IoUring, cqueue, squeue};
use parking_lot::Mutex;

use self::slots::Slots;
use self::thread::RingThread;
use super::reader::Reader;
use super::socket;
use crate::config::TransportConfig;
use crate::inbound;
use crate::matcher::Matcher;
use crate::outbound::Outbound;

/// How long stopping a ring waits for in-flight operations before leaking them.
const STOP_BUDGET: Duration = Duration::from_secs(2);

/// A ring and its progress thread.
#[derive(Debug)]
pub(crate) struct Ring {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    done: parking_lot::Mutex<mpsc::Receiver<()>>,
}

/// What callers share with the ring thread.
#[derive(Debug)]
struct Shared {
    tx: mpsc::Sender<Cmd>,
    /// Set by the ring thread just before it blocks; a poster that swaps it back writes
    /// the eventfd, so a busy ring takes commands without a system call per command.
    sleeping: AtomicBool,
    wake: OwnedFd,
    next_conn: AtomicU64,
}

enum Cmd {
    Add(Box<NewConn>),
    /// The link queued frames or requested a close (its `Outbound` says which).
    Kick {
        conn: u64,
    },
    /// A `recv` is about to park: watch the socket and read for it.
    Watch {
        conn: u64,
    },
    Stop,
}

struct NewConn {
    id: u64,
    zc_threshold: usize,
    fd: Arc<OwnedFd>,
    reader: Arc<Reader>,
    matcher: Arc<Matcher>,
    outbound: Arc<Mutex<Outbound>>,
}

/// A link's handle on its connection inside the ring.
#[derive(Debug)]
pub(crate) struct UringConn {
    shared: Arc<Shared>,
    id: u64,
    /// Payloads from this size on go out with `SEND_ZC`.
    zc_threshold: usize,
    /// Shared with the ring: the descriptor closes when both are done with it, so a
    /// caller's direct write can never hit a descriptor number that was reused.
    fd: Arc<OwnedFd>,
}

impl UringConn {
    /// Wakes the ring for this connection's queued frames or close request.
    pub(crate) fn kick(&self) {
        let _ = self.shared.post(Cmd::Kick { conn: self.id });
    }

    pub(crate) fn zero_copy_from(&self) -> usize {
        self.zc_threshold
    }

    /// Asks the ring to watch the socket for a `recv` about to park.
    pub(crate) fn watch(&self) {
        let _ = self.shared.post(Cmd::Watch { conn: self.id });
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Shared {
    fn post(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.tx.send(cmd).map_err(|e| e.0)?;
        if self.sleeping.swap(false, Ordering::SeqCst) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: `wake` is an eventfd we own; writing 8 bytes from a live array is
            // the eventfd protocol. A failed write (counter saturated) still leaves it
            // readable, which is all we need.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        Ok(())
    }
}

impl Ring {
    /// Sets up a ring (reporting the kernel's refusal, e.g. seccomp or
    /// `io_uring_disabled`) and starts its progress thread.
    pub(crate) fn new(cfg: &TransportConfig) -> io::Result<Ring> {
        let ring: IoUring = IoUring::builder()
            .setup_cqsize(cfg.uring_entries.saturating_mul(4))
            .build(cfg.uring_entries)?;
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(raw) };
        let wake_fd = wake.as_raw_fd();
        let slots = Slots::new(&ring, cfg.uring_slot, cfg.uring_slots);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            tx,
            sleeping: AtomicBool::new(false),
            wake,
            next_conn: AtomicU64::new(1),
        });
        let (done_tx, done) = mpsc::channel();
        let ring_thread = RingThread {
            ring,
            slots,
            rx,
            shared: shared.clone(),
            wake_fd,
            wake_buf: Box::new([0; 8]),
            conns: HashMap::new(),
            ops: HashMap::new(),
            next_op: 1,
            depart_timeout: cfg.depart_timeout,
            busy_poll: cfg.busy_poll,
            stopping: None,
        };
        let thread = std::thread::Builder::new()
            .name("chorus-uring".into())
            .spawn(move || {
                ring_thread.run();
                let _ = done_tx.send(());
            })?;
        Ok(Ring {
            shared,
            thread: Some(thread),
            done: parking_lot::Mutex::new(done),
        })
    }

    /// Hands an established connection to the ring.
    pub(crate) fn attach(
        &self,
        fd: Arc<OwnedFd>,
        reader: Arc<Reader>,
        outbound: Arc<Mutex<Outbound>>,
        zc_threshold: usize,
    ) -> UringConn {
        let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let matcher = reader.matcher().clone();
        let new = Box::new(NewConn {
            id,
            zc_threshold,
            fd: fd.clone(),
            reader,
            matcher: matcher.clone(),
            outbound: outbound.clone(),
        });
        if let Err(Cmd::Add(new)) = self.shared.post(Cmd::Add(new)) {
            // The ring is gone: close the connection properly and fail the link.
            socket::shutdown_of(&*new.fd);
            inbound::on_lost(&matcher, "io_uring progress thread has stopped".into());
            let _ = outbound.lock().close(None);
        }
        UringConn {
            shared: self.shared.clone(),
            id,
            zc_threshold,
            fd,
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let _ = self.shared.post(Cmd::Stop);
        if self.done.lock().recv_timeout(STOP_BUDGET * 2).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        } else {
            tracing::warn!("io_uring progress thread did not stop in time; detached");
        }
    }
}

/// Whether this kernel lets us set up a ring (for tests that need one).
pub(crate) fn available() -> bool {
    IoUring::<squeue::Entry, cqueue::Entry>::new(4).is_ok()
}
