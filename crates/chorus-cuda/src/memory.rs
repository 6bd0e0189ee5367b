//! Device memory as the engine borrows it (`GpuMem`) and owns it (`GpuBuffer`).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use chorus_engine::device::DeviceError;
use cudarc::driver::result;

use crate::allocator::StreamAllocator;
use crate::error::CudaError;

/// A region of device memory on one GPU: an address and a length. This is the engine's
/// `Device::Mem` for [`crate::CudaDevice`]; offsets into it are checked, never trusted.
#[derive(Debug)]
pub struct GpuMem {
    ptr: u64,
    len: usize,
}

impl GpuMem {
    /// Borrow `len` bytes of device memory at `ptr` (from `cudaMalloc`, a framework's
    /// allocator, or [`GpuBuffer`]).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory of the GPU the region is used with, valid and
    /// not freed for as long as any work queued on it may run.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> GpuMem {
        GpuMem { ptr, len }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of `self[off..off + len]`, or `OutOfBounds`.
    pub(crate) fn at(&self, off: usize, len: usize) -> Result<u64, DeviceError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr + off as u64),
            _ => Err(DeviceError::OutOfBounds {
                off,
                len,
                size: self.len,
            }),
        }
    }
}

/// An owned, stream-ordered allocation on a device's main stream, freed on that stream when
/// dropped (after everything queued on it before).
pub struct GpuBuffer {
    mem: GpuMem,
    alloc: Arc<StreamAllocator>,
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer").field("mem", &self.mem).finish()
    }
}

impl GpuBuffer {
    /// `bytes` zeroed bytes, allocated and cleared in order on the device's main stream.
    pub(crate) fn zeroed(
        alloc: &Arc<StreamAllocator>,
        bytes: usize,
    ) -> Result<GpuBuffer, CudaError> {
        let ptr = alloc.alloc(bytes)?;
        let buf = GpuBuffer {
            mem: GpuMem { ptr, len: bytes },
            alloc: alloc.clone(),
        };
        if bytes > 0 {
            // SAFETY: `ptr` holds `bytes` bytes allocated on this stream just above.
            unsafe { result::memset_d8_async(ptr, 0, bytes, alloc.stream().cu_stream()) }
                .map_err(|e| CudaError::driver("cuMemsetD8Async", e))?;
        }
        Ok(buf)
    }
}

impl Deref for GpuBuffer {
    type Target = GpuMem;
    fn deref(&self) -> &GpuMem {
        &self.mem
    }
}

impl DerefMut for GpuBuffer {
    fn deref_mut(&mut self) -> &mut GpuMem {
        &mut self.mem
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        self.alloc.free(self.mem.ptr, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_outside_the_memory_are_errors_not_panics() {
        // SAFETY: the address is never dereferenced; only bounds are computed.
        let m = unsafe { GpuMem::from_raw(0x1000, 64) };
        assert_eq!(m.at(0, 64), Ok(0x1000));
        assert_eq!(m.at(16, 16), Ok(0x1010));
        assert_eq!(
            m.at(60, 8),
            Err(DeviceError::OutOfBounds {
                off: 60,
                len: 8,
                size: 64
            })
        );
        assert!(m.at(usize::MAX, 2).is_err());
        assert_eq!(m.at(64, 0), Ok(0x1040));
    }
}
