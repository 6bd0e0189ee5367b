//! The epoll backend: one reader and one writer task per connection on the progress
//! thread's tokio runtime. Same semantics as the io_uring backend; the shared test suite
//! runs against both.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc};

use super::frame::OutFrame;
use super::socket;
use crate::inbound::{self, Flow};
use crate::matcher::Matcher;
use crate::wire::{Decoder, Route};

/// Smallest read we ask the kernel for, so small frames arrive in few system calls.
const MIN_READ: usize = 64 << 10;

/// The link's handle on its two tasks.
#[derive(Debug)]
pub(crate) struct EpollConn {
    tx: mpsc::UnboundedSender<OutFrame>,
    closer: Arc<Closer>,
}

impl EpollConn {
    pub(crate) fn start(
        handle: &Handle,
        stream: TcpStream,
        decoder: Decoder,
        matcher: Arc<Matcher>,
        peer: Route,
        me: Route,
        depart_timeout: Duration,
    ) -> Self {
        let (r, w) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let closer = Arc::new(Closer::default());
        handle.spawn(read_loop(
            r,
            decoder,
            matcher.clone(),
            peer,
            me,
            closer.clone(),
        ));
        handle.spawn(write_loop(w, rx, closer.clone(), matcher, depart_timeout));
        Self { tx, closer }
    }

    /// Queues a frame; hands it back if the writer has stopped.
    pub(crate) fn submit(&self, frame: OutFrame) -> Result<(), OutFrame> {
        self.tx.send(frame).map_err(|e| e.0)
    }

    /// Asks the writer to send `depart` (if any) and shut the connection; idempotent.
    pub(crate) fn close(&self, depart: Option<Bytes>) {
        self.closer.request(depart);
    }
}

/// The one-way close request: the first request's departure wins.
#[derive(Debug, Default)]
struct Closer {
    req: Mutex<Option<Option<Bytes>>>,
    notify: Notify,
}

impl Closer {
    fn request(&self, depart: Option<Bytes>) {
        {
            let mut req = self.req.lock();
            if req.is_some() {
                return;
            }
            *req = Some(depart);
        }
        // notify_one stores a permit if the writer is not waiting yet: no lost wake-up.
        self.notify.notify_one();
    }

    fn take_depart(&self) -> Option<Bytes> {
        self.req.lock().as_mut().and_then(Option::take)
    }
}

async fn read_loop(
    mut r: OwnedReadHalf,
    mut decoder: Decoder,
    matcher: Arc<Matcher>,
    peer: Route,
    me: Route,
    closer: Arc<Closer>,
) {
    loop {
        loop {
            match decoder.decode() {
                Ok(Some(frame)) => match inbound::on_frame(&matcher, peer, frame) {
                    Flow::Continue => {}
                    Flow::Close(depart) => {
                        closer.request(depart.and_then(|(c, d)| inbound::depart_frame(me, c, &d)));
                        return;
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    let Flow::Close(depart) = inbound::on_wire_error(&matcher, e) else {
                        return;
                    };
                    closer.request(depart.and_then(|(c, d)| inbound::depart_frame(me, c, &d)));
                    return;
                }
            }
        }
        let want = decoder.wanted().max(MIN_READ);
        let buf = decoder.buffer();
        buf.reserve(want);
        match r.read_buf(buf).await {
            Ok(0) => {
                inbound::on_lost(
                    &matcher,
                    "peer closed the connection without a departure".into(),
                );
                closer.request(None);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                inbound::on_lost(&matcher, format!("read: {e}"));
                closer.request(None);
                return;
            }
        }
    }
}

async fn write_loop(
    mut w: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<OutFrame>,
    closer: Arc<Closer>,
    matcher: Arc<Matcher>,
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
        let Some(mut frame) = next else { break };
        seq += 1;
        frame.stamp(seq);
        let credit = frame.credit.take();
        let result = {
            let write = write_frame(&mut w, &frame);
            tokio::pin!(write);
            tokio::select! {
                biased;
                r = &mut write => r,
                () = closer.notify.notified() => {
                    // Finish the frame (within the departure budget) so the departure
                    // starts on a frame boundary; otherwise skip the departure.
                    match tokio::time::timeout(depart_timeout, write).await {
                        Ok(Ok(())) => {}
                        _ => on_boundary = false,
                    }
                    if let Some(c) = credit {
                        matcher.release(c);
                    }
                    break;
                }
            }
        };
        if let Some(c) = credit {
            matcher.release(c);
        }
        if let Err(e) = result {
            inbound::on_lost(&matcher, format!("write: {e}"));
            on_boundary = false;
            break;
        }
    }
    // Whatever the reason we stopped: frames not yet written are dropped with the link.
    rx.close();
    while let Ok(mut f) = rx.try_recv() {
        if let Some(c) = f.credit.take() {
            matcher.release(c);
        }
    }
    if on_boundary && let Some(depart) = closer.take_depart() {
        let _ = tokio::time::timeout(depart_timeout, w.write_all(&depart)).await;
    }
    // Principle 1: shutdown before close, so a forked duplicate cannot hide the close.
    socket::shutdown_of(w.as_ref());
}

async fn write_frame(w: &mut OwnedWriteHalf, frame: &OutFrame) -> std::io::Result<()> {
    let head = &frame.head[..];
    let payload = &frame.payload[..];
    let total = head.len() + payload.len();
    let mut off = 0;
    while off < total {
        let n = if off < head.len() {
            w.write_vectored(&[IoSlice::new(&head[off..]), IoSlice::new(payload)])
                .await?
        } else {
            w.write(&payload[off - head.len()..]).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        off += n;
    }
    Ok(())
}
