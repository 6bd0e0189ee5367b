//! The `Link` port: the engine's view of one peer.
//!
//! A link carries tagged payloads in both directions between two ranks of one communicator.
//! The engine ships an in-process link for its own tests; `chorus-transport` provides TCP
//! (io_uring, epoll) and QUIC links; `chorus-cuda` may provide device-memory links whose
//! payload is not host bytes (hence the payload parameter, tied to [`crate::device::Device`]).
//!
//! # Contract every implementation keeps
//!
//! - **Matching.** `recv(tag)` resolves with the payload the peer sent under a tag with the
//!   same `(op, step)`. Payloads that arrive before their `recv` is posted are held (up to a
//!   bound the implementation documents; past it the link fails with
//!   [`LinkError::Overflow`]). If the held or arriving tag with that `(op, step)` differs in
//!   any other field (collective, offset, dtype), `recv` fails with
//!   [`LinkError::TagMismatch`] naming both: ranks calling different collectives is an error,
//!   never silent corruption.
//! - **Order.** Payloads are matched by tag, and an operation sends at most one payload
//!   per tag on a link, so their order across tags is free: a link may deliver a payload
//!   ahead of one sent before it (shm's small-payload mailbox overtakes its ring). Never a
//!   departure, though: every payload sent before a departure is delivered before the link
//!   fails with it.
//! - **Send completion.** `send` resolves once the link owns the payload (queued or written),
//!   not when the peer has it. Dropping a pending `send` future never leaves a partial frame
//!   on the wire: the link either finishes the frame in the background or fails.
//! - **Cancellation.** `cancel(reason)` is local, immediate and idempotent (first reason
//!   wins): every pending and later `send`/`recv` fails with [`LinkError::Cancelled`] within
//!   milliseconds, without waiting on the peer. Network links then send an explicit
//!   departure (best effort, bounded) and close at the connection level, so the peer sees the
//!   departure whatever the descriptor's reference count (principle 1).
//! - **Failure.** A peer's departure or a lost connection fails pending and later operations
//!   with [`LinkError::PeerDeparted`] or [`LinkError::ConnectionLost`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use chorus_protocol::{CloseCode, Collective, DType, OpSeq, Rank};

/// A boxed, `Send` future returned by link operations; boxing keeps `Link` object-safe.
pub type LinkFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LinkError>> + Send + 'a>>;

/// The engine's reduction for [`Link::recv_reduce_into`]: `dst[i] = op(dst[i], src[i])`
/// over two host slices of equal length, a whole number of elements, of any alignment.
/// It cannot fail: the engine checks the operator and type before it hands one out, and
/// records any error itself.
pub type Reducer<'a> = &'a (dyn Fn(&mut [u8], &[u8]) + Send + Sync);

/// One peer, as the engine sees it.
pub trait Link<P = Bytes>: Send + Sync {
    /// The rank at the other end, in the communicator's current numbering.
    fn peer(&self) -> Rank;

    /// Hand `payload` to the link for the peer, under `tag`.
    fn send(&self, tag: Tag, payload: P) -> LinkFuture<'_, ()>;

    /// Hand the host bytes `data` to the link for the peer, under `tag`, without the caller
    /// first copying them into a payload: a link that can write them at once does, and
    /// copies only what it could not write into a buffer it owns. Resolves, like `send`,
    /// once the link owns the bytes; a future dropped while still pending has put nothing
    /// on the wire, so the caller may fall back to `send`. `None` (the default) means this
    /// link takes only payloads.
    fn send_bytes<'a>(&'a self, tag: Tag, data: &'a [u8]) -> Option<LinkFuture<'a, ()>> {
        let _ = (tag, data);
        None
    }

    /// [`Link::send_bytes`] when it needs no wait: `Some` with the outcome if the link took
    /// the bytes at once (written, or copied and queued), `None` if it would first have to
    /// wait (for send-window credit), having numbered and sent nothing; the caller then
    /// uses `send_bytes` or `send`. No future to box: the path of small payloads. `None`
    /// (the default) always, for a link without it.
    fn send_bytes_now(&self, tag: Tag, data: &[u8]) -> Option<Result<(), LinkError>> {
        let _ = (tag, data);
        None
    }

    /// The payload the peer sends under `tag`.
    fn recv(&self, tag: Tag) -> LinkFuture<'_, P>;

    /// Receive the payload the peer sends under `tag` straight into the host bytes `dst`,
    /// without the caller unpacking a payload: a link that can copy from its transport's
    /// buffers into `dst` does, and copies a held payload otherwise. Resolves with the
    /// payload's length; the bytes are in `dst` only when that length is `dst.len()` (the
    /// caller reports any other length as a size mismatch). A future dropped while still
    /// pending may have written part of `dst`, and the payload is then lost to later
    /// receives, like an aborted operation's output. `None` (the default) means this link
    /// delivers only payloads, and the caller uses `recv`.
    fn recv_into<'a>(&'a self, tag: Tag, dst: &'a mut [u8]) -> Option<LinkFuture<'a, usize>> {
        let _ = (tag, dst);
        None
    }

    /// Receive the payload the peer sends under `tag` and reduce it into the host bytes
    /// `dst` (`dst[i] = op(dst[i], payload[i])`, elementwise for `tag.dtype`), through
    /// `reduce`, the engine's kernel: a link that can read the payload from its
    /// transport's buffers hands them to `reduce` block by block (each call gets
    /// subslices of equal length, a whole number of elements, in order and without
    /// overlap, covering `dst` once), skipping the copy into a payload; otherwise it
    /// reduces the held payload in one call. Resolves with the payload's length; `dst`
    /// holds the reduction only when that length is `dst.len()` (another length leaves
    /// `dst` untouched, and the caller reports a size mismatch). A future dropped while
    /// still pending may have reduced part of `dst`, like an aborted operation's output.
    /// `None` (the default) means this link delivers only payloads, and the caller uses
    /// `recv` and reduces itself.
    fn recv_reduce_into<'a>(
        &'a self,
        tag: Tag,
        dst: &'a mut [u8],
        reduce: Reducer<'a>,
    ) -> Option<LinkFuture<'a, usize>> {
        let _ = (tag, dst, reduce);
        None
    }

    /// Fail everything pending and everything later with `reason` (see the contract above).
    fn cancel(&self, reason: CancelReason);

    /// True once everything `send` accepted has left this process and reached the peer's
    /// host (nothing queued in user space, nothing unacknowledged on the wire), or the link
    /// has failed. A graceful close waits for it, bounded, before it cancels, so a peer
    /// still finishing its last operation gets all of it. Links that cannot tell say true.
    fn is_flushed(&self) -> bool {
        true
    }

    /// The error every later operation will fail with, if the link has failed (cancelled,
    /// the peer departed, the connection lost): how the peer ended, for a runtime that
    /// must tell a departure from a crash while no operation is running. Links that
    /// cannot tell say `None`.
    fn failure(&self) -> Option<LinkError> {
        None
    }

    /// True when the link moves bytes through memory shared with its peer, not a network:
    /// a world whose links all do has other algorithm crossovers
    /// ([`crate::Thresholds::shared_memory`]). Links that cannot tell say false.
    fn shares_memory(&self) -> bool {
        false
    }
}

/// Identifies one payload of one operation. Every rank derives the same tags from the same
/// call, so a difference is a programming error on some rank, detected at the receiver.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Tag {
    /// The collective the operation is, so ranks that called different ones are caught.
    pub collective: Collective,
    /// The operation's sequence number: collectives count up per communicator, point-to-point
    /// operations per peer and direction (with `P2P_SEQ_BIT` set).
    pub op: OpSeq,
    /// The payload's index among the operation's payloads on this link in this direction (not
    /// its place in the algorithm's schedule); credit returns set the engine's `CREDIT` bit.
    /// Matched with `op`.
    pub step: u32,
    /// Byte offset of the payload within the operation's buffer.
    pub offset: u64,
    /// The element type, checked by the receiver like the other fields.
    pub dtype: DType,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} step {} offset {} {}",
            self.collective, self.op, self.step, self.offset, self.dtype
        )
    }
}

/// Why a link was cancelled: the code its departure frame and connection close carry.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CancelReason {
    /// Carried to the peer by the departure frame and the connection-level close.
    pub code: CloseCode,
    /// Why, for the peer's error and log (cut to the protocol's detail bound on the wire).
    pub detail: Arc<str>,
}

impl CancelReason {
    /// A reason with `code` and a human-readable, lowercase `detail`.
    pub fn new(code: CloseCode, detail: impl Into<Arc<str>>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

/// Why a link operation failed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum LinkError {
    /// This side cancelled the link.
    #[error("link cancelled ({0})")]
    Cancelled(CancelReason),
    /// The peer sent a departure (or closed with an application code).
    #[error("peer departed ({code}): {detail}")]
    PeerDeparted {
        /// The departure's code (`normal`, `left`, `aborted`, `evicted`, ...).
        code: CloseCode,
        /// The peer's reason, as it sent it.
        detail: String,
    },
    /// The connection failed without a departure.
    #[error("connection lost: {detail}")]
    ConnectionLost {
        /// What failed (a reset, an end of stream, an IO error), for the log.
        detail: String,
    },
    /// The peer sent a payload for the same `(op, step)` under a different tag.
    #[error("tag mismatch: expected {expected}, peer sent {got}")]
    TagMismatch {
        /// The tag this side's `recv` posted.
        expected: Tag,
        /// The tag the peer's payload carried for the same `(op, step)`.
        got: Tag,
    },
    /// The peer sent bytes that fail validation; the connection was closed with `code`.
    #[error("protocol violation ({code}): {detail}")]
    Protocol {
        /// The close code the connection was closed with (`protocol-violation`, ...).
        code: CloseCode,
        /// The rule the peer's bytes broke.
        detail: String,
    },
    /// The peer sent more unclaimed data than the link holds.
    #[error("peer sent {bytes} bytes nobody asked for (limit {limit})")]
    Overflow {
        /// Bytes held for receives not yet posted, this payload included.
        bytes: u64,
        /// The link's bound on held bytes.
        limit: u64,
    },
}
