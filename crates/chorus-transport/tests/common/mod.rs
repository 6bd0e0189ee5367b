//! Helpers shared by the transport's integration tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_engine::link::Tag;
use chorus_protocol::message::Message;
use chorus_protocol::{Collective, CommId, DType, Epoch, OpSeq, Rank};
use chorus_transport::Route;
use chorus_transport::wire::{Decoder, Frame, Limits};

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

/// Reads frames off a raw socket with a deadline.
pub struct RawPeer {
    pub stream: TcpStream,
    pub decoder: Decoder,
}

impl RawPeer {
    pub fn new(stream: TcpStream, leftover: BytesMut) -> Self {
        let mut decoder = Decoder::new(Limits::data(1 << 30));
        decoder.buffer().extend_from_slice(&leftover);
        Self { stream, decoder }
    }

    pub fn connect(addr: std::net::SocketAddr) -> Self {
        Self::new(TcpStream::connect(addr).unwrap(), BytesMut::new())
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next frame, EOF, reset, or nothing within `within`.
    pub fn next(&mut self, within: Duration) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            match self.decoder.decode() {
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
                Ok(n) => self.decoder.buffer().extend_from_slice(&buf[..n]),
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
