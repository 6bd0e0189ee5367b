//! chorus: the collective communication library a training framework embeds.
//!
//! Floor 4 of the house (`DESIGN.md`): `Comm` (init, collectives, split, shrink, grow, abort,
//! destroy, health), the runtime that drives `chorus-control` over real transports on a
//! control thread nothing else can block, launch-environment detection and the flight
//! recorder. It wires the floors below together; it must never depend on the CLI, the
//! benches or the tests.

// `Error` carries its structured fields inline (rank, peer, op, step, evidence, ...): it is
// built only on the failure path, where a 136-byte move is nothing next to what failed.
#![allow(clippy::result_large_err)]

mod comm;
pub mod config;
mod element;
pub mod error;
pub mod host;
pub mod launch;
pub mod recorder;
mod runtime;
pub mod signal;
pub mod status;
pub mod unique_id;
pub mod watch;

pub use chorus_engine::{Buffer, Op, Reduction};
pub use chorus_protocol::JobSecret;
pub use chorus_protocol::{CommId, DType, Epoch, Rank};
pub use comm::{Blocking, Comm, Health};
pub use config::{Config, ConfigError, TransportChoice};
pub use element::Element;
pub use error::{Error, ErrorKind, Result};
pub use launch::{Launch, LaunchError, LaunchSource, RootSpec, SecretSource};
pub use runtime::root::RootHost;
pub use unique_id::UniqueId;
