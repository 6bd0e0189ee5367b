//! `MappedHost`: pinned host memory the GPU reads and writes directly (`cuMemHostAlloc` with
//! `DEVICEMAP`). Abort words live here, so the host sets them with a plain store that a
//! spinning kernel sees without any stream, copy or context call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cudarc::driver::{result, sys};

use crate::error::CudaError;
use crate::gpu::Gpu;

/// Pinned, device-mapped host memory, zeroed.
pub(crate) struct MappedHost {
    gpu: Arc<Gpu>,
    host: *mut u8,
    dev: u64,
    bytes: usize,
}

// SAFETY: the allocation is plain memory owned by this value; every access through it is
// atomic (words) or goes through `as_slice`/`as_mut_slice` under Rust's borrow rules.
unsafe impl Send for MappedHost {}
// SAFETY: as above; shared access only touches the words atomically.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    pub(crate) fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<Self, CudaError> {
        let bytes = bytes.max(64);
        gpu.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation; the pointer is checked below and freed once in Drop.
        let host =
            unsafe { result::malloc_host(bytes, flags) }.map_err(|e| CudaError::OutOfMemory {
                bytes,
                detail: format!("cuMemHostAlloc: {e:?}"),
            })? as *mut u8;
        if host.is_null() {
            return Err(CudaError::OutOfMemory {
                bytes,
                detail: "cuMemHostAlloc returned null".into(),
            });
        }
        // SAFETY: `host` points at `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in the current context.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) }.result();
        let mapped = MappedHost {
            gpu: gpu.clone(),
            host,
            dev,
            bytes,
        };
        r.map_err(|e| CudaError::driver("cuMemHostGetDevicePointer", e))?;
        Ok(mapped)
    }

    /// The device address of byte `offset`.
    pub(crate) fn device_ptr(&self, offset: usize) -> u64 {
        debug_assert!(offset < self.bytes);
        self.dev + offset as u64
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.bytes,
            "word outside mapped memory"
        );
        // SAFETY: in bounds and aligned (checked above; the allocation is page aligned), and
        // the memory lives as long as `self`. The device may write it too; atomics make the
        // host side's accesses well defined.
        unsafe { AtomicU32::from_ptr(self.host.add(offset).cast()) }
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.bytes,
            "word outside mapped memory"
        );
        // SAFETY: as in `word32`.
        unsafe { AtomicU64::from_ptr(self.host.add(offset).cast()) }
    }

    pub(crate) fn store_u32(&self, offset: usize, v: u32) {
        self.word32(offset).store(v, Ordering::SeqCst);
    }

    pub(crate) fn load_u32(&self, offset: usize) -> u32 {
        self.word32(offset).load(Ordering::SeqCst)
    }

    pub(crate) fn load_u64(&self, offset: usize) -> u64 {
        self.word64(offset).load(Ordering::SeqCst)
    }

    /// The bytes, for staging copies. Only while no kernel writes them.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` bytes at `host` belong to this value, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes) }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.host, self.bytes) }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind() {
            tracing::warn!(error = %e, bytes = self.bytes, "mapped host memory leaked: no context to free it in");
            return;
        }
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once. Owners drain every
        // stream that could still read it before dropping it (or leak it instead).
        if let Err(e) = unsafe { result::free_host(self.host.cast()) } {
            tracing::warn!(error = ?e, "cuMemFreeHost failed");
        }
    }
}
