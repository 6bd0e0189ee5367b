//! Deterministic inputs and the sequential reference every collective is checked against.

use chorus_protocol::DType;
use half::{bf16, f16};

use crate::{Reduction, fp8};

/// Every reduction the tests use (PreMulSum with scalars chosen to keep results exact).
pub fn reductions(dtype: DType) -> [Reduction; 6] {
    let s = if dtype.is_float() { 0.5 } else { 3.0 };
    [
        Reduction::Sum,
        Reduction::Prod,
        Reduction::Min,
        Reduction::Max,
        Reduction::Avg,
        Reduction::PreMulSum(s),
    ]
}

/// `count` input elements of `rank` for test case `case`, starting at logical index `first`.
pub fn input(
    case: u64,
    rank: u32,
    first: usize,
    count: usize,
    dtype: DType,
    red: Reduction,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in first..first + count {
        encode(dtype, value(case, rank, i, dtype, red), &mut out);
    }
    out
}

/// The reduction over ranks `0..n` of element `i` (in each rank's logical numbering),
/// appended to `out` as bytes.
pub fn reduced(case: u64, n: u32, i: usize, dtype: DType, red: Reduction, out: &mut Vec<u8>) {
    let vals: Vec<Val> = (0..n).map(|r| value(case, r, i, dtype, red)).collect();
    let m = mask(dtype);
    let v = if dtype.is_float() {
        let xs: Vec<f64> = vals
            .iter()
            .map(|v| match v {
                Val::F(x) => *x,
                Val::I(_) => unreachable!("a float dtype has float values"),
            })
            .collect();
        Val::F(match red {
            Reduction::Sum => xs.iter().sum(),
            Reduction::Prod => xs.iter().product(),
            Reduction::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
            Reduction::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Reduction::Avg => xs.iter().sum::<f64>() / f64::from(n),
            Reduction::PreMulSum(k) => xs.iter().map(|x| x * k).sum(),
        })
    } else {
        let xs: Vec<u64> = vals
            .iter()
            .map(|v| match v {
                Val::I(x) => *x,
                Val::F(_) => unreachable!("an integer dtype has integer values"),
            })
            .collect();
        let cmp = |a: u64, b: u64| {
            if signed(dtype) {
                sext(dtype, a).cmp(&sext(dtype, b))
            } else {
                a.cmp(&b)
            }
        };
        let sum = |xs: &[u64]| xs.iter().fold(0u64, |a, x| a.wrapping_add(*x)) & m;
        Val::I(match red {
            Reduction::Sum => sum(&xs),
            Reduction::Prod => xs.iter().fold(1u64, |a, x| a.wrapping_mul(*x)) & m,
            Reduction::Min => xs.iter().copied().min_by(|a, b| cmp(*a, *b)).unwrap_or(0),
            Reduction::Max => xs.iter().copied().max_by(|a, b| cmp(*a, *b)).unwrap_or(0),
            Reduction::Avg => {
                let s = sum(&xs);
                if signed(dtype) {
                    (sext(dtype, s) / i64::from(n)) as u64 & m
                } else {
                    s / u64::from(n)
                }
            }
            Reduction::PreMulSum(k) => {
                let scaled: Vec<u64> = xs.iter().map(|x| x.wrapping_mul(k as u64) & m).collect();
                sum(&scaled)
            }
        })
    };
    encode(dtype, v, out);
}

/// A distinctive fill for bytes an operation must not touch (or must overwrite).
pub fn garbage(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| 0xa5 ^ (i as u8).wrapping_mul(31))
        .collect()
}

/// A value, as the reference sees it.
#[derive(Copy, Clone, Debug)]
enum Val {
    /// Integer bits (masked to the type's width).
    I(u64),
    F(f64),
}

/// Input element `i` of rank `rank` for test case `case`: integers over their whole range,
/// floats from small sets on which every partial result is exact in every float type.
fn value(case: u64, rank: u32, i: usize, dtype: DType, red: Reduction) -> Val {
    let raw = splitmix(case.wrapping_mul(0x1_0000_0001) ^ (u64::from(rank) << 40) ^ i as u64);
    if !dtype.is_float() {
        return Val::I(raw & mask(dtype));
    }
    let pick = |set: &[f64]| set[(raw % set.len() as u64) as usize];
    Val::F(match red {
        Reduction::Prod => pick(&[-1.0, 1.0, 1.0, 2.0]),
        Reduction::Min | Reduction::Max => (raw % 17) as f64 - 8.0,
        _ => pick(&[-1.0, 0.0, 1.0]),
    })
}

fn encode(dtype: DType, v: Val, out: &mut Vec<u8>) {
    match (dtype, v) {
        (_, Val::I(x)) => out.extend_from_slice(&x.to_le_bytes()[..dtype.size()]),
        (DType::F32, Val::F(f)) => out.extend_from_slice(&(f as f32).to_le_bytes()),
        (DType::F64, Val::F(f)) => out.extend_from_slice(&f.to_le_bytes()),
        (DType::F16, Val::F(f)) => out.extend_from_slice(&f16::from_f64(f).to_le_bytes()),
        (DType::BF16, Val::F(f)) => out.extend_from_slice(&bf16::from_f64(f).to_le_bytes()),
        (DType::F8E4M3, Val::F(f)) => out.push(fp8::f32_to_e4m3(f as f32)),
        (DType::F8E5M2, Val::F(f)) => out.push(fp8::f32_to_e5m2(f as f32)),
        (d, v) => panic!("cannot encode {v:?} as {d}"),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// All ones over the type's width.
fn mask(dtype: DType) -> u64 {
    match dtype.size() {
        8 => u64::MAX,
        s => (1u64 << (s * 8)) - 1,
    }
}

fn signed(dtype: DType) -> bool {
    matches!(dtype, DType::I8 | DType::I32 | DType::I64)
}

/// `x`, sign-extended from the type's width.
fn sext(dtype: DType, x: u64) -> i64 {
    let w = dtype.size() as u32 * 8;
    ((x << (64 - w)) as i64) >> (64 - w)
}
