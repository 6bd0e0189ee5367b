//! `Comm`: the communicator a framework embeds — what `ncclComm_t` is, with the failure
//! behaviour NCCL lacks.
//!
//! Every call is async (awaitable on any executor) and has a blocking twin on
//! [`Comm::blocking`]. Every wait is bounded: collectives by the operation timeout and by
//! failure detection, `init`/`shrink`/`grow` by their deadlines, `destroy` by the teardown
//! budget. A failure is an [`Error`] naming the peer, the evidence, the operation and the
//! step; it never looks like success (principle 5).

mod blocking;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod membership;
#[cfg(feature = "cuda")]
mod same_gpu;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use chorus_engine::{Buffer, Context, LinkError, Op, OpError, OpErrorKind, Reduction};
use chorus_protocol::{CloseCode, CommId, Rank};
use futures::FutureExt;
use futures::future::{Either, ready};
use parking_lot::Mutex;
use tokio::sync::oneshot;

pub use blocking::Blocking;

use crate::config::Config;
use crate::element::{Element, bytes, bytes_mut};
use crate::error::{Error, ErrorKind, Result, from_abort, from_op};
use crate::introspection::{Health, Member, PeerHealth, RecentOp};
use crate::runtime::Session;
use crate::runtime::bootstrap::{self, Founded};
use crate::runtime::epoch::EpochState;
use crate::runtime::lineage::LineageHandle;
use crate::runtime::mailbox::{DataLink, LineageMsg};
use crate::runtime::root::RootHost;
use crate::unique_id::UniqueId;

/// A communicator: a group of ranks that run collectives together.
pub struct Comm {
    inner: Arc<Inner>,
}

struct Inner {
    session: Arc<Session>,
    lineage: Arc<LineageHandle>,
    epoch: Arc<EpochState>,
    /// Aborted by `abort` (and by an ancestor's abort): the root of everything this
    /// communicator and its descendants run (principle 4, seed 001).
    life: Context,
    /// Split children, aborted with this communicator.
    children: Mutex<Vec<Weak<Inner>>>,
    /// The bootstrap root this process hosts for the job, if any.
    _root: Option<RootHost>,
    /// One-way: set by `destroy` or `abort`, never cleared (principle 4).
    closed: AtomicBool,
    /// An abort's departure, still leaving: a later `destroy` lets it finish (bounded).
    departing: Mutex<Option<oneshot::Receiver<()>>>,
    _signal: Mutex<Option<crate::signal::Registration>>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.inner.epoch;
        f.debug_struct("Comm")
            .field("comm", &e.comm)
            .field("epoch", &e.epoch)
            .field("rank", &e.rank)
            .field("world", &e.world)
            .finish()
    }
}

impl Comm {
    /// Joins the communicator `id` names as `rank` of `world` (every rank calls this with
    /// the same `id` and `world`). Returns once every member has joined and every data link
    /// is up, or fails by `config.init_timeout`.
    pub async fn init(id: &UniqueId, rank: u32, world: u32, config: Config) -> Result<Comm> {
        let founded = bootstrap::init(id, rank, world, config).await?;
        Ok(Comm::founded(founded, None))
    }

    /// `init` from the launch environment (`CHORUS_*`, torchrun, Slurm, Open MPI; see
    /// [`crate::launch`]), with `config`. Without a token, rank 0 hosts the bootstrap root
    /// at the named address.
    pub async fn from_env(config: Config) -> Result<Comm> {
        let mut config = config;
        let joining = bootstrap::from_env(&config).await?;
        // A loopback bind cannot be reached from another host: under torchrun or Slurm
        // across nodes, bind where this host reaches the root from instead.
        if config.bind.is_loopback()
            && let Some(ip) = crate::launch::local_ip_toward(joining.id.root)
        {
            config.bind = ip;
        }
        let founded = bootstrap::init(&joining.id, joining.rank, joining.world, config).await?;
        Ok(Comm::founded(founded, joining.root))
    }

    /// A communicator for a lineage's first epoch, departing on signals if configured.
    fn founded(founded: Founded, root: Option<RootHost>) -> Comm {
        let Founded {
            session,
            lineage,
            epoch,
            life,
        } = founded;
        let comm = Comm::from_parts(session, lineage, epoch, life, root);
        comm.install_signal_departure();
        comm
    }

    fn from_parts(
        session: Arc<Session>,
        lineage: Arc<LineageHandle>,
        epoch: Arc<EpochState>,
        life: Context,
        root: Option<RootHost>,
    ) -> Comm {
        session.enter();
        Comm {
            inner: Arc::new(Inner {
                session,
                lineage,
                epoch,
                life,
                children: Mutex::new(Vec::new()),
                _root: root,
                closed: AtomicBool::new(false),
                departing: Mutex::new(None),
                _signal: Mutex::new(None),
            }),
        }
    }

    /// This member's rank.
    pub fn rank(&self) -> u32 {
        self.inner.epoch.rank.get()
    }

    /// The number of members.
    pub fn size(&self) -> u32 {
        self.inner.epoch.world
    }

    /// The membership generation: 0 after init, bumped by every shrink and grow.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch.epoch.get()
    }

    /// The communicator's id.
    pub fn id(&self) -> CommId {
        self.inner.epoch.comm
    }

    /// The peer table: every member's addresses, host and process.
    pub fn members(&self) -> Vec<Member> {
        self.inner.epoch.members.iter().map(Member::from).collect()
    }

    /// The blocking twin of every call.
    pub fn blocking(&self) -> Blocking<'_> {
        Blocking(self)
    }

    /// The first failure recorded on this communicator (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        self.inner.lineage.published().async_error()
    }

    /// The per-peer ledger and the first failure.
    pub fn health(&self) -> Health {
        let e = &self.inner.epoch;
        Health {
            rank: e.rank.get(),
            epoch: e.epoch.get(),
            world: e.world,
            peers: (self.inner.lineage.published().health().iter())
                .map(PeerHealth::from)
                .collect(),
            async_error: self.async_error(),
            heartbeat_lateness: self.inner.lineage.published().heartbeat_lateness(),
        }
    }

    /// The flight recorder's newest `max` operations.
    pub fn recent_ops(&self, max: usize) -> Vec<RecentOp> {
        let records = self.inner.epoch.recorder.records(max, Instant::now());
        records.iter().map(RecentOp::from).collect()
    }

    // -----------------------------------------------------------------------------------
    // Collectives

    /// Runs one operation on raw bytes (any `DType`, fp8 included).
    ///
    /// The operation is submitted when this is called, not when the future is first polled:
    /// it takes its place in the communicator's sequence at once, as an NCCL call does, so
    /// futures made in one order may be awaited in another. Drop it unfinished, polled or
    /// not, and the communicator is poisoned, as after any operation that did not end (its
    /// peers may be inside it). Built eagerly, the engine's future is the one this returns,
    /// not a field of another future: an `async fn` here would move those few kilobytes
    /// into its own state on every call, a measurable share of a small operation.
    pub fn run<'a>(&'a self, op: Op<'a, [u8]>) -> impl Future<Output = Result<()>> + Send + 'a {
        match self.usable() {
            Err(e) => Either::Left(ready(Err(e))),
            Ok(()) => Either::Right(
                (self.inner.epoch.engine.run(op)).map(move |r| r.map_err(|e| self.op_failed(&e))),
            ),
        }
    }

    /// Runs several operations together and completes them together (NCCL's group calls),
    /// submitted when called, as [`Comm::run`].
    pub fn group<'a>(
        &'a self,
        ops: Vec<Op<'a, [u8]>>,
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        match self.usable() {
            Err(e) => Either::Left(ready(Err(e))),
            Ok(()) => Either::Right(
                (self.inner.epoch.engine.group(ops))
                    .map(move |r| r.map_err(|e| self.op_failed(&e))),
            ),
        }
    }

    /// Every rank ends with the reduction of every rank's `send`.
    pub async fn all_reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Reduction,
    ) -> Result<()> {
        let count = send.len();
        self.run(Op::AllReduce {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
            reduction: op,
        })
        .await
    }

    /// All-reduce with one buffer for input and output.
    pub async fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: Reduction,
    ) -> Result<()> {
        let count = buf.len();
        self.run(Op::AllReduce {
            buf: Buffer::in_place(bytes_mut(buf)),
            count,
            dtype: T::DTYPE,
            reduction: op,
        })
        .await
    }

    /// The root ends with the reduction of every rank's `send` in `recv` (other ranks'
    /// `recv` is not touched and may be empty).
    pub async fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Reduction,
        root: u32,
    ) -> Result<()> {
        let count = send.len();
        self.run(Op::Reduce {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
            reduction: op,
            root: Rank(root),
        })
        .await
    }

    /// Every rank ends with the root's `buf`.
    pub async fn broadcast<T: Element>(&self, buf: &mut [T], root: u32) -> Result<()> {
        let count = buf.len();
        self.run(Op::Broadcast {
            buf: Buffer::in_place(bytes_mut(buf)),
            count,
            dtype: T::DTYPE,
            root: Rank(root),
        })
        .await
    }

    /// Every rank's `send` lands at `rank * send.len()` of every rank's `recv`.
    pub async fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = send.len();
        self.run(Op::AllGather {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
        })
        .await
    }

    /// Rank `i` ends with the reduction of block `i` of every rank's `send`
    /// (`send.len() == world * recv.len()`).
    pub async fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Reduction,
    ) -> Result<()> {
        let count = recv.len();
        self.run(Op::ReduceScatter {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
            reduction: op,
        })
        .await
    }

    /// Block `j` of rank `i`'s `send` lands in block `i` of rank `j`'s `recv`.
    pub async fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = send.len() / self.size().max(1) as usize;
        self.run(Op::AllToAll {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
        })
        .await
    }

    /// The root's `recv` ends with every rank's `send` in rank order.
    pub async fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<()> {
        let count = send.len();
        self.run(Op::Gather {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
            root: Rank(root),
        })
        .await
    }

    /// Rank `i` receives block `i` of the root's `send` in `recv`.
    pub async fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<()> {
        let count = recv.len();
        self.run(Op::Scatter {
            buf: Buffer::separate(bytes(send), bytes_mut(recv)),
            count,
            dtype: T::DTYPE,
            root: Rank(root),
        })
        .await
    }

    /// Sends `buf` to `peer`, which calls [`Comm::recv`].
    pub async fn send<T: Element>(&self, buf: &[T], peer: u32) -> Result<()> {
        self.run(Op::Send {
            buf: bytes(buf),
            count: buf.len(),
            dtype: T::DTYPE,
            peer: Rank(peer),
        })
        .await
    }

    /// Receives `buf.len()` elements from `peer`.
    pub async fn recv<T: Element>(&self, buf: &mut [T], peer: u32) -> Result<()> {
        let count = buf.len();
        self.run(Op::Recv {
            buf: bytes_mut(buf),
            count,
            dtype: T::DTYPE,
            peer: Rank(peer),
        })
        .await
    }

    /// Returns once every member has entered the barrier.
    pub async fn barrier(&self) -> Result<()> {
        self.run(Op::Barrier).await
    }

    fn usable(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(self.stamp(Error::new(
                ErrorKind::Destroyed,
                "the communicator was destroyed or aborted",
            )));
        }
        Ok(())
    }

    fn stamp(&self, e: Error) -> Error {
        let s = &self.inner.epoch;
        e.at(s.comm, s.epoch, s.rank)
    }

    /// A failed operation: its data-link evidence goes to the lineage
    /// ([`Comm::report_link_failure`]), and the caller gets the public error.
    fn op_failed(&self, e: &OpError) -> Error {
        self.report_link_failure(e);
        self.public_error(e)
    }

    /// Tells the lineage what the failed operation saw on a data link: a link lost without
    /// a departure is evidence for the control plane (conclusive: the peer's sockets
    /// closed), and a departure on it may strand the other members (see
    /// `lineage::policy::Policy::data_departed`).
    fn report_link_failure(&self, e: &OpError) {
        let root = e.root_cause();
        let epoch = self.inner.epoch.epoch;
        match (&root.kind, root.peer) {
            (OpErrorKind::Link(LinkError::ConnectionLost { .. }), Some(peer)) => {
                self.inner
                    .lineage
                    .tell(LineageMsg::DataLost { peer, epoch });
            }
            (OpErrorKind::Link(LinkError::PeerDeparted { code, .. }), Some(peer)) => {
                self.inner.lineage.tell(LineageMsg::DataDeparted {
                    peer,
                    epoch,
                    code: *code,
                });
            }
            _ => {}
        }
    }

    /// The public error for a failed operation, recorded as the communicator's first
    /// failure if it is one.
    fn public_error(&self, e: &OpError) -> Error {
        let root = e.root_cause();
        let mut err = from_op(e);
        // This member cancels a link only after recording why on the epoch's context (a
        // peer declared dead, an abort, destroy); an operation that happened to wake on the
        // cancelled link first reports that reason, not the cancel's code.
        if let OpErrorKind::Link(LinkError::Cancelled(_)) = &root.kind
            && let Some(reason) = self.inner.epoch.hooks.ctx.reason()
        {
            let why = from_abort(&reason);
            err.kind = why.kind;
            err.detail = why.detail;
            err.peer = why.peer.or(err.peer);
            err.evidence = why.evidence;
        }
        // A revoke that overtook a departure's own news (it is what revokes an epoch under
        // running operations, see `lineage::policy::Policy::data_departed`) names the departure
        // once this member's link to the leaver carries it.
        if err.kind == ErrorKind::Revoked
            && let Some(peer) = self.departed_on_links(err.waiting_on.map(Rank))
        {
            err.kind = ErrorKind::PeerDeparted;
            err.detail = format!("peer {peer} left the communicator ({})", err.detail);
            err.peer = Some(peer.get());
            err.evidence = Some(chorus_protocol::message::Evidence::Departed {
                code: CloseCode::NORMAL,
            });
        }
        let err = self.stamp(err);
        if !matches!(err.kind, ErrorKind::InvalidArgument) {
            self.inner.lineage.published().record_error(err.clone());
        }
        err
    }

    /// A member whose data link at this epoch carries a graceful departure: `first` if it
    /// does, else the lowest such rank.
    fn departed_on_links(&self, first: Option<Rank>) -> Option<Rank> {
        let departed = |l: &DataLink| {
            matches!(
                l.failure(),
                Some(LinkError::PeerDeparted { code, .. }) if code.is_graceful()
            )
        };
        let links = &self.inner.epoch.hooks.links;
        first
            .filter(|p| links.iter().any(|l| l.peer() == *p && departed(l)))
            .or_else(|| links.iter().filter(|l| departed(l)).map(|l| l.peer()).min())
    }
}
