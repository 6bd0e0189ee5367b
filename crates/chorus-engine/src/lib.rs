//! chorus-engine: the transport-independent collective engine.
//!
//! Floor 2 of the house (`docs/ARCHITECTURE.md`). Algorithms (ring, recursive halving/doubling,
//! trees), chunk pipelining, operation contexts and the abort tree; it owns the two ports through
//! which it touches the world: [`link::Link`] (one peer) and [`device::Device`] (memory and
//! reductions), with a host device ([`host_device::HostDevice`]) and an in-process link
//! ([`local::LocalLink`]) for its own tests and benchmarks.
//!
//! It must never depend on tokio, quinn, io-uring, cudarc, sockets or `chorus-control`: its
//! async code runs on any executor, and it learns about failures only through its operation
//! contexts and its links. Deadlines come from whoever owns a clock, through an abort.
//!
//! The runtime's entry point is [`Engine`]: build one per communicator with
//! [`Engine::new`], run [`Op`]s with [`Engine::run`] or [`Engine::group`], abort through
//! [`Engine::context`], watch [`Engine::running`].
//!
//! The non-default `testkit` feature adds the `testkit` module: the collective matrix's
//! cases, inputs and sequential reference, and worlds of host engines. It is a cargo
//! feature rather than `cfg(test)` so that device crates' tests (chorus-cuda's GPU matrix)
//! run the same cases against the same oracle. Test support only: never enable it in a
//! library or binary.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algo;
mod collective;
pub mod config;
pub mod context;
pub mod device;
pub mod engine;
pub mod error;
pub mod fp8;
pub mod host_device;
mod idmap;
mod kernel;
pub mod link;
pub mod local;
pub mod op;
mod pool;
pub mod progress;
mod run;
pub mod select;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use config::{Algorithm, EngineConfig, NETWORK_CHUNK_BYTES, Overrides, Thresholds};
pub use context::{AbortReason, Aborted, Context};
pub use device::{Device, DeviceError};
pub use engine::{Engine, P2P_SEQ_BIT};
pub use error::{EngineError, OpError, OpErrorKind};
pub use host_device::{HostBuffer, HostDevice};
pub use kernel::int_multiplier;
pub use link::{CancelReason, Link, LinkError, LinkFuture, Tag};
pub use local::{HeldLimit, LocalLink};
pub use op::{Buffer, Op, Reduction};
pub use progress::{OpObserver, OpProgress, OpSnapshot};

/// Host reductions on byte slices, for benchmarks and for devices that stage through host
/// memory: `dst[i] = op(dst[i], src[i])` for `Sum`, `Prod`, `Min` and `Max`.
pub fn host_reduce(
    dst: &mut [u8],
    src: &[u8],
    dtype: chorus_protocol::DType,
    op: chorus_protocol::ReduceOp,
) -> Result<(), DeviceError> {
    same_elements(dst, src, dtype)?;
    kernel::reduce(dst, src, dtype, op)
}

/// [`host_reduce`] on the portable loops whatever the CPU has: the reference the vectorised
/// kernels for the 16- and 8-bit floats are tested against, and the baseline the `reduce`
/// benchmark shows them beside. The same bits as [`host_reduce`], only slower.
pub fn host_reduce_portable(
    dst: &mut [u8],
    src: &[u8],
    dtype: chorus_protocol::DType,
    op: chorus_protocol::ReduceOp,
) -> Result<(), DeviceError> {
    same_elements(dst, src, dtype)?;
    kernel::reduce_on(kernel::Path::Portable, dst, src, dtype, op)
}

fn same_elements(dst: &[u8], src: &[u8], dtype: chorus_protocol::DType) -> Result<(), DeviceError> {
    if dst.len() != src.len() {
        return Err(DeviceError::OutOfBounds {
            off: 0,
            len: src.len(),
            size: dst.len(),
        });
    }
    if !dst.len().is_multiple_of(dtype.size()) {
        return Err(DeviceError::Misaligned {
            len: dst.len(),
            dtype,
        });
    }
    Ok(())
}
