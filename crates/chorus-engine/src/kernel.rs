//! Host arithmetic on byte slices: the reductions, scaling and division behind
//! [`crate::host_device::HostDevice`].
//!
//! Two paths compute the same bits:
//!
//! * **Fast**, for the 16- and 8-bit floats (f16, bf16, E4M3, E5M2) on CPUs that have the
//!   instructions (x86-64 with AVX2 and F16C, detected once at run time): the kernels of
//!   `chorus-simd`, which hold the `unsafe` of entering code compiled for those instructions,
//!   so this crate stays free of it.
//! * **Portable**, for everything else and the reference the fast kernels are tested
//!   against: plain element loops, run under [`pulp::Arch::dispatch`], which compiles the
//!   (fully inlined) loops a second time with AVX2 and FMA enabled and picks that copy at run
//!   time when the CPU has them. The native types (f32, f64, the integers) reduce here on
//!   every CPU, at memory speed; the 16- and 8-bit floats widen each element to `f32`,
//!   compute there and round back once (fp8 through precomputed 64 KiB tables per operator).
//!
//! Semantics, the same on both paths: integer sums and products wrap (two's complement), as
//! NCCL's do. The small floats compute in `f32` and round once to nearest-even; a NaN result
//! is a quiet NaN (f16/bf16 keep sign and payload; fp8 becomes `0x7f` with the sign); E4M3
//! saturates to ±448 and E5M2 overflows to infinity (see [`crate::fp8`]). Float `min`/`max`
//! return the non-NaN operand (IEEE `minNum`/`maxNum`); when the operands compare equal
//! (`+0` and `-0`) they return `dst`'s, as x86's `minNum` lowering does. That makes them
//! commutative in value but not in the sign of a zero: collectives that combine operands in
//! different orders on different ranks may disagree on the sign of a zero minimum.
//!
//! Slices of any alignment are accepted: when a slice is not aligned for its element type
//! (a payload cut from a receive buffer at an odd offset), the portable path stages blocks
//! through aligned stack buffers; the fast kernels read bytes and never need alignment.

use std::sync::OnceLock;

use bytemuck::Pod;
use chorus_protocol::{DType, ReduceOp};
use chorus_simd::{Format, Kernels};

use crate::device::DeviceError;
use crate::fp8;

/// Elements per staging block: 16 KiB of `f32`, well inside L1+L2 alongside its inputs.
const BLOCK: usize = 4096;

/// Which implementation computes the small floats: [`Path::Fast`] is `chorus-simd`'s where
/// the CPU runs it (the portable loops otherwise), [`Path::Portable`] always the loops.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Path {
    Fast,
    Portable,
}

/// The fast kernels for `dtype` on `path`, if this CPU runs them.
fn fast(path: Path, dtype: DType) -> Option<(Kernels, Format)> {
    let format = match dtype {
        DType::F16 => Format::F16,
        DType::BF16 => Format::Bf16,
        DType::F8E4M3 => Format::E4m3,
        DType::F8E5M2 => Format::E5m2,
        _ => return None,
    };
    match path {
        Path::Fast => Kernels::detect().map(|k| (k, format)),
        Path::Portable => None,
    }
}

/// `dst[i] = op(dst[i], src[i])`. `dst` and `src` have equal lengths, a whole number of
/// elements; `op` is `Sum`, `Prod`, `Min` or `Max`.
pub(crate) fn reduce(
    dst: &mut [u8],
    src: &[u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    reduce_on(Path::Fast, dst, src, dtype, op)
}

/// Whether [`reduce`] computes `op` on `dtype`: the four elementwise operators, on every
/// type (the engine composes `Avg` and `PreMulSum` from `Sum` and [`scale`]).
pub(crate) fn supports(dtype: DType, op: ReduceOp) -> bool {
    let _ = dtype;
    matches!(
        op,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max
    )
}

pub(crate) fn reduce_on(
    path: Path,
    dst: &mut [u8],
    src: &[u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    debug_assert_eq!(dst.len(), src.len());
    if let Some((kernels, format)) = fast(path, dtype) {
        let simd_op = match op {
            ReduceOp::Sum => chorus_simd::Op::Sum,
            ReduceOp::Prod => chorus_simd::Op::Prod,
            ReduceOp::Min => chorus_simd::Op::Min,
            ReduceOp::Max => chorus_simd::Op::Max,
            ReduceOp::Avg | ReduceOp::PreMulSum => {
                return Err(DeviceError::Unsupported { op, dtype });
            }
        };
        let len = dst.len();
        return kernels
            .reduce(format, simd_op, dst, src)
            .map_err(|_| DeviceError::Misaligned { len, dtype });
    }
    arch().dispatch(Reduce {
        dst,
        src,
        dtype,
        op,
    })
}

// The entry points as `pulp` operations: `with_simd` is inlined into a function compiled
// with the chosen instruction set, and everything below it is `#[inline(always)]`, so the
// whole loop nest is generated for that set. (A closure would be compiled on its own,
// for the baseline, and only called from there.)

struct Reduce<'a> {
    dst: &'a mut [u8],
    src: &'a [u8],
    dtype: DType,
    op: ReduceOp,
}

impl pulp::WithSimd for Reduce<'_> {
    type Output = Result<(), DeviceError>;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        reduce_any(self.dst, self.src, self.dtype, self.op)
    }
}

struct Scale<'a> {
    mem: &'a mut [u8],
    dtype: DType,
    factor: f64,
}

impl pulp::WithSimd for Scale<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        scale_any(self.mem, self.dtype, self.factor)
    }
}

struct Divide<'a> {
    mem: &'a mut [u8],
    dtype: DType,
    divisor: u32,
}

impl pulp::WithSimd for Divide<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        divide_any(self.mem, self.dtype, self.divisor)
    }
}

/// The best instruction set this CPU has, detected once.
fn arch() -> pulp::Arch {
    static ARCH: OnceLock<pulp::Arch> = OnceLock::new();
    *ARCH.get_or_init(pulp::Arch::new)
}

#[inline(always)]
fn reduce_any(dst: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) -> Result<(), DeviceError> {
    match dtype {
        DType::F32 => native::<f32>(dst, src, op),
        DType::F64 => native::<f64>(dst, src, op),
        DType::I8 => native::<i8>(dst, src, op),
        DType::U8 => native::<u8>(dst, src, op),
        DType::I32 => native::<i32>(dst, src, op),
        DType::U32 => native::<u32>(dst, src, op),
        DType::I64 => native::<i64>(dst, src, op),
        DType::U64 => native::<u64>(dst, src, op),
        DType::F16 => widened::<F16>(dst, src, op),
        DType::BF16 => widened::<BF16>(dst, src, op),
        DType::F8E4M3 => fp8_reduce::<E4M3>(dst, src, op),
        DType::F8E5M2 => fp8_reduce::<E5M2>(dst, src, op),
    }
    .map_err(|()| DeviceError::Unsupported { op, dtype })
}

/// `mem[i] *= factor`. Floats multiply in their compute precision (`f64` for f64, `f32`
/// otherwise). Integers multiply exactly (wrapping) by an integral factor that fits in `i64`;
/// any other factor goes through `f64` and truncates toward zero, saturating at the type's
/// bounds.
pub(crate) fn scale(mem: &mut [u8], dtype: DType, factor: f64) -> Result<(), DeviceError> {
    scale_on(Path::Fast, mem, dtype, factor)
}

pub(crate) fn scale_on(
    path: Path,
    mem: &mut [u8],
    dtype: DType,
    factor: f64,
) -> Result<(), DeviceError> {
    if let Some((kernels, format)) = fast(path, dtype) {
        let len = mem.len();
        return kernels
            .scale(format, mem, factor as f32)
            .map_err(|_| DeviceError::Misaligned { len, dtype });
    }
    arch().dispatch(Scale { mem, dtype, factor });
    Ok(())
}

#[inline(always)]
fn scale_any(mem: &mut [u8], dtype: DType, factor: f64) {
    match dtype {
        DType::F32 => {
            let f = factor as f32;
            map_native::<f32>(mem, |x| x * f);
        }
        DType::F64 => map_native::<f64>(mem, |x| x * factor),
        DType::I8 => scale_int::<i8>(mem, factor),
        DType::U8 => scale_int::<u8>(mem, factor),
        DType::I32 => scale_int::<i32>(mem, factor),
        DType::U32 => scale_int::<u32>(mem, factor),
        DType::I64 => scale_int::<i64>(mem, factor),
        DType::U64 => scale_int::<u64>(mem, factor),
        DType::F16 => map_widened::<F16>(mem, factor as f32, |x, f| x * f),
        DType::BF16 => map_widened::<BF16>(mem, factor as f32, |x, f| x * f),
        DType::F8E4M3 => map_widened::<E4M3>(mem, factor as f32, |x, f| x * f),
        DType::F8E5M2 => map_widened::<E5M2>(mem, factor as f32, |x, f| x * f),
    }
}

/// `mem[i] /= divisor`: integers truncate toward zero, floats divide in their compute
/// precision (the quotient is then rounded once to the type). A divisor of 0 counts as 1.
pub(crate) fn divide(mem: &mut [u8], dtype: DType, divisor: u32) -> Result<(), DeviceError> {
    divide_on(Path::Fast, mem, dtype, divisor)
}

pub(crate) fn divide_on(
    path: Path,
    mem: &mut [u8],
    dtype: DType,
    divisor: u32,
) -> Result<(), DeviceError> {
    if let Some((kernels, format)) = fast(path, dtype) {
        let len = mem.len();
        return kernels
            .divide(format, mem, divisor.max(1) as f32)
            .map_err(|_| DeviceError::Misaligned { len, dtype });
    }
    arch().dispatch(Divide {
        mem,
        dtype,
        divisor,
    });
    Ok(())
}

#[inline(always)]
fn divide_any(mem: &mut [u8], dtype: DType, divisor: u32) {
    let d = divisor.max(1);
    match dtype {
        DType::F32 => {
            let d = d as f32;
            map_native::<f32>(mem, |x| x / d);
        }
        DType::F64 => {
            let d = f64::from(d);
            map_native::<f64>(mem, |x| x / d);
        }
        DType::I8 => map_native::<i8>(mem, |x| (i64::from(x) / i64::from(d)) as i8),
        DType::U8 => map_native::<u8>(mem, |x| (u64::from(x) / u64::from(d)) as u8),
        DType::I32 => map_native::<i32>(mem, |x| (i64::from(x) / i64::from(d)) as i32),
        DType::U32 => map_native::<u32>(mem, |x| x / d),
        DType::I64 => map_native::<i64>(mem, |x| x / i64::from(d)),
        DType::U64 => map_native::<u64>(mem, |x| x / u64::from(d)),
        DType::F16 => map_widened::<F16>(mem, d as f32, |x, d| x / d),
        DType::BF16 => map_widened::<BF16>(mem, d as f32, |x, d| x / d),
        DType::F8E4M3 => map_widened::<E4M3>(mem, d as f32, |x, d| x / d),
        DType::F8E5M2 => map_widened::<E5M2>(mem, d as f32, |x, d| x / d),
    }
}

// ---------------------------------------------------------------------------------------------
// Native element types

/// An element type the CPU computes on directly.
trait Native: Pod + PartialOrd {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
}

macro_rules! native_int {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
        }
    )*};
}
native_int!(i8, u8, i32, u32, i64, u64);

macro_rules! native_float {
    ($($t:ty),*) => {$(
        impl Native for $t {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { a.max(b) }
        }
    )*};
}
native_float!(f32, f64);

#[inline(always)]
fn native<T: Native>(dst: &mut [u8], src: &[u8], op: ReduceOp) -> Result<(), ()> {
    match op {
        ReduceOp::Sum => zip_native::<T>(dst, src, T::sum),
        ReduceOp::Prod => zip_native::<T>(dst, src, T::prod),
        ReduceOp::Min => zip_native::<T>(dst, src, T::min),
        ReduceOp::Max => zip_native::<T>(dst, src, T::max),
        ReduceOp::Avg | ReduceOp::PreMulSum => return Err(()),
    }
    Ok(())
}

/// The loop the compiler vectorises: one pass, no bounds checks (zip), inlined `f`.
#[inline(always)]
fn zip_slices<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn zip_native<T: Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T + Copy) {
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        return zip_slices(d, s, f);
    }
    // Misaligned: stage blocks through aligned buffers.
    let size = size_of::<T>();
    let mut dbuf = [0u64; BLOCK / 2];
    let mut sbuf = [0u64; BLOCK / 2];
    let block_bytes = (BLOCK * 4 / size) * size;
    for (dc, sc) in dst.chunks_mut(block_bytes).zip(src.chunks(block_bytes)) {
        let n = dc.len();
        let db = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dbuf)[..n];
        let sb = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut sbuf)[..n];
        db.copy_from_slice(dc);
        sb.copy_from_slice(sc);
        zip_slices::<T>(bytemuck::cast_slice_mut(db), bytemuck::cast_slice(&*sb), f);
        dc.copy_from_slice(db);
    }
}

#[inline(always)]
fn map_native<T: Pod>(mem: &mut [u8], f: impl Fn(T) -> T + Copy) {
    if let Ok(m) = bytemuck::try_cast_slice_mut::<u8, T>(mem) {
        m.iter_mut().for_each(|x| *x = f(*x));
        return;
    }
    let size = size_of::<T>();
    let mut buf = [0u64; BLOCK / 2];
    let block_bytes = (BLOCK * 4 / size) * size;
    for c in mem.chunks_mut(block_bytes) {
        let b = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..c.len()];
        b.copy_from_slice(c);
        bytemuck::cast_slice_mut::<u8, T>(b)
            .iter_mut()
            .for_each(|x| *x = f(*x));
        c.copy_from_slice(b);
    }
}

/// Integer scaling: exact wrapping multiply for integral factors, else through `f64`.
trait ScaleInt: Native {
    fn from_i64_wrapping(v: i64) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64_saturating(v: f64) -> Self;
}

macro_rules! scale_int_impl {
    ($($t:ty),*) => {$(
        impl ScaleInt for $t {
            #[inline(always)]
            fn from_i64_wrapping(v: i64) -> Self { v as $t }
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn from_f64_saturating(v: f64) -> Self { v as $t }
        }
    )*};
}
scale_int_impl!(i8, u8, i32, u32, i64, u64);

#[inline(always)]
fn scale_int<T: ScaleInt>(mem: &mut [u8], factor: f64) {
    if let Some(m) = int_multiplier(factor) {
        let f = T::from_i64_wrapping(m);
        map_native::<T>(mem, |x| T::prod(x, f));
    } else {
        map_native::<T>(mem, |x| T::from_f64_saturating(x.to_f64() * factor));
    }
}

/// The multiplier of an exact integer scale: `Some(factor as i64)` when `factor` is
/// integral and below 2^63 in magnitude. Scaling an integer by such a factor multiplies
/// exactly (wrapping); by any other it goes through `f64` (the rule for `PreMulSum` on
/// integers, which the GPU kernels follow too).
pub fn int_multiplier(factor: f64) -> Option<i64> {
    // 2^63 bounds the integral factors that convert to i64 exactly.
    (factor.fract() == 0.0 && factor.abs() < 9_223_372_036_854_775_808.0).then_some(factor as i64)
}

// ---------------------------------------------------------------------------------------------
// Types computed in f32

/// A storage type that computes in `f32`: one element's conversions both ways. The loops
/// below apply them elementwise in a single fused pass, which vectorises.
trait Widened {
    /// The storage bits.
    type Bits: Pod;
    fn widen(b: Self::Bits) -> f32;
    fn narrow(x: f32) -> Self::Bits;
}

struct F16;
struct BF16;
struct E4M3;
struct E5M2;

impl Widened for F16 {
    type Bits = u16;
    #[inline(always)]
    fn widen(b: u16) -> f32 {
        fp8::f16_to_f32(b)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u16 {
        fp8::f32_to_f16(x)
    }
}

impl Widened for BF16 {
    type Bits = u16;
    #[inline(always)]
    fn widen(b: u16) -> f32 {
        f32::from_bits(u32::from(b) << 16)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u16 {
        bf16_bits(x)
    }
}

impl Widened for E4M3 {
    type Bits = u8;
    #[inline(always)]
    fn widen(b: u8) -> f32 {
        fp8::e4m3_to_f32(b)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u8 {
        fp8::f32_to_e4m3(x)
    }
}

impl Widened for E5M2 {
    type Bits = u8;
    #[inline(always)]
    fn widen(b: u8) -> f32 {
        fp8::e5m2_to_f32(b)
    }
    #[inline(always)]
    fn narrow(x: f32) -> u8 {
        fp8::f32_to_e5m2(x)
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even; NaN stays a quiet NaN). Branch-free so the
/// loop around it vectorises; agrees with `half::bf16::from_f32`.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) as u16) | 0x40;
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        quiet
    } else {
        rounded
    }
}

#[inline(always)]
fn widened<W: Widened>(dst: &mut [u8], src: &[u8], op: ReduceOp) -> Result<(), ()> {
    match op {
        ReduceOp::Sum => {
            zip_native::<W::Bits>(dst, src, |a, b| W::narrow(W::widen(a) + W::widen(b)))
        }
        ReduceOp::Prod => {
            zip_native::<W::Bits>(dst, src, |a, b| W::narrow(W::widen(a) * W::widen(b)))
        }
        ReduceOp::Min => {
            zip_native::<W::Bits>(dst, src, |a, b| W::narrow(W::widen(a).min(W::widen(b))))
        }
        ReduceOp::Max => {
            zip_native::<W::Bits>(dst, src, |a, b| W::narrow(W::widen(a).max(W::widen(b))))
        }
        ReduceOp::Avg | ReduceOp::PreMulSum => return Err(()),
    }
    Ok(())
}

/// fp8 reductions by table: every `(dst, src)` byte pair's result, computed once per
/// format and operator with the same scalar conversions as the other paths (so the bits are
/// identical), 64 KiB each, built on first use. One L1/L2 load per element beats decoding,
/// computing and re-rounding two values.
#[inline(always)]
fn fp8_reduce<W: Widened<Bits = u8> + Fp8Tables>(
    dst: &mut [u8],
    src: &[u8],
    op: ReduceOp,
) -> Result<(), ()> {
    let slot = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
        ReduceOp::Avg | ReduceOp::PreMulSum => return Err(()),
    };
    let table: &[u8; 65536] = W::tables()[slot].get_or_init(|| {
        let f = |a: f32, b: f32| match slot {
            0 => a + b,
            1 => a * b,
            2 => a.min(b),
            _ => a.max(b),
        };
        let mut t = Box::new([0u8; 65536]);
        for (i, r) in t.iter_mut().enumerate() {
            *r = W::narrow(f(W::widen((i >> 8) as u8), W::widen(i as u8)));
        }
        t
    });
    for (d, s) in dst.iter_mut().zip(src) {
        *d = table[usize::from(*d) << 8 | usize::from(*s)];
    }
    Ok(())
}

/// The lazily built operator tables of one fp8 format (sum, prod, min, max).
trait Fp8Tables {
    fn tables() -> &'static [OnceLock<Box<[u8; 65536]>>; 4];
}

impl Fp8Tables for E4M3 {
    fn tables() -> &'static [OnceLock<Box<[u8; 65536]>>; 4] {
        static T: [OnceLock<Box<[u8; 65536]>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        &T
    }
}

impl Fp8Tables for E5M2 {
    fn tables() -> &'static [OnceLock<Box<[u8; 65536]>>; 4] {
        static T: [OnceLock<Box<[u8; 65536]>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        &T
    }
}

#[inline(always)]
fn map_widened<W: Widened>(mem: &mut [u8], k: f32, f: impl Fn(f32, f32) -> f32 + Copy) {
    map_native::<W::Bits>(mem, |x| W::narrow(f(W::widen(x), k)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn native_ops() {
        let mut d = bytes(&[1i32, -5, 7, i32::MAX]);
        reduce(&mut d, &bytes(&[2i32, 3, -9, 1]), DType::I32, ReduceOp::Sum).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&d), &[3, -2, -2, i32::MIN]);
        let mut d = bytes(&[1.5f64, -2.0, f64::NAN]);
        reduce(
            &mut d,
            &bytes(&[0.5f64, 3.0, 4.0]),
            DType::F64,
            ReduceOp::Min,
        )
        .unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f64>(&d), &[0.5, -2.0, 4.0]);
        let mut d = bytes(&[200u8, 3]);
        reduce(&mut d, &bytes(&[2u8, 5]), DType::U8, ReduceOp::Prod).unwrap();
        assert_eq!(d, vec![144, 15]);
        assert!(reduce(&mut d.clone(), &d.clone(), DType::U8, ReduceOp::Avg).is_err());
    }

    #[test]
    fn misaligned_slices_give_the_same_result() {
        let n = 10_001;
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
        let b: Vec<f32> = (0..n).map(|i| (n - i) as f32).collect();
        let mut want = bytes(&a);
        reduce(&mut want, &bytes(&b), DType::F32, ReduceOp::Max).unwrap();
        // Shift both by one byte inside larger buffers.
        let mut dbuf = vec![0u8; n * 4 + 1];
        let mut sbuf = vec![0u8; n * 4 + 1];
        dbuf[1..].copy_from_slice(&bytes(&a));
        sbuf[1..].copy_from_slice(&bytes(&b));
        reduce(&mut dbuf[1..], &sbuf[1..], DType::F32, ReduceOp::Max).unwrap();
        assert_eq!(&dbuf[1..], &want[..]);
        let mut f = bytes(&a);
        scale(&mut f, DType::F32, 2.0).unwrap();
        let mut g = vec![0u8; n * 4 + 1];
        g[1..].copy_from_slice(&bytes(&a));
        scale(&mut g[1..], DType::F32, 2.0).unwrap();
        assert_eq!(&g[1..], &f[..]);
        // And for a widened type.
        let h: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 100) as f32)).collect();
        let mut want = bytes(&h);
        reduce(&mut want, &bytes(&h), DType::F16, ReduceOp::Sum).unwrap();
        let mut dbuf = vec![0u8; n * 2 + 1];
        dbuf[1..].copy_from_slice(&bytes(&h));
        reduce(&mut dbuf[1..], &bytes(&h), DType::F16, ReduceOp::Sum).unwrap();
        assert_eq!(&dbuf[1..], &want[..]);
    }

    #[test]
    fn half_types_round_once() {
        let a = [
            bf16::from_f32(1.0),
            bf16::from_f32(256.0),
            bf16::from_f32(-3.5),
        ];
        let b = [
            bf16::from_f32(2.0),
            bf16::from_f32(1.0),
            bf16::from_f32(f32::NAN),
        ];
        let mut d = bytes(&a);
        reduce(&mut d, &bytes(&b), DType::BF16, ReduceOp::Sum).unwrap();
        let got = bytemuck::cast_slice::<u8, bf16>(&d);
        assert_eq!(got[0].to_f32(), 3.0);
        // 257 is a tie between 256 and 258 in bf16: even mantissa wins.
        assert_eq!(got[1].to_f32(), 256.0);
        assert!(got[2].is_nan());
        for x in [1.0f32, 1.003_906_2, 3.1e38, -7.7e-39, f32::INFINITY, 0.1] {
            assert_eq!(bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
        }
    }

    #[test]
    fn integer_scale_and_divide_are_exact() {
        let mut m = bytes(&[i64::MAX - 1, -7, 9]);
        divide(&mut m, DType::I64, 3).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, i64>(&m),
            &[(i64::MAX - 1) / 3, -2, 3]
        );
        let mut m = bytes(&[(1u64 << 60) + 1, 5]);
        scale(&mut m, DType::U64, 3.0).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, u64>(&m),
            &[((1u64 << 60) + 1).wrapping_mul(3), 15]
        );
        let mut m = bytes(&[10i8, -10]);
        scale(&mut m, DType::I8, 0.5).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i8>(&m), &[5, -5]);
        let mut m = vec![250u8, 7];
        divide(&mut m, DType::U8, 200).unwrap();
        assert_eq!(m, vec![1, 0]);
    }

    #[test]
    fn fp8_sum_saturates_or_overflows() {
        let mut d = vec![fp8::f32_to_e4m3(400.0), fp8::f32_to_e4m3(1.5)];
        let s = d.clone();
        reduce(&mut d, &s, DType::F8E4M3, ReduceOp::Sum).unwrap();
        assert_eq!(fp8::e4m3_to_f32(d[0]), 448.0);
        assert_eq!(fp8::e4m3_to_f32(d[1]), 3.0);
        let mut d = vec![fp8::f32_to_e5m2(40960.0)];
        let s = d.clone();
        reduce(&mut d, &s, DType::F8E5M2, ReduceOp::Sum).unwrap();
        assert_eq!(fp8::e5m2_to_f32(d[0]), f32::INFINITY);
    }

    // -----------------------------------------------------------------------------------------
    // The fast path against the portable reference, and the edge cases on both.

    const SMALL: [DType; 4] = [DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2];
    const ARITH: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];
    const PATHS: [Path; 2] = [Path::Fast, Path::Portable];

    /// Element lengths the fast path is fed in turn, so that every tail length and every
    /// byte misalignment comes up.
    const PIECES: [usize; 14] = [1, 2, 3, 5, 7, 15, 16, 17, 31, 32, 33, 63, 100, 1000];

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn element(dtype: DType, v: &[u8], i: usize) -> u16 {
        match dtype.size() {
            1 => u16::from(v[i]),
            _ => u16::from_ne_bytes([v[2 * i], v[2 * i + 1]]),
        }
    }

    fn is_nan(dtype: DType, bits: u16) -> bool {
        match dtype {
            DType::F16 => bits & 0x7fff > 0x7c00,
            DType::BF16 => bits & 0x7fff > 0x7f80,
            DType::F8E4M3 => bits & 0x7f == 0x7f,
            _ => bits & 0x7f > 0x7c,
        }
    }

    /// Encodings of `dtype` from raw integers (the low bits).
    fn encode(dtype: DType, raw: impl IntoIterator<Item = u64>) -> Vec<u8> {
        let mut out = Vec::new();
        for r in raw {
            match dtype.size() {
                1 => out.push(r as u8),
                _ => out.extend_from_slice(&(r as u16).to_ne_bytes()),
            }
        }
        out
    }

    /// The fast path's `dst op src`, fed in pieces of every length at every offset.
    fn fast_in_pieces(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        let es = dtype.size();
        let mut d = a.to_vec();
        let (mut at, mut k) = (0, 0);
        while at < d.len() {
            let n = (PIECES[k % PIECES.len()] * es).min(d.len() - at);
            reduce_on(Path::Fast, &mut d[at..at + n], &b[at..at + n], dtype, op).unwrap();
            at += n;
            k += 1;
        }
        d
    }

    /// Fast and portable agree on every element of `a op b`: bit for bit, except that when
    /// both operands of a sum or product are NaN either may come back (the portable loop
    /// leaves the order to the compiler), so then both need only be NaN.
    fn assert_agree(dtype: DType, op: ReduceOp, a: &[u8], b: &[u8]) {
        let fast = fast_in_pieces(dtype, op, a, b);
        let mut want = a.to_vec();
        reduce_on(Path::Portable, &mut want, b, dtype, op).unwrap();
        for i in 0..a.len() / dtype.size() {
            let (x, y) = (element(dtype, a, i), element(dtype, b, i));
            let (got, exp) = (element(dtype, &fast, i), element(dtype, &want, i));
            let either = matches!(op, ReduceOp::Sum | ReduceOp::Prod)
                && is_nan(dtype, x)
                && is_nan(dtype, y);
            let ok = if either {
                is_nan(dtype, got) && is_nan(dtype, exp)
            } else {
                got == exp
            };
            assert!(
                ok,
                "{dtype} {op}: {x:#06x} {op} {y:#06x} = {got:#06x} fast, {exp:#06x} portable"
            );
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn fast_path_is_taken_where_the_cpu_has_it() {
        let has = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
        assert_eq!(Kernels::detect().is_some(), has);
    }

    #[test]
    fn fp8_fast_path_agrees_on_every_pair() {
        for dtype in [DType::F8E4M3, DType::F8E5M2] {
            let a = encode(dtype, (0..1u64 << 16).map(|i| i >> 8));
            let b = encode(dtype, 0..1u64 << 16);
            for op in ARITH {
                assert_agree(dtype, op, &a, &b);
            }
        }
    }

    /// Interesting 16-bit encodings: zeros, subnormals, normals at both ends, one and its
    /// neighbours, the largest finite, infinities, quiet and signalling NaNs with payloads,
    /// all with both signs.
    fn specials(dtype: DType) -> Vec<u64> {
        let positive: &[u64] = match dtype {
            DType::F16 => &[
                0x0000, 0x0001, 0x0002, 0x0003, 0x0200, 0x03ff, 0x0400, 0x0401, 0x07ff, 0x1000,
                0x2c00, 0x3555, 0x3bff, 0x3c00, 0x3c01, 0x3c02, 0x3e00, 0x4900, 0x5bff, 0x7800,
                0x7bfe, 0x7bff, 0x7c00, 0x7c01, 0x7d55, 0x7e00, 0x7e01, 0x7fff,
            ],
            _ => &[
                0x0000, 0x0001, 0x0002, 0x0040, 0x007f, 0x0080, 0x0081, 0x3c00, 0x3f7f, 0x3f80,
                0x3f81, 0x3f82, 0x4000, 0x4380, 0x4381, 0x4b00, 0x7f00, 0x7f7e, 0x7f7f, 0x7f80,
                0x7f81, 0x7fa5, 0x7fc0, 0x7fc1, 0x7fff,
            ],
        };
        positive.iter().flat_map(|&p| [p, p | 0x8000]).collect()
    }

    #[test]
    fn half_fast_path_agrees_on_specials_and_random_pairs() {
        for dtype in [DType::F16, DType::BF16] {
            let sp = specials(dtype);
            // Every special against every special.
            let a = encode(dtype, sp.iter().flat_map(|&x| sp.iter().map(move |_| x)));
            let b = encode(dtype, sp.iter().flat_map(|_| sp.iter().copied()));
            // Every encoding against a few specials.
            let few = [0usize, 1, 9, 13, 14, 22, 26, 45];
            let a2 = encode(dtype, (0..1u64 << 16).flat_map(|x| few.map(|_| x)));
            let b2 = encode(dtype, (0..1u64 << 16).flat_map(|_| few.map(|j| sp[j])));
            // Random pairs.
            let a3 = encode(dtype, (0..1u64 << 18).map(splitmix));
            let b3 = encode(dtype, (0..1u64 << 18).map(|i| splitmix(i ^ 1 << 40)));
            for op in ARITH {
                assert_agree(dtype, op, &a, &b);
                assert_agree(dtype, op, &a2, &b2);
                assert_agree(dtype, op, &a3, &b3);
            }
        }
    }

    #[test]
    fn scale_and_divide_agree_on_every_encoding() {
        let factors = [
            0.5,
            2.0,
            3.0,
            1.0 / 3.0,
            -0.75,
            1e-3,
            1e3,
            65504.0,
            1e-8,
            1e30,
            448.0,
            1.0 / 448.0,
            2f64.powi(-20),
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            // NaNs whose payload reaches an f32's low half (as 0x8001 and 0xffff), where
            // rounding to bf16 would carry into the top half.
            f64::from_bits(0x7ff8_1000_2000_0000),
            f64::from_bits(0xffff_ffff_e000_0000),
        ];
        let divisors = [0u32, 1, 2, 3, 7, 10, 1000, 65535, u32::MAX];
        for dtype in SMALL {
            let all = encode(dtype, 0..1u64 << (8 * dtype.size()));
            let check = |fast: &[u8], want: &[u8], what: &str, nan_k: bool| {
                for i in 0..all.len() / dtype.size() {
                    let x = element(dtype, &all, i);
                    let (got, exp) = (element(dtype, fast, i), element(dtype, want, i));
                    // A NaN element times a NaN factor: either NaN may come back.
                    let ok = if nan_k && is_nan(dtype, x) {
                        is_nan(dtype, got) && is_nan(dtype, exp)
                    } else {
                        got == exp
                    };
                    assert!(
                        ok,
                        "{dtype} {x:#06x} {what}: {got:#06x} fast, {exp:#06x} portable"
                    );
                }
            };
            for k in factors {
                let (mut fast, mut want) = (all.clone(), all.clone());
                scale_on(Path::Fast, &mut fast, dtype, k).unwrap();
                scale_on(Path::Portable, &mut want, dtype, k).unwrap();
                check(&fast, &want, &format!("* {k}"), k.is_nan());
            }
            for d in divisors {
                let (mut fast, mut want) = (all.clone(), all.clone());
                divide_on(Path::Fast, &mut fast, dtype, d).unwrap();
                divide_on(Path::Portable, &mut want, dtype, d).unwrap();
                check(&fast, &want, &format!("/ {d}"), false);
            }
            // Odd lengths and offsets.
            let mut fast = all.clone();
            for (i, piece) in fast[1..].chunks_mut(37 * dtype.size()).enumerate() {
                let n = piece.len() - piece.len() % dtype.size();
                if i % 2 == 0 {
                    scale_on(Path::Fast, &mut piece[..n], dtype, 0.375).unwrap();
                } else {
                    divide_on(Path::Fast, &mut piece[..n], dtype, 5).unwrap();
                }
            }
            let mut want = all.clone();
            for (i, piece) in want[1..].chunks_mut(37 * dtype.size()).enumerate() {
                let n = piece.len() - piece.len() % dtype.size();
                if i % 2 == 0 {
                    scale_on(Path::Portable, &mut piece[..n], dtype, 0.375).unwrap();
                } else {
                    divide_on(Path::Portable, &mut piece[..n], dtype, 5).unwrap();
                }
            }
            assert_eq!(fast, want, "{dtype} in odd pieces");
        }
    }

    /// `a op b` for single elements (given as raw encodings) on `path`.
    fn one(path: Path, dtype: DType, op: ReduceOp, a: u16, b: u16) -> u16 {
        let mut d = encode(dtype, [u64::from(a)]);
        reduce_on(path, &mut d, &encode(dtype, [u64::from(b)]), dtype, op).unwrap();
        element(dtype, &d, 0)
    }

    fn scaled(path: Path, dtype: DType, a: u16, k: f64) -> u16 {
        let mut d = encode(dtype, [u64::from(a)]);
        scale_on(path, &mut d, dtype, k).unwrap();
        element(dtype, &d, 0)
    }

    #[test]
    fn f16_edges_on_both_paths() {
        let (d, sum, min, max) = (DType::F16, ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max);
        let h = |x: f32| f16::from_f32(x).to_bits();
        for p in PATHS {
            // Ties round to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
            assert_eq!(one(p, d, sum, h(1.0), h(2f32.powi(-11))), h(1.0), "{p:?}");
            assert_eq!(
                one(p, d, sum, h(1.0 + 2f32.powi(-10)), h(2f32.powi(-11))),
                h(1.0 + 2f32.powi(-9))
            );
            // Subnormals: add exactly, cross into the normals, halve to even.
            assert_eq!(one(p, d, sum, 0x0001, 0x0001), 0x0002);
            assert_eq!(one(p, d, sum, 0x03ff, 0x0001), 0x0400);
            assert_eq!(scaled(p, d, 0x0001, 0.5), 0x0000);
            assert_eq!(scaled(p, d, 0x0003, 0.5), 0x0002);
            assert_eq!(scaled(p, d, 0x8003, 0.5), 0x8002);
            // Overflow: 65504 + 16 is halfway to 65536, whose even neighbour is infinity.
            assert_eq!(one(p, d, sum, 0x7bff, h(16.0)), 0x7c00);
            assert_eq!(one(p, d, sum, 0x7bff, h(15.0)), 0x7bff);
            assert_eq!(one(p, d, ReduceOp::Prod, 0xfbff, h(2.0)), 0xfc00);
            // Infinities and NaNs: sign and payload kept, signalling NaNs quieted.
            assert_eq!(one(p, d, sum, 0x7c00, 0xfc00) & 0x7e00, 0x7e00);
            assert_eq!(one(p, d, ReduceOp::Prod, 0x0000, 0x7c00) & 0x7e00, 0x7e00);
            assert_eq!(one(p, d, sum, 0x7e01, h(1.0)), 0x7e01);
            assert_eq!(one(p, d, sum, h(1.0), 0xfd55), 0xff55);
            assert_eq!(one(p, d, sum, 0x7c01, h(1.0)), 0x7e01);
            assert_eq!(scaled(p, d, 0xfe00, 2.0), 0xfe00);
            // Zeros and min/max: the non-NaN operand; equal operands give dst's.
            assert_eq!(one(p, d, sum, 0x8000, 0x8000), 0x8000);
            assert_eq!(one(p, d, sum, 0x0000, 0x8000), 0x0000);
            assert_eq!(one(p, d, min, 0x0000, 0x8000), 0x0000);
            assert_eq!(one(p, d, min, 0x8000, 0x0000), 0x8000);
            assert_eq!(one(p, d, max, 0x8000, 0x0000), 0x8000);
            assert_eq!(one(p, d, min, 0x7e00, h(1.0)), h(1.0));
            assert_eq!(one(p, d, max, h(1.0), 0x7e00), h(1.0));
            assert_eq!(one(p, d, min, 0x7e00, 0xfd00), 0xff00);
            assert_eq!(one(p, d, max, 0xfc00, 0x7c00), 0x7c00);
            assert_eq!(one(p, d, min, 0xfc00, 0x7c00), 0xfc00);
        }
    }

    #[test]
    fn bf16_edges_on_both_paths() {
        let (d, sum) = (DType::BF16, ReduceOp::Sum);
        let b = |x: f32| bf16::from_f32(x).to_bits();
        for p in PATHS {
            // 257 and 259 are ties: to the even neighbours 256 and 260.
            assert_eq!(one(p, d, sum, b(256.0), b(1.0)), b(256.0), "{p:?}");
            assert_eq!(one(p, d, sum, b(258.0), b(1.0)), b(260.0));
            assert_eq!(one(p, d, sum, 0x0001, 0x0001), 0x0002);
            assert_eq!(one(p, d, sum, 0x007f, 0x0001), 0x0080);
            assert_eq!(scaled(p, d, 0x0003, 0.5), 0x0002);
            assert_eq!(one(p, d, sum, 0x7f7f, 0x7f7f), 0x7f80);
            assert_eq!(one(p, d, sum, 0x7f80, 0xff80) & 0x7fc0, 0x7fc0);
            assert_eq!(one(p, d, sum, 0x7f81, b(1.0)), 0x7fc1);
            assert_eq!(scaled(p, d, 0xffc5, 2.0), 0xffc5);
            assert_eq!(one(p, d, ReduceOp::Max, 0x7fa5, 0xffa5), 0xffe5);
            assert_eq!(one(p, d, ReduceOp::Min, 0x8000, 0x0000), 0x8000);
        }
    }

    #[test]
    fn fp8_edges_on_both_paths() {
        let (sum, prod) = (ReduceOp::Sum, ReduceOp::Prod);
        let e4 = |x: f32| u16::from(fp8::f32_to_e4m3(x));
        let e5 = |x: f32| u16::from(fp8::f32_to_e5m2(x));
        let (d4, d5) = (DType::F8E4M3, DType::F8E5M2);
        for p in PATHS {
            // E4M3: ties to even, subnormals, saturation (infinity included), NaN kept.
            assert_eq!(one(p, d4, sum, e4(1.0), e4(0.0625)), e4(1.0), "{p:?}");
            assert_eq!(one(p, d4, sum, e4(1.125), e4(0.0625)), e4(1.25));
            assert_eq!(one(p, d4, sum, 0x01, 0x01), 0x02);
            assert_eq!(one(p, d4, sum, 0x07, 0x01), 0x08);
            assert_eq!(one(p, d4, sum, e4(448.0), e4(448.0)), 0x7e);
            assert_eq!(one(p, d4, sum, e4(-448.0), e4(-448.0)), 0xfe);
            assert_eq!(one(p, d4, prod, e4(-448.0), e4(448.0)), 0xfe);
            assert_eq!(one(p, d4, prod, 0x01, 0x01), 0x00);
            assert_eq!(one(p, d4, prod, 0x81, 0x01), 0x80);
            assert_eq!(scaled(p, d4, e4(1.0), f64::INFINITY), 0x7e);
            assert_eq!(one(p, d4, sum, 0x7f, e4(1.0)), 0x7f);
            assert_eq!(one(p, d4, sum, e4(1.0), 0xff), 0xff);
            assert_eq!(one(p, d4, prod, 0x00, 0xff), 0xff);
            // An invalid operation makes x86's default NaN, whose sign is set.
            assert_eq!(scaled(p, d4, 0x00, f64::INFINITY) & 0x7f, 0x7f);
            assert_eq!(one(p, d4, ReduceOp::Min, 0x80, 0x00), 0x80);
            // E5M2: ties to even, overflow to infinity, infinities, NaNs canonical.
            assert_eq!(one(p, d5, sum, e5(1.0), e5(0.125)), e5(1.0));
            assert_eq!(one(p, d5, sum, e5(1.25), e5(0.125)), e5(1.5));
            assert_eq!(one(p, d5, sum, 0x01, 0x01), 0x02);
            assert_eq!(one(p, d5, sum, e5(57344.0), e5(57344.0)), 0x7c);
            assert_eq!(one(p, d5, sum, e5(57344.0), e5(4096.0)), 0x7c);
            assert_eq!(one(p, d5, sum, e5(57344.0), e5(2048.0)), 0x7b);
            assert_eq!(one(p, d5, sum, 0x7c, 0xfc) & 0x7f, 0x7f);
            assert_eq!(one(p, d5, prod, 0x00, 0xfc) & 0x7f, 0x7f);
            assert_eq!(one(p, d5, sum, 0x7d, e5(1.0)), 0x7f);
            assert_eq!(one(p, d5, sum, e5(1.0), 0xfe), 0xff);
            assert_eq!(one(p, d5, ReduceOp::Max, 0x7d, 0xfe), 0xff);
            assert_eq!(one(p, d5, ReduceOp::Max, e5(2.0), 0x7c), 0x7c);
        }
    }
}
