//! Live progress of running operations, for the runtime's flight recorder and watchdog.
//!
//! Each operation publishes an [`OpProgress`] while it runs: what it is, which step it has
//! reached and which peer it is blocked on, in atomics any thread can read without stopping
//! the operation. That is what turns a hang into an answer like "rank 2 is waiting on rank 3
//! in all-reduce op 17, step 5". The progress also carries the operation's [`Context`], so a
//! watchdog that owns a clock can abort exactly that operation with a timeout reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use chorus_protocol::message::OpState;
use chorus_protocol::{Collective, DType, OpSeq, Rank};

use crate::config::Algorithm;
use crate::context::Context;
use crate::error::OpError;

const NOBODY: u32 = u32::MAX;

/// One operation's live progress.
#[derive(Debug)]
pub struct OpProgress {
    seq: OpSeq,
    collective: Collective,
    dtype: Option<DType>,
    bytes: u64,
    algorithm: Algorithm,
    peer_of_p2p: Option<Rank>,
    step: AtomicU32,
    steps: AtomicU32,
    waiting_on: AtomicU32,
    state: AtomicU8,
    context: Context,
}

/// A consistent-enough copy of an [`OpProgress`] (each field is read atomically; fields may
/// be from instants a few nanoseconds apart).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OpSnapshot {
    /// The operation's sequence number (see [`OpProgress::seq`]).
    pub seq: OpSeq,
    /// The operation's collective.
    pub collective: Collective,
    /// Its element type (`None` for a barrier, which carries no data).
    pub dtype: Option<DType>,
    /// Bytes of the operation's buffer on this rank.
    pub bytes: u64,
    /// The algorithm's name, as `CHORUS_ALGO` spells it.
    pub algorithm: &'static str,
    /// Where it stands at the snapshot.
    pub state: OpState,
    /// The step (tag step) last started.
    pub step: u32,
    /// The number of steps the schedule has, when known (0 otherwise).
    pub steps: u32,
    /// The peer the operation is blocked on right now, if any.
    pub waiting_on: Option<Rank>,
}

impl OpProgress {
    pub(crate) fn new(
        seq: OpSeq,
        collective: Collective,
        dtype: Option<DType>,
        bytes: u64,
        algorithm: Algorithm,
        peer_of_p2p: Option<Rank>,
        context: Context,
    ) -> Self {
        OpProgress {
            seq,
            collective,
            dtype,
            bytes,
            algorithm,
            peer_of_p2p,
            step: AtomicU32::new(0),
            steps: AtomicU32::new(0),
            waiting_on: AtomicU32::new(NOBODY),
            state: AtomicU8::new(OpState::Queued as u8),
            context,
        }
    }

    /// The operation's sequence number (for send/recv, the per-peer tag sequence, with
    /// [`crate::engine::P2P_SEQ_BIT`] set).
    pub fn seq(&self) -> OpSeq {
        self.seq
    }

    /// The operation's collective.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// The algorithm the engine chose for it (or the override).
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Bytes of the operation's buffer on this rank.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// For send and receive: the peer.
    pub fn p2p_peer(&self) -> Option<Rank> {
        self.peer_of_p2p
    }

    /// The operation's context: abort it to end this operation (for example with
    /// [`crate::AbortReason::Timeout`] when its deadline passes).
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Where it stands: queued, running, or how it ended.
    pub fn state(&self) -> OpState {
        match self.state.load(Ordering::Acquire) {
            0 => OpState::Queued,
            1 => OpState::Running,
            2 => OpState::Done,
            3 => OpState::Failed,
            _ => OpState::Aborted,
        }
    }

    /// The schedule step last started (0 before the first); may lag by a step while read.
    pub fn step(&self) -> u32 {
        self.step.load(Ordering::Relaxed)
    }

    /// The peer the operation is blocked on right now, if it is blocked on one: the rank to ask
    /// about a hang.
    pub fn waiting_on(&self) -> Option<Rank> {
        match self.waiting_on.load(Ordering::Relaxed) {
            NOBODY => None,
            r => Some(Rank(r)),
        }
    }

    /// A copy of every field, each read atomically (not all at one instant).
    pub fn snapshot(&self) -> OpSnapshot {
        OpSnapshot {
            seq: self.seq,
            collective: self.collective,
            dtype: self.dtype,
            bytes: self.bytes,
            algorithm: self.algorithm.name(),
            state: self.state(),
            step: self.step(),
            steps: self.steps.load(Ordering::Relaxed),
            waiting_on: self.waiting_on(),
        }
    }

    pub(crate) fn set_state(&self, s: OpState) {
        self.state.store(s as u8, Ordering::Release);
    }

    pub(crate) fn set_steps(&self, steps: u32) {
        self.steps.store(steps, Ordering::Relaxed);
    }

    pub(crate) fn enter(&self, step: u32, peer: Rank) {
        self.step.store(step, Ordering::Relaxed);
        self.waiting_on.store(peer.0, Ordering::Relaxed);
    }

    pub(crate) fn leave(&self) {
        self.waiting_on.store(NOBODY, Ordering::Relaxed);
    }
}

/// Hooks the runtime may install to record operations as they start and end (the flight
/// recorder). Called on the thread running the operation; keep them short and non-blocking.
pub trait OpObserver: Send + Sync {
    /// The operation was submitted and is about to run.
    fn started(&self, op: &Arc<OpProgress>) {
        let _ = op;
    }

    /// The operation ended (its state is `Done`, `Failed` or `Aborted`).
    fn finished(&self, op: &Arc<OpProgress>, result: Result<(), &OpError>) {
        let _ = (op, result);
    }
}
