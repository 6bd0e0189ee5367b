//! The Unix socket a segment travels over: an abstract address (no file anywhere, scoped to
//! the network namespace, gone with its listener), `SCM_RIGHTS` for the memfd, and
//! `SO_PEERCRED` for the peer's process id.
//!
//! After the handshake the socket carries exactly one message each way: the connector's
//! one byte [`SEGMENT`] with the memfd attached, and the acceptor's one byte [`MAPPED`]
//! once it has checked and mapped it. Then both ends close it; everything after lives in
//! the segment.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The byte the memfd rides on.
pub(super) const SEGMENT: u8 = b'S';
/// The acceptor's answer: the segment is mapped.
pub(super) const MAPPED: u8 = b'M';

/// The abstract address `name` (printed without its leading NUL).
pub(super) fn address(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// A fresh abstract name for a listener of this process.
pub(super) fn fresh_name() -> String {
    format!(
        "chorus-shm.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// Sends `byte` with `fd` attached.
pub(super) async fn send_fd(stream: &UnixStream, byte: u8, fd: impl AsFd) -> io::Result<()> {
    let fds = [fd.as_fd()];
    stream
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            let n = rustix::net::sendmsg(
                stream,
                &[IoSlice::new(&[byte])],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            )?;
            if n == 1 {
                Ok(())
            } else {
                Err(io::ErrorKind::WriteZero.into())
            }
        })
        .await
}

/// Receives one byte and the descriptor attached to it, if exactly one was (extra
/// descriptors are closed). End of stream is an error.
pub(super) async fn recv_fd(stream: &UnixStream) -> io::Result<(u8, Option<OwnedFd>)> {
    stream
        .async_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut byte = [0u8; 1];
            let msg = rustix::net::recvmsg(
                stream,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            )?;
            if msg.bytes == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the socket before the segment",
                ));
            }
            let mut fds: Vec<OwnedFd> = Vec::new();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = m {
                    fds.extend(rights);
                }
            }
            let fd = if fds.len() == 1 { fds.pop() } else { None };
            Ok((byte[0], fd))
        })
        .await
}

/// The process id the kernel recorded for the socket's peer (0 if it lives in a pid
/// namespace we cannot see).
pub(super) fn peer_pid(stream: &UnixStream) -> i32 {
    rustix::net::sockopt::socket_peercred(stream)
        .map(|c| c.pid.as_raw_nonzero().get())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_crosses_the_socket_with_its_byte_and_the_peer_is_named() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, b) = UnixStream::pair().unwrap();
            let memfd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
            rustix::fs::ftruncate(&memfd, 4321).unwrap();
            send_fd(&a, SEGMENT, &memfd).await.unwrap();
            let (byte, fd) = recv_fd(&b).await.unwrap();
            assert_eq!(byte, SEGMENT);
            let st = rustix::fs::fstat(fd.unwrap()).unwrap();
            assert_eq!(st.st_size, 4321);
            assert_eq!(peer_pid(&b), std::process::id() as i32);
            drop(a);
            assert!(recv_fd(&b).await.is_err(), "end of stream");
        });
    }
}
