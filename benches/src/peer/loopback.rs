//! Plain loopback TCP: one connection's streaming rate and its 8-byte ping-pong time, the
//! ceiling and the floor for any all-reduce whose ranks talk over TCP on this machine.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::peer::PeerError;

/// How long any single read, write or accept may block before the measurement fails.
const IO_DEADLINE: Duration = Duration::from_secs(10);
/// The size of each write in the streaming test.
const WRITE_BYTES: usize = 1 << 20;
/// At most this many round trips in the ping-pong test.
const MAX_ROUND_TRIPS: u32 = 20_000;

/// What one loopback connection can do.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TcpLimit {
    /// One connection, 1 MiB writes, receiver on another thread: GB/s (10^9 B/s).
    pub stream_gbs: f64,
    /// Half the mean round-trip time of an 8-byte message and its 8-byte echo, µs.
    pub pingpong_8b_us: f64,
}

/// Streams for `stream_for`, then ping-pongs for at most `pingpong_for`, on 127.0.0.1.
pub fn measure_tcp(stream_for: Duration, pingpong_for: Duration) -> Result<TcpLimit, PeerError> {
    Ok(TcpLimit {
        stream_gbs: stream(stream_for)?,
        pingpong_8b_us: pingpong(pingpong_for)?,
    })
}

fn stream(duration: Duration) -> Result<f64, PeerError> {
    let (mut sender, receiver) = pair()?;
    let sink = thread::spawn(move || drain(receiver));
    let chunk = vec![0x5au8; WRITE_BYTES];
    let started = Instant::now();
    let mut sent: u64 = 0;
    while started.elapsed() < duration {
        sender
            .write_all(&chunk)
            .map_err(|e| PeerError::io("write to the loopback stream", e))?;
        sent += WRITE_BYTES as u64;
    }
    sender
        .shutdown(Shutdown::Write)
        .map_err(|e| PeerError::io("shut the loopback stream", e))?;
    // The sink ends: every read it makes is bounded by IO_DEADLINE and the stream is shut.
    let received = sink
        .join()
        .map_err(|_| PeerError::io("join the loopback sink", io::Error::other("sink panicked")))?
        .map_err(|e| PeerError::io("read from the loopback stream", e))?;
    let elapsed = started.elapsed();
    if received != sent {
        return Err(PeerError::io(
            "stream over loopback",
            io::Error::other(format!("sent {sent} bytes, received {received}")),
        ));
    }
    Ok(sent as f64 / elapsed.as_secs_f64() / 1e9)
}

fn drain(mut stream: TcpStream) -> io::Result<u64> {
    let mut buf = vec![0u8; WRITE_BYTES];
    let mut total = 0;
    loop {
        match stream.read(&mut buf)? {
            0 => return Ok(total),
            n => total += n as u64,
        }
    }
}

fn pingpong(budget: Duration) -> Result<f64, PeerError> {
    let (mut client, mut server) = pair()?;
    for s in [&client, &server] {
        s.set_nodelay(true)
            .map_err(|e| PeerError::io("set TCP_NODELAY", e))?;
    }
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut msg = [0u8; 8];
        loop {
            match server.read_exact(&mut msg) {
                Ok(()) => server.write_all(&msg)?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut msg = *b"chorus!\0";
    let started = Instant::now();
    let mut trips = 0u32;
    while trips < MAX_ROUND_TRIPS && (trips < 100 || started.elapsed() < budget) {
        client
            .write_all(&msg)
            .map_err(|e| PeerError::io("send a ping", e))?;
        client
            .read_exact(&mut msg)
            .map_err(|e| PeerError::io("receive a pong", e))?;
        trips += 1;
    }
    let elapsed = started.elapsed();
    client
        .shutdown(Shutdown::Write)
        .map_err(|e| PeerError::io("shut the ping-pong connection", e))?;
    echo.join()
        .map_err(|_| PeerError::io("join the echo thread", io::Error::other("echo panicked")))?
        .map_err(|e| PeerError::io("echo over loopback", e))?;
    Ok(elapsed.as_secs_f64() * 1e6 / f64::from(trips) / 2.0)
}

/// A connected pair on 127.0.0.1 (an ephemeral port), every read and write bounded.
fn pair() -> Result<(TcpStream, TcpStream), PeerError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| PeerError::io("bind 127.0.0.1:0", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| PeerError::io("read the listener's port", e))?;
    let client = TcpStream::connect_timeout(&addr, IO_DEADLINE)
        .map_err(|e| PeerError::io(format!("connect to {addr}"), e))?;
    // Loopback connects complete in connect(), so the accept below finds the connection
    // queued; the listener is non-blocking so that a lost connection ends in an error.
    listener
        .set_nonblocking(true)
        .map_err(|e| PeerError::io("make the listener non-blocking", e))?;
    let accept_end = Instant::now() + IO_DEADLINE;
    let server = loop {
        match listener.accept() {
            Ok((server, _)) => break server,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < accept_end => {
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(PeerError::io(format!("accept on {addr}"), e)),
        }
    };
    for s in [&client, &server] {
        s.set_nonblocking(false)
            .map_err(|e| PeerError::io("make a socket blocking", e))?;
        s.set_read_timeout(Some(IO_DEADLINE))
            .map_err(|e| PeerError::io("set a read timeout", e))?;
        s.set_write_timeout(Some(IO_DEADLINE))
            .map_err(|e| PeerError::io("set a write timeout", e))?;
    }
    Ok((client, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_gives_a_rate_and_a_latency() {
        let limit = measure_tcp(Duration::from_millis(50), Duration::from_millis(20)).unwrap();
        assert!(
            limit.stream_gbs.is_finite() && limit.stream_gbs > 0.0,
            "{limit:?}"
        );
        assert!(
            limit.pingpong_8b_us.is_finite() && limit.pingpong_8b_us > 0.0,
            "{limit:?}"
        );
    }
}
