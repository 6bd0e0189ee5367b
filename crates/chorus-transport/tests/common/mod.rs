//! Helpers shared by the transport's integration tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_engine::link::{CancelReason, Link, LinkError, Tag};
use chorus_protocol::message::{Message, Role};
use chorus_protocol::{
    CloseCode, Collective, CommId, ConnectorConfig, DType, Decoder, Encoder, Envelope, Epoch,
    Frame, Gate, JobSecret, Limits, OpSeq, Rank, Side,
};
use chorus_transport::{RawConnection, Route, fresh};

pub fn tag(op: u64, step: u32) -> Tag {
    Tag {
        collective: Collective::AllReduce,
        op: OpSeq(op),
        step,
        offset: 0,
        dtype: DType::U8,
    }
}

pub fn route(rank: u32) -> Route {
    Route {
        comm: CommId(42),
        epoch: Epoch(1),
        sender: Rank(rank),
    }
}

/// A payload whose bytes depend on `seed` and position, so corruption or reordering shows.
pub fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// The bytes of the golden vector `name` in `protocol/vectors/`.
pub fn vector(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../protocol/vectors")
        .join(format!("{name}.hex"));
    let text = std::fs::read_to_string(&path).unwrap();
    let hex: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| c.is_ascii_hexdigit()))
        .collect();
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The `Hello` frame a connector with `secret` sends as `me` (no channel binding).
pub fn hello_bytes(secret: &JobSecret, me: Envelope, role: Role) -> Vec<u8> {
    let config = ConnectorConfig::new(
        secret.clone(),
        me,
        role,
        fresh::nonce(),
        Instant::now() + Duration::from_secs(5),
    );
    let mut out = BytesMut::new();
    chorus_protocol::Connector::new(config, &mut out).unwrap();
    out.to_vec()
}

/// Forks a child that keeps every descriptor (the seed-000 bystander) and sleeps. Only
/// async-signal-safe calls run in the child.
pub fn fork_holder() -> Holder {
    // SAFETY: the child calls only pause() and _exit(), both async-signal-safe, so forking
    // a multi-threaded process is sound.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        loop {
            // SAFETY: async-signal-safe; the child waits for the test's SIGKILL.
            unsafe { libc::pause() };
        }
    }
    Holder { pid }
}

/// A forked descriptor holder, killed and reaped (bounded) on drop.
pub struct Holder {
    pub pid: libc::pid_t,
}

impl Holder {
    pub fn alive(&self) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(self.pid, 0) == 0 }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: pid is our child; SIGKILL then a bounded non-blocking reap.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: reaping our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid || r < 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("descriptor holder {} not reaped within 5 s", self.pid);
    }
}

/// What a raw observer saw on a socket.
#[derive(Debug, PartialEq)]
pub enum Seen {
    Frame(Box<Frame>),
    Eof,
    Reset,
    Nothing,
}

/// Speaks the wire by hand over a blocking socket, with a plain `chorus_protocol` decoder
/// (and encoder, once past a handshake): the observer and the bad peer of the tests.
pub struct RawPeer {
    pub stream: TcpStream,
    pub decoder: Decoder,
    pub encoder: Encoder,
    /// The envelope `send_message` stamps.
    pub me: Envelope,
    /// Every byte read so far, when `capture` is set (tests that compare the wire byte
    /// for byte).
    pub captured: Vec<u8>,
    pub capture: bool,
}

impl RawPeer {
    /// One end of a connection handed out raw after the handshake.
    pub fn from_raw(raw: RawConnection) -> Self {
        Self {
            stream: raw.stream,
            decoder: raw.decoder,
            encoder: raw.encoder,
            me: raw.me,
            captured: Vec::new(),
            capture: false,
        }
    }

    /// A stranger dialling `addr`: it reads as a connector in the handshake phase (only
    /// `HelloAck` or `Reject` may come back).
    pub fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).unwrap(),
            decoder: Decoder::new(Side::Connector, Limits::DEFAULT),
            encoder: Encoder::default(),
            me: route(1),
            captured: Vec::new(),
            capture: false,
        }
    }

    /// A socket that carries no frames we care about (EOF watching).
    pub fn plain(stream: TcpStream) -> Self {
        Self {
            stream,
            decoder: Decoder::with_gate(Gate::Open, Limits::DEFAULT),
            encoder: Encoder::default(),
            me: route(0),
            captured: Vec::new(),
            capture: false,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Encodes `message` as the stream's next frame under `envelope` and sends it.
    pub fn send_message(&mut self, envelope: &Envelope, message: &Message) {
        let mut out = BytesMut::new();
        self.encoder.encode(envelope, message, &mut out).unwrap();
        self.send(&out);
    }

    /// The next frame, EOF, reset, or nothing within `within`.
    pub fn next(&mut self, within: Duration) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            match self.decoder.next() {
                Ok(Some(f)) => return Seen::Frame(Box::new(f)),
                Ok(None) => {}
                Err(e) => panic!("observer could not decode: {e}"),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Seen::Nothing;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut buf = [0u8; 65536];
            match self.stream.read(&mut buf) {
                Ok(0) => return Seen::Eof,
                Ok(n) => {
                    if self.capture {
                        self.captured.extend_from_slice(&buf[..n]);
                    }
                    self.decoder.push(&buf[..n]);
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return Seen::Nothing;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Seen::Reset,
                Err(e) => panic!("observer read: {e}"),
            }
        }
    }

    /// Skips chunks until a non-chunk frame, EOF or the deadline.
    pub fn next_control(&mut self, within: Duration) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Seen::Frame(f) if matches!(f.message, Message::Chunk(_)) => continue,
                other => return other,
            }
        }
    }
}

/// Drops `dropped`, the other end of `link`'s connection, which never became a link: the
/// receive pending on `link` must end within `wait` with a departure coded `deadline` (SPEC
/// 6, a connection given up before use), not as a lost connection. `what` names the case.
pub async fn a_dropped_end_departs_with_deadline<L: Link<Bytes>>(
    link: &L,
    dropped: impl Sized,
    wait: Duration,
    what: &str,
) {
    let pending = link.recv(tag(1, 0));
    drop(dropped);
    let r = tokio::time::timeout(wait, pending)
        .await
        .unwrap_or_else(|_| panic!("{what}: the dropped connection went unnoticed"));
    assert!(
        matches!(&r, Err(LinkError::PeerDeparted { code, .. }) if *code == CloseCode::DEADLINE),
        "{what}: {r:?}"
    );
}

/// `cancel` on `x` fails its pending receive synchronously, later sends fail with the same
/// reason, a second cancel changes nothing, and `y`, its peer, sees the departure with the
/// code and `detail`, also through `failure` with no operation asking. `wait` bounds the
/// peer's wait for the departure.
pub async fn cancel_is_local_and_immediate<L: Link<Bytes>>(
    x: &L,
    y: &L,
    detail: &'static str,
    wait: Duration,
) {
    let peer_recv = y.recv(tag(9, 0));
    let mut pending = std::pin::pin!(x.recv(tag(7, 0)));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(pending.as_mut().poll(&mut cx).is_pending());
    let reason = CancelReason::new(CloseCode::ABORTED, detail);
    let t0 = Instant::now();
    x.cancel(reason.clone());
    // Failed synchronously inside cancel(): no executor round trip, no peer involved.
    let std::task::Poll::Ready(r) = pending.as_mut().poll(&mut cx) else {
        panic!("pending recv still pending after cancel");
    };
    // The contract is 5 ms; the proof that it holds is that the future is ready at the
    // very next poll, with no executor round trip. The time bound only catches a cancel
    // that blocks, with room for a loaded machine's preemption.
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r, Err(LinkError::Cancelled(reason.clone())));
    assert_eq!(
        x.send(tag(8, 0), Bytes::new()).await,
        Err(LinkError::Cancelled(reason.clone()))
    );
    x.cancel(CancelReason::new(CloseCode::LEFT, "second"));
    assert_eq!(x.failure(), Some(LinkError::Cancelled(reason)));
    let seen = tokio::time::timeout(wait, peer_recv).await.unwrap();
    assert_eq!(
        seen,
        Err(LinkError::PeerDeparted {
            code: CloseCode::ABORTED,
            detail: detail.into()
        })
    );
    assert_eq!(y.failure(), seen.err());
}

/// Wait up to 5 s for a peer process to exit; kill it and fail the test if it does not.
pub fn reap(child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("peer process not reaped within 5 s");
}
