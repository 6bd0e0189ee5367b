//! `CudaDevice`: the engine's `Device` on a GPU.
//!
//! One `CudaDevice` is one rank's view of a GPU: a main stream on which every operation is
//! queued in call order (copies and reductions are kernel launches; nothing here blocks the
//! host), plus the device links attached to it. Several ranks may share a GPU, each with its
//! own `CudaDevice`. The waits are [`Device::settle`] (the engine's, at the end of every
//! operation), [`CudaDevice::synchronize`] and the staging copies, and each is bounded:
//! completion is polled against a deadline (`sync.rs`), and the engine's settle also ends as
//! soon as the operation is aborted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chorus_engine::context::Context;
use chorus_engine::device::{Device, DeviceError};
use chorus_protocol::{DType, Rank, ReduceOp};
use cudarc::driver::CudaStream;
use parking_lot::Mutex;

use crate::allocator::StreamAllocator;
use crate::error::CudaError;
use crate::gpu::Gpu;
use crate::health::{LinkHealth, Reads};
use crate::mapped::MappedHost;
use crate::memory::{GpuBuffer, GpuMem};
use crate::payload::GpuPayload;
use crate::sync;

/// A rank's GPU device.
#[derive(Clone)]
pub struct CudaDevice {
    pub(crate) inner: Arc<DeviceInner>,
}

/// Something with streams of its own that queues work for a device (a device link).
pub(crate) trait Attached: Send + Sync {
    /// Its streams, to be drained by the device's synchronisation.
    fn streams(&self) -> Vec<Arc<CudaStream>>;
    /// `Some(peer)`, once, if it was aborted or lost its peer with device waits retired: some
    /// of the data it carried is not the peer's.
    fn take_failure(&self) -> Option<(Rank, String)>;
}

/// How long [`Device::settle`] waits for an operation's work unless told otherwise
/// ([`CudaDevice::set_settle_timeout`]). The operation's own deadline, through its context,
/// usually ends the wait first.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct DeviceInner {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) stream: Arc<CudaStream>,
    /// The main stream's allocator, shared with the buffers and payloads it allocates.
    pub(crate) alloc: Arc<StreamAllocator>,
    name: String,
    attached: Mutex<Vec<Weak<dyn Attached>>>,
    /// Payloads from device links read on the main stream since the last settle.
    read: Reads<LinkHealth>,
    settle_timeout_us: AtomicU64,
    syncs: AtomicU64,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.inner.name)
            .finish()
    }
}

impl CudaDevice {
    /// A new rank on GPU `ordinal`, with its own main stream. The GPU is opened (and the
    /// kernels compiled) on first use in the process; [`CudaError::DeviceUnavailable`] if
    /// there is no driver, NVRTC or such device.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Self::on(Gpu::open(ordinal)?)
    }

    /// A new rank on an opened GPU.
    pub fn on(gpu: Arc<Gpu>) -> Result<Self, CudaError> {
        gpu.bind()?;
        let stream = gpu.new_stream()?;
        let name = format!("cuda:{}", gpu.ordinal());
        let alloc = Arc::new(StreamAllocator::new(gpu.clone(), stream.clone()));
        Ok(CudaDevice {
            inner: Arc::new(DeviceInner {
                gpu,
                stream,
                alloc,
                name,
                attached: Mutex::new(Vec::new()),
                read: Reads::default(),
                settle_timeout_us: AtomicU64::new(DEFAULT_SETTLE_TIMEOUT.as_micros() as u64),
                syncs: AtomicU64::new(0),
            }),
        })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.inner.gpu
    }

    /// A zeroed buffer of `bytes` bytes (stream-ordered on the main stream).
    pub fn buffer(&self, bytes: usize) -> Result<GpuBuffer, CudaError> {
        GpuBuffer::zeroed(&self.inner.alloc, bytes)
    }

    /// Wait until everything queued so far on this rank's streams (main and attached links)
    /// has run, for at most `timeout`. Fails with [`CudaError::Timeout`] if the work is still
    /// queued (nothing is cancelled: abort the links to retire waits on a peer), or
    /// [`CudaError::Aborted`] if a link attached to this device was aborted or lost its peer
    /// and retired device waits, so data it carried is partial. Each such link is reported
    /// by one synchronisation: a cancelled link does not fail every later one.
    pub fn synchronize(&self, timeout: Duration) -> Result<(), CudaError> {
        let inner = &self.inner;
        let live = inner.live_attached();
        let mut events = vec![sync::mark(&inner.stream)?];
        for a in &live {
            for s in a.streams() {
                events.push(sync::mark(&s)?);
            }
        }
        sync::wait_all(
            &events,
            timeout,
            &format!("stream synchronize on {}", inner.name),
        )?;
        inner.syncs.fetch_add(1, Ordering::Relaxed);
        let failures: Vec<(Rank, String)> = live.iter().filter_map(|a| a.take_failure()).collect();
        if let Some((peer, detail)) = failures.into_iter().next() {
            return Err(CudaError::Aborted {
                what: format!("work on {} ({detail})", inner.name),
                peer,
            });
        }
        Ok(())
    }

    /// Bound the engine's wait for each operation's work ([`Device::settle`]); a settle that
    /// passes it fails the operation with a timeout naming the wait.
    pub fn set_settle_timeout(&self, timeout: Duration) {
        let us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        self.inner.settle_timeout_us.store(us, Ordering::Relaxed);
    }

    /// The bound of [`Device::settle`]'s wait.
    pub fn settle_timeout(&self) -> Duration {
        Duration::from_micros(self.inner.settle_timeout_us.load(Ordering::Relaxed))
    }

    /// Wait until the main stream has run everything queued on it so far, for at most the
    /// settle timeout and only while `abandon` says no; then check that no payload read on it
    /// outside an engine operation ([`Device::unpack`] called directly) since the last such
    /// settle held bytes an abort kept from arriving. After `Ok`, every buffer those reads
    /// wrote holds their result. The links' own streams may still be moving this rank's
    /// sends; they need not finish for this rank's buffers to be final.
    pub fn settle_unless(&self, abandon: &dyn Fn() -> bool) -> Result<(), CudaError> {
        self.settle_reads(&None, abandon)
    }

    /// The settle of operation `op` (`None`: reads made outside the engine): wait for the
    /// main stream, then judge `op`'s reads, and only its. A failed wait fails the operation,
    /// and its reads go with it: they are no later operation's to answer for.
    fn settle_reads(
        &self,
        op: &Option<Context>,
        abandon: &dyn Fn() -> bool,
    ) -> Result<(), CudaError> {
        let inner = &self.inner;
        // Taken before the mark: every payload noted here had its read queued before it.
        let read = inner.read.take(op);
        let done = sync::mark(&inner.stream)?;
        sync::wait_all_unless(
            std::slice::from_ref(&done),
            self.settle_timeout(),
            &format!("settling the operation's work on {}", inner.name),
            abandon,
        )?;
        inner.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some((link, _)) = read.iter().find(|(link, last)| link.spoiled(*last)) {
            return Err(CudaError::Aborted {
                what: format!("data received on {}", inner.name),
                peer: link.peer,
            });
        }
        Ok(())
    }

    /// Copy `data` into `dst[off..]` and wait (at most `timeout`) until it is there.
    pub fn upload(
        &self,
        dst: &mut GpuMem,
        off: usize,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), CudaError> {
        let at = dst.at(off, data.len()).map_err(invalid)?;
        if data.is_empty() {
            return Ok(());
        }
        let mut staging = MappedHost::new(&self.inner.gpu, data.len())?;
        staging.as_mut_slice()[..data.len()].copy_from_slice(data);
        self.inner.gpu.kernels.copy(
            &self.inner.stream,
            at,
            staging.device_ptr(0),
            data.len() as u64,
        )?;
        self.finish_staged(staging, timeout, "upload").map(|_| ())
    }

    /// Copy `src[off..off + len]` to the host, waiting at most `timeout`.
    pub fn download(
        &self,
        src: &GpuMem,
        off: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>, CudaError> {
        let at = src.at(off, len).map_err(invalid)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let staging = MappedHost::new(&self.inner.gpu, len)?;
        self.inner
            .gpu
            .kernels
            .copy(&self.inner.stream, staging.device_ptr(0), at, len as u64)?;
        let staging = self.finish_staged(staging, timeout, "download")?;
        Ok(staging.as_slice()[..len].to_vec())
    }

    /// Wait for the main stream; on timeout the staging memory may still be in use by the
    /// queued copy, so it is leaked rather than freed under it.
    fn finish_staged(
        &self,
        staging: MappedHost,
        timeout: Duration,
        what: &str,
    ) -> Result<MappedHost, CudaError> {
        match sync::drain(
            &[&self.inner.stream],
            timeout,
            &format!("{what} on {}", self.inner.name),
        ) {
            Ok(()) => Ok(staging),
            Err(e) => {
                std::mem::forget(staging);
                Err(e)
            }
        }
    }

    /// Completed synchronisations so far (for tests and benchmarks).
    pub fn synchronizations(&self) -> u64 {
        self.inner.syncs.load(Ordering::Relaxed)
    }

    /// The main stream, for timing with events (benchmarks).
    #[doc(hidden)]
    pub fn main_stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    pub(crate) fn attach(&self, a: Weak<dyn Attached>) {
        let mut v = self.inner.attached.lock();
        v.retain(|w| w.strong_count() > 0);
        v.push(a);
    }

    fn kernels(&self) -> &crate::kernels::Kernels {
        &self.inner.gpu.kernels
    }
}

impl DeviceInner {
    fn live_attached(&self) -> Vec<Arc<dyn Attached>> {
        let mut v = self.attached.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }
}

fn invalid(e: DeviceError) -> CudaError {
    CudaError::Invalid(e.to_string())
}

/// Check that a region is whole elements of `dtype`.
fn elements(off: &[usize], len: usize, dtype: DType) -> Result<u64, DeviceError> {
    let size = dtype.size();
    if !len.is_multiple_of(size) || off.iter().any(|o| !o.is_multiple_of(size)) {
        return Err(DeviceError::Misaligned { len, dtype });
    }
    Ok((len / size) as u64)
}

fn has_kernel(op: ReduceOp, dtype: DType) -> Result<(), DeviceError> {
    match op {
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max => Ok(()),
        ReduceOp::Avg | ReduceOp::PreMulSum => Err(DeviceError::Unsupported { op, dtype }),
    }
}

impl Device for CudaDevice {
    type Mem = GpuMem;
    type Owned = GpuBuffer;
    type Payload = GpuPayload;

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn len(&self, mem: &GpuMem) -> usize {
        mem.len()
    }

    fn alloc(&self, bytes: usize) -> Result<GpuBuffer, DeviceError> {
        Ok(self.buffer(bytes)?)
    }

    fn copy(
        &self,
        dst: &mut GpuMem,
        dst_off: usize,
        src: &GpuMem,
        src_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let d = dst.at(dst_off, len)?;
        let s = src.at(src_off, len)?;
        if d != s {
            self.kernels().copy(&self.inner.stream, d, s, len as u64)?;
        }
        Ok(())
    }

    fn copy_within(
        &self,
        mem: &mut GpuMem,
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let s = mem.at(src_off, len)?;
        let d = mem.at(dst_off, len)?;
        if s == d || len == 0 {
            return Ok(());
        }
        let k = self.kernels();
        if s.abs_diff(d) >= len as u64 {
            k.copy(&self.inner.stream, d, s, len as u64)?;
        } else {
            // Overlapping: a parallel copy would read bytes it already overwrote, so go
            // through a stream-ordered temporary.
            let tmp = self.inner.alloc.alloc(len)?;
            let r = k
                .copy(&self.inner.stream, tmp, s, len as u64)
                .and_then(|()| k.copy(&self.inner.stream, d, tmp, len as u64));
            self.inner.alloc.free(tmp, None);
            r?;
        }
        Ok(())
    }

    fn reduce(
        &self,
        dst: &mut GpuMem,
        dst_off: usize,
        src: &GpuMem,
        src_off: usize,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        has_kernel(op, dtype)?;
        let n = elements(&[dst_off, src_off], len, dtype)?;
        let d = dst.at(dst_off, len)?;
        let s = src.at(src_off, len)?;
        Ok(self
            .kernels()
            .reduce(&self.inner.stream, dtype, op, d, s, n)?)
    }

    fn scale(
        &self,
        mem: &mut GpuMem,
        off: usize,
        len: usize,
        dtype: DType,
        factor: f64,
    ) -> Result<(), DeviceError> {
        let n = elements(&[off], len, dtype)?;
        let m = mem.at(off, len)?;
        Ok(self
            .kernels()
            .scale(&self.inner.stream, dtype, m, n, factor)?)
    }

    fn divide(
        &self,
        mem: &mut GpuMem,
        off: usize,
        len: usize,
        dtype: DType,
        divisor: u32,
    ) -> Result<(), DeviceError> {
        let n = elements(&[off], len, dtype)?;
        let m = mem.at(off, len)?;
        Ok(self
            .kernels()
            .divide(&self.inner.stream, dtype, m, n, divisor)?)
    }

    fn pack(&self, src: &GpuMem, off: usize, len: usize) -> Result<GpuPayload, DeviceError> {
        let s = src.at(off, len)?;
        let ptr = self.inner.alloc.alloc(len)?;
        let mut payload = GpuPayload {
            ptr,
            len,
            ready: None,
            alloc: self.inner.alloc.clone(),
            origin: None,
        };
        if len > 0 {
            self.kernels()
                .copy(&self.inner.stream, ptr, s, len as u64)?;
            payload.ready = Some(sync::mark(&self.inner.stream)?);
        }
        Ok(payload)
    }

    fn payload_len(&self, payload: &GpuPayload) -> usize {
        payload.len
    }

    fn unpack(
        &self,
        dst: &mut GpuMem,
        off: usize,
        payload: &GpuPayload,
    ) -> Result<(), DeviceError> {
        self.read_into(&None, dst, off, payload, None)
    }

    fn unpack_reduce(
        &self,
        dst: &mut GpuMem,
        off: usize,
        payload: &GpuPayload,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        self.read_into(&None, dst, off, payload, Some((dtype, op)))
    }

    fn unpack_for(
        &self,
        op: &Context,
        dst: &mut GpuMem,
        off: usize,
        payload: &GpuPayload,
    ) -> Result<(), DeviceError> {
        self.read_into(&Some(op.clone()), dst, off, payload, None)
    }

    fn unpack_reduce_for(
        &self,
        op: &Context,
        dst: &mut GpuMem,
        off: usize,
        payload: &GpuPayload,
        dtype: DType,
        reduce: ReduceOp,
    ) -> Result<(), DeviceError> {
        self.read_into(&Some(op.clone()), dst, off, payload, Some((dtype, reduce)))
    }

    fn forget(&self, op: &Context) {
        self.inner.read.forget(&Some(op.clone()));
    }

    fn settle(&self, op: &Context) -> Result<(), DeviceError> {
        Ok(self.settle_reads(&Some(op.clone()), &|| op.is_aborted())?)
    }
}

impl CudaDevice {
    /// Queue `dst[off..] = payload` (or its reduction into `dst`) behind the payload's bytes,
    /// and record the read for `op`'s settle to judge.
    fn read_into(
        &self,
        op: &Option<Context>,
        dst: &mut GpuMem,
        off: usize,
        payload: &GpuPayload,
        reduce: Option<(DType, ReduceOp)>,
    ) -> Result<(), DeviceError> {
        let d = dst.at(off, payload.len)?;
        let reduce = match reduce {
            Some((dtype, rop)) => {
                has_kernel(rop, dtype)?;
                Some((dtype, rop, elements(&[off], payload.len, dtype)?))
            }
            None => None,
        };
        self.after(payload)?;
        let (k, s) = (self.kernels(), &self.inner.stream);
        match reduce {
            Some((dtype, rop, n)) => k.reduce(s, dtype, rop, d, payload.ptr, n)?,
            None => k.copy(s, d, payload.ptr, payload.len as u64)?,
        }
        if let Some((link, last)) = &payload.origin {
            self.inner.read.note(op, link, *last);
        }
        Ok(())
    }

    /// Make the main stream wait for a payload's bytes.
    fn after(&self, payload: &GpuPayload) -> Result<(), CudaError> {
        if let Some(ev) = &payload.ready {
            self.inner.gpu.bind()?;
            self.inner
                .stream
                .wait(ev)
                .map_err(|e| CudaError::driver("cuStreamWaitEvent", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use chorus_engine::{AbortReason, Buffer, Engine, EngineConfig, Reduction};

    use crate::link::DeviceLink;
    use crate::testing::{Stall, block_on, gpu_or_skip};

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn settle_is_bounded_and_ends_when_the_operation_is_aborted() {
        let Some(gpu) = gpu_or_skip("GPU tests") else {
            return;
        };
        let dev = CudaDevice::on(gpu.clone()).unwrap();
        let stall = Stall::on(&gpu, &dev.inner.stream).unwrap();
        dev.set_settle_timeout(Duration::from_millis(100));
        let t = Instant::now();
        let err = dev.settle(&Context::root()).unwrap_err();
        assert!(
            matches!(&err, DeviceError::Wait(m) if m.contains("settling")),
            "{err}"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // Through the engine: an operation finished on the host waits for its kernels, and
        // its abort ends the wait at once (not at the settle timeout).
        dev.set_settle_timeout(Duration::from_secs(60));
        let root = Context::root();
        let engine: Engine<CudaDevice, DeviceLink> = Engine::new(
            Rank(0),
            1,
            Vec::<Arc<DeviceLink>>::new(),
            Arc::new(dev.clone()),
            &root,
            EngineConfig::default(),
        )
        .unwrap();
        let mut buf = dev.buffer(4096).unwrap();
        let (took, result) = std::thread::scope(|s| {
            let op = s.spawn(|| {
                let r = block_on(engine.all_reduce(
                    Buffer::InPlace(&mut buf),
                    1024,
                    DType::F32,
                    Reduction::PreMulSum(2.0),
                ));
                (r, Instant::now())
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!op.is_finished(), "Ok before the kernels ran");
            let at = Instant::now();
            engine.context().abort(AbortReason::requested("deadline"));
            let (r, done) = op.join().unwrap();
            (done.saturating_duration_since(at), r)
        });
        let err = result.unwrap_err();
        assert_eq!(
            err.abort_reason(),
            Some(&AbortReason::requested("deadline")),
            "{err}"
        );
        assert!(took < Duration::from_millis(200), "the abort took {took:?}");
        stall.release();
        dev.synchronize(T).unwrap();
        dev.settle(&Context::root()).unwrap();
        drop(buf);
        drop(stall);
    }

    #[test]
    fn partial_elements_are_misaligned() {
        assert_eq!(elements(&[0, 8], 16, DType::F32), Ok(4));
        assert_eq!(
            elements(&[0], 6, DType::F32),
            Err(DeviceError::Misaligned {
                len: 6,
                dtype: DType::F32
            })
        );
        assert_eq!(
            elements(&[2], 8, DType::F64),
            Err(DeviceError::Misaligned {
                len: 8,
                dtype: DType::F64
            })
        );
        assert_eq!(elements(&[3], 5, DType::U8), Ok(5));
    }

    #[test]
    fn avg_and_premulsum_are_composed_by_the_engine() {
        assert!(has_kernel(ReduceOp::Max, DType::F8E5M2).is_ok());
        assert_eq!(
            has_kernel(ReduceOp::Avg, DType::F32),
            Err(DeviceError::Unsupported {
                op: ReduceOp::Avg,
                dtype: DType::F32
            })
        );
    }
}
