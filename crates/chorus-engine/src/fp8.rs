//! The two OCP 8-bit float formats, as conversions to and from `f32`.
//!
//! Host reductions on fp8 decode to `f32`, compute there (sums and products of two fp8
//! values are exact in `f32`), and round once back to fp8 with round-to-nearest-even.
//! Overflow: E4M3 ("E4M3FN", no infinities) saturates to ±448, as CUDA's `__NV_SATFINITE`
//! does, so a large sum stays a large number instead of becoming NaN; E5M2 follows IEEE and
//! rounds to ±infinity. NaN stays NaN (the canonical quiet NaN of each format, sign kept).
//! The CUDA device must round the same way so host and GPU ranks agree bit for bit.

/// The value of an E4M3 byte (exponent bias 7, 3 mantissa bits, `S.1111.111` is NaN).
/// Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let b = u32::from(b);
    let sign = (b & 0x80) << 24;
    let em = b & 0x7f;
    let normal = f32::from_bits((em << 20) + ((127 - 7) << 23));
    let sub = em as f32 * (1.0 / 512.0);
    let v = if em >= 8 { normal } else { sub };
    let v = if em == 0x7f { f32::NAN } else { v };
    f32::from_bits(v.to_bits() | sign)
}

/// The value of an E5M2 byte (exponent bias 15, 2 mantissa bits, IEEE-style infinities and
/// NaNs): the top byte of an IEEE half.
#[inline(always)]
pub fn e5m2_to_f32(b: u8) -> f32 {
    f16_to_f32(u16::from(b) << 8)
}

/// `x` rounded to E4M3 (nearest, ties to even; saturating at ±448). Branch-free.
#[inline(always)]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    // Normal in E4M3 (|x| >= 2^-6): keep 3 mantissa bits, round at bit 20, rebias.
    let r = a.wrapping_add(0x7_ffff + ((a >> 20) & 1));
    let normal = (r >> 20).wrapping_sub((127 - 7) << 3) as u8;
    // Subnormal or zero: a multiple of 2^-9; 8 * 2^-9 rounds up into the smallest normal,
    // whose encoding is 0x08, so the integer is the encoding either way.
    let sub = (f32::from_bits(a) * 512.0).round_ties_even() as u8;
    let v = if a >= 0x3c80_0000 { normal } else { sub };
    // |x| >= 448 (infinity included) saturates to the largest finite value; NaN stays NaN.
    let v = if a >= 0x43e0_0000 { 0x7e } else { v };
    let v = if a > 0x7f80_0000 { 0x7f } else { v };
    sign | v
}

/// `x` rounded to E5M2 (nearest, ties to even; overflow to ±infinity). Branch-free.
#[inline(always)]
pub fn f32_to_e5m2(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    let r = a.wrapping_add(0xf_ffff + ((a >> 21) & 1));
    let normal = (r >> 21).wrapping_sub((127 - 15) << 2).min(0x7c) as u8;
    let sub = (f32::from_bits(a) * 65536.0).round_ties_even() as u8;
    let v = if a >= 0x3880_0000 { normal } else { sub };
    let v = if a > 0x7f80_0000 { 0x7f } else { v };
    sign | v
}

/// The value of IEEE half bits. Branch-free (no subnormal float arithmetic either, which
/// some CPUs take a slow path for), so loops over it vectorise; agrees with `half`.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let normal = (em << 13) + ((127 - 15) << 23);
    let special = (em << 13) | 0x7f80_0000;
    let sub = (em as f32 * (1.0 / 16_777_216.0)).to_bits();
    let v = if em < 0x400 { sub } else { normal };
    let v = if em >= 0x7c00 { special } else { v };
    f32::from_bits(v | sign)
}

/// `x` rounded to IEEE half bits (nearest, ties to even; NaN stays a quiet NaN).
/// Branch-free; agrees with `half::f16::from_f32`.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    let r = a.wrapping_add(0xfff + ((a >> 13) & 1));
    let normal = (r >> 13).wrapping_sub((127 - 15) << 10).min(0x7c00) as u16;
    // Below 2^-14: adding 0.5 leaves the value's multiple of 2^-24 in the low mantissa
    // bits, rounded to nearest even by the addition itself.
    let sub = ((f32::from_bits(a) + 0.5).to_bits() - 0x3f00_0000) as u16;
    let nan = 0x7e00 | ((a >> 13) & 0x3ff) as u16;
    let v = if a >= 0x3880_0000 { normal } else { sub };
    let v = if a > 0x7f80_0000 { nan } else { v };
    sign | v
}

#[cfg(test)]
/// Reference decode tables, written from the format definitions.
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

#[cfg(test)]
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
    fn decoders_match_the_format_tables() {
        let (t4, t5) = (e4m3_table(), e5m2_table());
        for b in 0..=255u8 {
            let (x, y) = (e4m3_to_f32(b), t4[usize::from(b)]);
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{b:#x}"
            );
            let (x, y) = (e5m2_to_f32(b), t5[usize::from(b)]);
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{b:#x}"
            );
        }
    }

    #[test]
    fn f16_codec_matches_half() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#x}"
            );
        }
        // Every f32 exponent, with mantissas around the rounding points.
        for e in 0..=255u32 {
            for m in [
                0u32, 1, 0xfff, 0x1000, 0x1fff, 0x2000, 0x3000, 0x7f_e000, 0x7f_ffff, 0x40_0000,
            ] {
                for s in [0u32, 1 << 31] {
                    let x = f32::from_bits(s | e << 23 | m);
                    let want = half::f16::from_f32(x);
                    let got = f32_to_f16(x);
                    if x.is_nan() {
                        assert!(half::f16::from_bits(got).is_nan());
                    } else {
                        assert_eq!(got, want.to_bits(), "{x:e} ({:#x})", x.to_bits());
                    }
                }
            }
        }
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
