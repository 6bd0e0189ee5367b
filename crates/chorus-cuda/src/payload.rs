//! `GpuPayload`: what a device link carries between two ranks on one GPU.

use std::sync::Arc;

use cudarc::driver::CudaEvent;

use crate::allocator::StreamAllocator;
use crate::health::LinkHealth;

/// A copy of some device memory, in a stream-ordered allocation, with the event after which
/// its bytes are complete. Whoever reads it makes their stream wait on that event first;
/// dropping it frees the memory in order behind that event.
pub struct GpuPayload {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) ready: Option<CudaEvent>,
    /// Frees the allocation, in order behind `ready`.
    pub(crate) alloc: Arc<StreamAllocator>,
    /// For a payload received through a device link: that link, and the generation of the
    /// last message it was made of (an abort may have retired the waits for its bytes).
    pub(crate) origin: Option<Origin>,
}

/// The link a payload came through and its last message's generation.
pub(crate) type Origin = (Arc<LinkHealth>, u64);

impl std::fmt::Debug for GpuPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPayload")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl GpuPayload {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Take the allocation out; the caller frees it (in stream order).
    pub(crate) fn take(mut self) -> (u64, usize, Option<CudaEvent>, Option<Origin>) {
        let ptr = std::mem::take(&mut self.ptr);
        (ptr, self.len, self.ready.take(), self.origin.take())
    }
}

impl Drop for GpuPayload {
    fn drop(&mut self) {
        if self.ptr != 0 {
            self.alloc.free(self.ptr, self.ready.as_ref());
        }
        if let Some(ready) = self.ready.take() {
            // cudarc stores a failed cuEventDestroy in the context: say whose it was.
            drop(ready);
            self.alloc
                .gpu()
                .take_stored_error("destroying a payload's event");
        }
    }
}
