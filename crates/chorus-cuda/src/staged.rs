//! `StagedLink`: device payloads over a host link (tcp, quic, shm), for peers on another
//! GPU or another host.
//!
//! A send cuts the payload into parts ([`crate::staging`]); each part is copied from device
//! memory into a pinned host slot on the link's copy stream, and handed to the host link as
//! soon as its copy completes, while the copies of the next parts run. A receive takes the
//! parts from the host link, puts each into a pinned slot and queues its copy up to a
//! device payload on the link's upload stream; the engine's reduction of that payload then
//! runs as a kernel on the device's main stream, after the payload's `ready` event.
//!
//! Nothing here waits on a peer on the device: the only device waits are the engine's own
//! (copies and kernels that always finish), so an abort needs no retirement here. Host-side
//! waits for a copy are polled, bounded by [`StagedConfig::copy_timeout`] and ended by the
//! host link's failure (an abort cancels it). A future dropped mid-way (an aborted
//! operation) frees device memory in stream order behind its copies, and a pinned slot is
//! reused only once its last copy is complete.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::{CloseCode, Rank};
use cudarc::driver::{CudaEvent, CudaStream, result};
use parking_lot::Mutex;

use crate::device::{Attached, CudaDevice};
use crate::error::CudaError;
use crate::mapped::MappedHost;
use crate::payload::GpuPayload;
use crate::staging::{
    HEADER_BYTES, Header, Parts, RecvPipeline, RecvStep, SendPipeline, SendStep, StageError,
    StagePlan,
};
use crate::sync;

/// Part size, slots and bounds of a staged link.
#[derive(Clone, Debug)]
pub struct StagedConfig {
    /// Bytes per part: the unit of a device-to-host copy and of a host message.
    pub chunk_bytes: usize,
    /// Parts staged at once per operation (pinned slots of `chunk_bytes`).
    pub depth: u32,
    /// Bound on one copy between device and host.
    pub copy_timeout: Duration,
    /// Most bytes one payload may announce (a peer's header past it is a protocol violation).
    pub max_payload_bytes: u64,
}

impl Default for StagedConfig {
    fn default() -> Self {
        StagedConfig {
            chunk_bytes: 64 << 10,
            depth: 4,
            copy_timeout: Duration::from_secs(30),
            max_payload_bytes: 4 << 30,
        }
    }
}

/// One peer over a host link, carrying [`GpuPayload`]s. Implements the engine's [`Link`].
pub struct StagedLink {
    core: Arc<Core>,
}

/// Pinned slots a link keeps between operations (more are made while many operations run).
const POOLED: usize = 32;

struct Core {
    inner: Arc<dyn Link<Bytes>>,
    device: CudaDevice,
    /// Device-to-host copies of sends.
    down: Arc<CudaStream>,
    /// Host-to-device copies of receives.
    up: Arc<CudaStream>,
    plan: StagePlan,
    slots: Mutex<Vec<Slot>>,
    config: StagedConfig,
}

/// A pinned host buffer and the event after which nothing queued touches it any more.
struct Slot {
    mem: MappedHost,
    busy: Option<CudaEvent>,
}

impl StagedLink {
    /// Device payloads on `device` to the peer at the other end of `inner`.
    pub fn new(
        device: &CudaDevice,
        inner: Arc<dyn Link<Bytes>>,
        config: &StagedConfig,
    ) -> Result<StagedLink, CudaError> {
        let plan = StagePlan::new(config.chunk_bytes, config.depth)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let gpu = device.gpu();
        gpu.bind()?;
        let stream = || {
            gpu.ctx
                .new_stream()
                .map_err(|e| CudaError::driver("cuStreamCreate", e))
        };
        let link = StagedLink {
            core: Arc::new(Core {
                inner,
                device: device.clone(),
                down: stream()?,
                up: stream()?,
                plan,
                slots: Mutex::new(Vec::new()),
                config: config.clone(),
            }),
        };
        // The device's synchronisation drains this link's copy streams too.
        let weak = Arc::downgrade(&link.core);
        device.attach(weak);
        Ok(link)
    }

    /// Wait (at most `timeout`) until this link's copy streams have run what is queued.
    pub fn flush(&self, timeout: Duration) -> Result<(), CudaError> {
        let c = &self.core;
        sync::drain(&[&c.down, &c.up], timeout, "staged link copies")
    }
}

impl Link<GpuPayload> for StagedLink {
    fn peer(&self) -> Rank {
        self.core.inner.peer()
    }

    fn send(&self, tag: Tag, payload: GpuPayload) -> LinkFuture<'_, ()> {
        Box::pin(self.core.clone().send(tag, payload))
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, GpuPayload> {
        Box::pin(self.core.clone().recv(tag))
    }

    fn cancel(&self, reason: CancelReason) {
        self.core.inner.cancel(reason);
    }

    fn is_flushed(&self) -> bool {
        self.core.inner.is_flushed()
    }

    fn failure(&self) -> Option<LinkError> {
        self.core.inner.failure()
    }
}

impl Attached for Core {
    fn streams(&self) -> Vec<Arc<CudaStream>> {
        vec![self.down.clone(), self.up.clone()]
    }

    /// Never: a staged receive either delivers every byte or fails its operation, so no
    /// device work is left holding data an abort cut short.
    fn take_failure(&self) -> Option<(Rank, String)> {
        None
    }
}

impl Drop for StagedLink {
    fn drop(&mut self) {
        // Pinned slots may still be the target of a copy an aborted operation queued: free
        // them only once the copy streams are drained; keep them if that does not happen.
        if let Err(e) = self.flush(self.core.config.copy_timeout.min(Duration::from_secs(2))) {
            tracing::warn!(error = %e, peer = %self.core.inner.peer(),
                "staged link copies did not drain; leaking its pinned slots");
            std::mem::forget(std::mem::take(&mut *self.core.slots.lock()));
        }
    }
}

/// Device memory handed to a send, freed in order on the copy stream (behind every copy
/// queued from it) however the send ends.
struct SentMemory<'a> {
    ptr: u64,
    stream: &'a CudaStream,
}

impl Drop for SentMemory<'_> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: allocated by cuMemAllocAsync and handed over by `GpuPayload::take`;
            // freed once, behind every copy from it on this stream.
            if let Err(e) = unsafe { result::free_async(self.ptr, self.stream.cu_stream()) } {
                tracing::warn!(error = ?e, "freeing a staged payload failed; leaking it");
            }
        }
    }
}

/// A receive's device payload until it is complete: dropped early (an aborted operation),
/// its memory is freed only behind the upload copies already queued into it.
struct Receiving<'a> {
    payload: Option<GpuPayload>,
    up: &'a CudaStream,
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        if let Some(mut p) = self.payload.take() {
            match sync::mark(self.up) {
                Ok(ev) => {
                    p.ready = Some(ev);
                    drop(p);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot order a dropped receive; leaking it");
                    std::mem::forget(p);
                }
            }
        }
    }
}

impl Core {
    async fn send(self: Arc<Self>, tag: Tag, payload: GpuPayload) -> Result<(), LinkError> {
        if let Some(e) = self.inner.failure() {
            return Err(e);
        }
        let parts = Parts::new(tag).map_err(|e| self.local(&e.to_string()))?;
        let mut pipe =
            SendPipeline::new(&self.plan, payload.len()).map_err(|e| self.local(&e.to_string()))?;
        let (ptr, _len, ready, _origin) = payload.take();
        let memory = SentMemory {
            ptr,
            stream: &self.down,
        };
        if let Some(ev) = &ready {
            self.device.gpu().bind().map_err(|e| self.local_cuda(&e))?;
            self.down
                .wait(ev)
                .map_err(|e| self.local_cuda(&CudaError::driver("cuStreamWaitEvent", e)))?;
        }
        let header = pipe.header();
        let slot_bytes = (header.chunk as u64).min(header.total) as usize;
        let mut slots = self.take_slots(self.plan.depth(), slot_bytes)?;
        let result = self
            .run_send(&mut pipe, &parts, memory.ptr, &mut slots)
            .await;
        self.put_slots(slots, &self.down);
        drop(memory);
        result
    }

    async fn run_send(
        &self,
        pipe: &mut SendPipeline,
        parts: &Parts,
        src: u64,
        slots: &mut [Slot],
    ) -> Result<(), LinkError> {
        let header = pipe.header();
        loop {
            let step = pipe.next();
            match &step {
                SendStep::Copy { slot, range, .. } => {
                    let slot =
                        slot_mut(slots, *slot).ok_or_else(|| self.local("no staging slot"))?;
                    if !range.is_empty() {
                        let host = &mut slot.mem.as_mut_slice()[..range.len()];
                        // SAFETY: `src` holds the payload (checked by the engine's pack),
                        // alive until `SentMemory` frees it behind this copy; `host` is a
                        // pinned slot nobody else uses until its `busy` event completes.
                        unsafe {
                            result::memcpy_dtoh_async(
                                host,
                                src + range.start as u64,
                                self.down.cu_stream(),
                            )
                        }
                        .map_err(|e| self.local_cuda(&CudaError::driver("cuMemcpyDtoHAsync", e)))?;
                    }
                    slot.busy = Some(sync::mark(&self.down).map_err(|e| self.local_cuda(&e))?);
                }
                SendStep::AwaitCopy { part } => {
                    let slot = slot_mut(slots, *part % self.plan.depth())
                        .ok_or_else(|| self.local("no staging slot"))?;
                    if let Some(ev) = &slot.busy {
                        self.completion(ev, "a device-to-host copy").await?;
                    }
                }
                SendStep::Send { part, slot, range } => {
                    let slot =
                        slot_mut(slots, *slot).ok_or_else(|| self.local("no staging slot"))?;
                    let data = &slot.mem.as_slice()[..range.len()];
                    let bytes = if *part == 0 {
                        let mut b = BytesMut::with_capacity(HEADER_BYTES + data.len());
                        b.extend_from_slice(&header.encode());
                        b.extend_from_slice(data);
                        b.freeze()
                    } else {
                        Bytes::copy_from_slice(data)
                    };
                    self.inner.send(parts.tag(*part), bytes).await?;
                }
                SendStep::Done => return Ok(()),
            }
            pipe.done(&step);
        }
    }

    async fn recv(self: Arc<Self>, tag: Tag) -> Result<GpuPayload, LinkError> {
        let parts = Parts::new(tag).map_err(|e| self.local(&e.to_string()))?;
        let mut pipe = RecvPipeline::new(&self.plan);
        // Taken once part 0 says how large the parts are.
        let mut slots = Vec::new();
        let mut receiving = Receiving {
            payload: None,
            up: &self.up,
        };
        let result = self
            .run_recv(&mut pipe, &parts, &mut receiving, &mut slots)
            .await;
        self.put_slots(slots, &self.up);
        let mut payload = result.and_then(|()| {
            receiving
                .payload
                .take()
                .ok_or_else(|| self.local("a receive ended without its payload"))
        })?;
        payload.ready = Some(sync::mark(&self.up).map_err(|e| self.local_cuda(&e))?);
        Ok(payload)
    }

    async fn run_recv(
        &self,
        pipe: &mut RecvPipeline,
        parts: &Parts,
        receiving: &mut Receiving<'_>,
        slots: &mut Vec<Slot>,
    ) -> Result<(), LinkError> {
        let mut held: Option<Bytes> = None;
        loop {
            let step = pipe.next();
            match &step {
                RecvStep::Recv { part } => {
                    let mut bytes = self.inner.recv(parts.tag(*part)).await?;
                    if *part == 0 {
                        let header = Header::decode(&bytes, self.config.max_payload_bytes)
                            .and_then(|h| pipe.opened(h).map(|()| h))
                            .map_err(|e| self.violation(&e))?;
                        let _ = bytes.split_to(HEADER_BYTES);
                        receiving.payload = Some(self.allocate(header.total as usize)?);
                        // No larger than a part the peer can send (its bytes are checked
                        // against the header before any is staged).
                        let slot_bytes = (header.chunk as u64).min(header.total) as usize;
                        *slots = self.take_slots(self.plan.depth(), slot_bytes)?;
                    }
                    pipe.check_len(*part, bytes.len())
                        .map_err(|e| self.violation(&e))?;
                    held = Some(bytes);
                }
                RecvStep::AwaitSlot { part } => {
                    let slot = slot_mut(slots, *part % self.plan.depth())
                        .ok_or_else(|| self.local("no staging slot"))?;
                    if let Some(ev) = &slot.busy {
                        self.completion(ev, "a host-to-device copy").await?;
                    }
                }
                RecvStep::Stage { slot, range, .. } => {
                    let bytes = held.take().unwrap_or_default();
                    let slot =
                        slot_mut(slots, *slot).ok_or_else(|| self.local("no staging slot"))?;
                    let dst = receiving.payload.as_ref().map_or(0, |p| p.ptr);
                    if !range.is_empty() && dst != 0 {
                        let host = &mut slot.mem.as_mut_slice()[..range.len()];
                        host.copy_from_slice(&bytes);
                        // SAFETY: `dst` is the payload's allocation of `header.total` bytes
                        // (ordered before this stream by `allocate`), freed only behind this
                        // stream's copies (`Receiving`); `host` is this slot's pinned memory,
                        // untouched by the host until its `busy` event completes.
                        unsafe {
                            result::memcpy_htod_async(
                                dst + range.start as u64,
                                &*host,
                                self.up.cu_stream(),
                            )
                        }
                        .map_err(|e| self.local_cuda(&CudaError::driver("cuMemcpyHtoDAsync", e)))?;
                    }
                    slot.busy = Some(sync::mark(&self.up).map_err(|e| self.local_cuda(&e))?);
                }
                RecvStep::Done => return Ok(()),
            }
            pipe.done(&step);
        }
    }

    /// A device payload of `len` bytes, allocated in order on the upload stream (so the
    /// copies into it wait for nothing the main stream queued) and freed, as every payload
    /// is, on the main stream behind its `ready` event and the engine's reads of it.
    fn allocate(&self, len: usize) -> Result<GpuPayload, LinkError> {
        let inner = &self.device.inner;
        let ptr = if len == 0 {
            0
        } else {
            self.device.gpu().bind().map_err(|e| self.local_cuda(&e))?;
            // SAFETY: a stream-ordered allocation on a live stream of this context; it is
            // freed once, by the payload's drop, on the main stream after `ready` (an event
            // on this stream recorded after every use here).
            unsafe { result::malloc_async(self.up.cu_stream(), len) }.map_err(|e| {
                self.local_cuda(&CudaError::OutOfMemory {
                    bytes: len,
                    detail: format!("cuMemAllocAsync: {e:?}"),
                })
            })?
        };
        Ok(GpuPayload {
            ptr,
            len,
            ready: None,
            alloc: inner.alloc.clone(),
            origin: None,
        })
    }

    /// `n` pinned slots of at least `bytes` for one operation: free ones from the pool
    /// whose last copy is done, new ones for the rest.
    fn take_slots(&self, n: u32, bytes: usize) -> Result<Vec<Slot>, LinkError> {
        let mut out = Vec::with_capacity(n as usize);
        {
            let mut pool = self.slots.lock();
            let mut i = 0;
            while i < pool.len() && out.len() < n as usize {
                let idle = match &pool[i].busy {
                    None => true,
                    Some(ev) => ev.try_is_complete().unwrap_or(false),
                };
                if idle && pool[i].mem.as_slice().len() >= bytes {
                    let mut s = pool.swap_remove(i);
                    s.busy = None;
                    out.push(s);
                } else {
                    i += 1;
                }
            }
        }
        while out.len() < n as usize {
            let mem = MappedHost::new(self.device.gpu(), bytes).map_err(|e| self.local_cuda(&e))?;
            out.push(Slot { mem, busy: None });
        }
        Ok(out)
    }

    /// Back to the pool, each slot that held a copy behind everything queued on `stream`
    /// so far (the copies of an operation that ended early may still be running). Idle
    /// slots past [`POOLED`] are freed instead.
    fn put_slots(&self, slots: Vec<Slot>, stream: &CudaStream) {
        let mut back = Vec::with_capacity(slots.len());
        for mut s in slots {
            if s.busy.is_some() {
                match sync::mark(stream) {
                    Ok(ev) => s.busy = Some(ev),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot order a staging slot; leaking it");
                        std::mem::forget(s);
                        continue;
                    }
                }
            }
            back.push(s);
        }
        let mut pool = self.slots.lock();
        pool.extend(back);
        let mut i = 0;
        while pool.len() > POOLED && i < pool.len() {
            let idle = match &pool[i].busy {
                None => true,
                Some(ev) => ev.try_is_complete().unwrap_or(false),
            };
            if idle {
                drop(pool.swap_remove(i));
            } else {
                i += 1;
            }
        }
    }

    /// Resolves once `event` completed; fails at the copy timeout, or when the host link
    /// fails (an abort cancels it), so the wait is bounded and ends with the operation.
    fn completion<'a>(
        &'a self,
        event: &'a CudaEvent,
        what: &'a str,
    ) -> impl Future<Output = Result<(), LinkError>> + Send + 'a {
        let deadline = Instant::now() + self.config.copy_timeout;
        poll_fn(move |cx| match event.try_is_complete() {
            Ok(true) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(self.local_cuda(&CudaError::driver("cuEventQuery", e)))),
            Ok(false) => {
                if let Some(e) = self.inner.failure() {
                    return Poll::Ready(Err(e));
                }
                if Instant::now() >= deadline {
                    return Poll::Ready(Err(self.local(&format!(
                        "{what} did not finish within {:?}",
                        self.config.copy_timeout
                    ))));
                }
                // Copies take microseconds: poll again at the executor's next turn.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
    }

    /// A failure on this side: the host link is cancelled with it (the peer sees this
    /// member leave it, not die), and the operation fails with the cancel.
    fn local(&self, detail: &str) -> LinkError {
        let reason = CancelReason::new(CloseCode::INTERNAL, format!("staging: {detail}"));
        self.inner.cancel(reason.clone());
        LinkError::Cancelled(reason)
    }

    fn local_cuda(&self, e: &CudaError) -> LinkError {
        self.local(&e.to_string())
    }

    /// The peer's parts break the staging rules: the host link is closed as a protocol
    /// violation.
    fn violation(&self, e: &StageError) -> LinkError {
        let detail = format!("staging: {e}");
        self.inner.cancel(CancelReason::new(
            CloseCode::PROTOCOL_VIOLATION,
            detail.clone(),
        ));
        LinkError::Protocol {
            code: CloseCode::PROTOCOL_VIOLATION,
            detail,
        }
    }
}

/// Slot `i` of an operation's slots (the schedule names only slots below its depth).
fn slot_mut(slots: &mut [Slot], i: u32) -> Option<&mut Slot> {
    slots.get_mut(i as usize)
}
