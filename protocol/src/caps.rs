//! Capability bits of `PeerInfo::caps` (SPEC.md, "Capabilities"). A member sets the bits of
//! what it can do; peers use the intersection. Unknown bits are ignored, so a newer member's
//! capabilities never make an older one refuse it.

/// Speaks the TCP data plane (either backend: io_uring and epoll share the wire).
pub const TCP: u64 = 1 << 0;
/// Speaks the QUIC data plane.
pub const QUIC: u64 = 1 << 1;
/// Can exchange through shared memory with a same-host peer.
pub const SHM: u64 = 1 << 2;
/// Has a CUDA device for its buffers.
pub const CUDA: u64 = 1 << 3;
/// Can map a same-host peer's device buffers through CUDA IPC handles.
pub const CUDA_IPC: u64 = 1 << 4;

/// Every bit this version defines.
pub const KNOWN: u64 = TCP | QUIC | SHM | CUDA | CUDA_IPC;
