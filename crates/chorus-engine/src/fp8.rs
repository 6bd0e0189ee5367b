//! The two OCP 8-bit float formats, as conversions to and from `f32`.
//!
//! Host reductions on fp8 decode to `f32`, compute there (sums and products of two fp8
//! values are exact in `f32`), and round once back to fp8 with round-to-nearest-even.
//! Overflow: E4M3 ("E4M3FN", no infinities) saturates to ±448, as CUDA's `__NV_SATFINITE`
//! does, so a large sum stays a large number instead of becoming NaN; E5M2 follows IEEE and
//! rounds to ±infinity. NaN stays NaN (the canonical quiet NaN of each format, sign kept).
//! The CUDA device must round the same way so host and GPU ranks agree bit for bit.

/// Decode table for E4M3: exponent bias 7, 3 mantissa bits, `S.1111.111` is NaN.
static E4M3_TO_F32: [f32; 256] = e4m3_table();
/// Decode table for E5M2: exponent bias 15, 2 mantissa bits, IEEE-style inf and NaN.
static E5M2_TO_F32: [f32; 256] = e5m2_table();

/// The value of an E4M3 byte.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_TO_F32[usize::from(b)]
}

/// The value of an E5M2 byte.
#[inline]
pub fn e5m2_to_f32(b: u8) -> f32 {
    E5M2_TO_F32[usize::from(b)]
}

/// `x` rounded to E4M3 (nearest, ties to even; saturating at ±448).
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7f;
    }
    if a >= 0x43e0_0000 {
        // |x| >= 448 (infinity included): saturate to the largest finite value.
        return sign | 0x7e;
    }
    if a >= 0x3c80_0000 {
        // Normal in E4M3 (|x| >= 2^-6): keep 3 mantissa bits, round at bit 20, rebias.
        let r = a + 0x7_ffff + ((a >> 20) & 1);
        let v = (r >> 20) - ((127 - 7) << 3);
        return sign | v as u8;
    }
    // Subnormal or zero: a multiple of 2^-9; 8 * 2^-9 rounds up into the smallest normal,
    // whose encoding is 0x08, so the integer is the encoding either way.
    let m = (f32::from_bits(a) * 512.0).round_ties_even();
    sign | m as u8
}

/// `x` rounded to E5M2 (nearest, ties to even; overflow to ±infinity).
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7f;
    }
    if a >= 0x3880_0000 {
        // Normal in E5M2 (|x| >= 2^-14): keep 2 mantissa bits, round at bit 21, rebias.
        let r = a + 0xf_ffff + ((a >> 21) & 1);
        let v = (r >> 21) - ((127 - 15) << 2);
        return sign | v.min(0x7c) as u8;
    }
    let m = (f32::from_bits(a) * 65536.0).round_ties_even();
    sign | m as u8
}

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u32;
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = (b >> 3) & 0xf;
        let m = b & 7;
        t[i] = if e == 15 && m == 7 {
            f32::NAN
        } else if e == 0 {
            sign * (m as f32) * (1.0 / 512.0)
        } else {
            sign * f32::from_bits(((e + 127 - 7) << 23) | (m << 20))
        };
        i += 1;
    }
    t
}

const fn e5m2_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u32;
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = (b >> 2) & 0x1f;
        let m = b & 3;
        t[i] = if e == 31 {
            if m == 0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        } else if e == 0 {
            sign * (m as f32) * (1.0 / 65536.0)
        } else {
            sign * f32::from_bits(((e + 127 - 15) << 23) | (m << 21))
        };
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_encodings() {
        assert_eq!(f32_to_e4m3(1.0), 0x38);
        assert_eq!(f32_to_e4m3(-2.0), 0xc0);
        assert_eq!(f32_to_e4m3(448.0), 0x7e);
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xfe);
        assert_eq!(f32_to_e4m3(2f32.powi(-9)), 0x01);
        assert_eq!(f32_to_e4m3(f32::NAN) & 0x7f, 0x7f);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert!(e4m3_to_f32(0x7f).is_nan());

        assert_eq!(f32_to_e5m2(1.0), 0x3c);
        assert_eq!(f32_to_e5m2(57344.0), 0x7b);
        assert_eq!(f32_to_e5m2(1e9), 0x7c);
        assert_eq!(f32_to_e5m2(-1e9), 0xfc);
        assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
        assert!(e5m2_to_f32(0x7e).is_nan());
    }

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            let x = e4m3_to_f32(b);
            if x.is_nan() {
                assert!(e4m3_to_f32(f32_to_e4m3(x)).is_nan());
            } else {
                assert_eq!(f32_to_e4m3(x), b, "e4m3 {b:#04x} = {x}");
            }
            let y = e5m2_to_f32(b);
            if y.is_nan() {
                assert!(e5m2_to_f32(f32_to_e5m2(y)).is_nan());
            } else {
                assert_eq!(f32_to_e5m2(y), b, "e5m2 {b:#04x} = {y}");
            }
        }
    }

    #[test]
    fn rounding_is_nearest_even() {
        // Midpoints between neighbours round to the one with an even mantissa.
        for b in 0..0x7du8 {
            let (lo, hi) = (e4m3_to_f32(b), e4m3_to_f32(b + 1));
            let mid = (lo + hi) / 2.0;
            let want = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(f32_to_e4m3(mid), want, "e4m3 between {lo} and {hi}");
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.25), b);
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.75), b + 1);
        }
        for b in 0..0x7bu8 {
            let (lo, hi) = (e5m2_to_f32(b), e5m2_to_f32(b + 1));
            let mid = (lo + hi) / 2.0;
            let want = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(f32_to_e5m2(mid), want, "e5m2 between {lo} and {hi}");
        }
        // Past the largest E5M2 normal by more than half an ulp: infinity.
        assert_eq!(f32_to_e5m2(61440.0), 0x7c);
        assert_eq!(f32_to_e5m2(61439.0), 0x7b);
    }
}
