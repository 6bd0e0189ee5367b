//! `TcpLink`: the engine's `Link` over one authenticated TCP connection, on either backend.
//!
//! A `send` that finds the stream idle writes its frame on the caller's thread with one
//! non-blocking `sendmsg` (header and payload as two iovecs, the payload uncopied); only
//! what the socket does not take at once goes to the backend's writer. A `recv` that finds
//! nothing held reads the socket itself for a while (non-blocking `recv`s, the core yielded
//! between them; up to `recv_spin`, less while spins keep missing, see `spin.rs`), so a
//! message that arrives meanwhile reaches it without a thread hop; then it parks, and the
//! backend's progress thread reads for it and wakes it.
//!
//! Unlike the shm link, this one has no `recv_into`: payloads land in the decoder's buffer
//! and the engine copies or reduces them from there. Receiving a large payload's bytes
//! straight into the destination instead (the frame's head read alone, then the payload,
//! as `shm/reader.rs` places from its ring) took the user-space copies from about 10 % of
//! the CPU to 2 % at 2 MiB, yet measured slower (2026-12-05, loopback, medians of 4–5
//! interleaved rounds; placing copies and reductions / copies only): 2 ranks, 512 KiB
//! 122 µs against 130 / 127, 2 MiB 535 against 554 / 527; 4 ranks, 512 KiB 428 against
//! 570 / 549, 8 MiB 11.1 ms against 12.2 / 11.1. It made two to three times the `recv`
//! calls (one for each head, one for each arrival while the payload streams in), and a
//! pass that places holds the reader for the whole payload.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::message::Depart;
use chorus_protocol::{CloseCode, CommId, Envelope, Epoch, Rank};
use parking_lot::{Mutex, MutexGuard};

use super::BackendKind;
use super::epoll::EpollConn;
use super::reader::{Pumped, Reader};
use super::socket;
use super::uring::UringConn;
use crate::matcher::{Credit, Matcher};
use crate::outbound::{self, Outbound};
use crate::spin::{CROWDED_NAP, SpinBudget, a_core_is_free};

/// A spinning receive yields its core after this many passes over the socket (see
/// `TcpLink::spin`).
const YIELD_EVERY: u32 = 4;

/// Frames whose payload is below this are written on the caller's thread when the stream
/// is idle, whatever their size (the socket takes what fits, the writer the rest): each hop
/// through a progress thread costs a wake-up, and with the peer's buffers as large as ours a
/// chunk usually fits whole. Payloads at or above the link's zero-copy threshold go to the
/// io_uring writer, which can send them from the caller's pages (`SEND_ZC`).
fn direct(payload: usize, zero_copy_from: usize) -> bool {
    payload < zero_copy_from
}

/// A data link to one peer over TCP. Cancel it (or drop it) to leave: the peer sees a
/// departure frame, then a connection-level close that no forked child can hold open.
#[derive(Debug)]
pub struct TcpLink {
    pub(super) matcher: Arc<Matcher>,
    /// The receiving half, shared with the backend's progress thread.
    pub(super) reader: Arc<Reader>,
    pub(super) outbound: Arc<Mutex<Outbound>>,
    /// The peer's envelope (communicator, epoch, rank) as the handshake established it.
    pub(super) peer: Envelope,
    pub(super) io: Io,
    /// How long a `recv` reads the socket itself before it parks (at most `recv_spin`).
    pub(super) spin: SpinBudget,
}

#[derive(Debug)]
pub(super) enum Io {
    Epoll(EpollConn),
    Uring(UringConn),
}

impl Io {
    /// Wakes the writer: frames are queued, or a close was requested.
    fn kick(&self) {
        match self {
            Io::Epoll(c) => c.kick(),
            Io::Uring(c) => c.kick(),
        }
    }

    /// Payloads from this size on are sent zero-copy by the writer (never on epoll).
    fn zero_copy_from(&self) -> usize {
        match self {
            Io::Epoll(_) => usize::MAX,
            Io::Uring(c) => c.zero_copy_from(),
        }
    }

    /// Asks the progress thread to watch the socket for a `recv` about to park.
    fn watch(&self) {
        match self {
            Io::Epoll(c) => c.watch(),
            Io::Uring(c) => c.watch(),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Io::Epoll(c) => c.fd(),
            Io::Uring(c) => c.fd(),
        }
    }
}

impl TcpLink {
    /// Which backend carries this link.
    pub fn backend(&self) -> BackendKind {
        match self.io {
            Io::Epoll(_) => BackendKind::Epoll,
            Io::Uring(_) => BackendKind::Uring,
        }
    }

    /// The communicator and epoch this link serves.
    pub fn comm(&self) -> (CommId, Epoch) {
        (self.peer.comm, self.peer.epoch)
    }

    /// The link's terminal error, if it has failed (cancelled, peer departed, lost).
    pub fn failure(&self) -> Option<LinkError> {
        self.matcher.terminal()
    }

    /// Fails the link locally and asks the writer to depart and shut the connection; what
    /// `cancel` and `Drop` share. Only the first failure sends a departure.
    fn leave(&self, reason: CancelReason) {
        let depart = self
            .matcher
            .fail(LinkError::Cancelled(reason.clone()))
            .then(|| Depart::new(reason.code, reason.detail.to_string()));
        self.close(depart);
    }

    fn close(&self, depart: Option<Depart>) {
        if outbound::request_close(&self.outbound, &self.matcher, depart) {
            self.io.kick();
        }
    }

    /// What `recv` does: the held payload, else read the socket here for the spin window,
    /// else park until the progress thread delivers it.
    async fn recv_chunk(&self, tag: Tag) -> Result<Bytes, LinkError> {
        if let Some(result) = self.spin(&tag) {
            return result;
        }
        let mut waiting = match self.matcher.register(tag) {
            Ok(waiting) => waiting,
            Err(result) => return result,
        };
        // Bytes that landed after the last pass: take them now rather than through a
        // progress thread that may not be watching yet.
        self.read_socket();
        if let Some(result) = waiting.try_result() {
            return result;
        }
        if self.reader.wants_watch() {
            self.io.watch();
        }
        waiting.await
    }

    /// Reads the socket on this thread until `tag`'s payload (or the link's failure) is
    /// here or the spin window (see `spin.rs`) has passed; `None` then.
    ///
    /// Sleeping in `ppoll` on the socket instead (woken by the kernel, still with no
    /// progress thread) measured no better at 2 ranks or 4 on 2 cores, and slower at 2.
    fn spin(&self, tag: &Tag) -> Option<Result<Bytes, LinkError>> {
        if let Some(result) = self.matcher.take(tag) {
            return Some(result);
        }
        let window = self.spin.window();
        if window.is_zero() {
            return None;
        }
        let start = Instant::now();
        let mut crowded = false;
        let mut tries = 0u32;
        let result = loop {
            self.read_socket();
            if let Some(result) = self.matcher.take(tag) {
                self.spin.caught();
                break Some(result);
            }
            if start.elapsed() >= window {
                self.spin.missed();
                break None;
            }
            // On a machine with more runnable threads than cores, the peer that is to send
            // may be waiting for this core. A pass is itself a system call, so the yield
            // comes every few passes, not after each: at 2 ranks on 2 cores a yield after
            // every pass made an 8-byte all-reduce 9 % slower (8.1 against 7.4 us, medians of
            // 8 interleaved runs), and at 4 ranks every fourth pass is as good as every one
            // (every sixteenth was 20 % slower).
            tries += 1;
            if !tries.is_multiple_of(YIELD_EVERY) {
                continue;
            }
            let yielding = Instant::now();
            std::thread::yield_now();
            if SpinBudget::crowded(yielding.elapsed()) {
                crowded = true;
                if self.spin.nap_now(a_core_is_free) {
                    std::thread::sleep(CROWDED_NAP);
                }
            }
        };
        self.spin.spun(crowded);
        result
    }

    /// One pass over the socket on this thread, unless another thread is reading it.
    fn read_socket(&self) {
        if let Pumped::Close(depart) = self.reader.try_pump() {
            self.close(depart);
        }
    }

    /// What `send_bytes` does: like `send_chunk`, but the payload is the caller's borrowed
    /// bytes, copied only as far as the socket does not take them at once.
    async fn send_slice(&self, tag: Tag, data: &[u8]) -> Result<(), LinkError> {
        // A future dropped while it awaits credit leaves no trace (the engine then sends a
        // payload instead).
        let (matcher, len) = (&*self.matcher, data.len());
        let (out, numbered, credit) =
            outbound::admit_under_credit(&self.outbound, matcher, len, |out| {
                out.number_len(matcher, &tag, len)
            })
            .await?;
        self.write_or_queue(out, numbered, data, credit)
    }

    /// `send_bytes_now`: `send_slice` when the credit is there at once.
    fn send_slice_now(&self, tag: Tag, data: &[u8]) -> Option<Result<(), LinkError>> {
        let matcher = &*self.matcher;
        let admitted = outbound::admit_now(&self.outbound, matcher, data.len(), |out| {
            out.number_len(matcher, &tag, data.len())
        })?;
        Some(
            admitted.and_then(|(out, numbered, credit)| {
                self.write_or_queue(out, numbered, data, credit)
            }),
        )
    }

    /// Writes a numbered chunk of `data` to the socket if the stream is idle (no buffer is
    /// made for what the socket takes at once), and queues the rest for the writer.
    fn write_or_queue(
        &self,
        mut out: MutexGuard<'_, outbound::Outbound>,
        numbered: outbound::Numbered,
        data: &[u8],
        credit: Credit,
    ) -> Result<(), LinkError> {
        let mut written = 0;
        if out.is_idle() {
            match socket::send_vectored(self.io.fd(), numbered.prefix(), data) {
                Ok(n) => written = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    drop(out);
                    self.matcher.release(credit);
                    return Err(self.lost(e));
                }
            }
            if written == numbered.prefix().len() + data.len() {
                drop(out);
                self.matcher.release(credit);
                return Ok(());
            }
        }
        let mut frame = numbered.into_frame(data, written);
        frame.credit = Some(credit);
        let wake = out.push(frame);
        drop(out);
        if wake {
            self.io.kick();
        }
        Ok(())
    }

    /// A write to the socket failed: the connection is lost, unless a departure the peer
    /// sent first is still to be read ([`Reader::write_failed`]).
    fn lost(&self, e: std::io::Error) -> LinkError {
        let lost = format!("send: {e}");
        self.reader.write_failed(lost.clone());
        self.close(None);
        self.failure()
            .unwrap_or(LinkError::ConnectionLost { detail: lost })
    }

    async fn send_chunk(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        let (matcher, len) = (&*self.matcher, payload.len());
        let (mut out, mut frame, credit) =
            outbound::admit_under_credit(&self.outbound, matcher, len, |out| {
                out.admit(matcher, &tag, payload)
            })
            .await?;
        if out.is_idle() && direct(frame.payload.len(), self.io.zero_copy_from()) {
            let (head, rest) = frame.rest();
            match socket::send_vectored(self.io.fd(), head, rest) {
                Ok(n) => frame.off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    drop(out);
                    self.matcher.release(credit);
                    return Err(self.lost(e));
                }
            }
            if frame.is_done() {
                drop(out);
                self.matcher.release(credit);
                return Ok(());
            }
        }
        frame.credit = Some(credit);
        let wake = out.push(frame);
        drop(out);
        if wake {
            self.io.kick();
        }
        Ok(())
    }
}

impl Link<Bytes> for TcpLink {
    fn peer(&self) -> Rank {
        self.matcher.peer()
    }

    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        Box::pin(self.send_chunk(tag, payload))
    }

    fn send_bytes<'a>(&'a self, tag: Tag, data: &'a [u8]) -> Option<LinkFuture<'a, ()>> {
        // Payloads the io_uring writer would send zero-copy need a buffer it can keep.
        if !direct(data.len(), self.io.zero_copy_from()) {
            return None;
        }
        Some(Box::pin(self.send_slice(tag, data)))
    }

    fn send_bytes_now(&self, tag: Tag, data: &[u8]) -> Option<Result<(), LinkError>> {
        if !direct(data.len(), self.io.zero_copy_from()) {
            return None;
        }
        self.send_slice_now(tag, data)
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        Box::pin(self.recv_chunk(tag))
    }

    fn cancel(&self, reason: CancelReason) {
        self.leave(reason);
    }

    fn failure(&self) -> Option<LinkError> {
        self.matcher.terminal()
    }

    fn is_flushed(&self) -> bool {
        if self.matcher.terminal().is_some() {
            return true;
        }
        // The queue first: a frame the writer holds is not in the kernel yet.
        self.outbound.lock().is_idle()
            && socket::unacknowledged(self.io.fd()).is_none_or(|n| n == 0)
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.leave(CancelReason::new(CloseCode::NORMAL, "link dropped"));
    }
}
