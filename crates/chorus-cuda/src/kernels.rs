//! The loaded kernels of `kernels/` and how each is launched.

use std::ffi::c_void;
use std::sync::Arc;

use chorus_engine::int_multiplier;
use chorus_protocol::{DType, ReduceOp};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, result};
use cudarc::nvrtc::Ptx;

use crate::compile::Image;
use crate::error::CudaError;
use crate::source;

/// Threads per block for the elementwise kernels.
pub(crate) const BLOCK: u32 = 256;
/// Resident blocks per multiprocessor the grid is sized for; grid-stride loops do the rest.
pub(crate) const BLOCKS_PER_SM: u32 = 16;

/// Function handles for every kernel, from one loaded module.
pub(crate) struct Kernels {
    reduce: Vec<CudaFunction>,
    scale: Vec<CudaFunction>,
    divide: Vec<CudaFunction>,
    copy: CudaFunction,
    put: CudaFunction,
    wait: CudaFunction,
    signal: CudaFunction,
    gate: CudaFunction,
    max_blocks: u32,
}

impl Kernels {
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        image: &Image,
        sm_count: u32,
    ) -> Result<Self, CudaError> {
        let module = ctx
            .load_module(Ptx::from_binary(image.bytes.clone()))
            .map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
        let get = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| CudaError::driver("cuModuleGetFunction", e))
        };
        let mut reduce = Vec::with_capacity(DType::ALL.len() * source::KERNEL_OPS.len());
        let mut scale = Vec::with_capacity(DType::ALL.len());
        let mut divide = Vec::with_capacity(DType::ALL.len());
        for dtype in DType::ALL {
            for op in source::KERNEL_OPS {
                // KERNEL_OPS are exactly the operators with kernels.
                let name = source::reduce_kernel(op, dtype).unwrap_or_default();
                reduce.push(get(&name)?);
            }
            scale.push(get(&source::scale_kernel(dtype))?);
            divide.push(get(&source::divide_kernel(dtype))?);
        }
        Ok(Kernels {
            reduce,
            scale,
            divide,
            copy: get(source::COPY)?,
            put: get(source::PUT)?,
            wait: get(source::WAIT)?,
            signal: get(source::SIGNAL)?,
            gate: get(source::GATE)?,
            max_blocks: sm_count.saturating_mul(BLOCKS_PER_SM).max(1),
        })
    }

    /// `dst[i] = op(dst[i], src[i])` for `n` elements, on `stream`.
    pub(crate) fn reduce(
        &self,
        stream: &CudaStream,
        dtype: DType,
        op: ReduceOp,
        dst: u64,
        src: u64,
        n: u64,
    ) -> Result<(), CudaError> {
        let Some(k) = source::KERNEL_OPS.iter().position(|&o| o == op) else {
            return Err(CudaError::Invalid(format!("{op} has no reduce kernel")));
        };
        if n == 0 {
            return Ok(());
        }
        let f = &self.reduce[dtype.code() as usize * source::KERNEL_OPS.len() + k];
        let units = (n * dtype.size() as u64).div_ceil(16);
        let (mut d, mut s, mut n) = (dst, src, n);
        launch(
            stream,
            f,
            self.grid(units),
            BLOCK,
            &mut [arg(&mut d), arg(&mut s), arg(&mut n)],
        )
    }

    /// `mem[i] = mem[i] * factor` for `n` elements (integers: a wrapping multiply when the
    /// factor is integral and below 2^63, as on the host).
    pub(crate) fn scale(
        &self,
        stream: &CudaStream,
        dtype: DType,
        mem: u64,
        n: u64,
        factor: f64,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let f = &self.scale[dtype.code() as usize];
        let (mut multiplier, mut exact) = match int_multiplier(factor) {
            // The kernel truncates the i64's bits to the element's width, as the host does.
            Some(m) => (m as u64, 1u64),
            None => (0, 0),
        };
        let (mut m, mut n_, mut fa) = (mem, n, factor);
        launch(
            stream,
            f,
            self.grid(n),
            BLOCK,
            &mut [
                arg(&mut m),
                arg(&mut n_),
                arg(&mut fa),
                arg(&mut multiplier),
                arg(&mut exact),
            ],
        )
    }

    /// `mem[i] = mem[i] / divisor` for `n` elements (a divisor of 0 counts as 1).
    pub(crate) fn divide(
        &self,
        stream: &CudaStream,
        dtype: DType,
        mem: u64,
        n: u64,
        divisor: u32,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let f = &self.divide[dtype.code() as usize];
        let (mut m, mut n_, mut d) = (mem, n, u64::from(divisor.max(1)));
        launch(
            stream,
            f,
            self.grid(n),
            BLOCK,
            &mut [arg(&mut m), arg(&mut n_), arg(&mut d)],
        )
    }

    /// Copy `bytes` between non-overlapping device regions.
    pub(crate) fn copy(
        &self,
        stream: &CudaStream,
        dst: u64,
        src: u64,
        bytes: u64,
    ) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        let (mut d, mut s, mut b) = (dst, src, bytes);
        launch(
            stream,
            &self.copy,
            self.grid(bytes.div_ceil(16)),
            BLOCK,
            &mut [arg(&mut d), arg(&mut s), arg(&mut b)],
        )
    }

    /// Copy `bytes` into a link's slot unless the send stream's `skip` word is set.
    pub(crate) fn put(
        &self,
        stream: &CudaStream,
        dst: u64,
        src: u64,
        bytes: u64,
        skip: u64,
    ) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        let (mut d, mut s, mut b, mut k) = (dst, src, bytes, skip);
        launch(
            stream,
            &self.put,
            self.grid(bytes.div_ceil(16)),
            BLOCK,
            &mut [arg(&mut d), arg(&mut s), arg(&mut b), arg(&mut k)],
        )
    }

    /// Hold `stream` until `*flag >= target` or the abort word is set (then record
    /// `generation` as the first retired one in `retired`, host memory, and `retired_dev`,
    /// device memory).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait(
        &self,
        stream: &CudaStream,
        flag: u64,
        target: u64,
        abort: u64,
        retired: u64,
        generation: u64,
        retired_dev: u64,
    ) -> Result<(), CudaError> {
        let (mut f, mut t, mut a, mut r, mut g, mut d) =
            (flag, target, abort, retired, generation, retired_dev);
        launch(
            stream,
            &self.wait,
            1,
            1,
            &mut [
                arg(&mut f),
                arg(&mut t),
                arg(&mut a),
                arg(&mut r),
                arg(&mut g),
                arg(&mut d),
            ],
        )
    }

    /// Set `*flag = value` after everything queued before it on `stream`, unless `skip` (0:
    /// never) is set.
    pub(crate) fn signal(
        &self,
        stream: &CudaStream,
        flag: u64,
        value: u64,
        skip: u64,
    ) -> Result<(), CudaError> {
        let (mut f, mut v, mut k) = (flag, value, skip);
        launch(
            stream,
            &self.signal,
            1,
            1,
            &mut [arg(&mut f), arg(&mut v), arg(&mut k)],
        )
    }

    /// Set `*skip` if `*taint` (a link's first retired receive) is at or before `taint_gen`.
    pub(crate) fn gate(
        &self,
        stream: &CudaStream,
        skip: u64,
        taint: u64,
        taint_gen: u64,
    ) -> Result<(), CudaError> {
        let (mut s, mut t, mut g) = (skip, taint, taint_gen);
        launch(
            stream,
            &self.gate,
            1,
            1,
            &mut [arg(&mut s), arg(&mut t), arg(&mut g)],
        )
    }

    fn grid(&self, units: u64) -> u32 {
        grid_for(units, self.max_blocks)
    }
}

/// Blocks for `units` pieces of work of one thread each, at most `max_blocks`.
pub(crate) fn grid_for(units: u64, max_blocks: u32) -> u32 {
    let blocks = units
        .div_ceil(BLOCK as u64)
        .clamp(1, max_blocks.max(1) as u64);
    blocks as u32
}

fn arg<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
    // SAFETY: `f` comes from the module loaded into this stream's context and stays loaded
    // while `Kernels` lives; `params` points at one local of the kernel's exact parameter
    // type (u64 for pointers and counts, f64 for factors) per parameter, in order, and the
    // driver copies them before returning. Callers pass device addresses valid for the sizes
    // given, which the device checks against each region's bounds before calling.
    unsafe {
        result::launch_kernel(
            f.cu_function(),
            (grid, 1, 1),
            (block, 1, 1),
            0,
            stream.cu_stream(),
            params,
        )
    }
    .map_err(|e| CudaError::driver("cuLaunchKernel", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_small_work_with_one_block_and_cap_large_work() {
        assert_eq!(grid_for(0, 2112), 1);
        assert_eq!(grid_for(1, 2112), 1);
        assert_eq!(grid_for(256, 2112), 1);
        assert_eq!(grid_for(257, 2112), 2);
        assert_eq!(grid_for(1 << 30, 132 * BLOCKS_PER_SM), 2112);
        assert_eq!(grid_for(10, 0), 1);
    }
}
