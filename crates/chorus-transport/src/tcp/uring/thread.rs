//! The ring's progress thread: its loop (commands in, submissions out, completions reaped,
//! then a spin or a sleep in the kernel) and the bookkeeping of what is in flight. Sends are
//! in `send.rs`, the close in `close.rs`.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use io_uring::types::{CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{IoUring, cqueue, opcode, squeue};
use parking_lot::Mutex;

use super::send::Sending;
use super::slots::Slots;
use super::{Cmd, NewConn, STOP_BUDGET, Shared};
use crate::inbound;
use crate::matcher::Matcher;
use crate::outbound::Outbound;
use crate::tcp::reader::{Pumped, Reader};
use crate::tcp::teardown::Teardown;

/// An operation in flight, keyed by its `user_data`.
pub(super) enum Op {
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

/// A connection as the ring thread holds it.
pub(super) struct Conn {
    pub(super) fd: Arc<OwnedFd>,
    /// Payloads at least this large go out with SEND_ZC.
    pub(super) zc_threshold: usize,
    pub(super) matcher: Arc<Matcher>,
    pub(super) outbound: Arc<Mutex<Outbound>>,
    /// The receiving half, shared with the link's callers.
    pub(super) reader: Arc<Reader>,
    /// The input poll in flight, if the ring is watching the socket.
    pub(super) poll: Option<u64>,
    pub(super) cur: Option<Sending>,
    pub(super) send: Option<u64>,
    /// Operations naming this connection that have not retired; the descriptor and the
    /// buffers stay until this is zero.
    pub(super) inflight: u32,
    /// The close sequence, once the close has begun.
    pub(super) closing: Option<Teardown<Instant>>,
}

/// What the ring's progress thread owns: the ring, the slots and every buffer an operation
/// in flight names, the connections and the operation table.
pub(super) struct RingThread {
    pub(super) ring: IoUring,
    pub(super) slots: Slots,
    pub(super) rx: mpsc::Receiver<Cmd>,
    pub(super) shared: Arc<Shared>,
    pub(super) wake_fd: RawFd,
    pub(super) wake_buf: Box<[u8; 8]>,
    pub(super) conns: HashMap<u64, Conn>,
    pub(super) ops: HashMap<u64, Op>,
    pub(super) next_op: u64,
    pub(super) depart_timeout: Duration,
    pub(super) busy_poll: Duration,
    pub(super) stopping: Option<Instant>,
}

impl RingThread {
    pub(super) fn run(mut self) {
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
            .filter_map(|c| c.closing.as_ref().and_then(Teardown::deadline))
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

    /// Queues an entry whose buffers the ring thread owns until its completion.
    pub(super) fn push(&mut self, entry: squeue::Entry, op: Op) -> u64 {
        let ud = self.next_op;
        self.next_op += 1;
        let entry = entry.user_data(ud);
        for _ in 0..3 {
            // SAFETY: every buffer `entry` names is owned by the ring thread — the slot pool,
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
}

pub(super) fn op_conn(op: &Op) -> Option<u64> {
    match op {
        Op::Poll { conn } | Op::Send { conn } | Op::SendZc { conn, .. } => Some(*conn),
        Op::Wake | Op::Cancel => None,
    }
}
