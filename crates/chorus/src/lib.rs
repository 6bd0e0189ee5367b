//! chorus: the collective communication library a training framework embeds.
//!
//! Floor 4 of the house (`docs/ARCHITECTURE.md`): `Comm` (init, collectives, split, shrink, grow,
//! abort, destroy, health), the runtime that drives `chorus-control` over real transports on a
//! control thread nothing else can block, launch-environment detection and the flight recorder. It
//! wires the floors below together; it must never depend on the CLI, the benches or the tests.

#![warn(missing_docs)]
// `Error` carries its structured fields inline (rank, peer, op, step, evidence, ...): it is
// built only on the failure path, where a 136-byte move is nothing next to what failed.
#![allow(clippy::result_large_err)]

mod comm;
pub mod config;
mod element;
pub mod error;
mod introspection;
pub mod launch;
mod recorder;
mod runtime;
mod signal;
pub mod status;
#[cfg(test)]
mod testkit;
pub mod unique_id;

/// Collectives on CUDA device memory, ordered on the caller's stream (the `cuda` feature):
/// [`Comm::cuda`] makes a [`cuda::CudaComm`] of a communicator's members; device memory is
/// borrowed with [`cuda::GpuMem::from_raw`] and streams with [`cuda::Stream::from_raw`].
/// CUDA is loaded at run time: without a driver, `Comm::cuda` fails with
/// [`ErrorKind::Device`] on every member.
#[cfg(feature = "cuda")]
pub mod cuda {
    pub use crate::comm::cuda::{CudaComm, CudaOptions, probe};
    pub use chorus_cuda::CallerStream as Stream;
    pub use chorus_cuda::GpuMem;
    pub use chorus_cuda::{LinkConfig, StagedConfig};
}

pub use chorus_control::Quorum;
pub use chorus_engine::{Buffer, Op, Reduction};
pub use chorus_protocol::JobSecret;
pub use chorus_protocol::message::Evidence;
/// The newtypes the raw-operation API ([`Op`]) and the status client ([`status`]) speak;
/// everywhere else ranks and epochs are plain `u32` and `u64`.
pub use chorus_protocol::{CloseCode, Collective, CommId, DType, Epoch, Rank};
pub use comm::{Blocking, Comm};
pub use config::{Config, ConfigError, TransportChoice};
pub use element::Element;
pub use error::{Error, ErrorKind, Result};
pub use introspection::{
    Health, HeartbeatLateness, Member, OpPhase, PeerCondition, PeerHealth, RecentOp,
};
pub use launch::{Launch, LaunchError, LaunchSource, RootSpec, SecretSource};
pub use runtime::root::RootHost;
pub use runtime::root_link::RootLink;
pub use unique_id::UniqueId;
