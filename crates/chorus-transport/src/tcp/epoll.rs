//! The epoll backend: a reader task and a writer task per connection on the progress
//! thread's tokio runtime. Same semantics as the io_uring backend; the shared test suite
//! runs against both.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use chorus_protocol::{Decoder, Envelope};
use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::socket;
use crate::inbound::{self, Flow};
use crate::matcher::Matcher;
use crate::outbound::{self, Next, OutFrame, Outbound};

/// The link's handle on its connection's tasks.
#[derive(Debug)]
pub(crate) struct EpollConn {
    stream: Arc<TcpStream>,
    wake: Arc<Notify>,
}

impl EpollConn {
    pub(crate) fn start(
        handle: &Handle,
        stream: TcpStream,
        decoder: Decoder,
        matcher: Arc<Matcher>,
        outbound: Arc<Mutex<Outbound>>,
        peer: Envelope,
        depart_timeout: Duration,
    ) -> Self {
        let stream = Arc::new(stream);
        let wake = Arc::new(Notify::new());
        handle.spawn(read_loop(
            stream.clone(),
            decoder,
            matcher.clone(),
            outbound.clone(),
            wake.clone(),
            peer,
        ));
        handle.spawn(write_loop(
            stream.clone(),
            outbound,
            wake.clone(),
            matcher,
            depart_timeout,
        ));
        Self { stream, wake }
    }

    /// Wakes the writer (frames queued or a close requested). `notify_one` stores a permit
    /// if the writer is not waiting yet, so no wake-up is lost.
    pub(crate) fn kick(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// Requests the close (first request wins) and wakes the writer to carry it out.
fn close(
    outbound: &Mutex<Outbound>,
    matcher: &Matcher,
    wake: &Notify,
    depart: Option<chorus_protocol::message::Depart>,
) {
    if outbound::request_close(outbound, matcher, depart) {
        wake.notify_one();
    }
}

async fn read_loop(
    stream: Arc<TcpStream>,
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
        let read = loop {
            if let Err(e) = stream.readable().await {
                break Err(e);
            }
            // Straight into the decoder's buffer, which has room for the whole frame in
            // progress: a chunk's payload is never copied on the way in.
            match stream.try_read_buf(decoder.recv_buf()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => break other,
            }
        };
        let detail = match read {
            Ok(0) => "peer closed the connection without a departure".to_string(),
            Ok(_) => continue,
            Err(e) => format!("read: {e}"),
        };
        inbound::on_lost(&matcher, detail);
        close(&outbound, &matcher, &wake, None);
        return;
    }
}

async fn write_loop(
    stream: Arc<TcpStream>,
    outbound: Arc<Mutex<Outbound>>,
    wake: Arc<Notify>,
    matcher: Arc<Matcher>,
    depart_timeout: Duration,
) {
    // Whether the stream is on a frame boundary, where a departure may start.
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
        let result = write_frame(&stream, &mut frame, &outbound, &wake, depart_timeout).await;
        frame.release(&matcher);
        match result {
            Ok(()) => {}
            Err(Stop::Budget) => {
                on_boundary = false;
                break;
            }
            Err(Stop::Io(e)) => {
                inbound::on_lost(&matcher, format!("write: {e}"));
                close(&outbound, &matcher, &wake, None);
                on_boundary = false;
                break;
            }
        }
    }
    // Frames queued behind a torn one are dropped with the link (credit returned).
    loop {
        let Some(frame) = outbound.lock().pop() else {
            break;
        };
        frame.release(&matcher);
    }
    let depart = outbound.lock().departure();
    if on_boundary && let Some(mut depart) = depart {
        let deadline = Instant::now() + depart_timeout;
        let _ = tokio::time::timeout_at(deadline, async {
            while !depart.is_done() {
                let n = write_some(&stream, &depart).await?;
                depart.off += n;
            }
            Ok::<_, io::Error>(())
        })
        .await;
    }
    // Principle 1: shutdown before close, so a forked duplicate cannot hide the close.
    socket::shutdown_of(&*stream);
}

enum Stop {
    /// A close was requested and the frame did not finish within the departure budget.
    Budget,
    Io(io::Error),
}

/// Writes the rest of `frame`. Once a close is requested, the frame gets the departure
/// budget to finish (so the departure can start on a boundary) and no more.
async fn write_frame(
    stream: &TcpStream,
    frame: &mut OutFrame,
    outbound: &Mutex<Outbound>,
    wake: &Notify,
    depart_timeout: Duration,
) -> Result<(), Stop> {
    let mut deadline: Option<Instant> = None;
    while !frame.is_done() {
        if deadline.is_none() && outbound.lock().is_closing() {
            deadline = Some(Instant::now() + depart_timeout);
        }
        let n = match deadline {
            Some(d) => match tokio::time::timeout_at(d, write_some(stream, frame)).await {
                Ok(r) => r.map_err(Stop::Io)?,
                Err(_) => return Err(Stop::Budget),
            },
            None => tokio::select! {
                r = write_some(stream, frame) => r.map_err(Stop::Io)?,
                // A wake-up may be a close request: re-check (queued frames wait anyway).
                () = wake.notified() => continue,
            },
        };
        frame.off += n;
    }
    Ok(())
}

/// One `sendmsg` of what is left of `frame` once the socket is writable.
async fn write_some(stream: &TcpStream, frame: &OutFrame) -> io::Result<usize> {
    let (head, payload) = frame.rest();
    stream
        .async_io(Interest::WRITABLE, || {
            socket::send_vectored(stream.as_fd(), head, payload)
        })
        .await
}
