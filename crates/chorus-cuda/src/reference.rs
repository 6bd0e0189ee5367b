//! The arithmetic the kernels implement, on the host: the oracle for tests (the GPU's and
//! the CPU-compiled kernels' results must match it bit for bit) and for the device check.
//! It is the engine's host device's arithmetic (`chorus_engine::HostDevice`), written again
//! from the definitions so the two can be checked against each other. Only the rule for
//! which factors scale an integer exactly is the engine's own (`chorus_engine::int_multiplier`):
//! it is a definition, not arithmetic to check.
//!
//! Narrow floats compute in f32 and round once to their own type (E4M3 saturates at ±448,
//! E5M2 overflows to ±infinity); integer sums and products
//! wrap; min and max ignore a NaN operand. Scaling an integer by an integral factor below
//! 2^63 multiplies exactly (wrapping), by any other factor goes through f64 and converts
//! like Rust's `as`. Dividing (the last step of an average) truncates integers toward zero
//! and divides floats in their compute precision.

use chorus_engine::int_multiplier;
use chorus_protocol::{DType, ReduceOp};
use half::{bf16, f16};

/// `dst[i] = op(dst[i], src[i])` over whole elements of `dtype`. `op` must have a kernel
/// (`Sum`, `Prod`, `Min`, `Max`); others leave `dst` unchanged and return false.
pub fn reduce(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> bool {
    if !matches!(
        op,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max
    ) {
        return false;
    }
    let size = dtype.size();
    for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
        reduce_one(dtype, op, d, s);
    }
    true
}

/// `mem[i] = mem[i] * factor` over whole elements of `dtype`.
pub fn scale(dtype: DType, mem: &mut [u8], factor: f64) {
    let multiplier = int_multiplier(factor);
    for e in mem.chunks_exact_mut(dtype.size()) {
        scale_one(dtype, e, factor, multiplier);
    }
}

/// `mem[i] = mem[i] / divisor` over whole elements of `dtype` (a divisor of 0 counts as 1).
pub fn divide(dtype: DType, mem: &mut [u8], divisor: u32) {
    let d = divisor.max(1);
    for e in mem.chunks_exact_mut(dtype.size()) {
        divide_one(dtype, e, d);
    }
}

macro_rules! float_op {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            ReduceOp::Sum => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Min => nan_ignoring(a, b, a < b),
            _ => nan_ignoring(a, b, a > b),
        }
    }};
}

macro_rules! int_op {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            ReduceOp::Sum => a.wrapping_add(b),
            ReduceOp::Prod => a.wrapping_mul(b),
            ReduceOp::Min => a.min(b),
            _ => a.max(b),
        }
    }};
}

/// The kernels' `(b != b) ? a : (pick ? a : b)`.
fn nan_ignoring<T: PartialEq + Copy>(a: T, b: T, pick_a: bool) -> T {
    #[allow(clippy::eq_op)]
    let b_is_nan = b != b;
    if b_is_nan || pick_a { a } else { b }
}

fn reduce_one(dtype: DType, op: ReduceOp, d: &mut [u8], s: &[u8]) {
    macro_rules! le {
        ($t:ty, $bytes:expr) => {
            <$t>::from_le_bytes($bytes.try_into().unwrap_or_default())
        };
    }
    match dtype {
        DType::F32 => d.copy_from_slice(&float_op!(op, le!(f32, &*d), le!(f32, s)).to_le_bytes()),
        DType::F64 => d.copy_from_slice(&float_op!(op, le!(f64, &*d), le!(f64, s)).to_le_bytes()),
        DType::F16 => {
            let r = float_op!(
                op,
                f16::from_bits(le!(u16, &*d)).to_f32(),
                f16::from_bits(le!(u16, s)).to_f32()
            );
            d.copy_from_slice(&f16::from_f32(r).to_bits().to_le_bytes());
        }
        DType::BF16 => {
            let r = float_op!(
                op,
                bf16::from_bits(le!(u16, &*d)).to_f32(),
                bf16::from_bits(le!(u16, s)).to_f32()
            );
            d.copy_from_slice(&bf16::from_f32(r).to_bits().to_le_bytes());
        }
        DType::F8E4M3 => d[0] = f32_to_e4m3(float_op!(op, e4m3_to_f32(d[0]), e4m3_to_f32(s[0]))),
        DType::F8E5M2 => d[0] = f32_to_e5m2(float_op!(op, e5m2_to_f32(d[0]), e5m2_to_f32(s[0]))),
        DType::I8 => d[0] = int_op!(op, d[0] as i8, s[0] as i8) as u8,
        DType::U8 => d[0] = int_op!(op, d[0], s[0]),
        DType::I32 => d.copy_from_slice(&int_op!(op, le!(i32, &*d), le!(i32, s)).to_le_bytes()),
        DType::U32 => d.copy_from_slice(&int_op!(op, le!(u32, &*d), le!(u32, s)).to_le_bytes()),
        DType::I64 => d.copy_from_slice(&int_op!(op, le!(i64, &*d), le!(i64, s)).to_le_bytes()),
        DType::U64 => d.copy_from_slice(&int_op!(op, le!(u64, &*d), le!(u64, s)).to_le_bytes()),
    }
}

fn scale_one(dtype: DType, e: &mut [u8], factor: f64, multiplier: Option<i64>) {
    macro_rules! le {
        ($t:ty) => {
            <$t>::from_le_bytes((&*e).try_into().unwrap_or_default())
        };
    }
    macro_rules! int {
        ($t:ty) => {{
            let a = le!($t);
            let r: $t = match multiplier {
                Some(m) => a.wrapping_mul(m as $t),
                None => (a as f64 * factor) as $t,
            };
            e.copy_from_slice(&r.to_le_bytes());
        }};
    }
    let f = factor as f32;
    match dtype {
        DType::F32 => e.copy_from_slice(&(le!(f32) * f).to_le_bytes()),
        DType::F64 => e.copy_from_slice(&(le!(f64) * factor).to_le_bytes()),
        DType::F16 => e.copy_from_slice(
            &f16::from_f32(f16::from_bits(le!(u16)).to_f32() * f)
                .to_bits()
                .to_le_bytes(),
        ),
        DType::BF16 => e.copy_from_slice(
            &bf16::from_f32(bf16::from_bits(le!(u16)).to_f32() * f)
                .to_bits()
                .to_le_bytes(),
        ),
        DType::F8E4M3 => e[0] = f32_to_e4m3(e4m3_to_f32(e[0]) * f),
        DType::F8E5M2 => e[0] = f32_to_e5m2(e5m2_to_f32(e[0]) * f),
        DType::I8 => int!(i8),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::U32 => int!(u32),
        DType::I64 => int!(i64),
        DType::U64 => int!(u64),
    }
}

fn divide_one(dtype: DType, e: &mut [u8], d: u32) {
    macro_rules! le {
        ($t:ty) => {
            <$t>::from_le_bytes((&*e).try_into().unwrap_or_default())
        };
    }
    macro_rules! int {
        ($t:ty, $wide:ty) => {{
            let r = ((le!($t) as $wide) / (d as $wide)) as $t;
            e.copy_from_slice(&r.to_le_bytes());
        }};
    }
    let f = d as f32;
    match dtype {
        DType::F32 => e.copy_from_slice(&(le!(f32) / f).to_le_bytes()),
        DType::F64 => e.copy_from_slice(&(le!(f64) / f64::from(d)).to_le_bytes()),
        DType::F16 => e.copy_from_slice(
            &f16::from_f32(f16::from_bits(le!(u16)).to_f32() / f)
                .to_bits()
                .to_le_bytes(),
        ),
        DType::BF16 => e.copy_from_slice(
            &bf16::from_f32(bf16::from_bits(le!(u16)).to_f32() / f)
                .to_bits()
                .to_le_bytes(),
        ),
        DType::F8E4M3 => e[0] = f32_to_e4m3(e4m3_to_f32(e[0]) / f),
        DType::F8E5M2 => e[0] = f32_to_e5m2(e5m2_to_f32(e[0]) / f),
        DType::I8 => e[0] = ((e[0] as i8 as i64) / i64::from(d)) as i8 as u8,
        DType::U8 => e[0] = (u32::from(e[0]) / d) as u8,
        DType::I32 => int!(i32, i64),
        DType::U32 => int!(u32, u64),
        DType::I64 => int!(i64, i64),
        DType::U64 => int!(u64, u64),
    }
}

/// OCP E4M3FN to f32 (exact).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let neg = b & 0x80 != 0;
    let e = (b >> 3) & 0xf;
    let m = (b & 7) as u32;
    let v = if e == 0xf && m == 7 {
        f32::NAN
    } else if e == 0 {
        m as f32 * 2f32.powi(-9)
    } else {
        f32::from_bits(((e as u32 + 120) << 23) | (m << 20))
    };
    if neg { -v } else { v }
}

/// OCP E5M2 to f32 (exact).
pub fn e5m2_to_f32(b: u8) -> f32 {
    let neg = b & 0x80 != 0;
    let e = (b >> 2) & 0x1f;
    let m = (b & 3) as u32;
    let v = if e == 0x1f {
        if m == 0 { f32::INFINITY } else { f32::NAN }
    } else if e == 0 {
        m as f32 * 2f32.powi(-16)
    } else {
        f32::from_bits(((e as u32 + 112) << 23) | (m << 21))
    };
    if neg { -v } else { v }
}

/// f32 to E4M3FN: nearest, ties to even, saturating at ±448, NaN to 0x7f/0xff.
pub fn f32_to_e4m3(f: f32) -> u8 {
    f32_to_f8(f, 3, 7, 448.0, 0x7e)
}

/// f32 to E5M2: nearest, ties to even, overflowing to ±infinity from 61440 (the midpoint
/// past ±57344) as IEEE rounding does, NaN to 0x7f/0xff.
pub fn f32_to_e5m2(f: f32) -> u8 {
    f32_to_f8(f, 2, 15, 61440.0, 0x7c)
}

/// Written from the definition (value grids and ties), not from the kernels' bit tricks,
/// so that the two are independent.
/// Magnitudes from `max` on (infinity included) encode as `max_code`.
fn f32_to_f8(f: f32, mbits: i32, bias: i32, max: f32, max_code: u8) -> u8 {
    let sign = if f.is_sign_negative() { 0x80u8 } else { 0 };
    if f.is_nan() {
        return sign | 0x7f;
    }
    let a = f.abs();
    if a >= max {
        return sign | max_code;
    }
    // The spacing of representable values around `a`.
    let min_normal_exp = 1 - bias;
    let exp = if a == 0.0 {
        min_normal_exp
    } else {
        (a.log2().floor() as i32).max(min_normal_exp)
    };
    // log2 may be off by one near powers of two; fix it up exactly.
    let mut exp = exp;
    while exp > min_normal_exp && 2f64.powi(exp) > a as f64 {
        exp -= 1;
    }
    while 2f64.powi(exp + 1) <= a as f64 {
        exp += 1;
    }
    let ulp = 2f64.powi(exp - mbits);
    let q = a as f64 / ulp;
    let lo = q.floor();
    let rem = q - lo;
    let mut n = lo as u64;
    if rem > 0.5 || (rem == 0.5 && n % 2 == 1) {
        n += 1;
    }
    let value = n as f64 * ulp;
    // Encode `value` (exactly representable, <= max).
    let code = if value == 0.0 {
        0
    } else {
        let e = value.log2().floor() as i32;
        if e < min_normal_exp {
            (value / 2f64.powi(min_normal_exp - mbits)) as u8
        } else {
            let man = ((value / 2f64.powi(e) - 1.0) * (1 << mbits) as f64).round() as u8;
            (((e + bias) as u8) << mbits) | man
        }
    };
    sign | code
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn integral_factors_multiply_exactly_and_averages_divide() {
        assert_eq!(int_multiplier(3.0), Some(3));
        assert_eq!(int_multiplier(-2.0), Some(-2));
        assert_eq!(int_multiplier(0.5), None);
        assert_eq!(int_multiplier(f64::NAN), None);
        assert_eq!(int_multiplier(f64::INFINITY), None);
        assert_eq!(int_multiplier(1e19), None);
        // An integral factor wraps like the engine's PreMulSum, never saturates.
        let mut v = i64::MAX.to_le_bytes().to_vec();
        scale(DType::I64, &mut v, 3.0);
        assert_eq!(
            i64::from_le_bytes(v.try_into().unwrap()),
            i64::MAX.wrapping_mul(3)
        );
        // 49 * (1/49) in f64 is just below 1 and truncates to 0; dividing gives the 1 an
        // average means.
        let mut v = 49i32.to_le_bytes().to_vec();
        scale(DType::I32, &mut v, 1.0 / 49.0);
        assert_eq!(i32::from_le_bytes(v.try_into().unwrap()), 0);
        let mut v = 49i32.to_le_bytes().to_vec();
        divide(DType::I32, &mut v, 49);
        assert_eq!(i32::from_le_bytes(v.try_into().unwrap()), 1);
        let mut v = (-7i8 as u8).to_le_bytes().to_vec();
        divide(DType::I8, &mut v, 2);
        assert_eq!(v[0] as i8, -3, "truncates toward zero");
        let mut v = u64::MAX.to_le_bytes().to_vec();
        divide(DType::U64, &mut v, 3);
        assert_eq!(u64::from_le_bytes(v.try_into().unwrap()), u64::MAX / 3);
        let mut v = 1.0f32.to_le_bytes().to_vec();
        divide(DType::F32, &mut v, 3);
        assert_eq!(f32::from_le_bytes(v.try_into().unwrap()), 1.0f32 / 3.0);
    }

    #[test]
    fn fp8_decode_then_encode_is_the_identity_on_every_code() {
        for b in 0..=255u8 {
            let f = e4m3_to_f32(b);
            if !f.is_nan() {
                assert_eq!(f32_to_e4m3(f), b, "e4m3 {b:#x} = {f}");
            }
            let f = e5m2_to_f32(b);
            if f.is_finite() {
                assert_eq!(f32_to_e5m2(f), b, "e5m2 {b:#x} = {f}");
            }
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn fp8_encode_rounds_ties_to_even_and_saturates() {
        // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): even is 0x38.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xfe);
        assert_eq!(f32_to_e5m2(f32::INFINITY), 0x7c);
        assert_eq!(f32_to_e5m2(61439.0), 0x7b);
        assert_eq!(f32_to_e5m2(-61440.0), 0xfc);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00); // a quarter unit: rounds to zero
        assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-11)), 0x01); // 0.75 unit: rounds to one
    }

    #[test]
    fn integer_sums_wrap_and_min_max_pick() {
        let mut d = [250u8, 3];
        reduce(DType::U8, ReduceOp::Sum, &mut d, &[10, 4]);
        assert_eq!(d, [4, 7]);
        let mut d = (-5i64).to_le_bytes();
        reduce(DType::I64, ReduceOp::Max, &mut d, &7i64.to_le_bytes());
        assert_eq!(i64::from_le_bytes(d), 7);
        assert!(!reduce(DType::F32, ReduceOp::Avg, &mut [0; 4], &[0; 4]));
    }

    #[test]
    fn float_min_ignores_nan() {
        let mut d = 1.0f32.to_le_bytes();
        reduce(DType::F32, ReduceOp::Min, &mut d, &f32::NAN.to_le_bytes());
        assert_eq!(f32::from_le_bytes(d), 1.0);
        let mut d = f32::NAN.to_le_bytes();
        reduce(DType::F32, ReduceOp::Min, &mut d, &1.0f32.to_le_bytes());
        assert_eq!(f32::from_le_bytes(d), 1.0);
    }

    #[test]
    fn integer_scaling_by_a_fraction_saturates_like_as() {
        let mut v = 100i8.to_le_bytes().to_vec();
        scale(DType::I8, &mut v, 2.5);
        assert_eq!(v[0] as i8, 127);
        let mut v = 100i8.to_le_bytes().to_vec();
        scale(DType::I8, &mut v, 3.0);
        assert_eq!(v[0] as i8, 100i8.wrapping_mul(3), "integral: wraps");
        let mut v = 7u32.to_le_bytes().to_vec();
        scale(DType::U32, &mut v, -1.5);
        assert_eq!(u32::from_le_bytes(v.try_into().unwrap()), 0);
    }

    /// Random bits: every class of value, NaN, infinities and subnormals included.
    fn noise(seed: u64, bytes: usize) -> Vec<u8> {
        let mut x = seed;
        (0..bytes)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) as u8
            })
            .collect()
    }

    /// Whether two results agree: bit for bit, or both NaN (payloads may differ), or, with
    /// `zeros`, both zero (min and max of +0 and -0 may pick either: IEEE leaves it open, and
    /// the host's vector paths do not promise one). Prints the first difference.
    fn agree(dtype: DType, a: &[u8], b: &[u8], zeros: bool) -> bool {
        let nan = |e: &[u8]| match dtype {
            DType::F32 => f32::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DType::F64 => f64::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DType::F16 => f16::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DType::BF16 => bf16::from_le_bytes(e.try_into().unwrap()).is_nan(),
            DType::F8E4M3 => e4m3_to_f32(e[0]).is_nan(),
            DType::F8E5M2 => e5m2_to_f32(e[0]).is_nan(),
            _ => false,
        };
        let zero = |e: &[u8]| {
            zeros && dtype.is_float() && {
                let mut m = e.to_vec();
                // Clear the sign bit (the top bit of the last, most significant byte).
                if let Some(top) = m.last_mut() {
                    *top &= 0x7f;
                }
                m.iter().all(|&x| x == 0)
            }
        };
        let first = a
            .chunks_exact(dtype.size())
            .zip(b.chunks_exact(dtype.size()))
            .position(|(x, y)| x != y && !(nan(x) && nan(y)) && !(zero(x) && zero(y)));
        if let Some(i) = first {
            let at = |v: &[u8]| v[i * dtype.size()..][..dtype.size()].to_vec();
            let _ = writeln!(
                std::io::stderr(),
                "{dtype} element {i}: {:x?} here, {:x?} on the host",
                at(a),
                at(b)
            );
        }
        first.is_none()
    }

    #[test]
    fn the_reference_is_the_engine_host_arithmetic() {
        use chorus_engine::{Device, HostDevice};
        let host = HostDevice;
        for (k, dtype) in DType::ALL.into_iter().enumerate() {
            let len = 4096 * dtype.size();
            let a = noise(k as u64 * 2 + 1, len);
            let b = noise(k as u64 * 2 + 2, len);
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let mut want = host.alloc(len).unwrap();
                want.copy_from_slice(&a);
                host.reduce(&mut want, 0, &b, 0, len, dtype, op).unwrap();
                let mut got = a.clone();
                assert!(reduce(dtype, op, &mut got, &b));
                let zeros = matches!(op, ReduceOp::Min | ReduceOp::Max);
                assert!(agree(dtype, &got, &want, zeros), "{op} over {dtype}");
            }
            for factor in [0.5, 1.0 / 3.0, 3.0, -2.0, 0.0, 1e30, -7.25, 1e19, f64::NAN] {
                let mut want = host.alloc(len).unwrap();
                want.copy_from_slice(&a);
                host.scale(&mut want, 0, len, dtype, factor).unwrap();
                let mut got = a.clone();
                scale(dtype, &mut got, factor);
                assert!(
                    agree(dtype, &got, &want, false),
                    "{dtype} scaled by {factor}"
                );
            }
            for divisor in [1u32, 2, 3, 4, 7, 8, 1000, u32::MAX] {
                let mut want = host.alloc(len).unwrap();
                want.copy_from_slice(&a);
                host.divide(&mut want, 0, len, dtype, divisor).unwrap();
                let mut got = a.clone();
                divide(dtype, &mut got, divisor);
                assert!(
                    agree(dtype, &got, &want, false),
                    "{dtype} divided by {divisor}"
                );
            }
        }
    }
}
