//! Errors of connection set-up and teardown (the link's own errors are the engine's
//! `LinkError`). Messages are short and lowercase and say which wait failed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use chorus_protocol::CloseCode;

use crate::wire::WireError;

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
    /// The peer refused us (or we refused it) with a code.
    #[error("handshake with {addr} rejected ({code}): {detail}")]
    Rejected {
        addr: SocketAddr,
        code: CloseCode,
        detail: String,
    },
    /// The peer sent bytes that fail validation during the handshake.
    #[error("handshake with {addr}: {source}")]
    Wire {
        addr: SocketAddr,
        #[source]
        source: WireError,
    },
    /// The connection closed during the handshake.
    #[error("handshake with {addr}: connection closed ({detail})")]
    Closed { addr: SocketAddr, detail: String },
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
            TransportError::Rejected { code, .. } => *code,
            TransportError::Wire { source, .. } => source.code(),
            TransportError::HandshakeTimeout { .. } | TransportError::ConnectTimeout { .. } => {
                CloseCode::DEADLINE
            }
            _ => CloseCode::INTERNAL,
        }
    }
}
