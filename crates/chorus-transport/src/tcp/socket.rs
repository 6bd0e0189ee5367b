//! TCP sockets: options, connect with a deadline and backed-off retries, and the
//! connection-level close that a duplicated descriptor cannot defeat.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Instant;

use socket2::SockRef;
use tokio::net::{TcpSocket, TcpStream};

use crate::config::TransportConfig;
use crate::error::TransportError;

/// A socket with our options; tokio (mio) creates it with `SOCK_CLOEXEC` and accepts with
/// `accept4(SOCK_CLOEXEC)`, which `tests::sockets_are_cloexec` checks.
pub(crate) fn new_socket(addr: SocketAddr, cfg: &TransportConfig) -> io::Result<TcpSocket> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Set before connect/listen so the window scale is negotiated for the large buffer.
    let size = u32::try_from(cfg.socket_buffer).unwrap_or(u32::MAX);
    sock.set_send_buffer_size(size)?;
    sock.set_recv_buffer_size(size)?;
    sock.set_nodelay(true)?;
    Ok(sock)
}

/// Connects to `addr`, retrying refused or failed attempts with the configured backoff,
/// all within `cfg.connect_timeout`.
pub(crate) async fn connect(
    addr: SocketAddr,
    cfg: &TransportConfig,
) -> Result<TcpStream, TransportError> {
    let start = Instant::now();
    let deadline = start + cfg.connect_timeout;
    let mut last = String::from("no attempt made");
    let mut attempts = 0;
    while attempts < cfg.backoff.attempts.max(1) {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        attempts += 1;
        let sock = new_socket(addr, cfg).map_err(TransportError::io("tcp socket"))?;
        match tokio::time::timeout(deadline - now, sock.connect(addr)).await {
            Ok(Ok(stream)) => {
                stream
                    .set_nodelay(true)
                    .map_err(TransportError::io("set TCP_NODELAY"))?;
                return Ok(stream);
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => {
                last = "attempt timed out".into();
                break;
            }
        }
        let pause = cfg.backoff.delay(attempts - 1);
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(pause.min(left)).await;
    }
    Err(TransportError::ConnectTimeout {
        addr,
        attempts,
        elapsed: start.elapsed(),
        last,
    })
}

/// `shutdown(SHUT_RDWR)`: acts on the socket shared by every duplicate of the descriptor,
/// so the peer sees the close even if a forked child still holds one (seed 000). `close`
/// alone only drops this process's reference.
pub(crate) fn shutdown(fd: BorrowedFd<'_>) {
    if let Err(e) = SockRef::from(&fd).shutdown(std::net::Shutdown::Both) {
        // ENOTCONN: the peer reset it already; nothing left to tell.
        if e.raw_os_error() != Some(libc::ENOTCONN) {
            tracing::debug!(fd = fd.as_raw_fd(), "shutdown: {e}");
        }
    }
}

/// Shuts down any socket-like thing; see [`shutdown`].
pub(crate) fn shutdown_of(s: &impl AsFd) {
    shutdown(s.as_fd());
}
