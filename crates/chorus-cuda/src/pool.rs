//! `MemPool`: the device memory pool every stream-ordered allocation of chorus comes from
//! (buffers, payloads, link regions in one process), private to chorus.
//!
//! Not the device's default pool: that one is the process's (the framework chorus is
//! embedded in allocates from it too), and setting its attributes would change how that
//! framework's memory behaves. Two attributes are set on ours:
//! - the release threshold, to the maximum: by default a pool hands memory back to the
//!   driver at every synchronisation, which would make each collective pay for fresh
//!   allocations;
//! - reuse with internal dependencies, off: with it on, the pool may serve an allocation on
//!   one stream with memory freed on another by making the first wait for the second, and a
//!   hidden wait on a link stream blocked on an absent peer is a stream that never drains.
//!   Memory is reused only where the stream order already allows it.

use std::ffi::c_int;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use crate::error::CudaError;

/// A private, stream-ordered device memory pool.
pub(crate) struct MemPool {
    pool: sys::CUmemoryPool,
}

// SAFETY: a pool handle is a driver object usable from any thread; this type only passes it
// to the driver, which synchronises internally.
unsafe impl Send for MemPool {}
// SAFETY: as above; no method mutates the handle itself.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// A new pool on `ctx`'s device, with the attributes above.
    pub(crate) fn new(ctx: &CudaContext) -> Result<MemPool, CudaError> {
        if !ctx.has_async_alloc() {
            return Err(CudaError::DeviceUnavailable(format!(
                "cuda:{} has no stream-ordered allocator",
                ctx.ordinal()
            )));
        }
        // SAFETY: all-zero is a valid value of this plain C struct (no handle types, no
        // security attributes, no size limit); the fields that matter are set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as c_int;
        // SAFETY: `props` is a valid, initialised pool description that outlives the call.
        let pool = unsafe { result::mem_pool::create(&props) }
            .map_err(|e| CudaError::driver("cuMemPoolCreate", e))?;
        let pool = MemPool { pool };
        let mut threshold = u64::MAX;
        let mut reuse_internal: c_int = 0;
        // SAFETY: a live pool; each value has the type its attribute takes (cuuint64_t and
        // int) and outlives the call.
        unsafe {
            result::mem_pool::set_attribute(
                pool.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
            .map_err(|e| CudaError::driver("cuMemPoolSetAttribute", e))?;
            result::mem_pool::set_attribute(
                pool.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                (&mut reuse_internal as *mut c_int).cast(),
            )
            .map_err(|e| CudaError::driver("cuMemPoolSetAttribute", e))?;
        }
        Ok(pool)
    }

    /// `bytes` bytes from the pool, in order on `stream`.
    ///
    /// # Safety
    /// The context owning `stream` and this pool must be current; the memory may be used only
    /// by work ordered after this call on `stream` (or on streams made to wait for it), and
    /// must be freed once (`cuMemFreeAsync`).
    pub(crate) unsafe fn alloc(
        &self,
        stream: &CudaStream,
        bytes: usize,
    ) -> Result<u64, DriverError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is valid for writes; the rest is the caller's promise.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool, stream.cu_stream()) }
            .result()?;
        Ok(ptr)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // SAFETY: created by cuMemPoolCreate and destroyed once; the GPU that owns it is
        // dropped only when nothing allocated from it is in use.
        if let Err(e) = unsafe { result::mem_pool::destroy(self.pool) } {
            tracing::warn!(error = ?e, "destroying the memory pool failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::gpu_or_skip;

    fn attr<T: Default>(pool: sys::CUmemoryPool, a: sys::CUmemPool_attribute) -> T {
        let mut v = T::default();
        // SAFETY: a live pool; `v` has the attribute's type and outlives the call.
        unsafe { result::mem_pool::get_attribute(pool, a, (&mut v as *mut T).cast()) }.unwrap();
        v
    }

    #[test]
    fn chorus_allocates_from_its_own_pool_and_leaves_the_default_one_alone() {
        let Some(gpu) = gpu_or_skip("GPU tests") else {
            return;
        };
        use sys::CUmemPool_attribute as A;
        let ours = &gpu.pool;
        assert_eq!(
            attr::<u64>(ours.pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
            u64::MAX
        );
        assert_eq!(
            attr::<c_int>(
                ours.pool,
                A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
            ),
            0
        );
        // SAFETY: the device handle comes from a live context.
        let default = unsafe { result::device::get_default_mem_pool(gpu.ctx.cu_device()) }.unwrap();
        assert_ne!(default, ours.pool);
        assert_eq!(
            attr::<u64>(default, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
            0,
            "the process's default pool keeps the driver's default"
        );
    }
}
