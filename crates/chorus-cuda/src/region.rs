//! The device memory one side of a device link writes: its outgoing slots, two counters and
//! two retirement records.
//!
//! Layout: `ready` (messages this side has put in its slots) at byte 0, `send_skip` (the
//! first send whose wait for a free slot was retired by an abort; from then on this side
//! puts and signals nothing) at byte 64, `consumed` (messages this side has taken out of the
//! peer's slots) at byte 128, `recv_retired` (the first message this side stopped waiting
//! for) at byte 192, then `slots` slots of `slot_bytes` each from byte 256. Counters only
//! grow, records are written once, and each word has one writer. The peer reads `ready` and
//! the slots only.

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::{Arc, OnceLock, Weak};

use cudarc::driver::{CudaStream, result, sys};
use parking_lot::Mutex;

use crate::error::CudaError;
use crate::gpu::Gpu;

pub(crate) const READY: u64 = 0;
pub(crate) const SEND_SKIP: u64 = 64;
pub(crate) const CONSUMED: u64 = 128;
pub(crate) const RECV_RETIRED: u64 = 192;
pub(crate) const SLOTS: u64 = 256;

/// One side's region.
pub(crate) struct Region {
    gpu: Arc<Gpu>,
    pub(crate) ptr: u64,
    bytes: usize,
    /// Set for a region shared with another process (plain `cuMemAlloc`, exportable);
    /// otherwise the region is a stream-ordered allocation freed on `stream`.
    ipc: bool,
    stream: Arc<CudaStream>,
}

impl Region {
    /// A zeroed region of `bytes`, ready when `stream` has run what is queued on it.
    pub(crate) fn new(
        gpu: &Arc<Gpu>,
        stream: &Arc<CudaStream>,
        bytes: usize,
        ipc: bool,
    ) -> Result<Arc<Region>, CudaError> {
        gpu.bind()?;
        // SAFETY: plain allocations in the bound context; freed once in Drop.
        let ptr = unsafe {
            if ipc {
                result::malloc_sync(bytes)
            } else {
                gpu.pool.alloc(stream, bytes)
            }
        }
        .map_err(|e| CudaError::OutOfMemory {
            bytes,
            detail: format!("device link region: {e:?}"),
        })?;
        let region = Arc::new(Region {
            gpu: gpu.clone(),
            ptr,
            bytes,
            ipc,
            stream: stream.clone(),
        });
        // SAFETY: `ptr` holds `bytes` bytes; the memset is ordered on `stream`, which the
        // caller drains before sharing the region.
        unsafe { result::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }
            .map_err(|e| CudaError::driver("cuMemsetD8Async", e))?;
        if !ipc {
            registry().lock().insert(ptr, Arc::downgrade(&region));
        }
        Ok(region)
    }

    /// The region of a link end in this process, by its token (its address).
    pub(crate) fn lookup(token: u64) -> Option<Arc<Region>> {
        registry().lock().get(&token).and_then(Weak::upgrade)
    }

    /// The CUDA IPC handle of an exportable region.
    pub(crate) fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        self.gpu.bind()?;
        let mut handle = sys::CUipcMemHandle {
            reserved: [0 as c_char; 64],
        };
        // SAFETY: `ptr` is a cuMemAlloc allocation of this context; `handle` is writable.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }
            .result()
            .map_err(|e| CudaError::driver("cuIpcGetMemHandle", e))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if !self.ipc {
            registry().lock().remove(&self.ptr);
        }
        if let Err(e) = self.gpu.bind() {
            tracing::warn!(error = %e, bytes = self.bytes, "a device link region leaked: no context to free it in");
            return;
        }
        // SAFETY: allocated in `new` and freed once. Both ends drain every stream that used
        // the region before letting go of it (a link that cannot drain leaks its region).
        let r = unsafe {
            if self.ipc {
                result::free_sync(self.ptr)
            } else {
                result::free_async(self.ptr, self.stream.cu_stream())
            }
        };
        if let Err(e) = r {
            tracing::warn!(error = ?e, bytes = self.bytes, "freeing a device link region failed");
        }
    }
}

fn registry() -> &'static Mutex<HashMap<u64, Weak<Region>>> {
    static REGIONS: OnceLock<Mutex<HashMap<u64, Weak<Region>>>> = OnceLock::new();
    REGIONS.get_or_init(Default::default)
}

/// The peer's region, as this side reaches it.
pub(crate) enum PeerRegion {
    /// A peer in this process: its region, kept alive until both ends let go.
    Shared(Arc<Region>),
    /// A peer in another process: its region mapped through CUDA IPC.
    Mapped { gpu: Arc<Gpu>, ptr: u64 },
}

impl PeerRegion {
    pub(crate) fn open(gpu: &Arc<Gpu>, handle: [u8; 64]) -> Result<PeerRegion, CudaError> {
        gpu.bind()?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is writable; the handle came from the peer's cuIpcGetMemHandle and
        // the driver validates it.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(|e| CudaError::driver("cuIpcOpenMemHandle", e))?;
        Ok(PeerRegion::Mapped {
            gpu: gpu.clone(),
            ptr,
        })
    }

    pub(crate) fn ptr(&self) -> u64 {
        match self {
            PeerRegion::Shared(r) => r.ptr,
            PeerRegion::Mapped { ptr, .. } => *ptr,
        }
    }
}

impl Drop for PeerRegion {
    fn drop(&mut self) {
        if let PeerRegion::Mapped { gpu, ptr } = self {
            if let Err(e) = gpu.bind() {
                tracing::warn!(error = %e, "a peer's region stays mapped: no context to close it in");
                return;
            }
            // SAFETY: opened once in `open`; this side's streams are drained first.
            if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(*ptr) }.result() {
                tracing::warn!(error = ?e, "closing a peer's region failed");
            }
        }
    }
}
