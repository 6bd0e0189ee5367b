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
//! drains as soon as the kernels already queued, copies and reductions, have run.

use std::sync::Arc;

use chorus_cuda::{
    CallerStream, CudaDevice, CudaError, GpuMem, GpuPayload, StagedConfig, StagedLink,
};
use chorus_engine::{Buffer, Engine, Link, Op, Reduction};
use chorus_protocol::{DType, Rank};

use super::Comm;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::epoch::engine_config;

/// The engine a device communicator runs its operations on.
type CudaEngine = Engine<CudaDevice, dyn Link<GpuPayload>>;

/// A communicator's collectives on CUDA device memory (see the module docs).
pub struct CudaComm {
    engine: CudaEngine,
    device: CudaDevice,
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

impl Comm {
    /// This communicator's members on CUDA device `ordinal` (every member calls it, each
    /// with its own device). Fails with [`ErrorKind::Device`] on every member if any member
    /// cannot open its device (no driver, no NVRTC, no such device): the members agree on
    /// that first, so none waits for one that gave up.
    pub async fn cuda(&self, ordinal: usize) -> Result<CudaComm> {
        let host = self.split(Some(0), self.rank()).await?.ok_or_else(|| {
            self.stamp(Error::new(
                ErrorKind::Internal,
                "a split with one color left this member out",
            ))
        })?;
        let opened = CudaDevice::new(ordinal);
        let mine = [u32::from(opened.is_ok())];
        let mut all = vec![0u32; host.size() as usize];
        host.all_gather(&mine, &mut all).await?;
        let device = opened.map_err(|e| host.device_error(ordinal, &e))?;
        if let Some(r) = all.iter().position(|&ok| ok == 0) {
            return Err(host.stamp(
                Error::new(
                    ErrorKind::Device,
                    format!("member {r} cannot open its CUDA device"),
                )
                .with_peer(Rank(r as u32)),
            ));
        }
        CudaComm::build(host, device, ordinal)
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
    fn build(host: Comm, device: CudaDevice, ordinal: usize) -> Result<CudaComm> {
        let e = &host.inner.epoch;
        let config = &host.inner.session.config;
        device.set_settle_timeout(config.op_timeout);
        let staged = StagedConfig::default();
        let mut links: Vec<Arc<dyn Link<GpuPayload>>> = Vec::with_capacity(e.hooks.links.len());
        for l in &e.hooks.links {
            let link = StagedLink::new(&device, l.clone(), &staged)
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
    }

    /// Survivors continue on a new epoch (as [`Comm::shrink`]), on the same devices.
    pub async fn shrink(&self) -> Result<CudaComm> {
        let host = self.host.shrink().await?;
        let ordinal = self.device.gpu().ordinal();
        CudaComm::build(host, self.device.clone(), ordinal)
    }

    /// Leaves gracefully (as [`Comm::destroy`]), after the device engine lets go of the links.
    pub async fn destroy(self) -> Result<()> {
        let CudaComm { engine, host, .. } = self;
        drop(engine);
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
        let recorded = self.device.complete_on(stream);
        result.map_err(|e| self.host.op_failed(&e))?;
        recorded.map_err(|e| self.host.device_error(self.device.gpu().ordinal(), &e))
    }
}
