//! `CudaComm`: a communicator's collectives on CUDA device memory, ordered on the caller's
//! stream as NCCL orders them (`ncclAllReduce(send, recv, count, dtype, op, comm, stream)`).
//!
//! [`Comm::cuda`] builds one from a host communicator: a split of it with the same members
//! (its own data links and sequence numbers, so host and device operations never share a
//! tag; its control plane, failure detection and abort tree under the parent's: aborting
//! the parent aborts it), and an engine on the GPU whose links stage device payloads through
//! pinned host memory over those data links (`chorus_cuda::StagedLink`).
//!
//! Each operation is ordered after the work already on the caller's stream by an event the
//! device's main stream waits on (no host wait, no device sync). The call returns when the
//! operation has completed on the device, with `Ok` or the named error, and the caller's
//! stream then waits on the main stream, so work the caller queues on it afterwards sees
//! the result. Nothing of the operation waits on a peer on the device (the staged links
//! wait on the host, bounded and ended by an abort), so after an abort the caller's stream
//! drains as soon as the kernels already queued, copies and reductions, have run. With
//! [`CudaOptions::device_links`], members on one GPU use `DeviceLink`s, whose kernels do
//! wait on the peer: a failed or aborted operation cancels them before it returns, which
//! retires those waits (the abort word), so the same holds.

use std::sync::Arc;
use std::time::Instant;

use chorus_cuda::{
    CallerStream, CudaDevice, CudaError, DeviceLink, GpuMem, GpuPayload, LinkConfig, StagedConfig,
    StagedLink,
};
use chorus_engine::{Buffer, CancelReason, Engine, Link, Op, Reduction};
use chorus_protocol::{CloseCode, DType, Rank};

use super::Comm;
use super::same_gpu::{CARD_WORDS, Card, Rendezvous, agreed, device_peers};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::epoch::engine_config;

/// The engine a device communicator runs its operations on.
type CudaEngine = Engine<CudaDevice, dyn Link<GpuPayload>>;

/// A communicator's collectives on CUDA device memory (see the module docs).
pub struct CudaComm {
    engine: CudaEngine,
    device: CudaDevice,
    /// The device links among `engine`'s links: the runtime cancels the host data links
    /// on failures, these are cancelled here (which retires their device waits).
    direct: Vec<Arc<DeviceLink>>,
    staged: StagedConfig,
    /// The split of the host communicator this one runs on; dropped last.
    host: Comm,
}

impl std::fmt::Debug for CudaComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaComm")
            .field("comm", &self.host)
            .field("device", &self.device)
            .finish()
    }
}

/// How [`Comm::cuda_with`] builds a device communicator. Every member passes the same.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// Join members on the same GPU by device links (`chorus_cuda::DeviceLink`: device
    /// memory slots, no host copies) instead of staging through pinned host memory. Off by
    /// default until device links keep slot credit on the host: their device-side waits
    /// for credit can block other streams when streams outnumber the hardware queues.
    pub device_links: bool,
    /// Part size, depth and bounds of the staged links.
    pub staged: StagedConfig,
    /// Slot geometry and deadlines of the device links.
    pub link: LinkConfig,
}

impl Comm {
    /// This communicator's members on CUDA device `ordinal` (every member calls it, each
    /// with its own device), with the default [`CudaOptions`]. Fails with
    /// [`ErrorKind::Device`] on every member if any member cannot open its device (no
    /// driver, no NVRTC, no such device): the members agree on that first, so none waits
    /// for one that gave up.
    pub async fn cuda(&self, ordinal: usize) -> Result<CudaComm> {
        self.cuda_with(ordinal, &CudaOptions::default()).await
    }

    /// [`Comm::cuda`] with `options` (the same on every member).
    pub async fn cuda_with(&self, ordinal: usize, options: &CudaOptions) -> Result<CudaComm> {
        let host = self.split(Some(0), self.rank()).await?.ok_or_else(|| {
            self.stamp(Error::new(
                ErrorKind::Internal,
                "a split with one color left this member out",
            ))
        })?;
        let opened = CudaDevice::new(ordinal);
        let rendezvous = match &opened {
            Ok(_) if options.device_links => {
                let nonce = rand::random::<u64>() | 1;
                match Rendezvous::bind(nonce) {
                    Ok(r) => Some((nonce, r)),
                    Err(e) => {
                        tracing::debug!(error = %e, "no device-link rendezvous socket; staging");
                        None
                    }
                }
            }
            _ => None,
        };
        let card = Card {
            ok: opened.is_ok(),
            uuid: opened.as_ref().map(|d| d.gpu().uuid()).unwrap_or_default(),
            nonce: rendezvous.as_ref().map_or(0, |(n, _)| *n),
        };
        let world = host.size() as usize;
        let mut all = vec![0u32; world * CARD_WORDS];
        host.all_gather(&card.encode(), &mut all).await?;
        let cards: Vec<Card> = all.chunks(CARD_WORDS).map(Card::decode).collect();
        let device = opened.map_err(|e| host.device_error(ordinal, &e))?;
        if let Some(r) = cards.iter().position(|c| !c.ok) {
            return Err(host.stamp(
                Error::new(
                    ErrorKind::Device,
                    format!("member {r} cannot open its CUDA device"),
                )
                .with_peer(Rank(r as u32)),
            ));
        }
        let direct = if options.device_links {
            let r = rendezvous.as_ref().map(|(_, r)| r);
            host.device_links(&device, r, &cards, &options.link).await?
        } else {
            Vec::new()
        };
        CudaComm::build(host, device, ordinal, direct, &options.staged)
    }

    /// Device links to the members on this member's GPU that both ends connected (agreed
    /// by an all-gather of who connected whom, so a pair either end could not connect
    /// stays staged on both). Bounded by the init timeout.
    async fn device_links(
        &self,
        device: &CudaDevice,
        rendezvous: Option<&Rendezvous>,
        cards: &[Card],
        config: &LinkConfig,
    ) -> Result<Vec<Arc<DeviceLink>>> {
        let (me, world) = (self.rank() as usize, self.size() as usize);
        let deadline = Instant::now() + self.inner.session.config.init_timeout;
        let peers: Vec<(usize, u64)> = device_peers(me, cards)
            .into_iter()
            .map(|p| (p, cards[p].nonce))
            .collect();
        let sockets = rendezvous.map_or_else(Vec::new, |r| r.pair(me, &peers, deadline));
        let links: Vec<(usize, DeviceLink)> = std::thread::scope(|s| {
            let handshakes: Vec<_> = sockets
                .into_iter()
                .map(|(p, socket)| {
                    let (me, peer) = (Rank(me as u32), Rank(p as u32));
                    s.spawn(move || (p, DeviceLink::connect(device, me, peer, socket, config)))
                })
                .collect();
            handshakes
                .into_iter()
                .filter_map(|h| h.join().ok())
                .filter_map(|(p, r)| match r {
                    Ok(link) => Some((p, link)),
                    Err(e) => {
                        tracing::debug!(peer = p, error = %e, "device link failed; staging");
                        None
                    }
                })
                .collect()
        });
        let mut row = vec![0u32; world];
        for (p, _) in &links {
            row[*p] = 1;
        }
        let mut table = vec![0u32; world * world];
        self.all_gather(&row, &mut table).await?;
        Ok(links
            .into_iter()
            .filter(|(p, _)| agreed(me, *p, world, &table))
            .map(|(_, l)| Arc::new(l))
            .collect())
    }

    /// The blocking twin of [`Comm::cuda`].
    pub fn cuda_blocking(&self, ordinal: usize) -> Result<CudaComm> {
        futures::executor::block_on(self.cuda(ordinal))
    }

    fn device_error(&self, ordinal: usize, e: &CudaError) -> Error {
        self.stamp(Error::new(
            ErrorKind::Device,
            format!("cuda:{ordinal}: {e}"),
        ))
    }
}

/// `Ok` if this process can use CUDA device `ordinal` (driver, NVRTC, the device, the
/// kernels compiled), else the [`ErrorKind::Device`] error saying what is missing. Opens
/// the device once per process, as [`Comm::cuda`] does.
pub fn probe(ordinal: usize) -> Result<()> {
    chorus_cuda::Gpu::open(ordinal)
        .map(|_| ())
        .map_err(|e| Error::new(ErrorKind::Device, format!("cuda:{ordinal}: {e}")))
}

impl CudaComm {
    fn build(
        host: Comm,
        device: CudaDevice,
        ordinal: usize,
        direct: Vec<Arc<DeviceLink>>,
        staged: &StagedConfig,
    ) -> Result<CudaComm> {
        let e = &host.inner.epoch;
        let config = &host.inner.session.config;
        device.set_settle_timeout(config.op_timeout);
        let mut links: Vec<Arc<dyn Link<GpuPayload>>> = Vec::with_capacity(e.hooks.links.len());
        for l in &e.hooks.links {
            if let Some(d) = direct.iter().find(|d| d.peer() == l.peer()) {
                links.push(d.clone());
                continue;
            }
            let link = StagedLink::new(&device, l.clone(), staged)
                .map_err(|err| host.device_error(ordinal, &err))?;
            links.push(Arc::new(link));
        }
        let engine = Engine::new(
            e.rank,
            e.world,
            links,
            Arc::new(device.clone()),
            &e.hooks.ctx,
            engine_config(config)?,
        )
        .map_err(|err| Error::new(ErrorKind::Internal, format!("engine: {err}")))?
        .with_observer(e.recorder.clone());
        Ok(CudaComm {
            engine,
            device,
            direct,
            staged: staged.clone(),
            host,
        })
    }

    /// The host communicator this one runs on (health, members, async error).
    pub fn comm(&self) -> &Comm {
        &self.host
    }

    /// This member's rank.
    pub fn rank(&self) -> u32 {
        self.host.rank()
    }

    /// The number of members.
    pub fn size(&self) -> u32 {
        self.host.size()
    }

    /// The device's name in errors and logs (`cuda:0`).
    pub fn device_name(&self) -> &str {
        chorus_engine::Device::name(&self.device)
    }

    /// Aborts this communicator now (as [`Comm::abort`]): the operation in flight ends with
    /// `Aborted` and the caller's stream drains once its queued copies have run.
    pub fn abort(&self, reason: &str) {
        self.host.abort(reason);
        self.cancel_direct(reason);
    }

    fn cancel_direct(&self, reason: &str) {
        for l in &self.direct {
            l.cancel(CancelReason::new(CloseCode::ABORTED, reason.to_owned()));
        }
    }

    /// Waits, at most `timeout`, until everything this member queued on the device (its
    /// main stream and its links' streams) has run: after an abort, the bound on how long
    /// the caller's stream can stay behind this communicator's work. Fails with
    /// [`ErrorKind::Timeout`] if work is still queued, [`ErrorKind::Aborted`] if a device
    /// link was cut short.
    pub fn synchronize(&self, timeout: std::time::Duration) -> Result<()> {
        self.device.synchronize(timeout).map_err(|e| {
            let kind = match e {
                CudaError::Timeout { .. } => ErrorKind::Timeout,
                CudaError::Aborted { .. } => ErrorKind::Aborted,
                _ => ErrorKind::Device,
            };
            self.host
                .stamp(Error::new(kind, format!("{}: {e}", self.device_name())))
        })
    }

    /// Survivors continue on a new epoch (as [`Comm::shrink`]), on the same devices.
    pub async fn shrink(&self) -> Result<CudaComm> {
        let host = self.host.shrink().await?;
        let ordinal = self.device.gpu().ordinal();
        // The survivors stage: device links would need a new rendezvous.
        CudaComm::build(host, self.device.clone(), ordinal, Vec::new(), &self.staged)
    }

    /// Leaves gracefully (as [`Comm::destroy`]), after the device engine lets go of the links.
    pub async fn destroy(self) -> Result<()> {
        let CudaComm {
            engine,
            direct,
            host,
            ..
        } = self;
        drop(engine);
        drop(direct);
        host.destroy().await
    }

    /// The blocking twin of [`CudaComm::destroy`].
    pub fn destroy_blocking(self) -> Result<()> {
        futures::executor::block_on(self.destroy())
    }

    /// Runs one operation on device memory, ordered after the work on `stream`, its
    /// completion recorded on `stream`.
    pub async fn run(&self, op: Op<'_, GpuMem>, stream: &CallerStream) -> Result<()> {
        self.host.usable()?;
        self.order_after(stream)?;
        let result = self.engine.run(op).await;
        self.finish(result, stream)
    }

    /// Runs several operations as one group (NCCL's group calls), ordered on `stream`.
    pub async fn group(&self, ops: Vec<Op<'_, GpuMem>>, stream: &CallerStream) -> Result<()> {
        self.host.usable()?;
        self.order_after(stream)?;
        let result = self.engine.group(ops).await;
        self.finish(result, stream)
    }

    /// Every rank ends with the reduction of every rank's `count` elements of `send`.
    pub async fn all_reduce(
        &self,
        buf: Buffer<'_, GpuMem>,
        count: usize,
        dtype: DType,
        reduction: Reduction,
        stream: &CallerStream,
    ) -> Result<()> {
        let op = Op::AllReduce {
            buf,
            count,
            dtype,
            reduction,
        };
        self.run(op, stream).await
    }

    /// Every rank ends with the root's `count` elements.
    pub async fn broadcast(
        &self,
        buf: &mut GpuMem,
        count: usize,
        dtype: DType,
        root: u32,
        stream: &CallerStream,
    ) -> Result<()> {
        let op = Op::Broadcast {
            buf: Buffer::InPlace(buf),
            count,
            dtype,
            root: Rank(root),
        };
        self.run(op, stream).await
    }

    /// Every rank's `count` elements land at `rank * count` of every rank's receive buffer.
    pub async fn all_gather(
        &self,
        buf: Buffer<'_, GpuMem>,
        count: usize,
        dtype: DType,
        stream: &CallerStream,
    ) -> Result<()> {
        let op = Op::AllGather { buf, count, dtype };
        self.run(op, stream).await
    }

    /// Rank `i` ends with the reduction of block `i` (`count` elements) of every rank's send.
    pub async fn reduce_scatter(
        &self,
        buf: Buffer<'_, GpuMem>,
        count: usize,
        dtype: DType,
        reduction: Reduction,
        stream: &CallerStream,
    ) -> Result<()> {
        let op = Op::ReduceScatter {
            buf,
            count,
            dtype,
            reduction,
        };
        self.run(op, stream).await
    }

    /// The blocking twin of [`CudaComm::run`].
    pub fn run_blocking(&self, op: Op<'_, GpuMem>, stream: &CallerStream) -> Result<()> {
        futures::executor::block_on(self.run(op, stream))
    }

    /// The blocking twin of [`CudaComm::group`].
    pub fn group_blocking(&self, ops: Vec<Op<'_, GpuMem>>, stream: &CallerStream) -> Result<()> {
        futures::executor::block_on(self.group(ops, stream))
    }

    fn order_after(&self, stream: &CallerStream) -> Result<()> {
        self.device
            .order_after(stream)
            .map_err(|e| self.host.device_error(self.device.gpu().ordinal(), &e))
    }

    /// The operation's outcome, after recording its completion on `stream` either way: after
    /// a failure the caller's later work must not run under writes the operation queued.
    fn finish(
        &self,
        result: std::result::Result<(), chorus_engine::OpError>,
        stream: &CallerStream,
    ) -> Result<()> {
        if let Err(e) = &result {
            // The engine is poisoned now; device waits on a peer must not outlive the
            // operation (an abort lands here within the engine's reaction time).
            self.cancel_direct(&format!("operation failed: {}", e.kind));
        }
        let recorded = self.device.complete_on(stream);
        result.map_err(|e| self.host.op_failed(&e))?;
        recorded.map_err(|e| self.host.device_error(self.device.gpu().ordinal(), &e))
    }
}
