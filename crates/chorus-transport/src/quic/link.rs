//! `QuicLink`: the engine's `Link` over one QUIC stream. Same matcher, outbound and inbound
//! rules as TCP; cancel ends with `CONNECTION_CLOSE` carrying the code, which no descriptor
//! holder can suppress and which the peer reads as a departure.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::message::Depart;
use chorus_protocol::{CloseCode, Decoder, Envelope, Rank};
use parking_lot::Mutex;
use quinn::{Connection, RecvStream, SendStream};
use tokio::io::AsyncReadExt;
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::{code_of, io_read_error, write_error};
use crate::inbound::{self, Flow};
use crate::matcher::Matcher;
use crate::outbound::{self, Next, OutFrame, Outbound};

/// A data link to one peer over QUIC.
#[derive(Debug)]
pub struct QuicLink {
    matcher: Arc<Matcher>,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn start(
    handle: &Handle,
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    decoder: Decoder,
    matcher: Arc<Matcher>,
    outbound: Arc<Mutex<Outbound>>,
    peer: Envelope,
    depart_timeout: Duration,
) -> QuicLink {
    let wake = Arc::new(Notify::new());
    handle.spawn(read_loop(
        recv,
        decoder,
        matcher.clone(),
        outbound.clone(),
        wake.clone(),
        peer,
    ));
    handle.spawn(write_loop(
        conn,
        send,
        outbound.clone(),
        wake.clone(),
        matcher.clone(),
        depart_timeout,
    ));
    QuicLink {
        matcher,
        outbound,
        wake,
    }
}

impl QuicLink {
    /// The link's terminal error, if it has failed.
    pub fn failure(&self) -> Option<LinkError> {
        self.matcher.terminal()
    }

    fn leave(&self, reason: CancelReason) {
        let depart = self
            .matcher
            .fail(LinkError::Cancelled(reason.clone()))
            .then(|| Depart::new(reason.code, reason.detail.to_string()));
        close(&self.outbound, &self.matcher, &self.wake, depart);
    }

    async fn send_chunk(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        let (matcher, len) = (&*self.matcher, payload.len());
        let (mut out, mut frame, credit) =
            outbound::admit_under_credit(&self.outbound, matcher, len, |out| {
                out.admit(matcher, &tag, payload)
            })
            .await?;
        frame.credit = Some(credit);
        let wake = out.push(frame);
        drop(out);
        if wake {
            self.wake.notify_one();
        }
        Ok(())
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

    fn failure(&self) -> Option<LinkError> {
        self.matcher.terminal()
    }
}

impl Drop for QuicLink {
    fn drop(&mut self) {
        self.leave(CancelReason::new(CloseCode::NORMAL, "link dropped"));
    }
}

/// Requests the close (first request wins) and wakes the writer to carry it out.
fn close(outbound: &Mutex<Outbound>, matcher: &Matcher, wake: &Notify, depart: Option<Depart>) {
    if outbound::request_close(outbound, matcher, depart) {
        wake.notify_one();
    }
}

async fn read_loop(
    mut recv: RecvStream,
    mut decoder: Decoder,
    matcher: Arc<Matcher>,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
    peer: Envelope,
) {
    loop {
        loop {
            let flow = match decoder.next() {
                Ok(Some(frame)) => inbound::on_frame(&matcher, &peer, frame),
                Ok(None) => break,
                Err(e) => inbound::on_decode_error(&matcher, &e),
            };
            if let Flow::Close(depart) = flow {
                close(&outbound, &matcher, &wake, depart);
                return;
            }
        }
        match recv.read_buf(decoder.recv_buf()).await {
            Ok(0) => {
                inbound::on_lost(
                    &matcher,
                    "peer finished the stream without a departure".into(),
                );
                close(&outbound, &matcher, &wake, None);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                matcher.fail(io_read_error(&e));
                close(&outbound, &matcher, &wake, None);
                return;
            }
        }
    }
}

async fn write_loop(
    conn: Connection,
    mut send: SendStream,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
    matcher: Arc<Matcher>,
    depart_timeout: Duration,
) {
    let mut on_boundary = true;
    loop {
        let next = outbound.lock().next();
        let mut frame = match next {
            Next::Frame(frame) => frame,
            Next::Wait => {
                wake.notified().await;
                continue;
            }
            Next::Close => break,
        };
        let result = write_frame(&mut send, &mut frame, &outbound, &wake).await;
        frame.release(&matcher);
        match result {
            Ok(()) => {}
            Err(Stop::Closing) => {
                // Part of a frame may be out: a departure now would corrupt the stream,
                // and CONNECTION_CLOSE carries the same code anyway.
                on_boundary = false;
                break;
            }
            Err(Stop::Write(e)) => {
                matcher.fail(write_error(e));
                close(&outbound, &matcher, &wake, None);
                on_boundary = false;
                break;
            }
        }
    }
    loop {
        let Some(frame) = outbound.lock().pop() else {
            break;
        };
        frame.release(&matcher);
    }
    let (code, detail) = outbound.lock().close_reason();
    let depart = outbound.lock().departure();
    if on_boundary && let Some(frame) = depart {
        let mut chunks = frame.rest_bytes();
        let _ = tokio::time::timeout(depart_timeout, send.write_all_chunks(&mut chunks)).await;
    }
    // Principle 1: the close is a message the peer reads whoever holds our UDP socket.
    conn.close(code_of(code), detail.as_bytes());
}

enum Stop {
    /// A close was requested while the frame was part-way out.
    Closing,
    Write(quinn::WriteError),
}

/// Writes the rest of `frame`, giving up as soon as a close is requested.
async fn write_frame(
    send: &mut SendStream,
    frame: &mut OutFrame,
    outbound: &Mutex<Outbound>,
    wake: &Notify,
) -> Result<(), Stop> {
    while !frame.is_done() {
        if outbound.lock().is_closing() {
            return Err(Stop::Closing);
        }
        let mut chunks = frame.rest_bytes();
        let start = chunks.iter().position(|c| !c.is_empty()).unwrap_or(1);
        tokio::select! {
            r = send.write_chunks(&mut chunks[start..]) => {
                frame.off += r.map_err(Stop::Write)?.bytes;
            }
            // A wake-up may be a close request: re-check at the top.
            () = wake.notified() => {}
        }
    }
    Ok(())
}
