//! The kernels, for x86-64 with AVX2 and F16C (every x86-64 CPU since 2013 has both).
//!
//! Each kernel walks its slices in 32-byte blocks (16 elements of the 16-bit formats, 32 of
//! the 8-bit ones); a last partial block is copied into a zero-padded block, computed the
//! same way and copied back, so every element goes through the same instructions.
//!
//! * Sums, products and the one-operand maps widen to `f32`, compute, and round back once.
//!   f16 uses the F16C conversions (`vcvtph2ps`, and `vcvtps2ph` with round-to-nearest-even);
//!   bf16 widens by a shift and narrows by integer round-to-nearest-even on the `f32` bits.
//!   fp8 widens through `vcvtph2ps` too (an E5M2 byte is the top half of an f16; E4M3's bits
//!   moved into an f16 give its value times 2^-8, a scale the narrowing takes back) and
//!   narrows with integer arithmetic on the `f32` bits around one `f32` addition that does
//!   the rounding in hardware (`fp8_code`), with no table and no conversion instruction.
//! * `min` and `max` never leave the integer domain: the sign-magnitude encodings compare as
//!   integers once negatives are negated (both zeros map to 0), NaNs are picked out by their
//!   magnitude, and the chosen operand is returned with a NaN quieted the way widening and
//!   narrowing would have quieted it.

/// How the one-operand kernels change each element.
#[derive(Copy, Clone, Debug)]
#[cfg_attr(
    not(target_arch = "x86_64"),
    expect(dead_code, reason = "only the x86-64 kernels read the factors")
)]
pub(crate) enum Map {
    Mul(f32),
    Div(f32),
}

/// What a [`Kernels`](crate::Kernels) holds: nothing where the kernels exist, and a value
/// that cannot be made where they do not.
#[cfg(target_arch = "x86_64")]
pub(crate) type Proof = ();
#[cfg(not(target_arch = "x86_64"))]
#[derive(Copy, Clone, Debug)]
pub(crate) enum Proof {}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{detect, map, reduce};

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn detect() -> Option<Proof> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn reduce(k: crate::Kernels, _: crate::Format, _: crate::Op, _: &mut [u8], _: &[u8]) {
    // No `Kernels` is ever made on this architecture.
    match k._detected {}
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn map(k: crate::Kernels, _: crate::Format, _: Map, _: &mut [u8]) {
    match k._detected {}
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use bytemuck::cast;

    use super::Map;
    use crate::{Format, Kernels, Op};

    /// A proof, if this CPU has AVX2 and F16C.
    pub(crate) fn detect() -> Option<super::Proof> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")).then_some(())
    }

    pub(crate) fn reduce(k: Kernels, format: Format, op: Op, dst: &mut [u8], src: &[u8]) {
        let Kernels { _detected: () } = k;
        // SAFETY: a `Kernels` exists only once `detect()` has seen AVX2 and F16C on this
        // CPU, which is all `reduce_avx2` is compiled to use.
        unsafe { reduce_avx2(format, op, dst, src) }
    }

    pub(crate) fn map(k: Kernels, format: Format, map: Map, mem: &mut [u8]) {
        let Kernels { _detected: () } = k;
        // SAFETY: as in `reduce`.
        unsafe { map_avx2(format, map, mem) }
    }

    /// The arithmetic operators, as `apply`'s parameter.
    const SUM: bool = false;
    const PROD: bool = true;

    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;

    /// The magnitude (bits without the sign) of +infinity in f16, bf16, E4M3's largest code
    /// (its NaN is the only code above `0x7e`) and E5M2: any magnitude above it is a NaN.
    const F16_INF: i16 = 0x7c00;
    const BF16_INF: i16 = 0x7f80;
    const E4M3_TOP: i8 = 0x7e;
    const E5M2_INF: i8 = 0x7c;
    /// What quieting sets in a NaN: the top mantissa bit (f16, bf16); the whole mantissa,
    /// which makes fp8's canonical `0x7f`.
    const F16_QUIET: i16 = 0x0200;
    const BF16_QUIET: i16 = 0x0040;
    const FP8_QUIET: i8 = 0x03;

    /// Runs `$step(&mut [u8; 32], &[u8; 32])` over equal-length slices, the last partial
    /// block zero-padded.
    macro_rules! zip_blocks {
        ($dst:expr, $src:expr, $step:expr) => {{
            let (dst, src): (&mut [u8], &[u8]) = ($dst, $src);
            let (dc, dt) = dst.as_chunks_mut::<32>();
            let (sc, st) = src.as_chunks::<32>();
            for (d, s) in dc.iter_mut().zip(sc) {
                $step(d, s);
            }
            // Equal lengths (checked by the caller) leave equal tails.
            if !dt.is_empty() && dt.len() == st.len() {
                let (mut d, mut s) = ([0u8; 32], [0u8; 32]);
                d[..dt.len()].copy_from_slice(dt);
                s[..st.len()].copy_from_slice(st);
                $step(&mut d, &s);
                let n = dt.len();
                dt.copy_from_slice(&d[..n]);
            }
        }};
    }

    /// Runs `$step(&mut [u8; 32])` over a slice, the last partial block zero-padded.
    macro_rules! map_blocks {
        ($mem:expr, $step:expr) => {{
            let mem: &mut [u8] = $mem;
            let (mc, mt) = mem.as_chunks_mut::<32>();
            for m in mc.iter_mut() {
                $step(m);
            }
            if !mt.is_empty() {
                let mut m = [0u8; 32];
                m[..mt.len()].copy_from_slice(mt);
                $step(&mut m);
                let n = mt.len();
                mt.copy_from_slice(&m[..n]);
            }
        }};
    }

    #[target_feature(enable = "avx2,f16c")]
    fn reduce_avx2(format: Format, op: Op, dst: &mut [u8], src: &[u8]) {
        match (format, op) {
            (Format::F16, Op::Sum) => zip_blocks!(dst, src, f16_arith::<SUM>),
            (Format::F16, Op::Prod) => zip_blocks!(dst, src, f16_arith::<PROD>),
            (Format::F16, Op::Min) => {
                zip_blocks!(dst, src, order16::<false, F16_INF, F16_QUIET>)
            }
            (Format::F16, Op::Max) => zip_blocks!(dst, src, order16::<true, F16_INF, F16_QUIET>),
            (Format::Bf16, Op::Sum) => zip_blocks!(dst, src, bf16_arith::<SUM>),
            (Format::Bf16, Op::Prod) => zip_blocks!(dst, src, bf16_arith::<PROD>),
            (Format::Bf16, Op::Min) => {
                zip_blocks!(dst, src, order16::<false, BF16_INF, BF16_QUIET>)
            }
            (Format::Bf16, Op::Max) => {
                zip_blocks!(dst, src, order16::<true, BF16_INF, BF16_QUIET>)
            }
            (Format::E4m3, Op::Sum) => zip_blocks!(dst, src, fp8_arith::<true, SUM>),
            (Format::E4m3, Op::Prod) => zip_blocks!(dst, src, fp8_arith::<true, PROD>),
            (Format::E4m3, Op::Min) => zip_blocks!(dst, src, order8::<false, E4M3_TOP>),
            (Format::E4m3, Op::Max) => zip_blocks!(dst, src, order8::<true, E4M3_TOP>),
            (Format::E5m2, Op::Sum) => zip_blocks!(dst, src, fp8_arith::<false, SUM>),
            (Format::E5m2, Op::Prod) => zip_blocks!(dst, src, fp8_arith::<false, PROD>),
            (Format::E5m2, Op::Min) => zip_blocks!(dst, src, order8::<false, E5M2_INF>),
            (Format::E5m2, Op::Max) => zip_blocks!(dst, src, order8::<true, E5M2_INF>),
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    fn map_avx2(format: Format, map: Map, mem: &mut [u8]) {
        let (div, k) = match map {
            Map::Mul(k) => (false, k),
            Map::Div(k) => (true, k),
        };
        // For bf16, a NaN factor's low 16 bits cleared (quiet bit kept): a product with it
        // rounds to the same bf16 (they fall below bf16's mantissa), and with every NaN
        // having zero low bits the bf16 narrowing needs no NaN select.
        let k = if format == Format::Bf16 && k.is_nan() {
            f32::from_bits(k.to_bits() & 0xffff_0000 | 0x0040_0000)
        } else {
            k
        };
        let k = _mm256_set1_ps(k);
        match (format, div) {
            (Format::F16, false) => map_blocks!(mem, |m| f16_map::<false>(m, k)),
            (Format::F16, true) => map_blocks!(mem, |m| f16_map::<true>(m, k)),
            (Format::Bf16, false) => map_blocks!(mem, |m| bf16_map::<false>(m, k)),
            (Format::Bf16, true) => map_blocks!(mem, |m| bf16_map::<true>(m, k)),
            (Format::E4m3, false) => map_blocks!(mem, |m| fp8_map::<true, false>(m, k)),
            (Format::E4m3, true) => map_blocks!(mem, |m| fp8_map::<true, true>(m, k)),
            (Format::E5m2, false) => map_blocks!(mem, |m| fp8_map::<false, false>(m, k)),
            (Format::E5m2, true) => map_blocks!(mem, |m| fp8_map::<false, true>(m, k)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // f32 arithmetic

    /// `a + b`, or `a * b` for `PROD`, on eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn apply<const PROD: bool>(a: __m256, b: __m256) -> __m256 {
        if PROD {
            _mm256_mul_ps(a, b)
        } else {
            _mm256_add_ps(a, b)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn scale<const DIV: bool>(x: __m256, k: __m256) -> __m256 {
        if DIV {
            _mm256_div_ps(x, k)
        } else {
            _mm256_mul_ps(x, k)
        }
    }

    // -----------------------------------------------------------------------------------------
    // f16

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn f16_arith<const OP: bool>(d: &mut [u8; 32], s: &[u8; 32]) {
        let [d0, d1]: [__m128i; 2] = cast(*d);
        let [s0, s1]: [__m128i; 2] = cast(*s);
        let r0 = apply::<OP>(_mm256_cvtph_ps(d0), _mm256_cvtph_ps(s0));
        let r1 = apply::<OP>(_mm256_cvtph_ps(d1), _mm256_cvtph_ps(s1));
        *d = cast([_mm256_cvtps_ph::<RNE>(r0), _mm256_cvtps_ph::<RNE>(r1)]);
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn f16_map<const DIV: bool>(m: &mut [u8; 32], k: __m256) {
        let [m0, m1]: [__m128i; 2] = cast(*m);
        let r0 = scale::<DIV>(_mm256_cvtph_ps(m0), k);
        let r1 = scale::<DIV>(_mm256_cvtph_ps(m1), k);
        *m = cast([_mm256_cvtps_ph::<RNE>(r0), _mm256_cvtps_ph::<RNE>(r1)]);
    }

    // -----------------------------------------------------------------------------------------
    // bf16

    /// Sixteen bf16 as two vectors of `f32` (lanes in `unpack` order, which `narrow_bf16`'s
    /// `pack` undoes).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn widen_bf16(v: __m256i) -> (__m256, __m256) {
        let z = _mm256_setzero_si256();
        (
            _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v)),
        )
    }

    /// `x` rounded to bf16 (nearest, ties to even), in the low half of each 32-bit lane.
    /// A NaN must be quiet with zero low 16 bits, which rounding then leaves alone, keeping
    /// the top half: the reference's quiet NaN. Every caller's NaNs are: x86 arithmetic
    /// returns an operand's NaN (quieted) or its default NaN, the operands are widened bf16
    /// and factors with those bits cleared (`map_avx2`).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn round_bf16(x: __m256) -> __m256i {
        let b = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
        _mm256_srli_epi32::<16>(_mm256_add_epi32(b, bias))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn narrow_bf16(lo: __m256, hi: __m256) -> __m256i {
        // Every lane is at most 0xffff, so the saturating pack is a plain one.
        _mm256_packus_epi32(round_bf16(lo), round_bf16(hi))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn bf16_arith<const OP: bool>(d: &mut [u8; 32], s: &[u8; 32]) {
        let (d0, d1) = widen_bf16(cast(*d));
        let (s0, s1) = widen_bf16(cast(*s));
        *d = cast(narrow_bf16(apply::<OP>(d0, s0), apply::<OP>(d1, s1)));
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn bf16_map<const DIV: bool>(m: &mut [u8; 32], k: __m256) {
        // `map_avx2` cleared the low bits of a NaN factor.
        let (m0, m1) = widen_bf16(cast(*m));
        *m = cast(narrow_bf16(scale::<DIV>(m0, k), scale::<DIV>(m1, k)));
    }

    // -----------------------------------------------------------------------------------------
    // fp8

    /// Eight `f32` magnitudes rounded to the code of an fp8 format with `mant` mantissa bits
    /// whose smallest normal binade is 2^`emin` (nearest, ties to even), in 32-bit lanes and
    /// capped at `top`. Adding `c`, the power of two `23 - mant` binades above the magnitude
    /// (but at least above 2^`emin`), rounds in hardware at the format's spacing; the sum's
    /// distance from `c` in bits is the mantissa counted from the implicit one, and `c`'s
    /// exponent gives the code's. Subnormals fall out of the same formula, with the smallest
    /// binade's `c`. Magnitudes too large for the format give codes past `top` (as unsigned
    /// numbers: for the largest `f32`s, infinity and NaN, `c`'s exponent overflows into the
    /// sign, and the difference wraps to one above 2^31), so the cap is all the overflow
    /// handling there is. A NaN gives `top`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn fp8_code(x: __m256, mant: i32, emin: i32, top: i32) -> __m256i {
        let a = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
        let e = _mm256_and_si256(a, _mm256_set1_epi32(0x7f80_0000));
        let e = _mm256_max_epi32(e, _mm256_set1_epi32((127 + emin) << 23));
        let c = _mm256_add_epi32(e, _mm256_set1_epi32((23 - mant) << 23));
        let sum = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(c));
        let k = _mm256_sub_epi32(_mm256_castps_si256(sum), c);
        // code = ((E - emin + 1) << mant) + k - (1 << mant)
        //      = k + ((E + 127) << mant) - ((127 + emin) << mant).
        let exponent = _mm256_srl_epi32(e, _mm_cvtsi32_si128(23 - mant));
        let code = _mm256_sub_epi32(
            _mm256_add_epi32(k, exponent),
            _mm256_set1_epi32((127 + emin) << mant),
        );
        _mm256_min_epu32(code, _mm256_set1_epi32(top))
    }

    /// Sixteen E5M2 bytes as two vectors of `f32`: each byte is the top half of an f16.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn widen_e5m2_16(v: __m128i) -> [__m256; 2] {
        let z = _mm_setzero_si128();
        [
            _mm256_cvtph_ps(_mm_unpacklo_epi8(z, v)),
            _mm256_cvtph_ps(_mm_unpackhi_epi8(z, v)),
        ]
    }

    /// Sixteen E4M3 bytes as two vectors of `f32` holding their values times 2^-8: the bits
    /// moved into an f16 (the sign to the top, exponent and mantissa to the bottom of f16's),
    /// whose bias is 8 more than E4M3's; subnormals map to subnormals. The NaN code becomes
    /// 480 * 2^-8: callers put NaNs back from the bytes ([`keep_e4m3_nan`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn widen_e4m3_16(v: __m128i) -> [__m256; 2] {
        // Sign-extended then shifted left by 7: the sign lands in bit 15 (and 14, cleared).
        let h = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(v));
        let h = _mm256_and_si256(h, _mm256_set1_epi16(0xbf80u16 as i16));
        [
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        ]
    }

    /// 32 fp8 bytes as four vectors of `f32`, in order (E4M3 scaled as [`widen_e4m3_16`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn widen_fp8<const E4M3: bool>(b: &[u8; 32]) -> [__m256; 4] {
        let [lo, hi]: [__m128i; 2] = cast(*b);
        let ([x0, x1], [x2, x3]) = if E4M3 {
            (widen_e4m3_16(lo), widen_e4m3_16(hi))
        } else {
            (widen_e5m2_16(lo), widen_e5m2_16(hi))
        };
        [x0, x1, x2, x3]
    }

    /// 32 `f32` rounded to fp8 (nearest, ties to even), in order: E4M3 (its values times
    /// 2^-`scale`) saturating at ±448, infinity included; E5M2 overflowing to infinity; NaN
    /// to `0x7f` with its sign when `NAN`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn narrow_fp8<const E4M3: bool, const NAN: bool>(x: [__m256; 4], scale: i32) -> __m256i {
        // (No closures here: they would be compiled apart, without the target features.)
        let (mant, emin, top) = if E4M3 {
            (3, -6 - scale, i32::from(E4M3_TOP))
        } else {
            (2, -14, i32::from(E5M2_INF))
        };
        let mut codes = [
            fp8_code(x[0], mant, emin, top),
            fp8_code(x[1], mant, emin, top),
            fp8_code(x[2], mant, emin, top),
            fp8_code(x[3], mant, emin, top),
        ];
        if NAN {
            for (code, x) in codes.iter_mut().zip(x) {
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
                *code = _mm256_blendv_epi8(*code, _mm256_set1_epi32(0x7f), nan);
            }
        }
        // Four vectors of 32-bit lanes (elements 0..8, 8..16, 16..24, 24..32) packed to
        // bytes: the codes (0..=0x7f) unsigned, the `f32` bits signed, which keeps their
        // signs. The packs work within 128-bit lanes, which leaves the 4-byte groups in the
        // order 0, 2, 4, 6, 1, 3, 5, 7; one permutation puts them back.
        let codes = _mm256_packus_epi16(
            _mm256_packus_epi32(codes[0], codes[1]),
            _mm256_packus_epi32(codes[2], codes[3]),
        );
        let bits = [
            _mm256_castps_si256(x[0]),
            _mm256_castps_si256(x[1]),
            _mm256_castps_si256(x[2]),
            _mm256_castps_si256(x[3]),
        ];
        let signs = _mm256_packs_epi16(
            _mm256_packs_epi32(bits[0], bits[1]),
            _mm256_packs_epi32(bits[2], bits[3]),
        );
        let signs = _mm256_and_si256(signs, _mm256_set1_epi8(0x80u8 as i8));
        let packed = _mm256_or_si256(codes, signs);
        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// `out` with the E4M3 NaNs of its operands put back: a NaN `a` wins, then a NaN `b`
    /// (x86's rule for which NaN an operation returns). E4M3 has no infinities, so its
    /// arithmetic makes a NaN only from a NaN operand.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn keep_e4m3_nan(out: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let m = _mm256_set1_epi8(0x7f);
        let a_nan = _mm256_cmpeq_epi8(_mm256_and_si256(a, m), m);
        let b_nan = _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m);
        _mm256_blendv_epi8(_mm256_blendv_epi8(out, b, b_nan), a, a_nan)
    }

    /// 32 `f32` that are sums or products of two fp8 values (E4M3's times 2^-8), rounded to
    /// fp8 through f16: `vcvtps2ph` to nearest-even, then nearest-even again on the f16 bits,
    /// dropping the 8 (E5M2) or 7 (E4M3) mantissa bits fp8 lacks. Rounding twice can differ
    /// from rounding once only when the first rounding lands exactly on a midpoint of the
    /// second from a value that was not on it, so within half an f16 unit of it; a sum or
    /// product of two fp8 values never is (its significant bits span too few places to
    /// reach both the midpoint's bit and a bit below f16's last; the tests check every
    /// pair). NaNs come out as `0x7f` with their sign for E5M2; E4M3 callers put them back
    /// from the operands ([`keep_e4m3_nan`]). For one-operand maps, whose factor is any
    /// `f32`, this does not hold: they use [`narrow_fp8`].
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn narrow_fp8_pairwise<const E4M3: bool>(x: [__m256; 4]) -> __m256i {
        let h = [
            _mm256_set_m128i(_mm256_cvtps_ph::<RNE>(x[1]), _mm256_cvtps_ph::<RNE>(x[0])),
            _mm256_set_m128i(_mm256_cvtps_ph::<RNE>(x[3]), _mm256_cvtps_ph::<RNE>(x[2])),
        ];
        let one = _mm256_set1_epi16(1);
        let v = h.map(|h| {
            let mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
            if E4M3 {
                let lsb = _mm256_and_si256(_mm256_srli_epi16::<7>(mag), one);
                let bias = _mm256_add_epi16(lsb, _mm256_set1_epi16(0x3f));
                let code = _mm256_srli_epi16::<7>(_mm256_add_epi16(mag, bias));
                let code = _mm256_min_epu16(code, _mm256_set1_epi16(i16::from(E4M3_TOP)));
                let sign = _mm256_and_si256(_mm256_srli_epi16::<8>(h), _mm256_set1_epi16(0x80));
                _mm256_or_si256(code, sign)
            } else {
                let top = _mm256_srli_epi16::<8>(h);
                let lsb = _mm256_and_si256(top, one);
                let bias = _mm256_add_epi16(lsb, _mm256_set1_epi16(0x7f));
                // No carry reaches the sign: infinity's 0x7c00 is the largest magnitude
                // short of a NaN.
                let code = _mm256_srli_epi16::<8>(_mm256_add_epi16(h, bias));
                let nan = _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(F16_INF));
                _mm256_blendv_epi8(code, _mm256_or_si256(top, _mm256_set1_epi16(0x7f)), nan)
            }
        });
        // In-lane pack: the 8-byte groups come out as elements 0, 16, 8, 24.
        let packed = _mm256_packus_epi16(v[0], v[1]);
        _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn fp8_arith<const E4M3: bool, const OP: bool>(d: &mut [u8; 32], s: &[u8; 32]) {
        let a = widen_fp8::<E4M3>(d);
        let b = widen_fp8::<E4M3>(s);
        let mut r = [
            apply::<OP>(a[0], b[0]),
            apply::<OP>(a[1], b[1]),
            apply::<OP>(a[2], b[2]),
            apply::<OP>(a[3], b[3]),
        ];
        *d = cast(if E4M3 {
            // Scaled operands: a sum carries one 2^-8, a product two; take one back.
            if OP == PROD {
                for r in &mut r {
                    *r = _mm256_mul_ps(*r, _mm256_set1_ps(256.0));
                }
            }
            keep_e4m3_nan(narrow_fp8_pairwise::<true>(r), cast(*d), cast(*s))
        } else {
            narrow_fp8_pairwise::<false>(r)
        });
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn fp8_map<const E4M3: bool, const DIV: bool>(m: &mut [u8; 32], k: __m256) {
        let x = widen_fp8::<E4M3>(m);
        let r = [
            scale::<DIV>(x[0], k),
            scale::<DIV>(x[1], k),
            scale::<DIV>(x[2], k),
            scale::<DIV>(x[3], k),
        ];
        *m = cast(if E4M3 {
            // A NaN or infinite factor can make NaNs here.
            let out = narrow_fp8::<true, true>(r, 8);
            keep_e4m3_nan(out, cast(*m), cast(*m))
        } else {
            narrow_fp8::<false, true>(r, 0)
        });
    }

    // -----------------------------------------------------------------------------------------
    // min and max on the encodings

    /// 16-bit sign-magnitude as an ordered integer: negatives negated, both zeros 0.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn key16(x: __m256i) -> __m256i {
        let mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7fff));
        let neg = _mm256_srai_epi16::<15>(x);
        _mm256_sub_epi16(_mm256_xor_si256(mag, neg), neg)
    }

    /// `min` (or `max`) of sixteen f16/bf16 pairs; `INF` is the format's infinity magnitude,
    /// `QUIET` its quiet bit.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn order16<const MAX: bool, const INF: i16, const QUIET: i16>(d: &mut [u8; 32], s: &[u8; 32]) {
        let (a, b): (__m256i, __m256i) = (cast(*d), cast(*s));
        let (ka, kb) = (key16(a), key16(b));
        let inf = _mm256_set1_epi16(INF);
        let magnitude = _mm256_set1_epi16(0x7fff);
        let a_nan = _mm256_cmpgt_epi16(_mm256_and_si256(a, magnitude), inf);
        let b_nan = _mm256_cmpgt_epi16(_mm256_and_si256(b, magnitude), inf);
        let beyond = if MAX {
            _mm256_cmpgt_epi16(kb, ka)
        } else {
            _mm256_cmpgt_epi16(ka, kb)
        };
        // `b` when it is ordered beyond `a` (a NaN `b` never is), or when `a` is NaN.
        let take_b = _mm256_or_si256(_mm256_andnot_si256(b_nan, beyond), a_nan);
        let r = _mm256_blendv_epi8(a, b, take_b);
        let r_nan = _mm256_cmpgt_epi16(_mm256_and_si256(r, magnitude), inf);
        *d = cast(_mm256_or_si256(
            r,
            _mm256_and_si256(r_nan, _mm256_set1_epi16(QUIET)),
        ));
    }

    /// 8-bit sign-magnitude as an ordered integer: negatives negated, both zeros 0.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn key8(x: __m256i) -> __m256i {
        let mag = _mm256_and_si256(x, _mm256_set1_epi8(0x7f));
        let neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), x);
        _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg)
    }

    /// `min` (or `max`) of 32 fp8 pairs; magnitudes above `TOP` are NaN.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn order8<const MAX: bool, const TOP: i8>(d: &mut [u8; 32], s: &[u8; 32]) {
        let (a, b): (__m256i, __m256i) = (cast(*d), cast(*s));
        let (ka, kb) = (key8(a), key8(b));
        let top = _mm256_set1_epi8(TOP);
        let magnitude = _mm256_set1_epi8(0x7f);
        let a_nan = _mm256_cmpgt_epi8(_mm256_and_si256(a, magnitude), top);
        let b_nan = _mm256_cmpgt_epi8(_mm256_and_si256(b, magnitude), top);
        let beyond = if MAX {
            _mm256_cmpgt_epi8(kb, ka)
        } else {
            _mm256_cmpgt_epi8(ka, kb)
        };
        let take_b = _mm256_or_si256(_mm256_andnot_si256(b_nan, beyond), a_nan);
        let r = _mm256_blendv_epi8(a, b, take_b);
        let r_nan = _mm256_cmpgt_epi8(_mm256_and_si256(r, magnitude), top);
        *d = cast(_mm256_or_si256(
            r,
            _mm256_and_si256(r_nan, _mm256_set1_epi8(FP8_QUIET)),
        ));
    }
}
