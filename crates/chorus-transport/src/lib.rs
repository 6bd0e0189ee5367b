//! chorus-transport: implementations of the engine's `Link` port.
//!
//! Floor 3 of the house (`DESIGN.md`): `tcp` over io_uring (with an epoll fallback) and
//! `quic` over quinn + rustls, each with connection-level cancellation that no duplicated
//! descriptor can defeat: a departure frame, then `shutdown(SHUT_RDWR)` before `close`
//! (TCP) or `CONNECTION_CLOSE` with an application code (QUIC).
//!
//! It may depend on `chorus-protocol` and `chorus-engine`; never on `chorus-control`,
//! `chorus-cuda`, `chorus` or the CLI.

pub mod config;
pub mod error;
pub mod greeting;
pub mod handshake;
pub mod identity;
mod inbound;
mod matcher;
mod progress;
pub mod quic;
pub mod secret;
pub mod tcp;
pub mod wire;

pub use config::{Backend, Backoff, Liveness, TransportConfig, ZeroCopy};
pub use error::TransportError;
pub use greeting::{Admission, admit_all};
pub use identity::{Fingerprint, Identity};
pub use quic::{ControlChannel, QuicConnection, QuicEndpoint, QuicLink};
pub use secret::JobSecret;
pub use tcp::{BackendKind, TcpConnection, TcpLink, TcpListener, TcpTransport};
pub use wire::Route;
