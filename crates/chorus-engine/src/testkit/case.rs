//! One operation of the matrix, the case lists, and what each rank's buffers hold before
//! and after it.

use chorus_protocol::{Collective, DType, Rank};

use super::reference::{garbage, input, reduced, reductions};
use crate::{Buffer, Op, Reduction};

/// One operation to check.
#[derive(Clone, Debug)]
pub struct Case {
    /// Seeds the inputs (`reference::input`), so every case's data differs and a result that
    /// landed in the wrong case's buffer is caught.
    pub id: u64,
    /// The collective under test.
    pub collective: Collective,
    /// The element type.
    pub dtype: DType,
    /// The reduction (ignored by collectives that do not reduce).
    pub reduction: Reduction,
    /// The operation's `count` argument, in elements (see [`Op`] for what it counts per
    /// collective).
    pub count: usize,
    /// Run with one buffer ([`Buffer::InPlace`]) instead of separate send and receive buffers.
    pub in_place: bool,
    /// The root rank, for the rooted collectives (ignored by the others).
    pub root: u32,
}

impl Case {
    /// This case's operation over `buf`.
    pub fn op<'a, M: ?Sized>(&self, buf: Buffer<'a, M>) -> Op<'a, M> {
        let (count, dtype, reduction, root) =
            (self.count, self.dtype, self.reduction, Rank(self.root));
        match self.collective {
            Collective::AllReduce => Op::AllReduce {
                buf,
                count,
                dtype,
                reduction,
            },
            Collective::Reduce => Op::Reduce {
                buf,
                count,
                dtype,
                reduction,
                root,
            },
            Collective::Broadcast => Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            },
            Collective::AllGather => Op::AllGather { buf, count, dtype },
            Collective::ReduceScatter => Op::ReduceScatter {
                buf,
                count,
                dtype,
                reduction,
            },
            Collective::AllToAll => Op::AllToAll { buf, count, dtype },
            Collective::Gather => Op::Gather {
                buf,
                count,
                dtype,
                root,
            },
            Collective::Scatter => Op::Scatter {
                buf,
                count,
                dtype,
                root,
            },
            Collective::SendRecv | Collective::Barrier => {
                unreachable!("the matrix has no {} case", self.collective)
            }
        }
    }
}

/// The collectives the matrix checks: all but send/receive and the barrier, which take no
/// single buffer (see `ring_exchange`).
pub fn collectives() -> impl Iterator<Item = Collective> {
    Collective::ALL
        .into_iter()
        .filter(|c| !matches!(c, Collective::SendRecv | Collective::Barrier))
}

/// Every collective x dtype x reduction (the reducing ones; the others once per dtype), in
/// and out of place and with counts from 1 up, for a world of `n`.
pub fn every_case(n: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut id = 0u64;
    for collective in collectives() {
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
    [
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
    .map(|(i, (collective, dtype, reduction))| Case {
        id: 10_000 + i as u64,
        collective,
        dtype,
        reduction,
        count: 150_001 + i * 999,
        in_place: i % 2 == 0,
        root: (i as u32) % n,
    })
    .collect()
}

/// Rank `r`'s send buffer for `case` in a world of `n`, its receive (or in-place) buffer
/// before the operation, and what that buffer must hold after it.
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
            // Rank j's block r lands in our block j.
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
        Collective::SendRecv | Collective::Barrier => {
            unreachable!("the matrix has no {} case", case.collective)
        }
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
            Collective::SendRecv | Collective::Barrier => {}
        }
    }
    (send, buf, want)
}

/// Whether `c` combines the ranks' data with a reduction.
fn reduces(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    )
}
