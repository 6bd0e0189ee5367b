//! `TcpLink`: the engine's `Link` over one authenticated TCP connection, on either backend.
//!
//! A `send` that finds the stream idle writes its frame on the caller's thread with one
//! non-blocking `sendmsg` (header and payload as two iovecs, the payload uncopied); only
//! what the socket does not take at once goes to the backend's writer. Receives complete on
//! the backend's progress thread, which wakes the waiting `recv` directly.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use bytes::Bytes;
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::message::Depart;
use chorus_protocol::{CloseCode, CommId, Envelope, Epoch, Rank};
use parking_lot::Mutex;

use super::BackendKind;
use super::epoll::EpollConn;
use super::socket;
use super::uring::UringConn;
use crate::inbound;
use crate::matcher::Matcher;
use crate::outbound::{self, Outbound};

/// Frames up to this size (header included) are written on the caller's thread when the
/// stream is idle. Larger ones go to the backend (io_uring may send them zero-copy); at
/// their size a thread hop costs nothing measurable.
const DIRECT_MAX: usize = 64 << 10;

/// A data link to one peer over TCP. Cancel it (or drop it) to leave: the peer sees a
/// departure frame, then a connection-level close that no forked child can hold open.
#[derive(Debug)]
pub struct TcpLink {
    pub(super) matcher: Arc<Matcher>,
    pub(super) outbound: Arc<Mutex<Outbound>>,
    /// The peer's envelope (communicator, epoch, rank) as the handshake established it.
    pub(super) peer: Envelope,
    pub(super) io: Io,
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

    async fn send_chunk(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        if let Some(err) = self.matcher.terminal() {
            return Err(err);
        }
        // Awaiting credit is the only suspension point; once it is granted the frame is
        // written or queued whole, so dropping this future never leaves a partial frame.
        let credit = self.matcher.acquire(payload.len()).await?;
        let mut out = self.outbound.lock();
        let mut frame = match out.admit(&self.matcher, &tag, payload) {
            Ok(frame) => frame,
            Err(e) => {
                drop(out);
                self.matcher.release(credit);
                return Err(e);
            }
        };
        if out.is_idle() && frame.len() <= DIRECT_MAX {
            let (head, rest) = frame.rest();
            match socket::send_vectored(self.io.fd(), head, rest) {
                Ok(n) => frame.off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    drop(out);
                    self.matcher.release(credit);
                    let lost = format!("send: {e}");
                    inbound::on_lost(&self.matcher, lost.clone());
                    self.close(None);
                    return Err(self
                        .failure()
                        .unwrap_or(LinkError::ConnectionLost { detail: lost }));
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

    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        Box::pin(self.matcher.recv(tag))
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
