//! `QuicLink`: the engine's `Link` over one QUIC stream. Same matcher and inbound rules as
//! TCP; cancel ends with `CONNECTION_CLOSE` carrying the code, which no descriptor holder
//! can suppress and which the peer reads as a departure.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::message::ChunkHeader;
use chorus_protocol::{CloseCode, Rank};
use parking_lot::Mutex;
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc};

use super::lost;
use crate::inbound::{self, Flow};
use crate::matcher::{Credit, Matcher};
use crate::wire::{self, Decoder, Route};

/// A data link to one peer over QUIC.
#[derive(Debug)]
pub struct QuicLink {
    matcher: Arc<Matcher>,
    me: Route,
    tx: mpsc::UnboundedSender<Out>,
    closer: Arc<Closer>,
    max_chunk: u32,
}

#[derive(Debug)]
struct Out {
    head: BytesMut,
    payload: Bytes,
    credit: Credit,
}

#[derive(Debug, Default)]
struct Closer {
    req: Mutex<Option<(CloseCode, String, bool)>>,
    notify: Notify,
}

impl Closer {
    /// First request wins; `depart` says whether to send a departure frame first.
    fn request(&self, code: CloseCode, detail: String, depart: bool) {
        {
            let mut req = self.req.lock();
            if req.is_some() {
                return;
            }
            *req = Some((code, detail, depart));
        }
        self.notify.notify_one();
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    handle: &Handle,
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    decoder: Decoder,
    matcher: Arc<Matcher>,
    me: Route,
    peer: Route,
    depart_timeout: Duration,
    max_chunk: u32,
) -> QuicLink {
    let (tx, rx) = mpsc::unbounded_channel();
    let closer = Arc::new(Closer::default());
    handle.spawn(read_loop(
        recv,
        decoder,
        matcher.clone(),
        peer,
        closer.clone(),
    ));
    handle.spawn(write_loop(
        conn,
        send,
        rx,
        closer.clone(),
        matcher.clone(),
        me,
        depart_timeout,
    ));
    QuicLink {
        matcher,
        me,
        tx,
        closer,
        max_chunk,
    }
}

impl QuicLink {
    /// The link's terminal error, if it has failed.
    pub fn failure(&self) -> Option<LinkError> {
        self.matcher.terminal()
    }

    fn leave(&self, reason: CancelReason) {
        if self.matcher.fail(LinkError::Cancelled(reason.clone())) {
            self.closer
                .request(reason.code, reason.detail.to_string(), true);
        } else {
            self.closer
                .request(CloseCode::NORMAL, "link dropped".into(), false);
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
        let credit = self.matcher.acquire(payload.len()).await?;
        self.tx
            .send(Out {
                head,
                payload,
                credit,
            })
            .map_err(|e| {
                self.matcher.release(e.0.credit);
                self.matcher
                    .terminal()
                    .unwrap_or_else(|| lost("link's writer has stopped"))
            })
    }
}

impl Link<Bytes> for QuicLink {
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

impl Drop for QuicLink {
    fn drop(&mut self) {
        self.leave(CancelReason::new(CloseCode::NORMAL, "link dropped"));
    }
}

async fn read_loop(
    mut recv: RecvStream,
    mut decoder: Decoder,
    matcher: Arc<Matcher>,
    peer: Route,
    closer: Arc<Closer>,
) {
    loop {
        loop {
            let flow = match decoder.decode() {
                Ok(Some(frame)) => inbound::on_frame(&matcher, peer, frame),
                Ok(None) => break,
                Err(e) => inbound::on_wire_error(&matcher, e),
            };
            if let Flow::Close(depart) = flow {
                match depart {
                    Some((code, detail)) => closer.request(code, detail, true),
                    None => closer.request(CloseCode::NORMAL, "peer departed".into(), false),
                }
                return;
            }
        }
        match recv.read_chunk(decoder.wanted().max(64 << 10), true).await {
            Ok(Some(chunk)) => decoder.buffer().extend_from_slice(&chunk.bytes),
            Ok(None) => {
                inbound::on_lost(
                    &matcher,
                    "peer finished the stream without a departure".into(),
                );
                closer.request(CloseCode::NORMAL, "stream finished".into(), false);
                return;
            }
            Err(e) => {
                matcher.fail(super::read_error(e));
                closer.request(CloseCode::NORMAL, "connection closed".into(), false);
                return;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_loop(
    conn: Connection,
    mut send: SendStream,
    mut rx: mpsc::UnboundedReceiver<Out>,
    closer: Arc<Closer>,
    matcher: Arc<Matcher>,
    me: Route,
    depart_timeout: Duration,
) {
    let mut seq = 0u64;
    let mut on_boundary = true;
    loop {
        let next = tokio::select! {
            biased;
            () = closer.notify.notified() => break,
            f = rx.recv() => f,
        };
        let Some(mut out) = next else { break };
        seq += 1;
        if let Some(field) = out.head.get_mut(32..40) {
            field.copy_from_slice(&seq.to_le_bytes());
        }
        let mut chunks = [out.head.freeze(), out.payload];
        let result = tokio::select! {
            biased;
            r = send.write_all_chunks(&mut chunks) => r,
            () = closer.notify.notified() => {
                // Part of a frame may be out: a departure now would corrupt the stream,
                // and CONNECTION_CLOSE carries the same code anyway.
                on_boundary = false;
                matcher.release(out.credit);
                break;
            }
        };
        matcher.release(out.credit);
        if let Err(e) = result {
            matcher.fail(super::write_error(e));
            on_boundary = false;
            break;
        }
    }
    rx.close();
    while let Ok(out) = rx.try_recv() {
        matcher.release(out.credit);
    }
    let req = closer.req.lock().take();
    let (code, detail, depart) = req.unwrap_or((CloseCode::NORMAL, "link closed".into(), false));
    if depart
        && on_boundary
        && let Some(frame) = inbound::depart_frame(me, code, &detail)
    {
        let _ = tokio::time::timeout(depart_timeout, send.write_all(&frame)).await;
    }
    // Principle 1: the close is a message the peer reads whoever holds our UDP socket.
    conn.close(VarInt::from_u32(code.0.into()), detail.as_bytes());
}
