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

/// `shutdown(SHUT_WR)`: the peer reads its end of stream after what was written, and this
/// end may still read (the close's flush, see `teardown.rs`).
pub(crate) fn shutdown_write(fd: BorrowedFd<'_>) {
    if let Err(e) = SockRef::from(&fd).shutdown(std::net::Shutdown::Write)
        && e.raw_os_error() != Some(libc::ENOTCONN)
    {
        tracing::debug!(fd = fd.as_raw_fd(), "shutdown(write): {e}");
    }
}

/// Bytes written to the socket that the peer has not acknowledged yet (`SIOCOUTQ`);
/// `None` if the kernel will not say.
pub(crate) fn unacknowledged(fd: BorrowedFd<'_>) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which is valid and
    // writable for the call; `fd` is a live socket for the borrow.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    (rc == 0).then(|| usize::try_from(n).unwrap_or(0))
}

/// Shuts down any socket-like thing; see [`shutdown`].
pub(crate) fn shutdown_of(s: &impl AsFd) {
    shutdown(s.as_fd());
}

/// One non-blocking `sendmsg` of `head` then `payload` (either may be empty): the bytes the
/// socket took, or `WouldBlock`. `MSG_NOSIGNAL`, so a peer that reset the connection is an
/// `EPIPE` error here, never a `SIGPIPE` that kills an embedding process.
pub(crate) fn send_vectored(fd: BorrowedFd<'_>, head: &[u8], payload: &[u8]) -> io::Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: head.as_ptr().cast_mut().cast(),
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr().cast_mut().cast(),
            iov_len: payload.len(),
        },
    ];
    let (iov_ptr, iov_len) = if head.is_empty() {
        (iov[1..].as_mut_ptr(), 1)
    } else {
        (iov.as_mut_ptr(), 2)
    };
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov_ptr;
    msg.msg_iovlen = iov_len;
    loop {
        // SAFETY: `fd` is a live socket for the borrow; the iovecs point into `head` and
        // `payload`, which outlive the call, and the kernel only reads through them.
        let n = unsafe {
            libc::sendmsg(
                fd.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One non-blocking `recv` into `buf`'s spare capacity (which the caller sized): the bytes
/// appended, 0 at the end of the stream, or `WouldBlock`.
pub(crate) fn recv_into(fd: BorrowedFd<'_>, buf: &mut bytes::BytesMut) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    if spare.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            "no room to read into",
        ));
    }
    loop {
        // SAFETY: `fd` is a live socket for the borrow; the kernel writes at most
        // `spare.len()` bytes into the spare capacity, which `buf` owns and keeps for the
        // call.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn send_vectored_writes_head_then_payload_and_reports_a_reset_as_an_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(send_vectored(c.as_fd(), b"head", b"payload").unwrap(), 11);
        assert_eq!(send_vectored(c.as_fd(), b"", b"!").unwrap(), 1);
        let mut got = [0u8; 12];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"headpayload!");
        shutdown_of(&c);
        let e = send_vectored(c.as_fd(), b"x", b"").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    }
}
