//! chorus-cuda: the GPU `Device` for the engine, through cudarc with dynamic loading.
//!
//! Floor 3 of the house (`DESIGN.md`): device buffers, streams, events, and the kernels of
//! `kernels/` compiled by NVRTC at first use. Device-side waits poll an abort word in mapped
//! pinned host memory, so aborting a communicator retires kernels already on the stream.
//!
//! It may depend on `chorus-protocol` and `chorus-engine`; never on `chorus-control`,
//! `chorus-transport`, `chorus` or the CLI. It must build and test on a machine without CUDA.
