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

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_protocol::message::Depart;
use io_uring::types::{CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use parking_lot::Mutex;

use super::reader::{Pumped, Reader};
use super::socket;
use crate::config::TransportConfig;
use crate::inbound;
use crate::matcher::Matcher;
use crate::outbound::{self, OutFrame, Outbound};

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
        let driver = Driver {
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
        let thread = thread::Builder::new()
            .name("chorus-uring".into())
            .spawn(move || {
                driver.run();
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

/// The registered buffer pool.
struct Slots {
    mem: Box<[u8]>,
    size: usize,
    free: Vec<u16>,
}

impl Slots {
    fn new(ring: &IoUring, size: usize, count: u16) -> Slots {
        let size = size.clamp(4096, 1 << 30);
        let mut mem = vec![0u8; size * count as usize].into_boxed_slice();
        let iovecs: Vec<libc::iovec> = mem
            .chunks_exact_mut(size)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr().cast(),
                iov_len: c.len(),
            })
            .collect();
        // SAFETY: the iovecs point into `mem`, which lives in the driver next to the ring
        // and is freed only after the ring (see `Driver::run`'s teardown).
        let registered = !iovecs.is_empty()
            && match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("io_uring buffer registration refused ({e}); using plain ops");
                    false
                }
            };
        let free = if registered {
            (0..count).rev().collect()
        } else {
            Vec::new()
        };
        Slots { mem, size, free }
    }

    fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    fn give(&mut self, slot: u16) {
        self.free.push(slot);
    }

    fn ptr(&mut self, slot: u16) -> *mut u8 {
        self.mem[slot as usize * self.size..].as_mut_ptr()
    }
}

/// An operation in flight, keyed by its `user_data`.
enum Op {
    /// The eventfd read that wakes the ring for new commands.
    Wake,
    /// A one-shot readiness poll of the connection's socket for input.
    Poll { conn: u64 },
    /// A send of the connection's current frame, from a registered slot or its own buffers.
    Send { conn: u64 },
    /// A zero-copy send of `keep`'s bytes; retired after the result and every notification.
    SendZc {
        conn: u64,
        keep: Bytes,
        result_seen: bool,
        notifs: u32,
    },
    /// An `ASYNC_CANCEL`; its own completion carries nothing we need.
    Cancel,
}

struct Conn {
    fd: Arc<OwnedFd>,
    /// Payloads at least this large go out with SEND_ZC.
    zc_threshold: usize,
    matcher: Arc<Matcher>,
    outbound: Arc<Mutex<Outbound>>,
    /// The receiving half, shared with the link's callers.
    reader: Arc<Reader>,
    /// The input poll in flight, if the ring is watching the socket.
    poll: Option<u64>,
    cur: Option<Sending>,
    send: Option<u64>,
    /// Operations naming this connection that have not retired; the descriptor and the
    /// buffers stay until this is zero.
    inflight: u32,
    closing: Option<Closing>,
}

struct Sending {
    frame: OutFrame,
    /// The rest of the frame was copied into this registered slot when the frame's offset
    /// was the second field.
    slot: Option<(u16, usize)>,
    depart: bool,
}

struct Closing {
    /// When the departure (and the frame before it) must be out, or the connection is
    /// shut regardless.
    deadline: Instant,
    shut: bool,
}

struct Driver {
    ring: IoUring,
    slots: Slots,
    rx: mpsc::Receiver<Cmd>,
    shared: Arc<Shared>,
    wake_fd: RawFd,
    wake_buf: Box<[u8; 8]>,
    conns: HashMap<u64, Conn>,
    ops: HashMap<u64, Op>,
    next_op: u64,
    depart_timeout: Duration,
    busy_poll: Duration,
    stopping: Option<Instant>,
}

impl Driver {
    fn run(mut self) {
        self.arm_wake();
        loop {
            while let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
            }
            self.tick();
            if let Some(since) = self.stopping {
                if self.ops.is_empty() {
                    break;
                }
                if since.elapsed() > STOP_BUDGET {
                    tracing::error!(
                        ops = self.ops.len(),
                        "io_uring operations still in flight at stop; leaking the ring"
                    );
                    // SAFETY-relevant: the kernel may still write into buffers these
                    // operations name; leaking keeps that memory valid forever.
                    std::mem::forget(self);
                    return;
                }
            }
            if self.spin() {
                self.reap();
                continue;
            }
            self.shared.sleeping.store(true, Ordering::SeqCst);
            match self.rx.try_recv() {
                Ok(cmd) => {
                    self.shared.sleeping.store(false, Ordering::SeqCst);
                    self.command(cmd);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) if self.stopping.is_none() => {
                    // Every handle is gone without a Stop: stop anyway.
                    self.command(Cmd::Stop);
                }
                Err(_) => {}
            }
            self.wait();
            self.shared.sleeping.store(false, Ordering::SeqCst);
            self.reap();
        }
        // No operation is in flight: dropping the ring, then the slots (field order), is
        // sound.
    }

    /// Spins on the completion queue (and the command channel) for up to `busy_poll`;
    /// true if something arrived. Submits first, so what was queued is in flight.
    fn spin(&mut self) -> bool {
        if self.busy_poll.is_zero() || self.stopping.is_some() {
            return false;
        }
        if !self.ring.submission().is_empty()
            && let Err(e) = self.ring.submit()
        {
            tracing::warn!("io_uring submit: {e}");
            return false;
        }
        let until = Instant::now() + self.busy_poll;
        loop {
            if !self.ring.completion().is_empty() {
                return true;
            }
            if let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    fn wait(&mut self) {
        let timeout = self
            .conns
            .values()
            .filter_map(|c| c.closing.as_ref().filter(|c| !c.shut).map(|c| c.deadline))
            .chain(self.stopping.map(|s| s + STOP_BUDGET))
            .min()
            .map(|d| {
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            });
        let result = match timeout {
            Some(t) => {
                let ts = Timespec::from(t);
                let args = SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        if let Err(e) = result {
            match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) => {}
                _ => tracing::error!("io_uring_enter: {e}"),
            }
        }
    }

    fn reap(&mut self) {
        let done: Vec<(u64, i32, u32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result(), c.flags()))
            .collect();
        for (ud, res, flags) in done {
            self.complete(ud, res, flags);
        }
    }

    /// Queues an entry whose buffers the driver owns until its completion.
    fn push(&mut self, entry: squeue::Entry, op: Op) -> u64 {
        let ud = self.next_op;
        self.next_op += 1;
        let entry = entry.user_data(ud);
        for _ in 0..3 {
            // SAFETY: every buffer `entry` names is owned by the driver — the slot pool,
            // the wake buffer, a connection (kept until its `inflight` count is zero), or
            // the `Bytes` kept in `op` — and so outlives the operation.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                if let Some(conn) = op_conn(&op)
                    && let Some(c) = self.conns.get_mut(&conn)
                {
                    c.inflight += 1;
                }
                self.ops.insert(ud, op);
                return ud;
            }
            if let Err(e) = self.ring.submit() {
                tracing::warn!("io_uring submit while full: {e}");
            }
        }
        tracing::error!("io_uring submission queue stuck full; dropping an operation");
        0
    }

    fn arm_wake(&mut self) {
        if self.stopping.is_some() {
            return;
        }
        let e = opcode::Read::new(Fd(self.wake_fd), self.wake_buf.as_mut_ptr(), 8).build();
        self.push(e, Op::Wake);
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add(new) => {
                let NewConn {
                    id,
                    zc_threshold,
                    fd,
                    reader,
                    matcher,
                    outbound,
                } = *new;
                self.conns.insert(
                    id,
                    Conn {
                        fd,
                        zc_threshold,
                        matcher,
                        outbound,
                        reader,
                        poll: None,
                        cur: None,
                        send: None,
                        inflight: 0,
                        closing: None,
                    },
                );
                if self.stopping.is_some() {
                    self.request_close(id, None);
                    return;
                }
                // Bytes read past the handshake may already hold whole frames; then watch
                // until the first reading, so an early departure is seen.
                if let Some(c) = self.conns.get(&id) {
                    match c.reader.decode_buffered() {
                        Pumped::Close(depart) => self.request_close(id, depart),
                        Pumped::Drained | Pumped::More | Pumped::Busy => self.arm_poll(id),
                    }
                }
                self.kick(id);
            }
            Cmd::Kick { conn } => self.kick(conn),
            Cmd::Watch { conn } => self.arm_poll(conn),
            Cmd::Stop => {
                if self.stopping.is_none() {
                    self.stopping = Some(Instant::now());
                    let ids: Vec<u64> = self.conns.keys().copied().collect();
                    for id in ids {
                        self.request_close(id, None);
                    }
                    let wakes: Vec<u64> = self
                        .ops
                        .iter()
                        .filter(|(_, op)| matches!(op, Op::Wake))
                        .map(|(ud, _)| *ud)
                        .collect();
                    for ud in wakes {
                        let e = opcode::AsyncCancel2::new(CancelBuilder::user_data(ud)).build();
                        self.push(e, Op::Cancel);
                    }
                }
            }
        }
    }

    /// The link queued frames or requested a close.
    fn kick(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let link_closing = c.outbound.lock().is_closing();
        if c.closing.is_some() {
            self.advance_close(id);
        } else if link_closing {
            self.begin_close(id);
        } else {
            self.pump_send(id);
        }
    }

    /// Enforces departure deadlines: a connection whose departure could not be written in
    /// time is shut regardless (the bound in "best effort, bounded").
    fn tick(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.closing
                    .as_ref()
                    .is_some_and(|cl| !cl.shut && now >= cl.deadline)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.shut(id);
        }
    }

    fn complete(&mut self, ud: u64, res: i32, flags: u32) {
        let Some(op) = self.ops.remove(&ud) else {
            return;
        };
        match op {
            Op::Wake => self.arm_wake(),
            Op::Cancel => {}
            Op::Poll { conn } => {
                self.retire(conn);
                self.on_poll(conn, res);
            }
            Op::Send { conn } => {
                self.retire(conn);
                self.on_sent(conn, res);
            }
            Op::SendZc {
                conn,
                keep,
                mut result_seen,
                mut notifs,
            } => {
                if cqueue::notif(flags) {
                    notifs = notifs.saturating_sub(1);
                } else {
                    result_seen = true;
                    if cqueue::more(flags) {
                        notifs += 1;
                    }
                    self.on_sent(conn, res);
                }
                if result_seen && notifs == 0 {
                    self.retire(conn);
                } else {
                    // Still referenced by the kernel until the notification.
                    self.ops.insert(
                        ud,
                        Op::SendZc {
                            conn,
                            keep,
                            result_seen,
                            notifs,
                        },
                    );
                }
            }
        }
    }

    /// One operation naming `conn` has retired; reap the connection if it was the last.
    fn retire(&mut self, conn: u64) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.inflight = c.inflight.saturating_sub(1);
        }
        self.maybe_reap(conn);
    }

    /// The input poll fired (or failed): read what is there for the waiting `recv`s, and
    /// watch again only while one still waits.
    fn on_poll(&mut self, id: u64, res: i32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.poll = None;
        c.reader.set_watching(false);
        if c.closing.is_some() {
            return;
        }
        let reader = c.reader.clone();
        if res < 0 && res != -libc::ECANCELED {
            let detail = format!("poll: {}", io::Error::from_raw_os_error(-res));
            inbound::on_lost(reader.matcher(), detail);
            self.request_close(id, None);
            return;
        }
        match reader.pump() {
            Pumped::Close(depart) => self.request_close(id, depart),
            // After `More` the poll fires again at once if someone still waits.
            Pumped::Drained | Pumped::More | Pumped::Busy => {
                if reader.matcher().has_waiters() {
                    self.arm_poll(id);
                }
            }
        }
    }

    /// Watches the socket for input with a one-shot poll, unless one is in flight.
    fn arm_poll(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.poll.is_some() || c.closing.is_some() {
            return;
        }
        c.reader.set_watching(true);
        let e = opcode::PollAdd::new(Fd(c.fd.as_raw_fd()), libc::POLLIN as u32).build();
        let ud = self.push(e, Op::Poll { conn: id });
        if let Some(c) = self.conns.get_mut(&id) {
            c.poll = Some(ud);
        }
    }

    /// Starts the next send segment if none is in flight, taking the next queued frame
    /// when the current one is done. False if there was nothing to send.
    fn pump_send(&mut self, id: u64) -> bool {
        let slot_size = self.slots.size;
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let zc_threshold = c.zc_threshold;
        if c.send.is_some() {
            return true;
        }
        if c.closing.as_ref().is_some_and(|cl| cl.shut) {
            return false;
        }
        if c.cur.is_none() {
            let next = c.outbound.lock().pop();
            let Some(frame) = next else {
                return false;
            };
            c.cur = Some(Sending {
                frame,
                slot: None,
                depart: false,
            });
        }
        let fd = c.fd.as_raw_fd();
        let Some(cur) = c.cur.as_mut() else {
            return false;
        };
        let left = cur.frame.len() - cur.frame.off;
        if cur.slot.is_none()
            && left <= slot_size
            && let Some(slot) = self.slots.take()
        {
            let (head, payload) = cur.frame.rest();
            let ptr = self.slots.ptr(slot);
            // SAFETY: `ptr` starts a slot of `slot_size >= left` bytes that no other
            // operation uses (it was just taken from the free list).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr, left) };
            dst[..head.len()].copy_from_slice(head);
            dst[head.len()..].copy_from_slice(payload);
            cur.slot = Some((slot, cur.frame.off));
        }
        let flags = libc::MSG_NOSIGNAL;
        let (entry, op) = if let Some((slot, base)) = cur.slot {
            let ptr = self.slots.ptr(slot).wrapping_add(cur.frame.off - base);
            let e = opcode::Send::new(Fd(fd), ptr, left as u32)
                .flags(flags)
                .build();
            (e, Op::Send { conn: id })
        } else {
            let (head, payload) = cur.frame.rest();
            if !head.is_empty() {
                let more = if payload.is_empty() {
                    0
                } else {
                    libc::MSG_MORE
                };
                let e = opcode::Send::new(Fd(fd), head.as_ptr(), head.len() as u32)
                    .flags(flags | more)
                    .build();
                (e, Op::Send { conn: id })
            } else {
                let keep = cur
                    .frame
                    .payload
                    .slice(cur.frame.payload.len() - payload.len()..);
                let len = keep.len().min(1 << 30) as u32;
                if cur.frame.payload.len() >= zc_threshold {
                    let e = opcode::SendZc::new(Fd(fd), keep.as_ptr(), len)
                        .flags(flags)
                        .build();
                    let op = Op::SendZc {
                        conn: id,
                        keep,
                        result_seen: false,
                        notifs: 0,
                    };
                    (e, op)
                } else {
                    let e = opcode::Send::new(Fd(fd), keep.as_ptr(), len)
                        .flags(flags)
                        .build();
                    (e, Op::Send { conn: id })
                }
            }
        };
        let ud = self.push(entry, op);
        if let Some(c) = self.conns.get_mut(&id) {
            c.send = Some(ud);
        }
        true
    }

    fn on_sent(&mut self, id: u64, res: i32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.send = None;
        if c.closing.as_ref().is_some_and(|cl| cl.shut) {
            return;
        }
        if res < 0 {
            let detail = format!("send: {}", io::Error::from_raw_os_error(-res));
            c.reader.write_failed(detail);
            // The stream is broken mid-frame: no departure can follow.
            self.request_close(id, None);
            self.shut(id);
            return;
        }
        let Some(cur) = c.cur.as_mut() else { return };
        cur.frame.off += res as usize;
        if !cur.frame.is_done() {
            self.pump_send(id);
            return;
        }
        let Some(mut done) = c.cur.take() else { return };
        if let Some((slot, _)) = done.slot.take() {
            self.slots.give(slot);
        }
        let was_depart = done.depart;
        done.frame.release(&c.matcher);
        if was_depart {
            self.shut(id);
        } else if c.closing.is_some() {
            self.advance_close(id);
        } else {
            self.pump_send(id);
        }
    }

    /// Marks the link's stream closing (first request wins: its departure is the one
    /// sent) and starts the close here.
    fn request_close(&mut self, id: u64, depart: Option<Depart>) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        outbound::request_close(&c.outbound, &c.matcher, depart);
        self.begin_close(id);
    }

    fn begin_close(&mut self, id: u64) {
        let deadline = Instant::now() + self.depart_timeout;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.closing.is_some() {
            return;
        }
        c.closing = Some(Closing {
            deadline,
            shut: false,
        });
        if let Some(ud) = c.poll {
            let e = opcode::AsyncCancel2::new(CancelBuilder::user_data(ud)).build();
            self.push(e, Op::Cancel);
        }
        self.advance_close(id);
    }

    /// Moves a closing connection on: finish the frame on the wire, send the departure,
    /// then shut.
    fn advance_close(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(closing) = c.closing.as_ref() else {
            return;
        };
        if closing.shut || c.send.is_some() {
            return;
        }
        // A frame part-way out (ours, or one a caller started) is finished first, so the
        // departure lands on a frame boundary.
        if self.pump_send(id) {
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let depart = c.outbound.lock().departure();
        match depart {
            Some(frame) => {
                c.cur = Some(Sending {
                    frame,
                    slot: None,
                    depart: true,
                });
                self.pump_send(id);
            }
            None => self.shut(id),
        }
    }

    /// Principle 1: `shutdown(SHUT_RDWR)` reaches the peer whoever else holds the
    /// descriptor; then cancel whatever is still in flight and let go once it retires.
    fn shut(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.closing.as_mut() {
            Some(cl) if cl.shut => return,
            Some(cl) => cl.shut = true,
            None => {
                c.closing = Some(Closing {
                    deadline: Instant::now(),
                    shut: true,
                })
            }
        }
        socket::shutdown_of(&*c.fd);
        let fd = c.fd.as_raw_fd();
        if c.inflight > 0 {
            let e = opcode::AsyncCancel2::new(CancelBuilder::fd(Fd(fd)).all()).build();
            self.push(e, Op::Cancel);
        }
        self.maybe_reap(id);
    }

    fn maybe_reap(&mut self, id: u64) {
        let reap = self
            .conns
            .get(&id)
            .is_some_and(|c| c.inflight == 0 && c.closing.as_ref().is_some_and(|cl| cl.shut));
        if reap && let Some(mut c) = self.conns.remove(&id) {
            if let Some(mut cur) = c.cur.take() {
                if let Some((slot, _)) = cur.slot.take() {
                    self.slots.give(slot);
                }
                cur.frame.release(&c.matcher);
            }
            let _ = c.outbound.lock().close(None);
            loop {
                let Some(frame) = c.outbound.lock().pop() else {
                    break;
                };
                frame.release(&c.matcher);
            }
            inbound::on_lost(&c.matcher, "connection closed".into());
            tracing::trace!(fd = c.fd.as_raw_fd(), "io_uring connection closed");
        }
    }
}

fn op_conn(op: &Op) -> Option<u64> {
    match op {
        Op::Poll { conn } | Op::Send { conn } | Op::SendZc { conn, .. } => Some(*conn),
        Op::Wake | Op::Cancel => None,
    }
}

/// Whether this kernel lets us set up a ring (for tests that need one).
pub(crate) fn available() -> bool {
    IoUring::<squeue::Entry, cqueue::Entry>::new(4).is_ok()
}
