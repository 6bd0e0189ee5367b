//! The host [`Device`]: CPU memory as `[u8]`, `Bytes` payloads (in recycled buffers, see
//! `pool.rs`), reductions from the private `kernel` module.

use std::ops::{Deref, DerefMut};

use bytes::Bytes;
use chorus_protocol::{DType, ReduceOp};

use crate::device::{Device, DeviceError};
use crate::kernel;
use crate::pool;

/// CPU memory. Stateless; share it freely.
#[derive(Copy, Clone, Default, Debug)]
pub struct HostDevice;

/// A zeroed host allocation, 8-byte aligned so every element type casts in place.
#[derive(Clone, Debug, Default)]
pub struct HostBuffer {
    words: Vec<u64>,
    len: usize,
}

impl HostBuffer {
    /// `bytes` zeroed bytes, or `OutOfMemory`.
    pub fn zeroed(bytes: usize) -> Result<Self, DeviceError> {
        let words_len = bytes.div_ceil(8);
        let mut words = Vec::new();
        words
            .try_reserve_exact(words_len)
            .map_err(|e| DeviceError::OutOfMemory {
                bytes,
                detail: e.to_string(),
            })?;
        words.resize(words_len, 0);
        Ok(HostBuffer { words, len: bytes })
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl Device for HostDevice {
    type Mem = [u8];
    type Owned = HostBuffer;
    type Payload = Bytes;

    fn name(&self) -> &str {
        "host"
    }

    fn len(&self, mem: &[u8]) -> usize {
        mem.len()
    }

    fn alloc(&self, bytes: usize) -> Result<HostBuffer, DeviceError> {
        HostBuffer::zeroed(bytes)
    }

    fn copy(
        &self,
        dst: &mut [u8],
        dst_off: usize,
        src: &[u8],
        src_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let s = region(src, src_off, len)?;
        region_mut(dst, dst_off, len)?.copy_from_slice(s);
        Ok(())
    }

    fn copy_within(
        &self,
        mem: &mut [u8],
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        region(mem, src_off, len)?;
        region(mem, dst_off, len)?;
        mem.copy_within(src_off..src_off + len, dst_off);
        Ok(())
    }

    fn reduce(
        &self,
        dst: &mut [u8],
        dst_off: usize,
        src: &[u8],
        src_off: usize,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        whole(len, dtype)?;
        let s = region(src, src_off, len)?;
        kernel::reduce(region_mut(dst, dst_off, len)?, s, dtype, op)
    }

    fn scale(
        &self,
        mem: &mut [u8],
        off: usize,
        len: usize,
        dtype: DType,
        factor: f64,
    ) -> Result<(), DeviceError> {
        whole(len, dtype)?;
        kernel::scale(region_mut(mem, off, len)?, dtype, factor)
    }

    fn divide(
        &self,
        mem: &mut [u8],
        off: usize,
        len: usize,
        dtype: DType,
        divisor: u32,
    ) -> Result<(), DeviceError> {
        whole(len, dtype)?;
        kernel::divide(region_mut(mem, off, len)?, dtype, divisor)
    }

    fn host_bytes<'m>(
        &self,
        src: &'m [u8],
        off: usize,
        len: usize,
    ) -> Option<Result<&'m [u8], DeviceError>> {
        Some(region(src, off, len))
    }

    fn host_bytes_mut<'m>(
        &self,
        dst: &'m mut [u8],
        off: usize,
        len: usize,
    ) -> Option<Result<&'m mut [u8], DeviceError>> {
        Some(region_mut(dst, off, len))
    }

    fn reduces_host(&self, dtype: DType, op: ReduceOp) -> bool {
        kernel::supports(dtype, op)
    }

    fn host_reduce(
        &self,
        dst: &mut [u8],
        src: &[u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        if dst.len() != src.len() {
            return Err(DeviceError::OutOfBounds {
                off: 0,
                len: src.len(),
                size: dst.len(),
            });
        }
        whole(src.len(), dtype)?;
        kernel::reduce(dst, src, dtype, op)
    }

    fn pack(&self, src: &[u8], off: usize, len: usize) -> Result<Bytes, DeviceError> {
        Ok(pool::copy(region(src, off, len)?))
    }

    fn payload_len(&self, payload: &Bytes) -> usize {
        payload.len()
    }

    fn unpack(&self, dst: &mut [u8], off: usize, payload: &Bytes) -> Result<(), DeviceError> {
        region_mut(dst, off, payload.len())?.copy_from_slice(payload);
        Ok(())
    }

    fn unpack_reduce(
        &self,
        dst: &mut [u8],
        off: usize,
        payload: &Bytes,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        whole(payload.len(), dtype)?;
        kernel::reduce(region_mut(dst, off, payload.len())?, payload, dtype, op)
    }
}

fn whole(len: usize, dtype: DType) -> Result<(), DeviceError> {
    if len.is_multiple_of(dtype.size()) {
        Ok(())
    } else {
        Err(DeviceError::Misaligned { len, dtype })
    }
}

fn region(mem: &[u8], off: usize, len: usize) -> Result<&[u8], DeviceError> {
    off.checked_add(len)
        .and_then(|end| mem.get(off..end))
        .ok_or(DeviceError::OutOfBounds {
            off,
            len,
            size: mem.len(),
        })
}

fn region_mut(mem: &mut [u8], off: usize, len: usize) -> Result<&mut [u8], DeviceError> {
    let size = mem.len();
    off.checked_add(len)
        .and_then(|end| mem.get_mut(off..end))
        .ok_or(DeviceError::OutOfBounds { off, len, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_errors_not_panics() {
        let d = HostDevice;
        let mut m = d.alloc(16).unwrap();
        assert_eq!(m.len(), 16);
        assert!(matches!(
            d.copy_within(&mut m, 8, 12, 8),
            Err(DeviceError::OutOfBounds { .. })
        ));
        assert!(matches!(
            d.pack(&m, usize::MAX, 2),
            Err(DeviceError::OutOfBounds { .. })
        ));
        let p = Bytes::from_static(&[1, 2, 3]);
        assert!(matches!(
            d.unpack_reduce(&mut m, 0, &p, DType::F32, ReduceOp::Sum),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            d.unpack(&mut m, 14, &p),
            Err(DeviceError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn pack_unpack_reduce_round_trip() {
        let d = HostDevice;
        let mut m = d.alloc(8).unwrap();
        m.copy_from_slice(bytemuck::cast_slice(&[1.0f32, 2.0]));
        let p = d.pack(&m, 0, 8).unwrap();
        d.unpack_reduce(&mut m, 0, &p, DType::F32, ReduceOp::Sum)
            .unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&m), &[2.0, 4.0]);
        d.divide(&mut m, 0, 8, DType::F32, 4).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&m), &[0.5, 1.0]);
    }
}
