//! Host arithmetic on byte slices: the reductions, scaling and division behind
//! [`crate::host::HostDevice`].
//!
//! Native types (f32, f64, the integers) reduce in place with plain element loops that the
//! compiler vectorises; the 16- and 8-bit floats convert blocks to `f32` (a cache-resident
//! scratch block on the stack), compute there and round back once. Integer sums and products
//! wrap (two's complement), as NCCL's do. Float `min`/`max` return the non-NaN operand
//! (IEEE `minNum`/`maxNum`), which is commutative, so every rank of a collective computes the
//! same bits whatever the order its algorithm combines them in.
//!
//! Each entry point runs under [`pulp::Arch::dispatch`], which compiles the (fully inlined)
//! loops a second time with AVX2/FMA/F16C enabled and picks that copy at run time when the
//! CPU has them, so the crate stays free of `unsafe` and of `-C target-cpu` requirements.
//!
//! Slices of any alignment are accepted: when a slice is not aligned for its element type
//! (a payload cut from a receive buffer at an odd offset), blocks are staged through aligned
//! stack buffers.

use std::sync::OnceLock;

use bytemuck::Pod;
use chorus_protocol::{DType, ReduceOp};

use crate::device::DeviceError;
use crate::fp8;

/// Elements per staging block: 16 KiB of `f32`, well inside L1+L2 alongside its inputs.
const BLOCK: usize = 4096;

/// `dst[i] = op(dst[i], src[i])`. `dst` and `src` have equal lengths, a whole number of
/// elements; `op` is `Sum`, `Prod`, `Min` or `Max`.
pub(crate) fn reduce(
    dst: &mut [u8],
    src: &[u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    debug_assert_eq!(dst.len(), src.len());
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
pub(crate) fn scale(mem: &mut [u8], dtype: DType, factor: f64) {
    arch().dispatch(Scale { mem, dtype, factor })
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
/// precision (the quotient is then rounded once to the type).
pub(crate) fn divide(mem: &mut [u8], dtype: DType, divisor: u32) {
    arch().dispatch(Divide {
        mem,
        dtype,
        divisor,
    })
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
    // 2^63 bounds the integral factors that convert to i64 exactly.
    if factor.fract() == 0.0 && factor.abs() < 9_223_372_036_854_775_808.0 {
        let f = T::from_i64_wrapping(factor as i64);
        map_native::<T>(mem, |x| T::prod(x, f));
    } else {
        map_native::<T>(mem, |x| T::from_f64_saturating(x.to_f64() * factor));
    }
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
        scale(&mut f, DType::F32, 2.0);
        let mut g = vec![0u8; n * 4 + 1];
        g[1..].copy_from_slice(&bytes(&a));
        scale(&mut g[1..], DType::F32, 2.0);
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
        divide(&mut m, DType::I64, 3);
        assert_eq!(
            bytemuck::cast_slice::<u8, i64>(&m),
            &[(i64::MAX - 1) / 3, -2, 3]
        );
        let mut m = bytes(&[(1u64 << 60) + 1, 5]);
        scale(&mut m, DType::U64, 3.0);
        assert_eq!(
            bytemuck::cast_slice::<u8, u64>(&m),
            &[((1u64 << 60) + 1).wrapping_mul(3), 15]
        );
        let mut m = bytes(&[10i8, -10]);
        scale(&mut m, DType::I8, 0.5);
        assert_eq!(bytemuck::cast_slice::<u8, i8>(&m), &[5, -5]);
        let mut m = vec![250u8, 7];
        divide(&mut m, DType::U8, 200);
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
}
