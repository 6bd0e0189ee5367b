//! The stream-ordered allocator of one rank's main stream: device memory from chorus's pool
//! (`pool.rs`: `cuMemAllocFromPoolAsync`), usable by work queued after the allocation, and freed in order behind
//! everything queued before the free (`cuMemFreeAsync`). Buffers and payloads hold it to
//! free themselves; it knows nothing of them.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, result};

use crate::error::CudaError;
use crate::gpu::Gpu;

/// Allocations in order on one stream of one GPU.
pub(crate) struct StreamAllocator {
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
}

impl StreamAllocator {
    pub(crate) fn new(gpu: Arc<Gpu>, stream: Arc<CudaStream>) -> Self {
        StreamAllocator { gpu, stream }
    }

    /// The GPU the allocations are on.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The stream the allocations are ordered on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `bytes` bytes from the device's pool, in order on the stream (0 for none).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<u64, CudaError> {
        if bytes == 0 {
            return Ok(0);
        }
        self.gpu.bind()?;
        // SAFETY: the stream belongs to this (bound) context; the memory is used only by
        // work ordered after this call on the stream, or on streams made to wait for it.
        unsafe { self.gpu.pool.alloc(&self.stream, bytes) }.map_err(|e| CudaError::OutOfMemory {
            bytes,
            detail: format!("cuMemAllocFromPoolAsync: {e:?}"),
        })
    }

    /// Free `ptr` in order on the stream, after `after` if given. Errors are logged: this
    /// runs from destructors.
    pub(crate) fn free(&self, ptr: u64, after: Option<&CudaEvent>) {
        if ptr == 0 {
            return;
        }
        let r = self.gpu.bind().and_then(|()| {
            if let Some(ev) = after {
                self.stream
                    .wait(ev)
                    .map_err(|e| CudaError::driver("cuStreamWaitEvent", e))?;
            }
            // SAFETY: `ptr` came from cuMemAllocFromPoolAsync in this context and is freed once;
            // every use of it is ordered before this point on the stream (directly, or
            // through `after`).
            unsafe { result::free_async(ptr, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("cuMemFreeAsync", e))
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "freeing device memory failed; leaking it");
        }
    }
}
