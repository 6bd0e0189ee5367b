//! The collective matrix the GPU tests run through `Engine<CudaDevice, DeviceLink>`, written
//! over any device, so the same cases, inputs and oracle also run through the host engine
//! here on every machine (tests/matrix_host.rs): the harness is proven before a GPU ever
//! runs it.
//!
//! Inputs are integers over their whole range, and floats from small sets on which every
//! partial result is exact in every float type, so the expected results do not depend on the
//! order in which an algorithm combines the ranks.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::collapsible_match
)]

use std::io::Write as _;

use chorus_cuda::reference;
use chorus_cuda::testing::block_on;
use chorus_engine::{
    Algorithm, Buffer, Device, Engine, EngineConfig, HostBuffer, HostDevice, Link, Op, Overrides,
    Reduction,
};
use chorus_protocol::{Collective, DType, Rank};
use half::{bf16, f16};

/// A device the matrix can put inputs on and read results from.
pub trait Rig: Device {
    /// A new allocation holding `data`.
    fn load(&self, data: &[u8]) -> Self::Owned;
    /// The bytes of `mem`.
    fn read(&self, mem: &Self::Mem) -> Vec<u8>;
}

impl Rig for HostDevice {
    fn load(&self, data: &[u8]) -> HostBuffer {
        let mut b = self.alloc(data.len()).unwrap();
        b.copy_from_slice(data);
        b
    }
    fn read(&self, mem: &[u8]) -> Vec<u8> {
        mem.to_vec()
    }
}

/// One operation to check.
#[derive(Clone, Debug)]
pub struct Case {
    pub id: u64,
    pub collective: Collective,
    pub dtype: DType,
    pub reduction: Reduction,
    pub count: usize,
    pub in_place: bool,
    pub root: u32,
}

pub const COLLECTIVES: [Collective; 8] = [
    Collective::AllReduce,
    Collective::Reduce,
    Collective::Broadcast,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::Gather,
    Collective::Scatter,
];

/// Every reduction (PreMulSum with scalars that keep results exact).
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

fn reduces(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    )
}

/// Every collective x dtype x reduction (the reducing ones; the others once per dtype), in
/// and out of place and with counts from 1 up, for a world of `n`.
pub fn every_case(n: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut id = 0u64;
    for collective in COLLECTIVES {
        for dtype in DType::ALL {
            let reds: Vec<Reduction> = if reduces(collective) {
                reductions(dtype).to_vec()
            } else {
                vec![Reduction::Sum]
            };
            for reduction in reds {
                cases.push(Case {
                    id,
                    collective,
                    dtype,
                    reduction,
                    count: 1 + (id as usize * 37) % 301,
                    in_place: id.is_multiple_of(3),
                    root: (id as u32 * 5 + 1) % n,
                });
                id += 1;
            }
        }
    }
    cases
}

/// A few large operations: payloads many slots long, under every reducing algorithm.
pub fn large_cases(n: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    for (i, (collective, dtype, reduction)) in [
        (Collective::AllReduce, DType::F32, Reduction::Sum),
        (Collective::AllReduce, DType::BF16, Reduction::Avg),
        (Collective::AllReduce, DType::I64, Reduction::PreMulSum(3.0)),
        (Collective::ReduceScatter, DType::F16, Reduction::Max),
        (Collective::Reduce, DType::U8, Reduction::Sum),
        (Collective::Broadcast, DType::F64, Reduction::Sum),
        (Collective::AllGather, DType::I32, Reduction::Sum),
    ]
    .into_iter()
    .enumerate()
    {
        cases.push(Case {
            id: 10_000 + i as u64,
            collective,
            dtype,
            reduction,
            count: 150_001 + i * 999,
            in_place: i % 2 == 0,
            root: (i as u32) % n,
        });
    }
    cases
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

/// Three configurations in which every algorithm appears, with small chunks and shallow
/// pipelines so that small counts still pipeline and hit flow control.
pub fn configs() -> Vec<EngineConfig> {
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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Copy, Clone, Debug)]
enum Val {
    /// Integer bits (masked to the type's width).
    I(u64),
    F(f64),
}

fn mask(dtype: DType) -> u64 {
    match dtype.size() {
        8 => u64::MAX,
        s => (1u64 << (s * 8)) - 1,
    }
}

fn signed(dtype: DType) -> bool {
    matches!(dtype, DType::I8 | DType::I32 | DType::I64)
}

fn sext(dtype: DType, x: u64) -> i64 {
    let w = dtype.size() as u32 * 8;
    ((x << (64 - w)) as i64) >> (64 - w)
}

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
        (DType::F8E4M3, Val::F(f)) => out.push(reference::f32_to_e4m3(f as f32)),
        (DType::F8E5M2, Val::F(f)) => out.push(reference::f32_to_e5m2(f as f32)),
        (d, v) => panic!("cannot encode {v:?} as {d}"),
    }
}

/// `count` input elements of `rank`, from logical index `first`.
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

/// The reduction over ranks `0..n` of element `i`, appended as bytes.
fn reduced(case: u64, n: u32, i: usize, dtype: DType, red: Reduction, out: &mut Vec<u8>) {
    let vals: Vec<Val> = (0..n).map(|r| value(case, r, i, dtype, red)).collect();
    let m = mask(dtype);
    let v = if dtype.is_float() {
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
    } else {
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

/// This rank's send buffer, its receive (or in-place) buffer before the operation, and what
/// that buffer must hold after it.
pub fn layout(case: &Case, r: u32, n: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (d, red, count, id) = (case.dtype, case.reduction, case.count, case.id);
    let block = count * d.size();
    let nb = n as usize;
    let mine = |first: usize, len: usize| input(id, r, first, len, d, red);
    let of = |rank: u32, first: usize, len: usize| input(id, rank, first, len, d, red);
    let fold = |first: usize, len: usize| {
        let mut v = Vec::new();
        for i in first..first + len {
            reduced(id, n, i, d, red, &mut v);
        }
        v
    };
    let rooted = r == case.root;
    let (send, mut buf, mut want) = match case.collective {
        Collective::AllReduce => (mine(0, count), garbage(block), fold(0, count)),
        Collective::Reduce => {
            let want = if rooted {
                fold(0, count)
            } else {
                garbage(block)
            };
            (mine(0, count), garbage(block), want)
        }
        Collective::Broadcast => (mine(0, count), garbage(block), of(case.root, 0, count)),
        Collective::AllGather => {
            let want: Vec<u8> = (0..n).flat_map(|j| of(j, 0, count)).collect();
            (mine(0, count), garbage(block * nb), want)
        }
        Collective::ReduceScatter => (
            mine(0, count * nb),
            garbage(block),
            fold(r as usize * count, count),
        ),
        Collective::AllToAll => {
            let want: Vec<u8> = (0..n)
                .flat_map(|j| of(j, r as usize * count, count))
                .collect();
            (mine(0, count * nb), garbage(block * nb), want)
        }
        Collective::Gather => {
            let want = if rooted {
                (0..n).flat_map(|j| of(j, 0, count)).collect()
            } else {
                garbage(block * nb)
            };
            (mine(0, count), garbage(block * nb), want)
        }
        Collective::Scatter => (
            mine(0, count * nb),
            garbage(block),
            of(case.root, r as usize * count, count),
        ),
        Collective::SendRecv | Collective::Barrier => unreachable!(),
    };
    if case.in_place {
        // Where NCCL's in-place forms keep the input, and what the whole buffer holds after.
        let rb = r as usize * block;
        match case.collective {
            Collective::AllReduce | Collective::AllToAll => buf = send.clone(),
            Collective::Reduce => {
                buf = send.clone();
                if !rooted {
                    want = send.clone();
                }
            }
            Collective::Broadcast => {
                if rooted {
                    buf = send.clone();
                }
            }
            Collective::AllGather => buf[rb..rb + block].copy_from_slice(&send),
            Collective::ReduceScatter => {
                buf = send.clone();
                let mut w = send.clone();
                w[rb..rb + block].copy_from_slice(&want);
                want = w;
            }
            Collective::Gather => {
                if rooted {
                    buf[rb..rb + block].copy_from_slice(&send);
                } else {
                    buf = send.clone();
                    want = send.clone();
                }
            }
            Collective::Scatter => {
                if rooted {
                    buf = send.clone();
                    let mut w = send.clone();
                    w[rb..rb + block].copy_from_slice(&want);
                    want = w;
                }
            }
            _ => {}
        }
    }
    (send, buf, want)
}

/// Run `case` on `e` (device memory in, device memory out) and compare with the oracle.
pub fn check<D, L>(e: &Engine<D, L>, case: &Case) -> Result<(), String>
where
    D: Rig,
    L: Link<D::Payload> + ?Sized,
{
    let (n, r) = (e.world(), e.rank().0);
    let dev = e.device();
    let (send, buf, want) = layout(case, r, n);
    let dsend = dev.load(&send);
    let mut dbuf = dev.load(&buf);
    let b = if case.in_place {
        Buffer::InPlace(&mut *dbuf)
    } else {
        Buffer::Separate {
            send: &*dsend,
            recv: &mut *dbuf,
        }
    };
    let (count, dtype, reduction, root) = (case.count, case.dtype, case.reduction, Rank(case.root));
    let op = match case.collective {
        Collective::AllReduce => Op::AllReduce {
            buf: b,
            count,
            dtype,
            reduction,
        },
        Collective::Reduce => Op::Reduce {
            buf: b,
            count,
            dtype,
            reduction,
            root,
        },
        Collective::Broadcast => Op::Broadcast {
            buf: b,
            count,
            dtype,
            root,
        },
        Collective::AllGather => Op::AllGather {
            buf: b,
            count,
            dtype,
        },
        Collective::ReduceScatter => Op::ReduceScatter {
            buf: b,
            count,
            dtype,
            reduction,
        },
        Collective::AllToAll => Op::AllToAll {
            buf: b,
            count,
            dtype,
        },
        Collective::Gather => Op::Gather {
            buf: b,
            count,
            dtype,
            root,
        },
        Collective::Scatter => Op::Scatter {
            buf: b,
            count,
            dtype,
            root,
        },
        _ => unreachable!(),
    };
    let algo = e.algorithm_for(case.collective, case.count * dtype.size());
    block_on(e.run(op)).map_err(|err| format!("r{r}/{n} {algo} {case:?}: {err}"))?;
    let got = dev.read(&dbuf);
    if got != want {
        let es = dtype.size();
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        let el = |v: &[u8]| v[at - at % es..(at - at % es + es).min(v.len())].to_vec();
        return Err(format!(
            "r{r}/{n} {algo} {case:?}: first difference at element {}: got {:?} want {:?}",
            at / es,
            el(&got),
            el(&want),
        ));
    }
    Ok(())
}

/// Send to the right and receive from the left in one group, then a barrier, for a few
/// counts; `Err` names the first problem.
pub fn ring_exchange<D, L>(e: &Engine<D, L>, round0: u64) -> Result<(), String>
where
    D: Rig,
    L: Link<D::Payload> + ?Sized,
{
    let (n, r) = (e.world(), e.rank().0);
    let dev = e.device();
    let (right, left) = (Rank((r + 1) % n), Rank((r + n - 1) % n));
    for (k, count) in [1usize, 7, 1023, 100_000].into_iter().enumerate() {
        let round = round0 + k as u64;
        let send = dev.load(&input(round, r, 0, count, DType::I32, Reduction::Sum));
        let mut recv = dev.load(&garbage(count * 4));
        let ops = vec![
            Op::Send {
                buf: &*send,
                count,
                dtype: DType::I32,
                peer: right,
            },
            Op::Recv {
                buf: &mut *recv,
                count,
                dtype: DType::I32,
                peer: left,
            },
        ];
        block_on(e.group(ops)).map_err(|err| format!("r{r} send/recv: {err}"))?;
        if dev.read(&recv) != input(round, left.0, 0, count, DType::I32, Reduction::Sum) {
            return Err(format!("r{r} round {round}: wrong data from {left}"));
        }
        block_on(e.barrier()).map_err(|err| format!("r{r} barrier: {err}"))?;
    }
    Ok(())
}

/// Every case in order on this rank, stopping at the first failure (the communicator is
/// poisoned then), which is also printed at once.
pub fn sweep<D, L>(e: &Engine<D, L>, cases: &[Case]) -> Result<(), String>
where
    D: Rig,
    L: Link<D::Payload> + ?Sized,
{
    for case in cases {
        if let Err(m) = check(e, case) {
            let _ = writeln!(std::io::stderr(), "FAILED: {m}");
            return Err(m);
        }
    }
    Ok(())
}

pub fn assert_clean(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(8)].join("\n")
    );
}
