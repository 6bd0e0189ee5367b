//! One rank of `chorus bench` (`chorus bench-rank`, started by the bench's launcher with the
//! launch environment set): joins the job, runs the sweep the way nccl-tests does, reports
//! on stdout ([`super::wire`]), and when a peer fails mid-sweep it shrinks with the other
//! survivors and carries on from the size it was at.
//!
//! Per size and mode (out-of-place, then in-place): a barrier, the warm-up calls, a
//! barrier, the timed calls; the time is the mean over the ranks of elapsed / calls. Then,
//! with `-c`, fresh data, one more call, and every element checked against the exact
//! expected value ([`super::pattern`]); wrong elements are summed over the ranks.

use std::time::Instant;

use chorus::{Buffer, Comm, Config, Error, Op, Rank, Reduction};
use chorus_protocol::ReduceOp;
use clap::Args;
use rustix::process::Signal;

use super::options::{Coll, InjectKind, SweepArgs};
use super::pattern::Pattern;
use super::shape::Shape;
use super::wire::{RankEvent, Timing, now_ns};
use crate::exit::Verdict;

#[derive(Args, Debug)]
pub(crate) struct RankArgs {
    /// The collective to measure.
    #[arg(value_enum)]
    pub(crate) collective: Coll,
    #[command(flatten)]
    pub(crate) sweep: SweepArgs,
}

/// The byte a receive buffer is filled with before a checked call: it never encodes a value
/// the patterns use (NaN for floats, -1 or the maximum for integers).
const POISON: u8 = 0xff;

pub(crate) fn run(args: RankArgs) -> Verdict {
    let launch_rank = std::env::var("CHORUS_RANK")
        .ok()
        .and_then(|r| r.parse::<u32>().ok());
    let fatal = |rank: u32, error: String| {
        RankEvent::Fatal { rank, error }.emit();
        Verdict::RankFailed
    };
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return fatal(launch_rank.unwrap_or(0), e.to_string()),
    };
    // Workaround for a runtime bug (on main at the time of writing): `Comm` init starts its
    // same-host process watches with `tokio::spawn` on the calling thread, which panics
    // outside a tokio runtime. A one-worker runtime entered here gives them one to run on;
    // later epochs start theirs on the control thread.
    let watches = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("rank-watch")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fatal(launch_rank.unwrap_or(0), format!("runtime: {e}")),
    };
    let entered = watches.enter();
    let comm = match Comm::from_env_blocking(config) {
        Ok(c) => c,
        Err(e) => return fatal(launch_rank.unwrap_or(0), e.to_string()),
    };
    drop(entered);
    let me = launch_rank.unwrap_or(comm.rank());
    RankEvent::Ready { rank: me }.emit();
    let sizes = match args.sweep.sizes(comm.size()) {
        Ok(s) => s,
        Err(e) => return fatal(me, e),
    };
    let mut bench = Bench {
        coll: args.collective,
        sweep: args.sweep,
        me,
        comm,
        timed: 0,
        corrupt: std::env::var("CHORUS_BENCH_CORRUPT").is_ok_and(|v| v == "1"),
    };
    let verdict = match bench.sweep(&sizes) {
        Ok(()) => {
            // Nobody leaves while another still runs a call of the sweep.
            let _ = bench.comm.blocking().barrier();
            let _ = bench.comm.destroy_blocking();
            Verdict::Ok
        }
        Err(e) => fatal(me, e.to_string()),
    };
    watches.shutdown_background();
    verdict
}

struct Bench {
    coll: Coll,
    sweep: SweepArgs,
    /// This rank's launch rank, which names it in every report.
    me: u32,
    comm: Comm,
    /// Timed calls made so far over the whole sweep (what `--inject ...@ITER` counts).
    timed: u64,
    /// `CHORUS_BENCH_CORRUPT=1`: rank 0 spoils one element of each checked result (tests).
    corrupt: bool,
}

/// Which of the two modes a call runs in.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Mode {
    OutOfPlace,
    InPlace,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::OutOfPlace => "out-of-place",
            Mode::InPlace => "in-place",
        }
    }
}

impl Bench {
    fn sweep(&mut self, sizes: &[u64]) -> Result<(), Error> {
        let mut at = 0;
        let mut warmed = false;
        while at < sizes.len() {
            let result = if warmed {
                self.size(sizes[at])
            } else {
                self.warm(sizes).map(|()| None)
            };
            match result {
                Ok(row) => {
                    if let Some(row) = row {
                        if self.comm.rank() == 0 {
                            row.emit();
                        }
                        at += 1;
                    }
                    warmed = true;
                }
                Err(e) if e.is_recoverable_by_shrink() => {
                    self.failed(sizes[at], &e);
                    at = self.recover(at)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// nccl-tests' warm-up before the sweep: `-w` calls of the collective at the largest
    /// size, then at the smallest (at least one). Buffers, links and the pools behind them
    /// reach their working sizes, and ranks that started on one core have had a chance to
    /// be spread (they sleep in the large calls) before the first timed size.
    fn warm(&self, sizes: &[u64]) -> Result<(), Error> {
        let (Some(&largest), Some(&smallest)) = (sizes.last(), sizes.first()) else {
            return Ok(());
        };
        let elt = self.sweep.dtype.size();
        for (bytes, calls) in [
            (largest, self.sweep.warmup),
            (smallest, self.sweep.warmup.max(1)),
        ] {
            let shape = Shape::new(self.coll, bytes, elt, self.comm.size());
            // Zeros: every reduction of zeros stays finite and in range.
            let send = Aligned::new(shape.send * elt);
            let mut recv = Aligned::new(shape.send.max(shape.recv) * elt);
            self.comm.blocking().barrier()?;
            for _ in 0..calls {
                self.call(&shape, Mode::OutOfPlace, send.bytes(), recv.bytes_mut())?;
            }
        }
        self.comm.blocking().barrier()
    }

    fn failed(&self, size: u64, e: &Error) {
        RankEvent::Failed {
            rank: self.me,
            world: self.comm.size(),
            size,
            t_ns: now_ns(),
            error: e.to_string(),
        }
        .emit();
    }

    /// Shrinks with the other survivors and agrees on the size to resume at (the smallest
    /// any survivor was at). Retries while further peers fail, at most once per peer; a
    /// shrink that itself ran out of time (its agreement never finished) or cannot reach a
    /// quorum (this rank is the cut-off minority) is not retried: asking again would only
    /// wait out the same bound again.
    fn recover(&mut self, at: usize) -> Result<usize, Error> {
        let mut attempts = self.comm.size();
        loop {
            let started = Instant::now();
            let next = self.comm.blocking().shrink()?;
            RankEvent::Shrunk {
                rank: self.me,
                new_rank: next.rank(),
                world: next.size(),
                epoch: next.epoch(),
                shrink_ms: started.elapsed().as_secs_f64() * 1e3,
                t_ns: now_ns(),
            }
            .emit();
            self.comm = next;
            let mut resume = [at as u64];
            match self
                .comm
                .blocking()
                .all_reduce_in_place(&mut resume, Reduction::Min)
            {
                Ok(()) => return Ok(resume[0] as usize),
                Err(e) if e.is_recoverable_by_shrink() && attempts > 1 => {
                    attempts -= 1;
                    self.failed(0, &e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Measures one size in both modes; `Some(row)` when done.
    fn size(&mut self, bytes: u64) -> Result<Option<RankEvent>, Error> {
        let n = self.comm.size();
        let dtype = self.sweep.dtype;
        let shape = Shape::new(self.coll, bytes, dtype.size(), n);
        let op = self.coll.reduces().then_some(self.sweep.op);
        let pattern = Pattern::new(dtype, op, n);
        let out_of_place = Some(self.mode(&shape, &pattern, Mode::OutOfPlace, bytes)?);
        // One buffer cannot be both the source and the destination of a send and a receive
        // (nccl-tests does not check that case either).
        let in_place = if self.coll == Coll::SendRecv {
            None
        } else {
            Some(self.mode(&shape, &pattern, Mode::InPlace, bytes)?)
        };
        Ok(Some(RankEvent::Row {
            size: shape.size,
            count: shape.count as u64,
            world: n,
            root: if self.coll.rooted() {
                i64::from(self.sweep.root)
            } else {
                -1
            },
            out_of_place,
            in_place,
        }))
    }

    fn mode(
        &mut self,
        shape: &Shape,
        pattern: &Pattern,
        mode: Mode,
        bytes: u64,
    ) -> Result<Timing, Error> {
        let elt = pattern.elt();
        let r = self.comm.rank();
        let mut send = Aligned::new(shape.send * elt);
        let mut recv = Aligned::new(shape.send.max(shape.recv) * elt);
        // Timed calls: the pattern out of place; zeros in place (repeated in-place sums of
        // zeros cannot overflow).
        match mode {
            Mode::OutOfPlace => pattern.fill(r, 0, send.bytes_mut()),
            Mode::InPlace => recv.bytes_mut().fill(0),
        }
        self.comm.blocking().barrier()?;
        for _ in 0..self.sweep.warmup {
            self.call(shape, mode, send.bytes(), recv.bytes_mut())?;
        }
        self.comm.blocking().barrier()?;
        let started = Instant::now();
        for _ in 0..self.sweep.iters {
            self.maybe_inject(bytes, mode);
            self.call(shape, mode, send.bytes(), recv.bytes_mut())?;
            self.timed += 1;
        }
        let per_call_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(self.sweep.iters);
        let mut sum = [per_call_us];
        self.comm
            .blocking()
            .all_reduce_in_place(&mut sum, Reduction::Sum)?;
        let time_us = sum[0] / f64::from(self.comm.size());
        let wrong = if self.sweep.check == 0 {
            None
        } else {
            let mut wrong = 0;
            for _ in 0..self.sweep.check {
                wrong += self.check(shape, pattern, mode, &mut send, &mut recv)?;
            }
            let mut total = [wrong];
            self.comm
                .blocking()
                .all_reduce_in_place(&mut total, Reduction::Sum)?;
            Some(total[0])
        };
        Ok(Timing { time_us, wrong })
    }

    /// One checked call on fresh data; the number of wrong elements on this rank.
    fn check(
        &self,
        shape: &Shape,
        pattern: &Pattern,
        mode: Mode,
        send: &mut Aligned,
        io: &mut Aligned,
    ) -> Result<u64, Error> {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let elt = pattern.elt();
        let block = shape.count;
        let root = self.sweep.root;
        io.bytes_mut().fill(POISON);
        match mode {
            Mode::OutOfPlace => pattern.fill(r, 0, send.bytes_mut()),
            Mode::InPlace => {
                let buf = io.bytes_mut();
                match self.coll {
                    Coll::AllGather => {
                        pattern.fill(r, 0, &mut buf[r as usize * block * elt..][..block * elt])
                    }
                    Coll::Broadcast if r != root => {}
                    _ => pattern.fill(r, 0, buf),
                }
            }
        }
        self.call(shape, mode, send.bytes(), io.bytes_mut())?;
        if self.corrupt && r == 0 && !io.bytes().is_empty() {
            // Test hook: spoil one result element, so tests see wrong results counted.
            let last = io.bytes().len() - 1;
            io.bytes_mut()[last] ^= 0x01;
        }
        // What this rank must hold afterwards, and where.
        let got = io.bytes();
        let mut expected = vec![0u8; shape.recv * elt];
        let region = match self.coll {
            Coll::AllReduce => {
                pattern.fill_reduced(0, &mut expected);
                0..expected.len()
            }
            Coll::Reduce => {
                if r != root {
                    return Ok(0);
                }
                pattern.fill_reduced(0, &mut expected);
                0..expected.len()
            }
            Coll::Broadcast => {
                pattern.fill(root, 0, &mut expected);
                0..expected.len()
            }
            Coll::SendRecv => {
                let from = if n == 1 { r } else { (r + n - 1) % n };
                pattern.fill(from, 0, &mut expected);
                0..expected.len()
            }
            Coll::AllGather => {
                for (j, part) in expected.chunks_exact_mut((block * elt).max(1)).enumerate() {
                    pattern.fill(j as u32, 0, part);
                }
                0..expected.len()
            }
            Coll::ReduceScatter => {
                pattern.fill_reduced(r as usize * block, &mut expected);
                match mode {
                    Mode::OutOfPlace => 0..expected.len(),
                    // In place the result lands in this rank's block of the whole buffer.
                    Mode::InPlace => {
                        let at = r as usize * block * elt;
                        return Ok(pattern.wrong(&expected, &got[at..at + block * elt]));
                    }
                }
            }
            Coll::AllToAll => {
                for (j, part) in expected.chunks_exact_mut((block * elt).max(1)).enumerate() {
                    pattern.fill(j as u32, r as usize * block, part);
                }
                0..expected.len()
            }
        };
        Ok(pattern.wrong(&expected[region.clone()], &got[region]))
    }

    /// Kills or freezes this rank if `--inject` says so for this timed call.
    fn maybe_inject(&self, bytes: u64, mode: Mode) {
        let Some(j) = self
            .sweep
            .inject
            .iter()
            .find(|j| j.rank == self.me && j.iter == self.timed)
        else {
            return;
        };
        RankEvent::Inject {
            rank: self.me,
            kind: j.kind.name().into(),
            iter: j.iter,
            size: bytes,
            mode: mode.name().into(),
            t_ns: now_ns(),
        }
        .emit();
        let signal = match j.kind {
            InjectKind::Kill => Signal::KILL,
            InjectKind::Stop => Signal::STOP,
        };
        // Only this process: the point is a rank that vanishes or freezes mid-sweep. After
        // a SIGCONT the rank carries on and finds itself left behind.
        let _ = rustix::process::kill_process(rustix::process::getpid(), signal);
    }

    /// One call of the collective in `mode` (`io` is the receive buffer, or the only buffer
    /// in place).
    fn call(&self, shape: &Shape, mode: Mode, send: &[u8], io: &mut [u8]) -> Result<(), Error> {
        let dtype = self.sweep.dtype;
        let (n, r) = (self.comm.size(), self.comm.rank());
        let elt = dtype.size();
        let count = shape.count;
        let reduction = reduction(self.sweep.op);
        let root = Rank(self.sweep.root.min(n - 1));
        let blocking = self.comm.blocking();
        if self.coll == Coll::SendRecv {
            let bytes = count * elt;
            if n == 1 {
                // A world of one sends to itself: a local copy.
                io[..bytes].copy_from_slice(&send[..bytes]);
                return Ok(());
            }
            return blocking.group(vec![
                Op::Send {
                    buf: &send[..bytes],
                    count,
                    dtype,
                    peer: Rank((r + 1) % n),
                },
                Op::Recv {
                    buf: &mut io[..bytes],
                    count,
                    dtype,
                    peer: Rank((r + n - 1) % n),
                },
            ]);
        }
        let buf = match mode {
            Mode::OutOfPlace => Buffer::separate(send, &mut io[..shape.recv * elt]),
            Mode::InPlace => Buffer::in_place(io),
        };
        blocking.run(match self.coll {
            Coll::AllReduce => Op::AllReduce {
                buf,
                count,
                dtype,
                reduction,
            },
            Coll::Reduce => Op::Reduce {
                buf,
                count,
                dtype,
                reduction,
                root,
            },
            Coll::Broadcast => Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            },
            Coll::AllGather => Op::AllGather { buf, count, dtype },
            Coll::ReduceScatter => Op::ReduceScatter {
                buf,
                count,
                dtype,
                reduction,
            },
            // Send-recv returned above.
            Coll::AllToAll | Coll::SendRecv => Op::AllToAll { buf, count, dtype },
        })
    }
}

fn reduction(op: ReduceOp) -> Reduction {
    Reduction::try_from(op).unwrap_or(Reduction::Sum)
}

/// A byte buffer aligned for any element type (backed by `u64`s).
struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        Aligned {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}
