//! chorus-transport: implementations of the engine's `Link` port.
//!
//! Floor 3 of the house (`docs/ARCHITECTURE.md`): `tcp` over io_uring (with an epoll
//! fallback), `quic` over quinn + rustls, and `shm` (same-host peers through a shared memfd
//! segment), each with connection-level cancellation that no duplicated descriptor can
//! defeat: a departure frame, then `shutdown(SHUT_RDWR)` before `close` (TCP),
//! `CONNECTION_CLOSE` with an application code (QUIC), or a one-way closed word in the
//! segment (shm).
//!
//! Every byte on every stream is the spec's: frames are made and read by
//! `chorus_protocol`'s `Encoder` and `Decoder` (one of each per byte stream), and every
//! stream opens with the protocol's `Connector` / `Acceptor` handshake, bound to the TLS
//! session on QUIC. This crate moves bytes and enforces deadlines; it never frames them
//! itself.
//!
//! It may depend on `chorus-protocol` and `chorus-engine`; never on `chorus-control`,
//! `chorus-cuda`, `chorus` or the CLI.

mod accept;
pub mod admission;
pub mod config;
pub mod error;
pub mod fresh;
mod handshake;
pub mod identity;
mod inbound;
mod matcher;
mod outbound;
mod progress_thread;
pub mod quic;
pub mod shm;
mod spin;
pub mod tcp;

pub use admission::{Admission, admit_all};
/// The routing fields of our frames on a stream (communicator, epoch, our rank): the
/// protocol's `Envelope`, under the name the transport's API has always used.
pub use chorus_protocol::Envelope as Route;
pub use chorus_protocol::JobSecret;
pub use config::{Backend, Backoff, Liveness, TransportConfig, ZeroCopy};
pub use error::TransportError;
pub use identity::{Fingerprint, Identity};
pub use quic::{ControlChannel, QuicConnection, QuicEndpoint, QuicLink};
pub use shm::{RawShm, RawSlot, ShmConnection, ShmLink, ShmListener, ShmTransport};
pub use tcp::{BackendKind, RawConnection, TcpConnection, TcpLink, TcpListener, TcpTransport};

use chorus_protocol::CloseCode;

/// The code a connection given up before it became a link or a channel ends with, on every
/// transport (SPEC 6): `deadline`, a live peer's refusal. Not `normal`, which a control
/// stream's peer reads as this member leaving; not a bare close, which reads as a lost
/// peer, so that the peer's runtime counts this live member out of the next agreement (a
/// member whose build of an epoch's links failed gives up the connections still being set
/// up, which its peers may have made links already).
pub(crate) const GIVEN_UP: CloseCode = CloseCode::DEADLINE;

/// The detail that goes with [`GIVEN_UP`].
pub(crate) const GIVEN_UP_DETAIL: &str = "connection given up before use";
