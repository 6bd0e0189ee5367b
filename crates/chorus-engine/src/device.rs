//! The `Device` port: memory and arithmetic.
//!
//! The engine's algorithms never touch memory directly; they ask a `Device` to copy, reduce,
//! and turn a region into a [`Device::Payload`] for a [`crate::link::Link`] (and back). The
//! host device here works on `[u8]` with `Bytes` payloads; `chorus-cuda` implements it for
//! GPU memory. A `Link<D::Payload>` is what connects two ranks on devices of type `D`.
//!
//! Offsets and lengths are in bytes and must be multiples of the element size where a dtype
//! is involved; a region outside the memory is a [`DeviceError::OutOfBounds`], never a panic.

use std::ops::DerefMut;

use chorus_protocol::{DType, ReduceOp};

use crate::context::Context;

/// Memory and arithmetic for one rank.
pub trait Device: Send + Sync + 'static {
    /// Memory as the engine borrows it (`[u8]` on the host).
    type Mem: ?Sized + Send + Sync;
    /// An owned allocation (scratch space).
    type Owned: DerefMut<Target = Self::Mem> + Send + Sync;
    /// What travels over a link between two ranks on this kind of device.
    type Payload: Send + Sync + 'static;

    /// Short name for logs and errors (`host`, `cuda:0`).
    fn name(&self) -> &str;

    /// Length of `mem` in bytes.
    fn len(&self, mem: &Self::Mem) -> usize;

    /// A zeroed allocation of `bytes` bytes.
    fn alloc(&self, bytes: usize) -> Result<Self::Owned, DeviceError>;

    /// `dst[dst_off..][..len] = src[src_off..][..len]`.
    fn copy(
        &self,
        dst: &mut Self::Mem,
        dst_off: usize,
        src: &Self::Mem,
        src_off: usize,
        len: usize,
    ) -> Result<(), DeviceError>;

    /// Copy `len` bytes from `src_off` to `dst_off` within one memory (regions may overlap).
    fn copy_within(
        &self,
        mem: &mut Self::Mem,
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DeviceError>;

    /// `dst[i] = op(dst[i], src[i])` elementwise over `len` bytes of `dtype` elements.
    /// `op` is one of `Sum`, `Prod`, `Min`, `Max`; the engine composes `Avg` and
    /// `PreMulSum` from `Sum` and [`Device::scale`].
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        dst: &mut Self::Mem,
        dst_off: usize,
        src: &Self::Mem,
        src_off: usize,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError>;

    /// `mem[i] = mem[i] * factor` elementwise (integers: multiply then truncate toward zero;
    /// `Avg` passes `1/n`).
    fn scale(
        &self,
        mem: &mut Self::Mem,
        off: usize,
        len: usize,
        dtype: DType,
        factor: f64,
    ) -> Result<(), DeviceError>;

    /// `mem[i] = mem[i] / divisor` elementwise: the last step of `Avg`. Integers divide
    /// exactly, truncating toward zero (a float factor of `1/n` would be off by one for
    /// large values); floats divide in their own precision. The default goes through
    /// [`Device::scale`] with `1/divisor`, which is exact for floats only up to rounding.
    fn divide(
        &self,
        mem: &mut Self::Mem,
        off: usize,
        len: usize,
        dtype: DType,
        divisor: u32,
    ) -> Result<(), DeviceError> {
        self.scale(mem, off, len, dtype, 1.0 / f64::from(divisor))
    }

    /// `src[off..][..len]` as host bytes a link can write directly (see
    /// [`crate::link::Link::send_bytes`]), when this device's memory is host memory;
    /// `None` (the default) otherwise, and the engine packs a payload instead.
    fn host_bytes<'m>(
        &self,
        src: &'m Self::Mem,
        off: usize,
        len: usize,
    ) -> Option<Result<&'m [u8], DeviceError>> {
        let _ = (src, off, len);
        None
    }

    /// `dst[off..][..len]` as host bytes a link can receive into directly (see
    /// [`crate::link::Link::recv_into`]), when this device's memory is host memory;
    /// `None` (the default) otherwise, and the engine unpacks a payload instead.
    fn host_bytes_mut<'m>(
        &self,
        dst: &'m mut Self::Mem,
        off: usize,
        len: usize,
    ) -> Option<Result<&'m mut [u8], DeviceError>> {
        let _ = (dst, off, len);
        None
    }

    /// Whether [`Device::host_reduce`] computes `op` on `dtype`: when this device's memory
    /// is host memory and its kernel has that operator for that type. `false` (the
    /// default) makes the engine receive a payload and call [`Device::unpack_reduce`].
    fn reduces_host(&self, dtype: DType, op: ReduceOp) -> bool {
        let _ = (dtype, op);
        false
    }

    /// `dst[i] = op(dst[i], src[i])` on host bytes of equal length, a whole number of
    /// `dtype` elements, of any alignment: the kernel a link applies to the bytes it
    /// receives (see [`crate::link::Link::recv_reduce_into`]). Called only where
    /// [`Device::reduces_host`] said yes; the default refuses.
    fn host_reduce(
        &self,
        dst: &mut [u8],
        src: &[u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        let _ = (dst, src);
        Err(DeviceError::Unsupported { op, dtype })
    }

    /// A payload holding a copy of `src[off..][..len]`, for a link to send.
    fn pack(&self, src: &Self::Mem, off: usize, len: usize) -> Result<Self::Payload, DeviceError>;

    /// Length of a payload in bytes.
    fn payload_len(&self, payload: &Self::Payload) -> usize;

    /// `dst[off..][..payload_len] = payload`.
    fn unpack(
        &self,
        dst: &mut Self::Mem,
        off: usize,
        payload: &Self::Payload,
    ) -> Result<(), DeviceError>;

    /// `dst[off + i] = op(dst[off + i], payload[i])`, the reduction of a received payload.
    fn unpack_reduce(
        &self,
        dst: &mut Self::Mem,
        off: usize,
        payload: &Self::Payload,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError>;

    /// [`Device::unpack`] as part of operation `op` (its context): the form the engine calls,
    /// so that a device that judges at [`Device::settle`] what each operation read (a GPU,
    /// whose reads an abort can leave partial) keeps each operation's record apart from the
    /// others'. By default, `unpack`.
    fn unpack_for(
        &self,
        op: &Context,
        dst: &mut Self::Mem,
        off: usize,
        payload: &Self::Payload,
    ) -> Result<(), DeviceError> {
        let _ = op;
        self.unpack(dst, off, payload)
    }

    /// [`Device::unpack_reduce`] as part of operation `op`, as [`Device::unpack_for`].
    #[allow(clippy::too_many_arguments)]
    fn unpack_reduce_for(
        &self,
        op: &Context,
        dst: &mut Self::Mem,
        off: usize,
        payload: &Self::Payload,
        dtype: DType,
        reduce: ReduceOp,
    ) -> Result<(), DeviceError> {
        let _ = op;
        self.unpack_reduce(dst, off, payload, dtype, reduce)
    }

    /// Operation `op` ended without a successful [`Device::settle`] (it failed, and says its
    /// output is partial): drop whatever the device recorded for it, so that no later
    /// operation is judged by it. By default, nothing.
    fn forget(&self, op: &Context) {
        let _ = op;
    }

    /// Wait until the work this rank's device calls have queued is done, or say why it
    /// cannot be. The engine calls it once at the end of every operation whose sends and
    /// receives all succeeded, and reports `Ok` only if it returns `Ok`: a device that queues
    /// work (GPU streams) must not let a caller read or free a buffer that is still being
    /// written, nor call data good that a retired device wait left partial.
    ///
    /// `op` is the operation's context. The wait must be bounded, and should end promptly
    /// once `op` is aborted (the engine then reports the abort, not this error). The host
    /// device finishes every call before it returns, so the default does nothing. A failed
    /// operation is reported without settling: its queued work ends with its links.
    fn settle(&self, op: &Context) -> Result<(), DeviceError> {
        let _ = op;
        Ok(())
    }
}

/// Why a device operation failed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DeviceError {
    /// A region fell outside its memory.
    #[error("region {off}+{len} outside memory of {size} bytes")]
    OutOfBounds {
        /// The region's start, in bytes.
        off: usize,
        /// The region's length, in bytes.
        len: usize,
        /// The memory's size, in bytes.
        size: usize,
    },
    /// A length or offset is not a whole number of elements.
    #[error("{len} bytes is not a whole number of {dtype} elements")]
    Misaligned {
        /// The length or offset, in bytes.
        len: usize,
        /// The element type it should be a multiple of.
        dtype: DType,
    },
    /// The device cannot apply this operator to this type.
    #[error("{op} is not supported for {dtype} on this device")]
    Unsupported {
        /// The operator asked for.
        op: ReduceOp,
        /// The element type asked for.
        dtype: DType,
    },
    /// Allocation failed.
    #[error("cannot allocate {bytes} bytes: {detail}")]
    OutOfMemory {
        /// The size asked for, in bytes.
        bytes: usize,
        /// The allocator's or driver's error.
        detail: String,
    },
    /// The device (driver, runtime) is not there or failed.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// A device-side wait passed its deadline or was aborted.
    #[error("device wait ended: {0}")]
    Wait(String),
}
