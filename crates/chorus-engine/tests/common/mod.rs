//! Shared harness for the engine's integration tests: ranks as threads over in-process
//! links, deterministic inputs and a sequential reference.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use chorus_engine::fp8;
use chorus_engine::{
    AbortReason, Algorithm, Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink,
    Overrides, Reduction,
};
use chorus_protocol::{DType, Rank};

pub type HostEngine = Engine<HostDevice, LocalLink<Bytes>>;

/// Run `f` on every rank of a world of `n` threads. Each rank gets one engine per config,
/// each over its own mesh, all under one root context. If the world has not finished within
/// `limit`, the root is aborted (so nothing hangs) and the test fails.
pub fn run_world<R: Send>(
    n: u32,
    configs: &[EngineConfig],
    limit: Duration,
    f: impl Fn(&[HostEngine]) -> R + Send + Sync,
) -> Vec<R> {
    let root = Context::root();
    let dev = Arc::new(HostDevice);
    let mut per_rank: Vec<Vec<HostEngine>> = (0..n).map(|_| Vec::new()).collect();
    for config in configs {
        let mesh = chorus_engine::local::mesh::<Bytes>(n, HeldLimit::bytes(64 << 20));
        for (r, links) in mesh.into_iter().enumerate() {
            let e = Engine::new(Rank(r as u32), n, links, dev.clone(), &root, config.clone())
                .expect("engine");
            per_rank[r].push(e);
        }
    }
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        let handles: Vec<_> = per_rank
            .iter()
            .map(|engines| {
                let tx = tx.clone();
                let f = &f;
                s.spawn(move || {
                    let r = f(engines);
                    let _ = tx.send(());
                    r
                })
            })
            .collect();
        let mut done = 0;
        let mut timed_out = false;
        while done < n {
            match rx.recv_timeout(limit) {
                Ok(()) => done += 1,
                Err(_) => {
                    root.abort(AbortReason::requested("test watchdog"));
                    timed_out = true;
                    break;
                }
            }
        }
        let results: Vec<R> = handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect();
        assert!(!timed_out, "world of {n} did not finish within {limit:?}");
        results
    })
}

/// One config forcing `algos` (`[all-reduce, reduce, broadcast, all-gather, reduce-scatter]`).
pub fn forced(algos: [Algorithm; 5], chunk_bytes: usize, depth: usize) -> EngineConfig {
    EngineConfig {
        chunk_bytes,
        pipeline_depth: depth,
        overrides: Overrides {
            all_reduce: Some(algos[0]),
            reduce: Some(algos[1]),
            broadcast: Some(algos[2]),
            all_gather: Some(algos[3]),
            reduce_scatter: Some(algos[4]),
        },
        ..EngineConfig::default()
    }
}

/// The three forced configurations the matrix runs: every algorithm appears in one, with
/// small chunks and shallow pipelines so that small counts still pipeline and hit flow
/// control.
pub fn matrix_configs() -> Vec<EngineConfig> {
    use Algorithm::*;
    vec![
        forced([Ring, Ring, Ring, Ring, Ring], 256, 2),
        forced(
            [
                RecursiveDoubling,
                BinomialTree,
                BinomialTree,
                Bruck,
                HalvingDoubling,
            ],
            512,
            3,
        ),
        forced([HalvingDoubling, Ring, BinomialTree, Ring, Ring], 4096, 8),
    ]
}

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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A value, as the reference sees it.
#[derive(Copy, Clone, Debug)]
enum Val {
    /// Integer bits (masked to the type's width).
    I(u64),
    F(f64),
}

fn width(dtype: DType) -> u32 {
    dtype.size() as u32 * 8
}

fn mask(dtype: DType) -> u64 {
    if width(dtype) == 64 {
        u64::MAX
    } else {
        (1u64 << width(dtype)) - 1
    }
}

fn signed(dtype: DType) -> bool {
    matches!(dtype, DType::I8 | DType::I32 | DType::I64)
}

fn sext(dtype: DType, x: u64) -> i64 {
    let w = width(dtype);
    ((x << (64 - w)) as i64) >> (64 - w)
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
        (DType::F16, Val::F(f)) => out.extend_from_slice(&half::f16::from_f64(f).to_le_bytes()),
        (DType::BF16, Val::F(f)) => out.extend_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
        (DType::F8E4M3, Val::F(f)) => out.push(fp8::f32_to_e4m3(f as f32)),
        (DType::F8E5M2, Val::F(f)) => out.push(fp8::f32_to_e5m2(f as f32)),
        (d, v) => panic!("cannot encode {v:?} as {d}"),
    }
}

/// `count` input elements of `rank`, starting at logical index `first`.
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

/// The reduction over ranks `0..n` of element `i` (in each rank's logical numbering), as
/// bytes.
pub fn reduced(case: u64, n: u32, i: usize, dtype: DType, red: Reduction, out: &mut Vec<u8>) {
    let vals: Vec<Val> = (0..n).map(|r| value(case, r, i, dtype, red)).collect();
    let m = mask(dtype);
    let v = match vals[0] {
        Val::I(_) => {
            let xs: Vec<u64> = vals
                .iter()
                .map(|v| match v {
                    Val::I(x) => *x,
                    Val::F(_) => unreachable!(),
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
                Reduction::Min => xs.iter().copied().min_by(|a, b| cmp(*a, *b)).unwrap(),
                Reduction::Max => xs.iter().copied().max_by(|a, b| cmp(*a, *b)).unwrap(),
                Reduction::Avg => {
                    let s = sum(&xs);
                    if signed(dtype) {
                        (sext(dtype, s) / i64::from(n)) as u64 & m
                    } else {
                        s / u64::from(n)
                    }
                }
                Reduction::PreMulSum(k) => {
                    let scaled: Vec<u64> =
                        xs.iter().map(|x| x.wrapping_mul(k as u64) & m).collect();
                    sum(&scaled)
                }
            })
        }
        Val::F(_) => {
            let xs: Vec<f64> = vals
                .iter()
                .map(|v| match v {
                    Val::F(x) => *x,
                    Val::I(_) => unreachable!(),
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
        }
    };
    encode(dtype, v, out);
}

/// A distinctive fill for bytes an operation must not touch (or must overwrite).
pub fn garbage(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| 0xa5 ^ (i as u8).wrapping_mul(31))
        .collect()
}
