//! Errors of connection set-up and teardown (the link's own errors are the engine's
//! `LinkError`). Messages are short and lowercase and say which wait failed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use chorus_protocol::{CloseCode, DecodeError, EncodeError, HandshakeError};

/// Why a transport, listener, connect or handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The io_uring backend was asked for explicitly and the kernel refused a ring.
    #[error("io_uring unavailable: {0}")]
    UringUnavailable(io::Error),
    /// A socket or ring system call failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// `connect` ran out of its deadline or attempts.
    #[error("connect to {addr} gave up after {attempts} attempts in {elapsed:?}: {last}")]
    ConnectTimeout {
        addr: SocketAddr,
        attempts: u32,
        elapsed: Duration,
        last: String,
    },
    /// The handshake did not finish within its deadline.
    #[error("handshake with {addr} exceeded its {timeout:?} deadline")]
    HandshakeTimeout { addr: SocketAddr, timeout: Duration },
    /// The handshake failed: the peer refused us, we refused it, or a proof did not verify.
    /// [`HandshakeError::code`] is the code the stream was closed with.
    #[error("handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: HandshakeError,
    },
    /// The peer sent bytes that fail the codec during the handshake.
    #[error("handshake with {addr}: {source}")]
    Decode {
        addr: SocketAddr,
        #[source]
        source: DecodeError,
    },
    /// This end could not encode a handshake frame (a bug, or a limit set too low).
    #[error("handshake with {addr}: {source}")]
    Encode {
        addr: SocketAddr,
        #[source]
        source: EncodeError,
    },
    /// The connection closed during the handshake.
    #[error("handshake with {addr}: connection closed ({detail})")]
    Closed { addr: SocketAddr, detail: String },
    /// The connection was opened for a role this call does not serve (e.g. `into_link` on
    /// a member connection).
    #[error("connection opened as {found:?}, expected {expected:?}")]
    WrongRole {
        expected: chorus_protocol::message::Role,
        found: chorus_protocol::message::Role,
    },
    /// Certificate generation or TLS configuration failed.
    #[error("identity: {0}")]
    Identity(String),
    /// QUIC connection set-up failed.
    #[error("quic: {0}")]
    Quic(String),
    /// The transport (its progress thread) has shut down.
    #[error("transport is shut down")]
    Shutdown,
}

impl TransportError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> TransportError {
        move |source| TransportError::Io { what, source }
    }

    /// The close code this failure maps to, for the runtime's evidence and notices.
    pub fn code(&self) -> CloseCode {
        match self {
            TransportError::Handshake { source, .. } => source.code(),
            TransportError::Decode { source, .. } => source.code(),
            TransportError::HandshakeTimeout { .. } | TransportError::ConnectTimeout { .. } => {
                CloseCode::DEADLINE
            }
            _ => CloseCode::INTERNAL,
        }
    }
}
