//! chorus-simd: vectorised host arithmetic on the 16- and 8-bit floats.
//!
//! Floor 1 of the house (`docs/ARCHITECTURE.md`), beside `chorus-protocol`: it imports no
//! chorus crate and nothing but `bytemuck`; `chorus-engine` (floor 2) calls it from its host
//! reductions. It must never import anything that does IO, reads a clock or spawns a thread.
//! It is the one place in the workspace for target-feature `unsafe`.
//!
//! It exists to hold the one kind of `unsafe` that host arithmetic needs: entering code
//! compiled for instructions the baseline target lacks (AVX2 and F16C on x86-64), after
//! the CPU has been asked whether it has them. Everything else is safe code: the kernels are
//! `#[target_feature]` functions, in which the `std::arch` intrinsics are safe to call, and
//! they load and store through `bytemuck` casts of byte arrays, not raw pointers.
//!
//! The arithmetic is fixed here, for every format: widen each element to `f32` (exactly),
//! apply the operator in `f32`, round once back to the format (nearest, ties to even).
//! `min`/`max` follow x86's `minNum` lowering: `min(a, b)` is `b` when `b < a` or `a` is NaN,
//! else `a` (so equal operands, `+0`/`-0` included, give `a`). NaN results are quiet NaNs: f16
//! and bf16 keep sign and payload (quiet bit set); fp8 gives its format's `0x7f` with the
//! sign; when both operands of a sum or product are NaN, `dst`'s comes back, and an invalid
//! operation (infinity minus infinity, zero times infinity) gives x86's default NaN, whose
//! sign bit is set. E4M3 ("E4M3FN") saturates to ±448, E5M2 overflows to ±infinity. These
//! are the rules of `chorus-engine`'s portable reference, which its tests hold this crate to
//! bit for bit (except which of two NaN operands comes back, a choice the portable loops
//! leave to the compiler).

mod avx2;

use std::sync::OnceLock;

/// An element format this crate computes on.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Format {
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of an `f32`).
    Bf16,
    /// OCP 8-bit E4M3 (no infinities, one NaN per sign).
    E4m3,
    /// OCP 8-bit E5M2 (IEEE-style infinities and NaNs).
    E5m2,
}

impl Format {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Format::F16 | Format::Bf16 => 2,
            Format::E4m3 | Format::E5m2 => 1,
        }
    }
}

/// An elementwise binary operator.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
}

/// Slices that are not a whole number of equal-length elements.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct LengthError {
    /// Destination length in bytes.
    pub dst: usize,
    /// Source length in bytes (equal to `dst` for the one-operand kernels).
    pub src: usize,
    /// The format's element size.
    pub size: usize,
}

impl std::fmt::Display for LengthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "slices of {} and {} bytes are not equal whole numbers of {}-byte elements",
            self.dst, self.src, self.size
        )
    }
}

impl std::error::Error for LengthError {}

/// Proof that this CPU runs the vectorised kernels (x86-64 with AVX2 and F16C); only
/// [`Kernels::detect`] makes one. Copy it freely.
#[derive(Copy, Clone, Debug)]
pub struct Kernels {
    _detected: avx2::Proof,
}

impl Kernels {
    /// The kernels, if this CPU has what they need (asked once per process).
    pub fn detect() -> Option<Kernels> {
        static PROOF: OnceLock<Option<avx2::Proof>> = OnceLock::new();
        (*PROOF.get_or_init(avx2::detect)).map(|p| Kernels { _detected: p })
    }

    /// `dst[i] = op(dst[i], src[i])` over every element.
    pub fn reduce(
        self,
        format: Format,
        op: Op,
        dst: &mut [u8],
        src: &[u8],
    ) -> Result<(), LengthError> {
        whole(format, dst.len(), src.len())?;
        avx2::reduce(self, format, op, dst, src);
        Ok(())
    }

    /// `mem[i] = mem[i] * factor` over every element (in `f32`, rounded once).
    pub fn scale(self, format: Format, mem: &mut [u8], factor: f32) -> Result<(), LengthError> {
        whole(format, mem.len(), mem.len())?;
        avx2::map(self, format, avx2::Map::Mul(factor), mem);
        Ok(())
    }

    /// `mem[i] = mem[i] / divisor` over every element (in `f32`, rounded once).
    pub fn divide(self, format: Format, mem: &mut [u8], divisor: f32) -> Result<(), LengthError> {
        whole(format, mem.len(), mem.len())?;
        avx2::map(self, format, avx2::Map::Div(divisor), mem);
        Ok(())
    }
}

fn whole(format: Format, dst: usize, src: usize) -> Result<(), LengthError> {
    let size = format.size();
    if dst == src && dst.is_multiple_of(size) {
        Ok(())
    } else {
        Err(LengthError { dst, src, size })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use half::{bf16, f16};

    use super::*;

    /// The kernels, or `None` after saying once, straight to stderr (the harness captures
    /// `eprintln!` of passing tests), that this CPU lacks AVX2 or F16C. The engine's
    /// portable-path tests still cover the arithmetic there. (The crates above the engine
    /// share `chorus_engine::testkit::skip`; this crate sits below it.)
    fn kernels_or_skip() -> Option<Kernels> {
        use std::io::Write as _;
        static SAID: std::sync::Once = std::sync::Once::new();
        let k = Kernels::detect();
        if k.is_none() {
            SAID.call_once(|| {
                let _ = std::io::stderr()
                    .write_all(b"skipped: the chorus-simd kernel tests: no AVX2 and F16C here\n");
            });
        }
        k
    }

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    #[test]
    fn lengths_are_checked() {
        let Some(k) = kernels_or_skip() else { return };
        let err = k.reduce(Format::F16, Op::Sum, &mut [0; 4], &[0; 6]);
        assert_eq!(
            err,
            Err(LengthError {
                dst: 4,
                src: 6,
                size: 2
            })
        );
        assert!(
            k.reduce(Format::Bf16, Op::Max, &mut [0; 3], &[0; 3])
                .is_err()
        );
        assert!(k.scale(Format::F16, &mut [0; 5], 2.0).is_err());
        assert!(k.divide(Format::E4m3, &mut [], 2.0).is_ok());
        assert!(k.reduce(Format::E5m2, Op::Min, &mut [], &[]).is_ok());
        let text = LengthError {
            dst: 4,
            src: 6,
            size: 2,
        }
        .to_string();
        assert!(text.contains("4 and 6 bytes"), "{text}");
    }

    /// Random finite pairs (every length up to a few blocks, so the tails come up) against
    /// the `half` crate's rounding of the `f32` result.
    #[test]
    fn f16_and_bf16_round_like_half() {
        let Some(k) = kernels_or_skip() else { return };
        for n in 0..100usize {
            let a: Vec<f32> = (0..n)
                .map(|i| splitmix((n * 1000 + i) as u64) as i32 as f32 * 2e-7)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| splitmix((n * 7 + i) as u64 ^ 1 << 50) as i16 as f32 / 300.0)
                .collect();
            for (op, f) in [
                (Op::Sum, (|x, y| x + y) as fn(f32, f32) -> f32),
                (Op::Prod, |x, y| x * y),
                (Op::Min, f32::min),
                (Op::Max, f32::max),
            ] {
                let h = |v: &[f32]| -> Vec<f16> { v.iter().map(|&x| f16::from_f32(x)).collect() };
                let (mut d, s) = (h(&a), h(&b));
                let want: Vec<f16> = d
                    .iter()
                    .zip(&s)
                    .map(|(x, y)| f16::from_f32(f(x.to_f32(), y.to_f32())))
                    .collect();
                k.reduce(
                    Format::F16,
                    op,
                    bytemuck::cast_slice_mut(&mut d),
                    bytemuck::cast_slice(&s),
                )
                .unwrap();
                assert_eq!(d, want, "f16 {op:?} n={n}");

                let g = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
                let (mut d, s) = (g(&a), g(&b));
                let want: Vec<bf16> = d
                    .iter()
                    .zip(&s)
                    .map(|(x, y)| bf16::from_f32(f(x.to_f32(), y.to_f32())))
                    .collect();
                k.reduce(
                    Format::Bf16,
                    op,
                    bytemuck::cast_slice_mut(&mut d),
                    bytemuck::cast_slice(&s),
                )
                .unwrap();
                assert_eq!(d, want, "bf16 {op:?} n={n}");
            }
            let (mut d, want): (Vec<f16>, Vec<f16>) = a
                .iter()
                .map(|&x| {
                    let x = f16::from_f32(x);
                    (x, f16::from_f32(x.to_f32() / 3.0))
                })
                .unzip();
            k.divide(Format::F16, bytemuck::cast_slice_mut(&mut d), 3.0)
                .unwrap();
            assert_eq!(d, want, "f16 / 3 n={n}");
        }
    }

    #[test]
    fn fp8_known_values() {
        let Some(k) = kernels_or_skip() else { return };
        // E4M3: 1 + 1 = 2, 448 + 448 saturates, 2^-9 + 2^-9 = 2^-8, NaN stays.
        let mut d = [0x38, 0x7e, 0x01, 0x7f, 0xb8];
        k.reduce(
            Format::E4m3,
            Op::Sum,
            &mut d,
            &[0x38, 0x7e, 0x01, 0x38, 0x38],
        )
        .unwrap();
        assert_eq!(d, [0x40, 0x7e, 0x02, 0x7f, 0x00]);
        // E5M2: 1 + 1 = 2, 57344 + 57344 overflows, -inf * 2 = -inf, max(NaN, 1) = 1.
        let mut d = [0x3c, 0x7b, 0xfc, 0x7e];
        k.reduce(Format::E5m2, Op::Sum, &mut d, &[0x3c, 0x7b, 0x40, 0x3c])
            .unwrap();
        assert_eq!(d[..3], [0x40, 0x7c, 0xfc]);
        let mut d = [0x7e, 0x3c];
        k.reduce(Format::E5m2, Op::Max, &mut d, &[0x3c, 0x7d])
            .unwrap();
        assert_eq!(d, [0x3c, 0x3c]);
        let mut d = [0x3c, 0x01];
        k.scale(Format::E5m2, &mut d, 0.5).unwrap();
        // 2^-16 / 2 is halfway to zero: even is zero.
        assert_eq!(d, [0x38, 0x00]);
    }
}
