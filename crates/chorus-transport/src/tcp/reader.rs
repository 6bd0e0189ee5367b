//! The receiving half of one TCP link's byte stream, shared by the link's callers and the
//! backend's progress thread.
//!
//! Whoever reads the socket does so under this lock: a non-blocking `recv` straight into the
//! protocol decoder's buffer (a chunk's payload is never copied on the way in), then every
//! whole frame goes to the matcher. The lock is what keeps the stream in order when two
//! threads take turns reading it.
//!
//! A `recv` that finds nothing held reads the socket itself for a short while before it
//! parks (see `link.rs`), so a message that arrives within that window goes from the kernel
//! to the waiting caller with no thread hop. Only a caller about to park asks the progress
//! thread to watch the socket ([`Reader::wants_watch`]), and the io_uring ring stops
//! watching once nobody waits; so while callers keep up, incoming messages do not wake the
//! progress thread at all.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chorus_protocol::message::Depart;
use chorus_protocol::{Decoder, Envelope};
use parking_lot::Mutex;

use super::socket;
use crate::inbound::{self, Flow};
use crate::matcher::Matcher;

/// Frames from this size on end a pass over the socket (see [`Pumped::More`]); below it the
/// allocator's caches recycle buffers well enough.
const LARGE_FRAME: usize = 64 << 10;

/// How many passes a failed write reads before it records the loss: enough for the large
/// frames a departing peer sent before its departure to drain; a bound in case the socket
/// keeps delivering.
const WRITE_FAILED_PASSES: usize = 64;

/// The socket, whoever owns the descriptor (the ring's `OwnedFd`, tokio's `TcpStream`).
pub(crate) type Socket = Arc<dyn AsFd + Send + Sync>;

/// The reading state of one link.
pub(crate) struct Reader {
    fd: Socket,
    matcher: Arc<Matcher>,
    /// The peer's envelope: the epoch its frames must carry.
    peer: Envelope,
    state: Mutex<ReadState>,
    /// The progress thread has a readiness watch on the socket (io_uring: a poll in flight).
    watching: AtomicBool,
}

impl ReadState {
    /// Ends the stream with `depart` (the departure owed to the peer, if any).
    fn end(&mut self, depart: Option<Depart>) -> Pumped {
        self.ended = Some(depart.clone());
        Pumped::Close(depart)
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader")
            .field("fd", &self.fd.as_fd().as_raw_fd())
            .field("peer", &self.peer)
            .field("watching", &self.watching)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct ReadState {
    decoder: Decoder,
    /// The stream ended or was refused: nobody reads it again, and every pass answers with
    /// the same close (so whichever reader requests the link's close first, a departure the
    /// stream owes the peer is the one requested).
    ended: Option<Option<Depart>>,
}

/// What a pass over the socket found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pumped {
    /// Everything the socket had is decoded; the stream goes on.
    Drained,
    /// A large frame was delivered and reading stopped there: the socket may hold more.
    /// (Its payload shares the decoder's buffer; reading on at once would make the decoder
    /// allocate a fresh buffer for the next frame, while a pass after the payload has been
    /// consumed reuses the same, already-mapped memory.)
    More,
    /// Another thread is reading right now (only from [`Reader::try_pump`]).
    Busy,
    /// The stream is over (already, or by what this pass read): the caller requests the
    /// link's close with this departure, if any (a second request is a no-op).
    Close(Option<Depart>),
}

impl Reader {
    pub(crate) fn new(fd: Socket, decoder: Decoder, matcher: Arc<Matcher>, peer: Envelope) -> Self {
        Reader {
            fd,
            matcher,
            peer,
            state: Mutex::new(ReadState {
                decoder,
                ended: None,
            }),
            watching: AtomicBool::new(false),
        }
    }

    pub(crate) fn matcher(&self) -> &Arc<Matcher> {
        &self.matcher
    }

    /// Reads and decodes whatever the socket holds, waiting for another reader to finish.
    pub(crate) fn pump(&self) -> Pumped {
        let mut st = self.state.lock();
        self.drain(&mut st)
    }

    /// A write to the socket failed (`detail`): the connection is lost — unless the peer
    /// left first. A departing peer sends `Depart`, then closes; a write racing that close
    /// fails (`EPIPE`, `ECONNRESET`) while the departure still waits, unread, in the receive
    /// queue (the kernel hands out queued data before the reset). So what the socket holds
    /// is read first, and the loss is recorded only if it said nothing more final (the
    /// first failure recorded on a link is the one everyone sees). Bounded: at most
    /// [`WRITE_FAILED_PASSES`] passes.
    pub(crate) fn write_failed(&self, detail: String) {
        for _ in 0..WRITE_FAILED_PASSES {
            if !matches!(self.pump(), Pumped::More) {
                break;
            }
        }
        inbound::on_lost(&self.matcher, detail);
    }

    /// Like [`Reader::pump`], but returns `Busy` at once if another thread is reading (it
    /// will hand over whatever it finds).
    pub(crate) fn try_pump(&self) -> Pumped {
        match self.state.try_lock() {
            Some(mut st) => self.drain(&mut st),
            None => Pumped::Busy,
        }
    }

    /// Decodes frames already buffered (bytes read past the handshake), without reading.
    pub(crate) fn decode_buffered(&self) -> Pumped {
        let mut st = self.state.lock();
        if let Some(depart) = &st.ended {
            return Pumped::Close(depart.clone());
        }
        match self.decode(&mut st.decoder).0 {
            Flow::Continue => Pumped::Drained,
            Flow::Close(depart) => st.end(depart),
        }
    }

    fn drain(&self, st: &mut ReadState) -> Pumped {
        if let Some(depart) = &st.ended {
            return Pumped::Close(depart.clone());
        }
        loop {
            let read = socket::recv_into(self.fd.as_fd(), st.decoder.recv_buf());
            let detail = match read {
                Ok(0) => "peer closed the connection without a departure".to_string(),
                Ok(_) => match self.decode(&mut st.decoder) {
                    (Flow::Close(depart), _) => return st.end(depart),
                    (Flow::Continue, true) => return Pumped::More,
                    (Flow::Continue, false) => continue,
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Pumped::Drained,
                Err(e) => format!("recv: {e}"),
            };
            inbound::on_lost(&self.matcher, detail);
            return st.end(None);
        }
    }

    /// Hands every whole buffered frame to the matcher; also says whether one of them was
    /// large (see [`Pumped::More`]).
    fn decode(&self, decoder: &mut Decoder) -> (Flow, bool) {
        let mut large = false;
        loop {
            let flow = match decoder.next() {
                Ok(Some(frame)) => {
                    large |= frame.header.body_len as usize >= LARGE_FRAME;
                    inbound::on_frame(&self.matcher, &self.peer, frame)
                }
                Ok(None) => return (Flow::Continue, large),
                Err(e) => inbound::on_decode_error(&self.matcher, &e),
            };
            if let Flow::Close(_) = flow {
                return (flow, large);
            }
        }
    }

    /// A caller about to park: true if the progress thread is not watching the socket and
    /// must be asked to. Call after registering the waiter, so that a progress thread that
    /// just stopped watching either saw the waiter or is seen here not watching.
    pub(crate) fn wants_watch(&self) -> bool {
        !self.watching.load(Ordering::SeqCst)
    }

    /// The progress thread records whether it watches the socket.
    pub(crate) fn set_watching(&self, on: bool) {
        self.watching.store(on, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::OwnedFd;

    use bytes::BytesMut;
    use chorus_engine::LinkError;
    use chorus_protocol::message::{Message, Role};
    use chorus_protocol::{CloseCode, CommId, Encoder, Epoch, Gate, Limits, Rank, Side};

    use super::*;

    /// A connected pair: this end's reader (rank 0 reading rank 1's data stream) and the
    /// peer's plain socket.
    fn reader_and_peer() -> (Reader, TcpStream, Envelope) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mine, _) = l.accept().unwrap();
        let envelope = Envelope::new(CommId(7), Epoch(0), Rank(1));
        let gate = Gate::Established {
            role: Role::Data,
            local: Side::Acceptor,
            comm: CommId(7),
            peer: Rank(1),
        };
        let decoder = Decoder::with_gate(gate, Limits::DEFAULT);
        let matcher = Arc::new(Matcher::new(Rank(1), 1 << 20, 1 << 20));
        mine.set_nonblocking(true).unwrap();
        let fd: Socket = Arc::new(OwnedFd::from(mine));
        (Reader::new(fd, decoder, matcher, envelope), peer, envelope)
    }

    /// The peer closes with a reset (linger 0), after writing `bytes`.
    fn reset_after(mut peer: TcpStream, bytes: &[u8]) {
        peer.write_all(bytes).unwrap();
        socket2::SockRef::from(&peer)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(peer);
        // Let the reset arrive.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    #[test]
    fn a_failed_write_reads_the_departure_the_peer_sent_before_it_closed() {
        let (reader, peer, envelope) = reader_and_peer();
        let mut frame = BytesMut::new();
        let depart = Message::Depart(Depart {
            code: CloseCode::ABORTED,
            detail: "leaving".into(),
        });
        Encoder::new(Limits::DEFAULT)
            .encode(&envelope, &depart, &mut frame)
            .unwrap();
        reset_after(peer, &frame);
        let e = socket::send_vectored(reader.fd.as_fd(), b"x", b"").unwrap_err();
        reader.write_failed(format!("send: {e}"));
        assert_eq!(
            reader.matcher().terminal(),
            Some(LinkError::PeerDeparted {
                code: CloseCode::ABORTED,
                detail: "leaving".into()
            }),
            "the departure was in the receive queue when the write failed"
        );
    }

    #[test]
    fn a_failed_write_with_nothing_to_read_is_a_lost_connection() {
        let (reader, peer, _) = reader_and_peer();
        reset_after(peer, b"");
        let e = socket::send_vectored(reader.fd.as_fd(), b"x", b"").unwrap_err();
        reader.write_failed(format!("send: {e}"));
        assert!(
            matches!(
                reader.matcher().terminal(),
                Some(LinkError::ConnectionLost { .. })
            ),
            "{:?}",
            reader.matcher().terminal()
        );
    }
}
