//! The communicator-level engine: one rank's view of a communicator, running collectives
//! over one link per peer on one device.
//!
//! The runtime in `chorus` builds one [`Engine`] per communicator (and per split or shrunk
//! child, passing the parent's [`Engine::context`] as the parent context), submits operations
//! with [`Engine::run`] / [`Engine::group`] (or the `_in` forms with an operation context it
//! made with [`Engine::op_context`], to arm a deadline on it), reads live progress with
//! [`Engine::running`], and aborts with [`Engine::context`]`.abort(..)`.
//!
//! Operations are futures that run on any executor. Sequence numbers are assigned when an
//! operation is submitted (when `run` is called, not when its future is first polled), so
//! every rank must submit the same operations in the same order, as with NCCL.
//!
//! After any operation fails, the engine is poisoned: stale chunks of the failed operation
//! may still be in flight on its links, so later operations fail at once with
//! [`OpErrorKind::Poisoned`], and operations still running are aborted with
//! [`AbortReason::OpFailed`]. The runtime then aborts, revokes or shrinks.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chorus_protocol::message::OpState;
use chorus_protocol::{Collective, DType, OpSeq, Rank};
use futures::future::Either;
use parking_lot::Mutex;
use tracing::Instrument;

use crate::collective;
use crate::config::{Algorithm, EngineConfig};
use crate::context::{AbortReason, Context};
use crate::device::Device;
use crate::error::{EngineError, OpError, OpErrorKind};
use crate::idmap::IdMap;
use crate::link::Link;
use crate::op::{Buffer, Op, Reduction};
use crate::progress::{OpObserver, OpProgress};
use crate::run::{Run, RunSetup};
use crate::select::select;

/// Send/receive tags use their own per-peer sequence, marked by this bit in [`OpSeq`], so
/// point-to-point traffic (which only two ranks see) never shifts the collective sequence
/// every rank shares.
pub const P2P_SEQ_BIT: u64 = 1 << 63;

/// One rank of one communicator.
pub struct Engine<D: Device, L: Link<D::Payload> + ?Sized> {
    rank: Rank,
    world: u32,
    /// Indexed by rank; `None` at this rank.
    links: Vec<Option<Arc<L>>>,
    device: Arc<D>,
    /// Source of empty payloads (credits, barrier tokens).
    token: D::Owned,
    ctx: Context,
    config: EngineConfig,
    next_seq: AtomicU64,
    /// Next point-to-point sequence per (direction is send, peer).
    p2p_seq: Mutex<IdMap<(bool, u32), u64>>,
    poison: Mutex<Option<Arc<OpError>>>,
    /// The operations in flight, by id, in no particular order: a few at a time (a group's
    /// members at most), so a short list scanned beats a hash map, whose insert and remove
    /// were a few hundred instructions of every small operation.
    running: Mutex<Vec<(u64, Arc<OpProgress>)>>,
    next_id: AtomicU64,
    observer: Option<Arc<dyn OpObserver>>,
}

/// An operation that has its sequence number and context, ready to run.
struct Prepared {
    id: u64,
    progress: Arc<OpProgress>,
}

/// A prepared operation that is completed exactly once: by [`Armed::finish`], or, if its
/// future is dropped before it finished (a caller's timeout, a cancelled task), by `Drop`,
/// which records it as aborted and poisons the communicator, since its peers may still be
/// exchanging chunks of it.
struct Armed<'e, D: Device, L: Link<D::Payload> + ?Sized> {
    engine: &'e Engine<D, L>,
    p: Prepared,
    done: bool,
}

impl<D: Device, L: Link<D::Payload> + ?Sized> Armed<'_, D, L> {
    fn finish(mut self, result: Result<(), OpError>) -> Result<(), OpError> {
        self.done = true;
        self.engine.complete(&self.p, result)
    }
}

impl<D: Device, L: Link<D::Payload> + ?Sized> Drop for Armed<'_, D, L> {
    fn drop(&mut self) {
        if !self.done {
            let e = OpError {
                kind: OpErrorKind::Aborted(AbortReason::requested(
                    "operation dropped before it completed",
                )),
                collective: self.p.progress.collective(),
                op: self.p.progress.seq(),
                step: Some(self.p.progress.step()),
                peer: self.p.progress.waiting_on(),
                partial_output: true,
            };
            let _ = self.engine.complete(&self.p, Err(e));
        }
    }
}

impl<D, L> Engine<D, L>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    /// The engine of rank `rank` in a communicator of `world` ranks, with one link per other
    /// rank (any order; each link's [`Link::peer`] says which), on `device`. Its context is a
    /// new child of `parent`, so aborting `parent` aborts everything this engine runs.
    pub fn new(
        rank: Rank,
        world: u32,
        links: impl IntoIterator<Item = Arc<L>>,
        device: Arc<D>,
        parent: &Context,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        if world == 0 || rank.0 >= world {
            return Err(EngineError::RankOutOfRange { rank, world });
        }
        config.validate()?;
        let mut table: Vec<Option<Arc<L>>> = (0..world).map(|_| None).collect();
        for link in links {
            let peer = link.peer();
            if peer == rank || peer.0 >= world {
                return Err(EngineError::Links(format!(
                    "link to {peer} in a world of {world} at {rank}"
                )));
            }
            let slot = &mut table[peer.index()];
            if slot.is_some() {
                return Err(EngineError::Links(format!("two links to {peer}")));
            }
            *slot = Some(link);
        }
        if let Some(missing) = (0..world).find(|&r| r != rank.0 && table[r as usize].is_none()) {
            return Err(EngineError::Links(format!("no link to r{missing}")));
        }
        let token = device
            .alloc(8)
            .map_err(|e| EngineError::Config(format!("device {}: {e}", device.name())))?;
        Ok(Engine {
            rank,
            world,
            links: table,
            device,
            token,
            ctx: parent.child(),
            config,
            next_seq: AtomicU64::new(0),
            p2p_seq: Mutex::new(IdMap::default()),
            poison: Mutex::new(None),
            running: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            observer: None,
        })
    }

    /// Install hooks called when each operation starts and ends (the flight recorder).
    pub fn with_observer(mut self, observer: Arc<dyn OpObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// This rank's place in the communicator (`0..world`), fixed for the engine's life: a shrink
    /// builds a new engine.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The number of ranks in the communicator.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The device every operation's copies and reductions run on.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The configuration the engine was built with (chunk size, pipeline depth, algorithms).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The link to `peer`, if `peer` is another rank of this communicator.
    pub fn link(&self, peer: Rank) -> Option<&Arc<L>> {
        self.links.get(peer.index()).and_then(Option::as_ref)
    }

    /// The communicator's context: parent of every operation's context and of every child
    /// communicator's (pass it as `parent` when building a split or shrunk engine). Abort it
    /// to end everything running here and below.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// A fresh operation context under this communicator, for [`Engine::run_in`] and
    /// [`Engine::group_in`]: the runtime arms its deadline on it before submitting.
    pub fn op_context(&self) -> Context {
        self.ctx.child()
    }

    /// The first failure, once the engine is poisoned.
    pub fn poisoned(&self) -> Option<Arc<OpError>> {
        self.poison.lock().clone()
    }

    /// The operations running now, oldest first.
    pub fn running(&self) -> Vec<Arc<OpProgress>> {
        let mut ops: Vec<(u64, Arc<OpProgress>)> = self
            .running
            .lock()
            .iter()
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        ops.sort_unstable_by_key(|(id, _)| *id);
        ops.into_iter().map(|(_, p)| p).collect()
    }

    /// The collective sequence number the next collective will get.
    pub fn next_seq(&self) -> OpSeq {
        OpSeq(self.next_seq.load(Ordering::Relaxed))
    }

    /// The algorithm the engine would choose for `collective` on `bytes` (see
    /// [`crate::select`]).
    pub fn algorithm_for(&self, collective: Collective, bytes: usize) -> Algorithm {
        select(collective, bytes, self.world, &self.config)
    }

    /// Run one operation in a new context under the communicator's.
    pub fn run<'a>(
        &'a self,
        op: Op<'a, D::Mem>,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        let ctx = self.ctx.clone();
        self.run_in(&ctx, op)
    }

    /// Run one operation in a new child of `ctx`, which must be this engine's context or a
    /// descendant of it (see [`Engine::op_context`]).
    pub fn run_in<'a>(
        &'a self,
        ctx: &Context,
        op: Op<'a, D::Mem>,
    ) -> impl Future<Output = Result<(), OpError>> + Send + use<'a, D, L> {
        let span = self.span(&op);
        let armed = self.prepare(ctx, &op);
        if let Ok(armed) = &armed {
            span.record("op", armed.p.progress.seq().0);
        }
        let run = async move {
            let armed = armed?;
            let result = self.execute(&armed.p, op).await;
            armed.finish(result)
        };
        // Entering a span nobody listens to still costs a call on every poll.
        if span.is_disabled() {
            Either::Left(run)
        } else {
            Either::Right(run.instrument(span))
        }
    }

    /// Run several operations together (NCCL's group calls): they are submitted in order,
    /// run concurrently and complete together. If one fails, the others are aborted and the
    /// first failure is returned.
    pub fn group<'a>(
        &'a self,
        ops: Vec<Op<'a, D::Mem>>,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        let ctx = self.ctx.clone();
        self.group_in(&ctx, ops)
    }

    /// [`Engine::group`] under `ctx` (see [`Engine::run_in`]).
    pub fn group_in<'a>(
        &'a self,
        ctx: &Context,
        ops: Vec<Op<'a, D::Mem>>,
    ) -> impl Future<Output = Result<(), OpError>> + Send + use<'a, D, L> {
        let prepared: Vec<_> = ops
            .iter()
            .map(|op| (self.span(op), self.prepare(ctx, op)))
            .collect();
        async move {
            let runs = prepared.into_iter().zip(ops).map(|((span, armed), op)| {
                async move {
                    let armed = armed?;
                    tracing::Span::current().record("op", armed.p.progress.seq().0);
                    let result = self.execute(&armed.p, op).await;
                    armed.finish(result)
                }
                .instrument(span)
            });
            let results = futures::future::join_all(runs).await;
            let mut first: Option<OpError> = None;
            for r in results {
                if let Err(e) = r {
                    let secondary = matches!(
                        e.kind,
                        OpErrorKind::Aborted(AbortReason::OpFailed { .. })
                            | OpErrorKind::Poisoned(_)
                    );
                    match &first {
                        None => first = Some(e),
                        Some(f)
                            if !secondary
                                && matches!(
                                    f.kind,
                                    OpErrorKind::Aborted(AbortReason::OpFailed { .. })
                                        | OpErrorKind::Poisoned(_)
                                ) =>
                        {
                            first = Some(e)
                        }
                        Some(_) => {}
                    }
                }
            }
            first.map_or(Ok(()), Err)
        }
    }

    // Convenience forms, one per collective.

    /// All-reduce `count` elements (see [`Op::AllReduce`]).
    pub fn all_reduce<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        reduction: Reduction,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::AllReduce {
            buf,
            count,
            dtype,
            reduction,
        })
    }

    /// Reduce `count` elements to `root` (see [`Op::Reduce`]).
    pub fn reduce<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        reduction: Reduction,
        root: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Reduce {
            buf,
            count,
            dtype,
            reduction,
            root,
        })
    }

    /// Broadcast `count` elements from `root` (see [`Op::Broadcast`]).
    pub fn broadcast<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        root: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Broadcast {
            buf,
            count,
            dtype,
            root,
        })
    }

    /// All-gather `count` elements per rank (see [`Op::AllGather`]).
    pub fn all_gather<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::AllGather { buf, count, dtype })
    }

    /// Reduce-scatter to `count` elements per rank (see [`Op::ReduceScatter`]).
    pub fn reduce_scatter<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        reduction: Reduction,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::ReduceScatter {
            buf,
            count,
            dtype,
            reduction,
        })
    }

    /// All-to-all with `count` elements per pair (see [`Op::AllToAll`]).
    pub fn all_to_all<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::AllToAll { buf, count, dtype })
    }

    /// Gather `count` elements per rank at `root` (see [`Op::Gather`]).
    pub fn gather<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        root: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Gather {
            buf,
            count,
            dtype,
            root,
        })
    }

    /// Scatter `count` elements per rank from `root` (see [`Op::Scatter`]).
    pub fn scatter<'a>(
        &'a self,
        buf: Buffer<'a, D::Mem>,
        count: usize,
        dtype: DType,
        root: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Scatter {
            buf,
            count,
            dtype,
            root,
        })
    }

    /// Send `count` elements to `peer`.
    pub fn send<'a>(
        &'a self,
        buf: &'a D::Mem,
        count: usize,
        dtype: DType,
        peer: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Send {
            buf,
            count,
            dtype,
            peer,
        })
    }

    /// Receive `count` elements from `peer`.
    pub fn recv<'a>(
        &'a self,
        buf: &'a mut D::Mem,
        count: usize,
        dtype: DType,
        peer: Rank,
    ) -> impl Future<Output = Result<(), OpError>> + Send + 'a {
        self.run(Op::Recv {
            buf,
            count,
            dtype,
            peer,
        })
    }

    /// Wait until every rank has entered the barrier.
    pub fn barrier(&self) -> impl Future<Output = Result<(), OpError>> + Send + '_ {
        self.run(Op::Barrier)
    }

    // Submission internals.

    /// Assign the sequence number and context, publish progress. Synchronous, so the order
    /// of submission is the order of sequence numbers.
    fn span(&self, op: &Op<'_, D::Mem>) -> tracing::Span {
        tracing::debug_span!(
            "op",
            rank = self.rank.0,
            collective = %op.collective(),
            count = op.count(),
            op = tracing::field::Empty,
        )
    }

    fn prepare(&self, ctx: &Context, op: &Op<'_, D::Mem>) -> Result<Armed<'_, D, L>, OpError> {
        let collective = op.collective();
        let dtype = op.dtype();
        let p2p = match op {
            Op::Send { peer, .. } => Some((true, *peer)),
            Op::Recv { peer, .. } => Some((false, *peer)),
            _ => None,
        };
        let seq = match p2p {
            Some((is_send, peer)) => {
                let mut seqs = self.p2p_seq.lock();
                let next = seqs.entry((is_send, peer.0)).or_insert(0);
                let s = *next;
                *next += 1;
                OpSeq(P2P_SEQ_BIT | s)
            }
            None => OpSeq(self.next_seq.fetch_add(1, Ordering::Relaxed)),
        };
        let fail = |kind| OpError {
            kind,
            collective,
            op: seq,
            step: None,
            peer: None,
            partial_output: false,
        };
        if let Some(first) = self.poisoned() {
            return Err(fail(OpErrorKind::Poisoned(first)));
        }
        let bytes = collective::measure(op, self.world);
        let algorithm = select(collective, bytes, self.world, &self.config);
        let op_ctx = ctx.child();
        let progress = Arc::new(OpProgress::new(
            seq,
            collective,
            (collective != Collective::Barrier).then_some(dtype),
            bytes as u64,
            algorithm,
            p2p.map(|(_, peer)| peer),
            op_ctx,
        ));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.running.lock().push((id, progress.clone()));
        let armed = Armed {
            engine: self,
            p: Prepared { id, progress },
            done: false,
        };
        if let Some(obs) = &self.observer {
            obs.started(&armed.p.progress);
        }
        if !ctx.descends_from(&self.ctx) {
            let e = fail(OpErrorKind::InvalidArgument(
                "operation context is not under this communicator's context".into(),
            ));
            return Err(armed.finish(Err(e.clone())).err().unwrap_or(e));
        }
        Ok(armed)
    }

    async fn execute(&self, p: &Prepared, op: Op<'_, D::Mem>) -> Result<(), OpError> {
        let progress = p.progress.clone();
        progress.set_state(OpState::Running);
        let setup = RunSetup {
            dev: &*self.device,
            links: &self.links,
            token: &self.token,
            rank: self.rank.0,
            world: self.world,
            chunk_bytes: self.config.chunk_bytes,
            depth: self.config.pipeline_depth,
        };
        let mut run = Run::new(
            setup,
            op.collective(),
            progress.seq(),
            op.dtype(),
            progress.clone(),
        );
        run.check_aborted()?;
        collective::execute(&mut run, progress.algorithm(), op).await?;
        run.finish().await?;
        run.settle()
    }

    fn complete(&self, p: &Prepared, result: Result<(), OpError>) -> Result<(), OpError> {
        {
            let mut running = self.running.lock();
            if let Some(i) = running.iter().position(|(id, _)| *id == p.id) {
                running.swap_remove(i);
            }
        }
        match &result {
            Ok(()) => p.progress.set_state(OpState::Done),
            Err(e) => {
                // Its reads are not the next operation's to answer for.
                self.device.forget(p.progress.context());
                let aborted = matches!(e.kind, OpErrorKind::Aborted(_));
                p.progress.set_state(if aborted {
                    OpState::Aborted
                } else {
                    OpState::Failed
                });
                let first = {
                    let mut poison = self.poison.lock();
                    if poison.is_none() {
                        *poison = Some(Arc::new(e.clone()));
                        true
                    } else {
                        false
                    }
                };
                if first {
                    tracing::debug!(rank = %self.rank, op = %e.op, error = %e, "operation failed; communicator poisoned");
                    let reason = AbortReason::OpFailed {
                        op: e.op,
                        collective: e.collective,
                    };
                    for other in self.running() {
                        other.context().abort(reason.clone());
                    }
                }
            }
        }
        if let Some(obs) = &self.observer {
            obs.finished(&p.progress, result.as_ref().map(|_| ()));
        }
        result
    }
}
