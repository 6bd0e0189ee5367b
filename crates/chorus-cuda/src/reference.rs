//! The arithmetic the kernels implement, on the host: the oracle for tests (the GPU's and
//! the CPU-compiled kernels' results must match it bit for bit) and for the device check.
//!
//! Narrow floats compute in f32 and round once to their own type; integer sums and products
//! wrap; min and max ignore a NaN operand; scaling an integer divides when the factor is the
//! reciprocal of an integer (see [`int_divisor`]) and otherwise converts like Rust's `as`.

use chorus_protocol::{DType, ReduceOp};
use half::{bf16, f16};

/// The divisor that `factor` is the reciprocal of, if it is one (`1/3` → `3`), so that
/// averaging integers divides exactly instead of multiplying by a rounded reciprocal.
pub fn int_divisor(factor: f64) -> Option<u64> {
    if !(factor > 0.0 && factor <= 1.0) {
        return None;
    }
    let inv = 1.0 / factor;
    let n = inv.round();
    if (1.0..9.0e15).contains(&n) && (inv - n).abs() <= 1e-9 * n {
        Some(n as u64)
    } else {
        None
    }
}

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
    let divisor = int_divisor(factor);
    for e in mem.chunks_exact_mut(dtype.size()) {
        scale_one(dtype, e, factor, divisor);
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

fn scale_one(dtype: DType, e: &mut [u8], factor: f64, divisor: Option<u64>) {
    macro_rules! le {
        ($t:ty) => {
            <$t>::from_le_bytes((&*e).try_into().unwrap_or_default())
        };
    }
    macro_rules! int {
        ($t:ty, $wide:ty) => {{
            let a = le!($t);
            let r: $t = match divisor {
                Some(n) => ((a as $wide) / (n as $wide)) as $t,
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
        DType::I8 => {
            let a = e[0] as i8;
            let r = match divisor {
                Some(n) => ((a as i64) / (n as i64)) as i8,
                None => (a as f64 * factor) as i8,
            };
            e[0] = r as u8;
        }
        DType::U8 => {
            let a = e[0];
            e[0] = match divisor {
                Some(n) => ((a as u64) / n) as u8,
                None => (a as f64 * factor) as u8,
            };
        }
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

/// f32 to E5M2: nearest, ties to even, saturating at ±57344 (infinities too), NaN to 0x7f/0xff.
pub fn f32_to_e5m2(f: f32) -> u8 {
    f32_to_f8(f, 2, 15, 57344.0, 0x7b)
}

/// Written from the definition (value grids and ties), not from the kernels' bit tricks,
/// so that the two are independent.
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

    #[test]
    fn reciprocals_of_integers_divide() {
        assert_eq!(int_divisor(1.0 / 3.0), Some(3));
        assert_eq!(int_divisor(0.25), Some(4));
        assert_eq!(int_divisor(1.0), Some(1));
        assert_eq!(int_divisor(0.3), None);
        assert_eq!(int_divisor(2.0), None);
        assert_eq!(int_divisor(-0.5), None);
        assert_eq!(int_divisor(f64::NAN), None);
        // 6 * (1/3) in f64 truncates to 1; dividing gives the 2 an average means.
        let mut v = 6i32.to_le_bytes().to_vec();
        scale(DType::I32, &mut v, 1.0 / 3.0);
        assert_eq!(i32::from_le_bytes(v.try_into().unwrap()), 2);
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
        assert_eq!(f32_to_e5m2(f32::INFINITY), 0x7b);
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
    fn integer_scaling_saturates_like_as() {
        let mut v = 100i8.to_le_bytes().to_vec();
        scale(DType::I8, &mut v, 3.0);
        assert_eq!(v[0] as i8, 127);
        let mut v = 7u32.to_le_bytes().to_vec();
        scale(DType::U32, &mut v, -1.5);
        assert_eq!(u32::from_le_bytes(v.try_into().unwrap()), 0);
    }
}
