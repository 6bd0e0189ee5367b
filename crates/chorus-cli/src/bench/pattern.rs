//! The data a checked call runs on, and the exact result it must give.
//!
//! Every element is a small non-negative integer, chosen per reduction so that every
//! partial result of every algorithm is exactly representable in the element type (fp8
//! included): no tolerance is needed, a result is right or wrong. Values depend on the rank
//! and on the element's index (so data dropped, doubled or moved to the wrong place is
//! caught), and repeat with a short period, so the expected result is computed once per
//! period rather than per element.
//!
//! - sum: `(7i + 3r) mod m`, with `m` small enough that `n` of them cannot exceed the type's
//!   exact range;
//! - avg: the same for all ranks but the last, whose value makes the column sum a multiple
//!   of `n` (the average is then exact, and integer division cannot truncate);
//! - prod: 2 where `(i + r) mod q == 0`, else 1 (at most ⌈n/q⌉ twos per column, within
//!   range);
//! - min, max, and collectives that do not reduce: `(7i + 3r) mod m`, `m` up to 64.

use chorus::DType;
use chorus_protocol::ReduceOp;

/// One sweep size's data at one world size.
#[derive(Clone, Debug)]
pub(crate) struct Pattern {
    dtype: DType,
    n: u32,
    /// Encoded values of each rank over one period.
    tables: Vec<Vec<u8>>,
    /// Encoded reduction over all ranks over one period (empty without a reduction).
    reduced: Vec<u8>,
    period: usize,
}

impl Pattern {
    /// The pattern for `n` ranks of `dtype`, reduced with `op` (or not reduced: `None`).
    pub(crate) fn new(dtype: DType, op: Option<ReduceOp>, n: u32) -> Pattern {
        let n = n.max(1);
        let exact = exact_range(dtype);
        let n64 = u64::from(n);
        let spread = |m: u64| move |r: u32, i: u64| (7 * i + 3 * u64::from(r)) % m;
        let (period, value): (u64, Box<dyn Fn(u32, u64) -> u64>) = match op {
            Some(ReduceOp::Sum) => {
                let m = (exact / n64).clamp(1, 64);
                (m, Box::new(spread(m)))
            }
            Some(ReduceOp::Avg) => {
                let m = (exact / n64).clamp(1, 64);
                if n == 1 {
                    (m, Box::new(spread(m)))
                } else if n64 - 1 > exact {
                    (1, Box::new(|_, _| 0))
                } else {
                    let p = spread(m);
                    let last = n - 1;
                    let value = move |r: u32, i: u64| {
                        if r < last {
                            p(r, i)
                        } else {
                            let others: u64 = (0..last).map(|o| p(o, i)).sum();
                            (n64 - others % n64) % n64
                        }
                    };
                    (m, Box::new(value))
                }
            }
            Some(ReduceOp::Prod) => {
                // At most ⌈n/q⌉ ≤ log2(exact) twos in a column; at least a period of 3 so
                // that positions differ.
                let doublings = u64::from(exact.max(2).ilog2());
                let q = n64.div_ceil(doublings).max(3);
                (
                    q,
                    Box::new(move |r, i| if (i + u64::from(r)) % q == 0 { 2 } else { 1 }),
                )
            }
            Some(ReduceOp::Min | ReduceOp::Max | ReduceOp::PreMulSum) | None => {
                let m = exact.min(63) + 1;
                (m, Box::new(spread(m)))
            }
        };
        let period = period as usize;
        let elt = dtype.size();
        let mut tables = vec![Vec::with_capacity(period * elt); n as usize];
        let mut reduced = Vec::with_capacity(if op.is_some() { period * elt } else { 0 });
        for i in 0..period as u64 {
            let column: Vec<u64> = (0..n).map(|r| value(r, i)).collect();
            for (r, v) in column.iter().enumerate() {
                tables[r].extend_from_slice(&encode(dtype, *v));
            }
            if let Some(op) = op {
                reduced.extend_from_slice(&encode(dtype, reduce(op, &column, n64)));
            }
        }
        Pattern {
            dtype,
            n,
            tables,
            reduced,
            period,
        }
    }

    /// Bytes per element.
    pub(crate) fn elt(&self) -> usize {
        self.dtype.size()
    }

    /// Writes rank `r`'s elements `start..` into `out`.
    pub(crate) fn fill(&self, r: u32, start: usize, out: &mut [u8]) {
        let table = &self.tables[(r % self.n) as usize];
        tile(table, self.elt(), self.period, start, out);
    }

    /// Writes the reduction over all ranks of elements `start..` into `out` (zeros when the
    /// pattern has no reduction).
    pub(crate) fn fill_reduced(&self, start: usize, out: &mut [u8]) {
        if self.reduced.is_empty() {
            out.fill(0);
            return;
        }
        tile(&self.reduced, self.elt(), self.period, start, out);
    }

    /// How many elements of `got` differ from `expected`, bit for bit.
    pub(crate) fn wrong(&self, expected: &[u8], got: &[u8]) -> u64 {
        let elt = self.elt();
        let differing = expected
            .chunks_exact(elt)
            .zip(got.chunks_exact(elt))
            .filter(|(a, b)| a != b)
            .count();
        let missing = expected.len().abs_diff(got.len()) / elt;
        (differing + missing) as u64
    }
}

/// Fills `out` with the periodic `table` starting at element `start`.
fn tile(table: &[u8], elt: usize, period: usize, start: usize, out: &mut [u8]) {
    let mut at = (start % period) * elt;
    let mut done = 0;
    while done < out.len() {
        let take = (table.len() - at).min(out.len() - done);
        out[done..done + take].copy_from_slice(&table[at..at + take]);
        done += take;
        at = 0;
    }
}

fn reduce(op: ReduceOp, column: &[u64], n: u64) -> u64 {
    match op {
        ReduceOp::Sum | ReduceOp::PreMulSum => column.iter().sum(),
        ReduceOp::Avg => column.iter().sum::<u64>() / n,
        ReduceOp::Prod => column.iter().product(),
        ReduceOp::Min => column.iter().copied().min().unwrap_or(0),
        ReduceOp::Max => column.iter().copied().max().unwrap_or(0),
    }
}

/// The largest integer up to which every integer is exact in `dtype` (capped at 2^53).
fn exact_range(dtype: DType) -> u64 {
    match dtype {
        DType::I8 => 127,
        DType::U8 => 255,
        DType::I32 => i32::MAX as u64,
        DType::U32 => u64::from(u32::MAX),
        DType::I64 | DType::U64 | DType::F64 => 1 << 53,
        DType::F32 => 1 << 24,
        DType::F16 => 2048,
        DType::BF16 => 256,
        DType::F8E4M3 => 16,
        DType::F8E5M2 => 8,
    }
}

/// `v` (within [`exact_range`]) as one element of `dtype`, little-endian.
fn encode(dtype: DType, v: u64) -> Vec<u8> {
    let f = v as f32;
    match dtype {
        DType::F32 => f.to_le_bytes().to_vec(),
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(f).to_bits().to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(f).to_bits().to_le_bytes().to_vec(),
        DType::I8 => (v as i8).to_le_bytes().to_vec(),
        DType::U8 => (v as u8).to_le_bytes().to_vec(),
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        DType::U32 => (v as u32).to_le_bytes().to_vec(),
        DType::I64 => (v as i64).to_le_bytes().to_vec(),
        DType::U64 => v.to_le_bytes().to_vec(),
        DType::F8E4M3 => vec![chorus_engine::fp8::f32_to_e4m3(f)],
        DType::F8E5M2 => vec![chorus_engine::fp8::f32_to_e5m2(f)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes one element back to a number, to check the encoding is exact.
    fn decode(dtype: DType, b: &[u8]) -> f64 {
        match dtype {
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()).into(),
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
            DType::F16 => half::f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).into(),
            DType::BF16 => half::bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).into(),
            DType::I8 => f64::from(b[0] as i8),
            DType::U8 => f64::from(b[0]),
            DType::I32 => f64::from(i32::from_le_bytes(b.try_into().unwrap())),
            DType::U32 => f64::from(u32::from_le_bytes(b.try_into().unwrap())),
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::F8E4M3 => chorus_engine::fp8::e4m3_to_f32(b[0]).into(),
            DType::F8E5M2 => chorus_engine::fp8::e5m2_to_f32(b[0]).into(),
        }
    }

    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    #[test]
    fn every_result_is_exact_in_every_type() {
        for dtype in DType::ALL {
            for op in OPS {
                for n in [1u32, 2, 3, 4, 7, 16] {
                    let p = Pattern::new(dtype, Some(op), n);
                    let elt = dtype.size();
                    let len = 3 * p.period + 5;
                    let mut expected = vec![0u8; len * elt];
                    p.fill_reduced(0, &mut expected);
                    let mut ranks = vec![vec![0u8; len * elt]; n as usize];
                    for (r, buf) in ranks.iter_mut().enumerate() {
                        p.fill(r as u32, 0, buf);
                    }
                    for i in 0..len {
                        let at = i * elt..(i + 1) * elt;
                        let vals: Vec<f64> = ranks
                            .iter()
                            .map(|b| decode(dtype, &b[at.clone()]))
                            .collect();
                        let want = match op {
                            ReduceOp::Sum => vals.iter().sum::<f64>(),
                            ReduceOp::Prod => vals.iter().product::<f64>(),
                            ReduceOp::Min => vals.iter().copied().fold(f64::MAX, f64::min),
                            ReduceOp::Max => vals.iter().copied().fold(0.0, f64::max),
                            ReduceOp::Avg => {
                                let s = vals.iter().sum::<f64>();
                                assert_eq!(s % f64::from(n), 0.0, "{dtype} avg n={n} sum {s}");
                                s / f64::from(n)
                            }
                            ReduceOp::PreMulSum => unreachable!(),
                        };
                        let got = decode(dtype, &expected[at]);
                        assert_eq!(got, want, "{dtype} {op:?} n={n} element {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_and_positions_differ_so_misplaced_data_is_caught() {
        let p = Pattern::new(DType::F32, Some(ReduceOp::Sum), 4);
        let (mut a, mut b) = (vec![0u8; 256], vec![0u8; 256]);
        p.fill(0, 0, &mut a);
        p.fill(1, 0, &mut b);
        assert_ne!(a, b, "ranks differ");
        p.fill(0, 1, &mut b);
        assert_ne!(a, b, "a shift by one element differs");
        // Filling from an offset continues the same sequence.
        let mut whole = vec![0u8; 400];
        p.fill(2, 0, &mut whole);
        let mut tail = vec![0u8; 200];
        p.fill(2, 50, &mut tail);
        assert_eq!(&whole[200..], &tail[..]);
        assert_eq!(p.wrong(&whole, &whole), 0);
        let mut spoiled = whole.clone();
        spoiled[7] ^= 1;
        spoiled[399] ^= 1;
        assert_eq!(p.wrong(&whole, &spoiled), 2);
    }
}
