//! `Comm`: the communicator a framework embeds — what `ncclComm_t` is, with the failure
//! behaviour NCCL lacks.
//!
//! Every call is async (awaitable on any executor) and has a blocking twin on
//! [`Comm::blocking`]. Every wait is bounded: collectives by the operation timeout and by
//! failure detection, `init`/`shrink`/`grow` by their deadlines, `destroy` by the teardown
//! budget. A failure is an [`Error`] naming the peer, the evidence, the operation and the
//! step; it never looks like success (principle 5).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use bytes::Bytes;
use chorus_engine::context::AbortReason;
use chorus_engine::{
    Buffer, CancelReason, Context, Engine, EngineConfig, HostDevice, Link, LinkError, Op, OpError,
    OpErrorKind, Reduction,
};
use chorus_protocol::message::{Join, Message, PeerInfo, PeerStatus, Role, Welcome};
use chorus_protocol::{CloseCode, Collective, CommId, Envelope, Epoch, Rank};
use chorus_transport::Fingerprint;
use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::element::{Element, bytes, bytes_mut};
use crate::error::{Error, ErrorKind, Result, from_abort, from_op};
use crate::launch::{self, RootSpec, SecretSource};
use crate::recorder::Recorder;
use crate::runtime::lineage::{self, Driver, EpochHooks, LineageMsg, NextEpoch, Request, Shared};
use crate::runtime::registry::DataLink;
use crate::runtime::root::RootHost;
use crate::runtime::{Session, links, millis, socket_addr, tokio_instant};
use crate::signal;
use crate::unique_id::{UniqueId, derived_comm};

type HostEngine = Engine<HostDevice, dyn Link<Bytes>>;

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
    _signal: Mutex<Option<signal::Registration>>,
}

/// One epoch's data plane.
struct EpochState {
    comm: CommId,
    epoch: Epoch,
    rank: Rank,
    world: u32,
    members: Vec<PeerInfo>,
    hooks: Arc<EpochHooks>,
    engine: HostEngine,
    recorder: Arc<Recorder>,
}

/// The lineage's driver handle; stops the driver when the last communicator using it goes.
struct LineageHandle {
    handle: lineage::Handle,
}

impl Drop for LineageHandle {
    fn drop(&mut self) {
        let (reply, _) = oneshot::channel();
        let _ = self.handle.request(Request::Depart {
            code: CloseCode::NORMAL,
            detail: "communicator dropped".into(),
            reply,
        });
    }
}

/// The health of a communicator, as `ncclCommGetAsyncError` and a ledger would tell it.
#[derive(Clone, Debug)]
pub struct Health {
    pub rank: Rank,
    pub epoch: Epoch,
    pub world: u32,
    /// This member's view of every member: state, last heard, evidence.
    pub peers: Vec<PeerStatus>,
    /// The first failure recorded on this communicator, if any.
    pub async_error: Option<Error>,
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
        Self::init_hosting(id, rank, world, config, None).await
    }

    /// `init` from the launch environment (`CHORUS_*`, torchrun, Slurm, Open MPI; see
    /// [`crate::launch`]), with `config`. Without a token, rank 0 hosts the bootstrap root
    /// at the named address.
    pub async fn from_env(config: Config) -> Result<Comm> {
        let launch = launch::detect().map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
        match launch.root {
            RootSpec::Token(id) => {
                Self::init_hosting(&id, launch.rank.get(), launch.world, config, None).await
            }
            RootSpec::Address {
                addr,
                bind,
                secret,
                secret_from,
                ..
            } => {
                if secret_from == SecretSource::DerivedInsecure {
                    tracing::warn!(
                        %bind,
                        "CHORUS_INSECURE_DERIVED_SECRET=1: the job secret is derived from the \
                         launch environment while the root is reachable beyond this host; \
                         anyone who can reach it can join the job"
                    );
                }
                let comm = derived_comm(&secret);
                let root = if launch.rank == Rank(0) {
                    let root = RootHost::start_with(
                        bind,
                        launch.world,
                        &config,
                        secret.clone(),
                        comm,
                        false,
                    )
                    .await
                    .map_err(|e| match e.kind() {
                        // The told address may not be this host's (a NAT, a service name).
                        ErrorKind::Transport => Error::new(
                            ErrorKind::Transport,
                            format!(
                                "root at {bind}: {e} (set CHORUS_ROOT_BIND to an address of \
                                 this host, or 0.0.0.0 for every interface)"
                            ),
                        ),
                        _ => e,
                    })?;
                    Some(root)
                } else {
                    None
                };
                let id = UniqueId {
                    comm,
                    root: addr,
                    fingerprint: Fingerprint::ANY.0,
                    secret,
                };
                Self::init_hosting(&id, launch.rank.get(), launch.world, config, root).await
            }
        }
    }

    async fn init_hosting(
        id: &UniqueId,
        rank: u32,
        world: u32,
        config: Config,
        root: Option<RootHost>,
    ) -> Result<Comm> {
        config
            .check()
            .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
        if world == 0 || rank >= world {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("rank {rank} outside a world of {world}"),
            ));
        }
        let started = Instant::now();
        let deadline = started + config.init_timeout;
        let rank = Rank(rank);
        let session = Session::start(config.clone(), id.secret.clone()).await?;
        let inbox = Inbox::serve(&session, id.comm, Epoch(0), rank);
        let welcome = {
            let (session, id) = (session.clone(), id.clone());
            session
                .clone()
                .run(bootstrap(session, id, rank, world, deadline))
                .await??
        };
        let life = Context::root();
        let (lineage, epoch) =
            start_lineage(&session, welcome, rank, inbox, &life, deadline).await?;
        tracing::info!(comm = %epoch.comm, rank = %rank, world, ms = millis(started.elapsed()), "communicator ready");
        let comm = Comm::from_parts(session, lineage, epoch, life, root);
        comm.install_signal_departure();
        Ok(comm)
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

    fn install_signal_departure(&self) {
        if !self.inner.session.config.depart_on_signal {
            return;
        }
        if let Err(e) = signal::install(self.inner.session.config.teardown_budget) {
            tracing::warn!("departure on signals unavailable: {e}");
            return;
        }
        let departer: Arc<dyn signal::Departer> =
            Arc::new(SignalDeparter(Arc::downgrade(&self.inner)));
        let registration = signal::register(&departer);
        // The registry holds it weakly; keep it alive as long as this communicator.
        std::mem::forget(departer);
        if let Ok(mut slot) = self.inner._signal.lock() {
            *slot = Some(registration);
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
    pub fn epoch(&self) -> Epoch {
        self.inner.epoch.epoch
    }

    /// The communicator's id.
    pub fn id(&self) -> CommId {
        self.inner.epoch.comm
    }

    /// The peer table: every member's addresses, host and process.
    pub fn members(&self) -> &[PeerInfo] {
        &self.inner.epoch.members
    }

    /// The blocking twin of every call.
    pub fn blocking(&self) -> Blocking<'_> {
        Blocking(self)
    }

    /// The first failure recorded on this communicator (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        self.inner.lineage.handle.shared.async_error()
    }

    /// The per-peer ledger and the first failure.
    pub fn health(&self) -> Health {
        let e = &self.inner.epoch;
        Health {
            rank: e.rank,
            epoch: e.epoch,
            world: e.world,
            peers: self.inner.lineage.handle.shared.health(),
            async_error: self.async_error(),
        }
    }

    /// The flight recorder's newest `max` operations.
    pub fn recent_ops(&self, max: usize) -> Vec<chorus_protocol::message::OpRecord> {
        self.inner.epoch.recorder.records(max, Instant::now())
    }

    // -----------------------------------------------------------------------------------
    // Collectives

    /// Runs one operation on raw bytes (any `DType`, fp8 included).
    pub async fn run(&self, op: Op<'_, [u8]>) -> Result<()> {
        self.usable()?;
        let result = self.inner.epoch.engine.run(op).await;
        result.map_err(|e| self.op_error(&e))
    }

    /// Runs several operations together and completes them together (NCCL's group calls).
    pub async fn group(&self, ops: Vec<Op<'_, [u8]>>) -> Result<()> {
        self.usable()?;
        let result = self.inner.epoch.engine.group(ops).await;
        result.map_err(|e| self.op_error(&e))
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

    /// The public error for a failed operation; a data link lost without a departure is
    /// also evidence for the control plane (conclusive: the peer's sockets closed).
    fn op_error(&self, e: &OpError) -> Error {
        let root = e.root_cause();
        let epoch = self.inner.epoch.epoch;
        match (&root.kind, root.peer) {
            (OpErrorKind::Link(LinkError::ConnectionLost { .. }), Some(peer)) => {
                let _ = self
                    .inner
                    .lineage
                    .handle
                    .tx
                    .send(LineageMsg::DataLost { peer, epoch });
            }
            (OpErrorKind::Link(LinkError::PeerDeparted { code, .. }), Some(peer)) => {
                let _ = self.inner.lineage.handle.tx.send(LineageMsg::DataDeparted {
                    peer,
                    epoch,
                    code: *code,
                });
            }
            _ => {}
        }
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
        // running operations, see `lineage::Driver::on_data_departed`) names the departure
        // once this member's link to the leaver carries it.
        if err.kind == ErrorKind::Revoked
            && let Some(peer) = self.departed_on_links(err.waiting_on)
        {
            err.kind = ErrorKind::PeerDeparted;
            err.detail = format!("peer {peer} left the communicator ({})", err.detail);
            err.peer = Some(peer);
            err.evidence = Some(chorus_protocol::message::Evidence::Departed {
                code: CloseCode::NORMAL,
            });
        }
        let err = self.stamp(err);
        if !matches!(err.kind, ErrorKind::InvalidArgument) {
            self.inner.lineage.handle.shared.record_error(err.clone());
        }
        err
    }

    /// A member whose data link at this epoch carries a graceful departure: `first` if it
    /// does, else the lowest such rank.
    fn departed_on_links(&self, first: Option<Rank>) -> Option<Rank> {
        let departed = |l: &DataLink| {
            matches!(
                l.failure(),
                Some(LinkError::PeerDeparted {
                    code: CloseCode::NORMAL | CloseCode::LEFT,
                    ..
                })
            )
        };
        let links = &self.inner.epoch.hooks.links;
        first
            .filter(|p| links.iter().any(|l| l.peer() == *p && departed(l)))
            .or_else(|| links.iter().filter(|l| departed(l)).map(|l| l.peer()).min())
    }

    // -----------------------------------------------------------------------------------
    // Membership

    /// Aborts this communicator now: every operation in flight on it, and on every
    /// communicator split or shrunk from it, returns `Err(Aborted)`; the other members see
    /// this member depart (code `aborted`). Local, immediate, idempotent, one-way: it never
    /// waits on a peer.
    pub fn abort(&self, reason: &str) {
        self.inner.abort(reason);
    }

    /// Revokes the communicator on every member: their operations at this epoch fail with
    /// `Revoked` (even past failed ranks); shrink to continue.
    pub async fn revoke(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        if !self.inner.lineage.handle.request(Request::Revoke { reply }) {
            return Err(self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")));
        }
        rx.await
            .map_err(|_| self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")))
    }

    /// Survivors agree on who is gone and continue in a new communicator: ranks compacted
    /// in their old order, the next epoch, fresh links. Every survivor calls it.
    pub async fn shrink(&self) -> Result<Comm> {
        let (reply, rx) = oneshot::channel();
        let after = self.inner.epoch.epoch;
        self.agree(Request::Shrink { after, reply }, rx).await
    }

    /// Admits `joiners` new processes (which call [`Comm::join`] with
    /// [`Comm::grow_token`]) at the next epoch; every member calls it.
    pub async fn grow(&self, joiners: u32) -> Result<Comm> {
        let (reply, rx) = oneshot::channel();
        let after = self.inner.epoch.epoch;
        self.agree(
            Request::Grow {
                after,
                joiners,
                reply,
            },
            rx,
        )
        .await
    }

    async fn agree(
        &self,
        request: Request,
        rx: oneshot::Receiver<Result<NextEpoch>>,
    ) -> Result<Comm> {
        let started = Instant::now();
        if !self.inner.lineage.handle.request(request) {
            return Err(self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")));
        }
        let next = rx
            .await
            .map_err(|_| self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")))?
            .map_err(|e| self.stamp(e))?;
        let session = self.inner.session.clone();
        let deadline = Instant::now() + session.config.agree_timeout;
        let life = self.inner.life.child();
        let epoch = build_epoch(
            &session,
            &self.inner.lineage,
            &life,
            next.agreed.comm,
            next.agreed.epoch(),
            next.agreed.rank,
            next.table,
            deadline,
        )
        .await?;
        tracing::info!(epoch = %epoch.epoch, world = epoch.world, rank = %epoch.rank,
            ms = millis(started.elapsed()), "new epoch ready");
        Ok(Comm::from_parts(
            session,
            self.inner.lineage.clone(),
            epoch,
            life,
            None,
        ))
    }

    /// The token a new process passes to [`Comm::join`] to be admitted by [`Comm::grow`]:
    /// rank 0's control endpoint, its certificate, the job secret and this communicator.
    pub fn grow_token(&self) -> UniqueId {
        let e = &self.inner.epoch;
        let coordinator = &e.members[0];
        UniqueId {
            comm: e.comm,
            root: socket_addr(&coordinator.control),
            fingerprint: coordinator.fingerprint,
            secret: self.inner.session.secret.clone(),
        }
    }

    /// Joins a running communicator as a new member (the members call [`Comm::grow`]).
    pub async fn join(token: &UniqueId, config: Config) -> Result<Comm> {
        config
            .check()
            .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
        let started = Instant::now();
        let deadline = started + config.agree_timeout;
        let session = Session::start(config.clone(), token.secret.clone()).await?;
        let welcome = {
            let (s, t) = (session.clone(), token.clone());
            session.clone().run(ask_to_join(s, t, deadline)).await??
        };
        let fingerprint = session.identity.fingerprint().0;
        let me = welcome
            .members
            .iter()
            .find(|p| p.fingerprint == fingerprint && p.incarnation == session.incarnation)
            .map(|p| p.rank)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Bootstrap,
                    "the welcome does not list this process",
                )
            })?;
        let inbox = Inbox::serve(&session, welcome.comm, welcome.epoch, me);
        let life = Context::root();
        let (lineage, epoch) = start_lineage(&session, welcome, me, inbox, &life, deadline).await?;
        tracing::info!(rank = %me, ms = millis(started.elapsed()), "joined");
        let comm = Comm::from_parts(session, lineage, epoch, life, None);
        comm.install_signal_departure();
        Ok(comm)
    }

    /// Splits into sub-communicators: members with the same `color` form one, ranked by
    /// `key` (ties by old rank); `None` opts out. Aborting this communicator aborts the
    /// children too. Every member calls it.
    pub async fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Comm>> {
        let world = self.size() as usize;
        let mine = [color.map_or(u32::MAX, |c| c), key];
        let mut all = vec![0u32; 2 * world];
        self.all_gather(&mine, &mut all).await?;
        let Some(color) = color else { return Ok(None) };
        let mut group: Vec<(u32, u32)> = (0..world)
            .filter(|&r| all[2 * r] == color)
            .map(|r| (all[2 * r + 1], r as u32))
            .collect();
        group.sort();
        let old = &self.inner.epoch;
        let members: Vec<PeerInfo> = group
            .iter()
            .enumerate()
            .map(|(new, (_, oldr))| PeerInfo {
                rank: Rank(new as u32),
                ..old.members[*oldr as usize].clone()
            })
            .collect();
        let me = Rank(
            group
                .iter()
                .position(|(_, r)| *r == old.rank.get())
                .unwrap_or(0) as u32,
        );
        let comm = split_id(old.comm, old.epoch, self.next_split(), color);
        let welcome = Welcome {
            comm,
            epoch: Epoch(0),
            members,
        };
        let session = self.inner.session.clone();
        let inbox = Inbox::serve(&session, comm, Epoch(0), me);
        let life = self.inner.life.child();
        let deadline = Instant::now() + session.config.init_timeout;
        let (lineage, epoch) = start_lineage(&session, welcome, me, inbox, &life, deadline).await?;
        let child = Comm::from_parts(session, lineage, epoch, life, None);
        if let Ok(mut children) = self.inner.children.lock() {
            children.retain(|w| w.strong_count() > 0);
            children.push(Arc::downgrade(&child.inner));
        }
        Ok(Some(child))
    }

    fn next_split(&self) -> u64 {
        self.inner.epoch.engine.next_seq().get()
    }

    /// Leaves gracefully: departures to every peer, links closed at the connection level,
    /// the control thread stopped — all within the teardown budget, whatever the peers do
    /// (a frozen peer included; seed 002).
    pub async fn destroy(self) -> Result<()> {
        let budget = self.inner.session.config.teardown_budget;
        let started = Instant::now();
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            // Aborted before: the links are cancelled and the departures on their way;
            // what is left is to let them leave the process, with the session.
            let departing = self.inner.departing.lock().ok().and_then(|mut d| d.take());
            if let Some(rx) = departing {
                let deadline = tokio_instant(started + budget / 2);
                let _ = self
                    .inner
                    .session
                    .run(async move { tokio::time::timeout_at(deadline, rx).await })
                    .await;
            }
            self.shut_session(started, budget);
            return Ok(());
        }
        let deadline = started + budget;
        let links = self.inner.epoch.hooks.links.clone();
        // A peer may still be finishing the last operation with this member: it gets
        // everything this member's operations handed to the links before they close
        // (at most half the budget: a frozen peer takes nothing).
        {
            let links = links.clone();
            let until = started + budget / 2;
            let _ = self.inner.session.run(flush(links, until)).await;
        }
        // The data links depart first: a peer blocked on this member's data fails at once
        // on its link (which delivers the departure after the data), and a peer that sees
        // this process exit can read from its link that it left rather than died.
        for link in &links {
            link.cancel(CancelReason::new(
                CloseCode::NORMAL,
                "communicator destroyed",
            ));
        }
        // Only the lineage's newest communicator speaks for this member: destroying an
        // older one (after a shrink or grow) must not take the member out of the new one.
        let newest = self.inner.lineage.handle.shared.newest_epoch() <= self.inner.epoch.epoch;
        if newest {
            let (reply, rx) = oneshot::channel();
            let requested = self.inner.lineage.handle.request(Request::Depart {
                code: CloseCode::NORMAL,
                detail: "destroyed".into(),
                reply,
            });
            let depart = async move {
                if requested {
                    let _ = rx.await;
                }
            };
            // The wait for the departures is on the control thread's clock, so it is
            // bounded even on an executor without timers.
            let _ = self
                .inner
                .session
                .run(async move { tokio::time::timeout_at(tokio_instant(deadline), depart).await })
                .await;
        }
        self.inner.epoch.hooks.ctx.abort(AbortReason::Shutdown);
        self.shut_session(started, budget);
        tracing::debug!(ms = millis(started.elapsed()), newest, "destroyed");
        Ok(())
    }

    /// Stops the control thread if this was the last communicator on it, within what is
    /// left of `budget`.
    fn shut_session(&self, started: Instant, budget: std::time::Duration) {
        let left = budget.saturating_sub(started.elapsed());
        if self.inner.session.live() == 1 {
            self.inner.session.shutdown(left);
        }
    }
}

/// Waits until every link has flushed what it accepted, or `until` (polled: this runs
/// once per destroy, on the control thread).
async fn flush(links: Vec<DataLink>, until: Instant) {
    while Instant::now() < until && !links.iter().all(|l| l.is_flushed()) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let unflushed: Vec<Rank> = links
        .iter()
        .filter(|l| !l.is_flushed())
        .map(|l| l.peer())
        .collect();
    if !unflushed.is_empty() {
        tracing::debug!(?unflushed, "data links not flushed within the budget");
    }
}

impl Inner {
    fn abort(&self, reason: &str) {
        if self.life.abort(AbortReason::requested(reason.to_owned())) {
            tracing::warn!(comm = %self.epoch.comm, rank = %self.epoch.rank, reason, "communicator aborted");
        }
        self.closed.store(true, Ordering::Release);
        for link in &self.epoch.hooks.links {
            link.cancel(CancelReason::new(CloseCode::ABORTED, reason.to_owned()));
        }
        let (reply, rx) = oneshot::channel();
        if self.lineage.handle.request(Request::Depart {
            code: CloseCode::ABORTED,
            detail: reason.to_owned(),
            reply,
        }) && let Ok(mut slot) = self.departing.lock()
            && slot.is_none()
        {
            *slot = Some(rx);
        }
        let children: Vec<Arc<Inner>> = self
            .children
            .lock()
            .map(|c| c.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for child in children {
            child.abort(reason);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A communicator dropped without destroy still leaves with a message (principle 1).
        if !self.closed.swap(true, Ordering::AcqRel) {
            for link in &self.epoch.hooks.links {
                link.cancel(CancelReason::new(CloseCode::NORMAL, "communicator dropped"));
            }
        }
        self.session
            .registry
            .retire(self.epoch.comm, self.epoch.epoch);
        self.session.leave();
    }
}

/// Departs on a caught signal, through the communicator's driver.
struct SignalDeparter(Weak<Inner>);

impl signal::Departer for SignalDeparter {
    fn depart_now(&self, reason: &str, deadline: Instant) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let (reply, rx) = oneshot::channel();
        if inner.lineage.handle.request(Request::Depart {
            code: CloseCode::LEFT,
            detail: reason.to_owned(),
            reply,
        }) {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = async move {
                let _ = tokio::time::timeout(left, rx).await;
            };
            let _ = futures::executor::block_on(inner.session.run(wait));
        }
        for link in &inner.epoch.hooks.links {
            link.cancel(CancelReason::new(CloseCode::LEFT, reason.to_owned()));
        }
    }
}

/// A lineage driver's inbox, registered with the session's registry before anyone can know
/// the communicator: peers that get the peer table first connect at once, and must be
/// admitted and routed to it.
struct Inbox {
    tx: mpsc::UnboundedSender<LineageMsg>,
    rx: mpsc::UnboundedReceiver<LineageMsg>,
}

impl Inbox {
    fn serve(session: &Session, comm: CommId, epoch: Epoch, me: Rank) -> Inbox {
        let (tx, rx) = mpsc::unbounded_channel();
        session.registry.serve(comm, epoch, me, tx.clone());
        Inbox { tx, rx }
    }
}

/// Starts the control driver of `welcome`'s communicator as `me` and builds its first
/// epoch's data plane under `life`.
async fn start_lineage(
    session: &Arc<Session>,
    welcome: Welcome,
    me: Rank,
    inbox: Inbox,
    life: &Context,
    deadline: Instant,
) -> Result<(Arc<LineageHandle>, Arc<EpochState>)> {
    let Inbox { tx, rx } = inbox;
    let shared = Arc::new(Shared::default());
    let driver = Driver::new(
        session.clone(),
        &welcome,
        me,
        rx,
        tx.clone(),
        shared.clone(),
    )?;
    session.handle.spawn(driver.run());
    let lineage = Arc::new(LineageHandle {
        handle: lineage::Handle { tx, shared },
    });
    let epoch = build_epoch(
        session,
        &lineage,
        life,
        welcome.comm,
        welcome.epoch,
        me,
        welcome.members,
        deadline,
    )
    .await?;
    Ok((lineage, epoch))
}

/// Builds an epoch's data plane: links to every member, the engine, the hooks the driver
/// aborts on failures.
#[allow(clippy::too_many_arguments)]
async fn build_epoch(
    session: &Arc<Session>,
    lineage: &Arc<LineageHandle>,
    life: &Context,
    comm: CommId,
    epoch: Epoch,
    rank: Rank,
    members: Vec<PeerInfo>,
    deadline: Instant,
) -> Result<Arc<EpochState>> {
    let world = members.len() as u32;
    let ctx = life.child();
    let recorder = Arc::new(Recorder::new(session.config.recorder_ops));
    // Attached before the links are built: a member declared absent at this epoch (now or
    // while they are built) aborts the build at once, naming it, instead of leaving it to
    // wait for that member's links until the deadline.
    let building = Arc::new(EpochHooks {
        epoch,
        ctx: ctx.clone(),
        links: Vec::new(),
        recorder: recorder.clone(),
        building: true,
    });
    lineage
        .handle
        .request(Request::Attach(Arc::downgrade(&building)));
    let links: Vec<DataLink> = {
        let (s, m, aborted) = (session.clone(), members.clone(), ctx.aborted());
        session
            .run(async move {
                tokio::select! {
                    built = links::mesh(s, comm, epoch, rank, m, deadline) => built,
                    reason = aborted => Err(from_abort(&reason)),
                }
            })
            .await??
    };
    drop(building);
    let engine_config = engine_config(&session.config)?;
    let engine = Engine::new(
        rank,
        world,
        links.clone(),
        Arc::new(HostDevice),
        &ctx,
        engine_config,
    )
    .map_err(|e| Error::new(ErrorKind::Internal, format!("engine: {e}")))?
    .with_observer(recorder.clone());
    let hooks = Arc::new(EpochHooks {
        epoch,
        ctx,
        links,
        recorder: recorder.clone(),
        building: false,
    });
    lineage.handle.shared.built(epoch);
    lineage
        .handle
        .request(Request::Attach(Arc::downgrade(&hooks)));
    Ok(Arc::new(EpochState {
        comm,
        epoch,
        rank,
        world,
        members,
        hooks,
        engine,
        recorder,
    }))
}

/// The engine's configuration from the communicator's (algorithm overrides checked here).
fn engine_config(config: &Config) -> Result<EngineConfig> {
    let mut ec = EngineConfig::default();
    for (collective, name) in &config.algorithms.0 {
        let algo = chorus_engine::Algorithm::from_name(name).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("CHORUS_ALGO: '{name}' is not an algorithm for {collective}"),
            )
        })?;
        let slot = match collective {
            Collective::AllReduce => &mut ec.overrides.all_reduce,
            Collective::Reduce => &mut ec.overrides.reduce,
            Collective::Broadcast => &mut ec.overrides.broadcast,
            Collective::AllGather => &mut ec.overrides.all_gather,
            Collective::ReduceScatter => &mut ec.overrides.reduce_scatter,
            other => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("CHORUS_ALGO: {other} has a single algorithm"),
                ));
            }
        };
        *slot = Some(algo);
    }
    Ok(ec)
}

/// Joins the bootstrap root and returns the first epoch's peer table.
async fn bootstrap(
    session: Arc<Session>,
    id: UniqueId,
    rank: Rank,
    world: u32,
    deadline: Instant,
) -> Result<Welcome> {
    let route = Envelope::new(id.comm, Epoch(0), rank);
    let connect = session.quic.connect(
        id.root,
        Fingerprint(id.fingerprint),
        Role::Bootstrap,
        route,
        Rank::NONE,
    );
    let conn = match tokio::time::timeout_at(tokio_instant(deadline), connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Err(Error::new(
                ErrorKind::Bootstrap,
                format!("cannot reach the root at {}: {e}", id.root),
            ));
        }
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("the root at {} did not answer in time", id.root),
            ));
        }
    };
    let channel = conn.into_control();
    let join = Join {
        world,
        peer: session.peer_info(rank),
    };
    let exchange = async {
        channel
            .send(Message::Join(join))
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
        channel
            .recv()
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))
    };
    let frame = match tokio::time::timeout_at(tokio_instant(deadline), exchange).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                "not every rank joined before the init deadline",
            ));
        }
    };
    let welcome = match frame.message {
        Message::Welcome(w) => w,
        Message::Reject(r) => {
            return Err(Error::new(
                ErrorKind::Bootstrap,
                format!("the root refused: {} ({})", r.detail, r.code),
            ));
        }
        other => {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("the root answered with {}", other.kind()),
            ));
        }
    };
    let mine = welcome.members.get(rank.index());
    if welcome.comm != id.comm
        || welcome.members.len() != world as usize
        || mine.is_none_or(|p| p.fingerprint != session.identity.fingerprint().0)
    {
        return Err(Error::new(
            ErrorKind::Bootstrap,
            "the root's peer table does not match this join",
        ));
    }
    Ok(welcome)
}

/// Asks a running communicator's coordinator to admit this process; returns its welcome.
async fn ask_to_join(session: Arc<Session>, token: UniqueId, deadline: Instant) -> Result<Welcome> {
    let route = Envelope::new(token.comm, Epoch(0), Rank::NONE);
    let connect = session.quic.connect(
        token.root,
        Fingerprint(token.fingerprint),
        Role::Joiner,
        route,
        Rank(0),
    );
    let conn = match tokio::time::timeout_at(tokio_instant(deadline), connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Err(Error::new(
                ErrorKind::Bootstrap,
                format!("cannot reach {}: {e}", token.root),
            ));
        }
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                "the coordinator did not answer in time",
            ));
        }
    };
    let channel = conn.into_control();
    let join = Join {
        world: 0,
        peer: session.peer_info(Rank::NONE),
    };
    let exchange = async {
        channel
            .send(Message::Join(join))
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
        loop {
            let frame = channel
                .recv()
                .await
                .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
            match frame.message {
                Message::Welcome(w) => return Ok(w),
                Message::Reject(r) => {
                    return Err(Error::new(
                        ErrorKind::Bootstrap,
                        format!("refused: {} ({})", r.detail, r.code),
                    ));
                }
                _ => {}
            }
        }
    };
    match tokio::time::timeout_at(tokio_instant(deadline), exchange).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            "not admitted before the deadline (did the members call grow?)",
        )),
    }
}

/// A child communicator's id: every member derives the same from the parent, the epoch, the
/// split's sequence and the color.
fn split_id(parent: CommId, epoch: Epoch, seq: u64, color: u32) -> CommId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"chorus split\0")
        .chain_update(parent.get().to_le_bytes())
        .chain_update(epoch.get().to_le_bytes())
        .chain_update(seq.to_le_bytes())
        .chain_update(color.to_le_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    CommId(u64::from_le_bytes(id))
}

/// Resolves `host:port`; a name that does not resolve is a configuration error.
/// Blocking twins of [`Comm`]'s calls, for code without an executor.
#[derive(Debug, Clone, Copy)]
pub struct Blocking<'a>(&'a Comm);

impl Blocking<'_> {
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: Reduction) -> Result<()> {
        block_on(self.0.all_reduce(send, recv, op))
    }
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: Reduction) -> Result<()> {
        block_on(self.0.all_reduce_in_place(buf, op))
    }
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Reduction,
        root: u32,
    ) -> Result<()> {
        block_on(self.0.reduce(send, recv, op, root))
    }
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: u32) -> Result<()> {
        block_on(self.0.broadcast(buf, root))
    }
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        block_on(self.0.all_gather(send, recv))
    }
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: Reduction,
    ) -> Result<()> {
        block_on(self.0.reduce_scatter(send, recv, op))
    }
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        block_on(self.0.all_to_all(send, recv))
    }
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<()> {
        block_on(self.0.gather(send, recv, root))
    }
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<()> {
        block_on(self.0.scatter(send, recv, root))
    }
    pub fn send<T: Element>(&self, buf: &[T], peer: u32) -> Result<()> {
        block_on(self.0.send(buf, peer))
    }
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: u32) -> Result<()> {
        block_on(self.0.recv(buf, peer))
    }
    pub fn barrier(&self) -> Result<()> {
        block_on(self.0.barrier())
    }
    pub fn run(&self, op: Op<'_, [u8]>) -> Result<()> {
        block_on(self.0.run(op))
    }
    pub fn group(&self, ops: Vec<Op<'_, [u8]>>) -> Result<()> {
        block_on(self.0.group(ops))
    }
    pub fn revoke(&self) -> Result<()> {
        block_on(self.0.revoke())
    }
    pub fn shrink(&self) -> Result<Comm> {
        block_on(self.0.shrink())
    }
    pub fn grow(&self, joiners: u32) -> Result<Comm> {
        block_on(self.0.grow(joiners))
    }
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Comm>> {
        block_on(self.0.split(color, key))
    }
}

/// Blocking constructors and teardown (they own or consume the communicator).
impl Comm {
    pub fn init_blocking(id: &UniqueId, rank: u32, world: u32, config: Config) -> Result<Comm> {
        block_on(Comm::init(id, rank, world, config))
    }
    pub fn from_env_blocking(config: Config) -> Result<Comm> {
        block_on(Comm::from_env(config))
    }
    pub fn join_blocking(token: &UniqueId, config: Config) -> Result<Comm> {
        block_on(Comm::join(token, config))
    }
    pub fn destroy_blocking(self) -> Result<()> {
        block_on(self.destroy())
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}
