//! The correctness matrix: every collective, algorithm, dtype and reduction against a
//! sequential reference, in and out of place, over worlds of 1 to 16 ranks.

#![allow(clippy::unwrap_used, clippy::collapsible_match)]

use std::time::Duration;

use chorus_engine::testkit::{
    Case, Host, assert_clean, collectives, forced, garbage, input, matrix_configs, reductions,
    run_world, sweep,
};
use chorus_engine::{Algorithm, Buffer, EngineConfig, Op, Reduction};
use chorus_protocol::{Collective, DType, Rank};
use futures::executor::block_on;

const LIMIT: Duration = Duration::from_secs(240);

/// Every `(dtype, reduction)` pair, in a fixed order.
fn pairs() -> Vec<(DType, Reduction)> {
    DType::ALL
        .iter()
        .flat_map(|&d| reductions(d).into_iter().map(move |r| (d, r)))
        .collect()
}

/// Run `cases` on every engine of every rank of a world of `n`, and return the failures.
fn run(n: u32, configs: &[EngineConfig], cases: &[Case]) -> Vec<String> {
    let failures = run_world(n, configs, LIMIT, |engines| {
        // A failure poisons that engine's communicator; the next config's still runs.
        engines
            .iter()
            .filter_map(|e| sweep(&Host, e, cases).err())
            .collect::<Vec<_>>()
    });
    failures.into_iter().flatten().collect()
}

/// Every collective x count in {0, 1, 7, 1023} x placement x root, dtype and reduction
/// cycling through all pairs, on every forced algorithm set.
fn structural_cases(n: u32) -> Vec<Case> {
    let pairs = pairs();
    let mut cases = Vec::new();
    let mut id = 0u64;
    for collective in collectives() {
        for count in [0, 1, 7, 1023] {
            for in_place in [false, true] {
                let (dtype, reduction) = pairs[(id as usize * 7) % pairs.len()];
                // Sums of up to 8 fp8 values stay exact; wider worlds use f32.
                let (dtype, reduction) = if n > 8 && dtype.size() == 1 && dtype.is_float() {
                    (DType::F32, reduction)
                } else {
                    (dtype, reduction)
                };
                cases.push(Case {
                    id,
                    collective,
                    dtype,
                    reduction,
                    count,
                    in_place,
                    root: (id as u32 * 5 + 1) % n,
                });
                id += 1;
            }
        }
    }
    cases
}

#[test]
fn every_collective_and_algorithm_in_worlds_of_1_to_8() {
    for n in [1, 2, 3, 4, 5, 8] {
        assert_clean(run(n, &matrix_configs(), &structural_cases(n)));
    }
}

#[test]
fn world_of_16() {
    assert_clean(run(16, &matrix_configs(), &structural_cases(16)));
}

/// Every dtype x reduction through every reducing algorithm, at a non-power-of-two and a
/// power-of-two world.
#[test]
fn every_dtype_and_reduction_through_every_reducing_algorithm() {
    for n in [3, 4] {
        let mut cases = Vec::new();
        for (i, (dtype, reduction)) in pairs().into_iter().enumerate() {
            for (j, collective) in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::Reduce,
            ]
            .into_iter()
            .enumerate()
            {
                cases.push(Case {
                    id: 1000 + (i * 3 + j) as u64,
                    collective,
                    dtype,
                    reduction,
                    count: if i % 2 == 0 { 1023 } else { 7 },
                    in_place: i % 3 == 0,
                    root: (i as u32) % n,
                });
            }
        }
        assert_clean(run(n, &matrix_configs(), &cases));
    }
}

/// The 2^20 + 3 count, on a few collectives and algorithms (with the default chunking).
#[test]
fn large_counts() {
    use Algorithm::*;
    let big = (1 << 20) + 3;
    let case = |id, collective, in_place| Case {
        id,
        collective,
        dtype: DType::F32,
        reduction: Reduction::Sum,
        count: big,
        in_place,
        root: 1,
    };
    let ring = forced([Ring, Ring, Ring, Ring, Ring], 256 << 10, 8);
    let log = forced(
        [
            HalvingDoubling,
            BinomialTree,
            BinomialTree,
            Bruck,
            HalvingDoubling,
        ],
        256 << 10,
        8,
    );
    assert_clean(run(
        5,
        &[ring],
        &[
            case(1, Collective::AllReduce, false),
            case(2, Collective::ReduceScatter, true),
        ],
    ));
    assert_clean(run(
        3,
        &[log],
        &[
            case(3, Collective::AllReduce, true),
            case(4, Collective::Broadcast, false),
        ],
    ));
}

/// Send/receive in a group (each rank sends right and receives from the left at once, which
/// without grouping could deadlock), then a barrier; sequence numbers stay aligned after.
#[test]
fn grouped_send_recv_and_barrier() {
    for n in [2u32, 3, 5] {
        let results = run_world(n, &[EngineConfig::default()], LIMIT, |engines| {
            let e = &engines[0];
            let r = e.rank().0;
            let right = Rank((r + 1) % n);
            let left = Rank((r + n - 1) % n);
            let mut errs = Vec::new();
            for (round, count) in [0usize, 1, 7, 1023, 100_000].into_iter().enumerate() {
                let send = input(round as u64, r, 0, count, DType::I32, Reduction::Sum);
                let mut recv = garbage(count * 4);
                let ops = vec![
                    Op::Send {
                        buf: &send[..],
                        count,
                        dtype: DType::I32,
                        peer: right,
                    },
                    Op::Recv {
                        buf: &mut recv[..],
                        count,
                        dtype: DType::I32,
                        peer: left,
                    },
                ];
                if let Err(err) = block_on(e.group(ops)) {
                    errs.push(format!("r{r}: {err}"));
                    break;
                }
                if recv != input(round as u64, left.0, 0, count, DType::I32, Reduction::Sum) {
                    errs.push(format!("r{r} round {round}: wrong data from {left}"));
                }
                if let Err(err) = block_on(e.barrier()) {
                    errs.push(format!("r{r} barrier: {err}"));
                }
            }
            // A collective after the point-to-point traffic still lines up.
            let mut v = vec![1u8; 16];
            if let Err(err) =
                block_on(e.all_reduce(Buffer::InPlace(&mut v[..]), 16, DType::U8, Reduction::Sum))
            {
                errs.push(format!("r{r} all-reduce: {err}"));
            } else if v != vec![n as u8; 16] {
                errs.push(format!("r{r} all-reduce after send/recv: {v:?}"));
            }
            errs
        });
        assert_clean(results.into_iter().flatten().collect());
    }
}

/// A group of different collectives completes together and each result is right.
#[test]
fn grouped_collectives() {
    let n = 4;
    let results = run_world(n, &[EngineConfig::default()], LIMIT, |engines| {
        let e = &engines[0];
        let r = e.rank().0;
        let mut a = vec![r as u8 + 1; 100];
        let mut b = vec![0u8; 4 * 3];
        let mine = [r as u8; 3];
        let mut c = if r == 2 { vec![9u8; 5] } else { vec![0u8; 5] };
        let ops = vec![
            Op::AllReduce {
                buf: Buffer::InPlace(&mut a[..]),
                count: 100,
                dtype: DType::U8,
                reduction: Reduction::Max,
            },
            Op::AllGather {
                buf: Buffer::Separate {
                    send: &mine[..],
                    recv: &mut b[..],
                },
                count: 3,
                dtype: DType::U8,
            },
            Op::Broadcast {
                buf: Buffer::InPlace(&mut c[..]),
                count: 5,
                dtype: DType::U8,
                root: Rank(2),
            },
        ];
        block_on(e.group(ops)).map_err(|e| e.to_string())?;
        let want_b: Vec<u8> = (0..4u8).flat_map(|j| [j; 3]).collect();
        if a != vec![4u8; 100] || b != want_b || c != vec![9u8; 5] {
            return Err(format!("r{r}: {a:?} {b:?} {c:?}"));
        }
        Ok(())
    });
    for r in results {
        r.unwrap();
    }
}
