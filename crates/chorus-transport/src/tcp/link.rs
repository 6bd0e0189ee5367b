//! `TcpLink`: the engine's `Link` over one authenticated TCP connection, on either backend.

use std::sync::Arc;

use bytes::Bytes;
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::message::ChunkHeader;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use super::BackendKind;
use super::epoll::EpollConn;
use super::frame::OutFrame;
use super::uring::UringConn;
use crate::inbound;
use crate::matcher::Matcher;
use crate::wire::{self, Route};

/// A data link to one peer over TCP. Cancel it (or drop it) to leave: the peer sees a
/// departure frame, then a connection-level close that no forked child can hold open.
#[derive(Debug)]
pub struct TcpLink {
    pub(super) matcher: Arc<Matcher>,
    pub(super) me: Route,
    pub(super) peer: Route,
    pub(super) io: Io,
    pub(super) max_chunk: u32,
}

#[derive(Debug)]
pub(super) enum Io {
    Epoll(EpollConn),
    Uring(UringConn),
}

impl Io {
    fn submit(&self, frame: OutFrame) -> Result<(), OutFrame> {
        match self {
            Io::Epoll(c) => c.submit(frame),
            Io::Uring(c) => c.submit(frame),
        }
    }

    fn close(&self, depart: Option<Bytes>) {
        match self {
            Io::Epoll(c) => c.close(depart),
            Io::Uring(c) => c.close(depart),
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

    /// Leaves with `code` unless the link already failed; what `cancel` and `Drop` share.
    fn leave(&self, reason: CancelReason) {
        if self.matcher.fail(LinkError::Cancelled(reason.clone())) {
            self.io
                .close(inbound::depart_frame(self.me, reason.code, &reason.detail));
        } else {
            self.io.close(None);
        }
    }

    async fn send_chunk(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        if let Some(err) = self.matcher.terminal() {
            return Err(err);
        }
        if payload.len() > self.max_chunk as usize {
            return Err(LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!(
                    "payload of {} bytes exceeds the {}-byte chunk limit",
                    payload.len(),
                    self.max_chunk
                ),
            });
        }
        let header = ChunkHeader {
            collective: tag.collective.code(),
            dtype: tag.dtype.code(),
            op: tag.op,
            step: tag.step,
            offset: tag.offset,
        };
        let head = wire::encode_chunk_prefix(self.me, 0, &header, payload.len()).map_err(|e| {
            LinkError::Protocol {
                code: e.code(),
                detail: e.to_string(),
            }
        })?;
        // Awaiting credit is the only suspension point; once it is granted the frame is
        // queued whole, so dropping this future never leaves a partial frame.
        let credit = self.matcher.acquire(payload.len()).await?;
        let frame = OutFrame {
            head,
            payload,
            credit: Some(credit),
        };
        self.io.submit(frame).map_err(|mut f| {
            if let Some(c) = f.credit.take() {
                self.matcher.release(c);
            }
            self.matcher
                .terminal()
                .unwrap_or_else(|| LinkError::ConnectionLost {
                    detail: "link's writer has stopped".into(),
                })
        })
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
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.leave(CancelReason::new(CloseCode::NORMAL, "link dropped"));
    }
}
