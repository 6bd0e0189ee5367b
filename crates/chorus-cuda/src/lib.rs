//! chorus-cuda: the GPU `Device` for the engine, through cudarc with dynamic loading.
//!
//! Floor 3 of the house (`docs/ARCHITECTURE.md`): device buffers, streams, events, and the kernels
//! of `kernels/` compiled by NVRTC at first use. Device-side waits poll an abort word in mapped
//! pinned host memory, so aborting a communicator retires kernels already on the stream.
//!
//! It may depend on `chorus-protocol` and `chorus-engine`; never on `chorus-control`,
//! `chorus-transport`, `chorus` or the CLI. It must build and test on a machine without CUDA:
//! nothing here links against CUDA, and [`probe::libraries`] finds the driver and NVRTC
//! before cudarc would panic on their absence, answering [`CudaError::DeviceUnavailable`].
//!
//! - [`CudaDevice`]: one rank's GPU (`Device` with `Mem = GpuMem`, `Payload = GpuPayload`).
//! - [`DeviceLink`]: `Link<GpuPayload>` between two ranks on one GPU, threads or processes;
//!   [`local::connect_all`] joins N ranks in one process.
//! - The engine's completion, [`chorus_engine::Device::settle`] ([`CudaDevice::settle_unless`]):
//!   a bounded, abort-aware wait for the main stream at the end of every operation, which
//!   also fails the operation if an abort kept any of the bytes it read from arriving.
//! - [`StagedLink`]: `Link<GpuPayload>` over a host link (tcp, quic, shm) for peers on
//!   another GPU or host, by the schedule of [`staging`].
//! - [`CallerStream`] with [`CudaDevice::order_after`] and [`CudaDevice::complete_on`]: a
//!   rank's work ordered after the caller's stream, and its completion recorded on it.
//! - [`CudaDevice::synchronize`]: the bounded wait for everything a rank queued, its links'
//!   streams included.
//!
//! The non-default `testkit` feature adds `testing` (find a GPU or print the skip line, a
//! minimal executor, worlds of engines over device links with a watchdog) and
//! `DeviceLink::freeze_for_test` / `receive_stream_for_test`, for this crate's tests, its `gpu_bench` example and the
//! device check (`kernels/check.sh`). Test support only: never enable it in a library or
//! binary.

mod allocator;
pub mod cache;
pub mod compile;
mod credit;
pub mod device;
pub mod error;
pub mod gpu;
mod health;
pub mod host_frame;
mod kernels;
pub mod link;
pub mod local;
mod mapped;
pub mod memory;
mod ordering;
pub mod payload;
mod pool;
pub mod probe;
pub mod reference;
mod region;
pub mod source;
pub mod staged;
pub mod staging;
mod sync;
#[cfg(feature = "testkit")]
pub mod testing;

pub use device::CudaDevice;
pub use error::CudaError;
pub use gpu::Gpu;
pub use link::{DeviceLink, LinkConfig};
pub use memory::{GpuBuffer, GpuMem};
pub use ordering::CallerStream;
pub use payload::GpuPayload;
pub use staged::{StagedConfig, StagedLink};
