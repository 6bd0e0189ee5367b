//! `DeviceLink`: two ranks on one GPU exchanging payloads through device memory.
//!
//! Each end owns a `Region` of slots, and a payload travels as slot messages of at most one
//! slot each. A send (`send.rs`) queues, on the link's send stream, for each part: a wait
//! until the peer has taken the slot's previous message out, a copy into the slot, and a
//! signal raising `ready`; the peer's reader thread (`reader.rs`) queues, on its receive
//! stream, the mirror image — wait for `ready`, copy out, signal `consumed` — and files the
//! payload for `recv`. The host keeps the slot credit (`credit.rs`, and the `Sent`, `Queued`
//! and `Credit` frames of `host_frame.rs`): a part is queued only once the peer has queued
//! the take-out that frees its slot, and a take-out only once its part is queued, so no
//! device wait is queued ahead of the work that ends it and streams may share hardware
//! queues (`CUDA_DEVICE_MAX_CONNECTIONS`) without deadlock. A send short of credit is a
//! pending future on the host, woken by the peer's `Credit`; the host never waits for the
//! GPU, and the GPU waits only in `chorus_wait`, which also polls this end's abort word:
//! [`Link::cancel`], a departure or a lost peer set it, and every wait on the peer returns at
//! once (seed 002: NCCL could not do this, and a lost peer cost the context).
//!
//! A retired wait never passes garbage off as data: a retired receive is recorded in the
//! link's `LinkHealth`, which the payload carries, so the device that reads it fails its
//! settle; a retired send stops that stream's puts and signals for good, so the peer never
//! sees `ready` for a slot that was not filled (its own waits retire when it learns of the
//! abort); and a payload forwarded from a link whose receive retired is gated the same way.
//!
//! Ends in one process (threads) share regions directly; ends in two processes map each
//! other's region through CUDA IPC. Either way the host side is a connected Unix socket.

use std::collections::VecDeque;
use std::future::Future;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_protocol::{CloseCode, Rank};
use cudarc::driver::CudaStream;
use parking_lot::{Condvar, Mutex};

mod reader;
mod send;

use send::Sends;

use crate::device::{Attached, CudaDevice};
use crate::error::CudaError;
use crate::health::{LinkHealth, Origins, RETIRED_RECV, RETIRED_SEND};
use crate::host_frame::{Hello, HostFrame, RegionInfo, VERSION, process_nonce};
use crate::mapped::MappedHost;
use crate::payload::GpuPayload;
use crate::region::{PeerRegion, Region, SLOTS};
#[cfg(test)]
use crate::region::{READY, SEND_SKIP};
use crate::sync;

/// Slot geometry and the link's deadlines.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Bytes per slot (a multiple of 256). Larger slots mean fewer kernel launches per
    /// payload; `slots * slot_bytes` of device memory per end.
    pub slot_bytes: usize,
    /// Slots per end (at least 1; 2 or more lets copies in and out overlap).
    pub slots: u32,
    /// Bound on the whole handshake.
    pub handshake_timeout: Duration,
    /// Bound on draining the link's streams, and on waiting for the peer's departure, when
    /// the link is dropped.
    pub teardown_timeout: Duration,
    /// Bound on writing one frame to the peer (a frozen peer stops reading).
    pub write_timeout: Duration,
    /// Most payload bytes received but not yet claimed by `recv`; past it the link fails
    /// with `Overflow`.
    pub max_held_bytes: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            slot_bytes: 8 << 20,
            slots: 4,
            handshake_timeout: Duration::from_secs(10),
            teardown_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
            max_held_bytes: 4 << 30,
        }
    }
}

impl LinkConfig {
    fn check(&self) -> Result<(), CudaError> {
        if self.slot_bytes == 0 || !self.slot_bytes.is_multiple_of(256) {
            return Err(CudaError::Invalid(format!(
                "slot_bytes {} is not a positive multiple of 256",
                self.slot_bytes
            )));
        }
        if self.slots == 0 {
            return Err(CudaError::Invalid(
                "a device link needs at least one slot".into(),
            ));
        }
        Ok(())
    }

    fn region_bytes(&self) -> usize {
        SLOTS as usize + self.slots as usize * self.slot_bytes
    }
}

/// One end of a device link. Implements the engine's [`Link`] for [`GpuPayload`].
pub struct DeviceLink {
    core: Arc<LinkCore>,
    reader: Option<JoinHandle<()>>,
}

struct LinkCore {
    device: CudaDevice,
    me: Rank,
    peer: Rank,
    send_stream: Arc<CudaStream>,
    recv_stream: Arc<CudaStream>,
    /// The abort word and retirement records; payloads received here share it.
    health: Arc<LinkHealth>,
    own: Arc<Region>,
    /// Links whose payloads this one forwarded (their records are read by gates queued on
    /// the send stream).
    origins: Origins<LinkHealth>,
    theirs: PeerRegion,
    slot_bytes: u64,
    slots: u64,
    socket: UnixStream,
    /// The sends' turns and the slot messages queued (`send.rs`).
    sends: Mutex<Sends>,
    /// Sends waiting for credit.
    credit_wakers: Mutex<Vec<Waker>>,
    /// Slot messages this end has told the peer it queued (the peer's credit cannot pass it).
    queued: AtomicU64,
    /// The peer's credit: slot messages whose take-out it has queued.
    credit: AtomicU64,
    /// Held while a frame is written, so frames from the sends and the reader never mix.
    wr: Mutex<()>,
    mailbox: Mutex<Mailbox>,
    cancelled: OnceLock<CancelReason>,
    /// Set when the peer failed or sent garbage (not on an orderly departure).
    failure: OnceLock<LinkError>,
    reader_done: (Mutex<bool>, Condvar),
    frozen: AtomicBool,
    /// Whether a synchronisation has reported this link's retired waits.
    reported: AtomicBool,
    config: LinkConfig,
}

/// What one held payload costs beyond its bytes (its mailbox entry, tag and handle),
/// counted against `max_held_bytes` so a peer announcing empty payloads under fresh tags
/// cannot grow the mailbox without limit.
const HELD_ENTRY_COST: u64 = 64;

/// The bytes a held payload of `len` bytes counts against the bound.
fn held_cost(len: u64) -> u64 {
    len.saturating_add(HELD_ENTRY_COST)
}

#[derive(Default)]
struct Mailbox {
    held: VecDeque<(Tag, GpuPayload)>,
    /// Held and announced payloads, each at [`held_cost`].
    held_bytes: u64,
    wakers: Vec<Waker>,
    /// Why no more payloads will arrive.
    closed: Option<LinkError>,
}

impl DeviceLink {
    /// Connect rank `me` on `device` with rank `peer` at the other end of `socket` (a
    /// connected Unix stream; `UnixStream::pair()` for threads of one process). Both ends
    /// call this at the same time; it returns once both have exchanged regions, or fails
    /// within `config.handshake_timeout`.
    pub fn connect(
        device: &CudaDevice,
        me: Rank,
        peer: Rank,
        socket: UnixStream,
        config: &LinkConfig,
    ) -> Result<DeviceLink, CudaError> {
        config.check()?;
        let link_err = |detail: String| CudaError::Link { peer, detail };
        let deadline = Instant::now() + config.handshake_timeout;
        let io = |what: &str, e: std::io::Error| link_err(format!("{what}: {e}"));
        socket
            .set_write_timeout(Some(config.handshake_timeout))
            .map_err(|e| io("socket", e))?;
        let gpu = device.gpu().clone();
        let hello = Hello {
            version: VERSION,
            nonce: process_nonce(),
            rank: me,
            uuid: gpu.uuid(),
            slot_bytes: config.slot_bytes as u64,
            slots: config.slots,
        };
        HostFrame::Hello(hello.clone())
            .write_to(&mut &socket)
            .map_err(|e| io("sending hello", e))?;
        let theirs = match read_before(&socket, deadline).map_err(&link_err)? {
            HostFrame::Hello(h) => h,
            other => return Err(link_err(format!("expected hello, got {other:?}"))),
        };
        if theirs.version != VERSION {
            return Err(link_err(format!(
                "peer speaks version {}, not {VERSION}",
                theirs.version
            )));
        }
        if theirs.rank != peer {
            return Err(link_err(format!("the peer says it is {}", theirs.rank)));
        }
        if theirs.uuid != hello.uuid {
            return Err(link_err("the peer is on another GPU".into()));
        }
        if (theirs.slot_bytes, theirs.slots) != (hello.slot_bytes, hello.slots) {
            return Err(link_err(format!(
                "slot geometry differs: {}x{} here, {}x{} there",
                hello.slots, hello.slot_bytes, theirs.slots, theirs.slot_bytes
            )));
        }
        // Not by PID: two processes in different PID namespaces can have the same one, and
        // taking the peer for this process would read our own region as theirs.
        let same_process = theirs.nonce == hello.nonce;

        gpu.bind()?;
        let send_stream = gpu.new_stream()?;
        let recv_stream = gpu.new_stream()?;
        let own = Region::new(&gpu, &send_stream, config.region_bytes(), !same_process)?;
        sync::drain(
            &[&send_stream],
            config.handshake_timeout,
            "clearing a link region",
        )?;
        let info = RegionInfo {
            token: own.ptr,
            ipc: if same_process {
                None
            } else {
                Some(own.ipc_handle()?)
            },
        };
        HostFrame::Region(info)
            .write_to(&mut &socket)
            .map_err(|e| io("sending region", e))?;
        let their_region = match read_before(&socket, deadline).map_err(&link_err)? {
            HostFrame::Region(r) => r,
            other => return Err(link_err(format!("expected region, got {other:?}"))),
        };
        let theirs = match (same_process, their_region.ipc) {
            (true, _) => {
                let region = Region::lookup(their_region.token)
                    .ok_or_else(|| link_err("the peer's region is gone".into()))?;
                // Reading our own slots back as the peer's data would be silent garbage.
                if Arc::ptr_eq(&region, &own) {
                    return Err(link_err("the peer named this end's own region".into()));
                }
                PeerRegion::Shared(region)
            }
            (false, Some(handle)) => PeerRegion::open(&gpu, handle)?,
            (false, None) => {
                return Err(link_err(
                    "a peer in another process sent no IPC handle".into(),
                ));
            }
        };
        socket.set_read_timeout(None).map_err(|e| io("socket", e))?;
        socket
            .set_write_timeout(Some(config.write_timeout))
            .map_err(|e| io("socket", e))?;

        let health = Arc::new(LinkHealth::new(
            peer,
            MappedHost::new(&gpu, 256)?,
            own.clone(),
        ));
        let core = Arc::new(LinkCore {
            device: device.clone(),
            me,
            peer,
            send_stream,
            recv_stream,
            health,
            own,
            origins: Origins::default(),
            theirs,
            slot_bytes: config.slot_bytes as u64,
            slots: config.slots as u64,
            socket,
            sends: Mutex::new(Sends::default()),
            credit_wakers: Mutex::new(Vec::new()),
            queued: AtomicU64::new(0),
            credit: AtomicU64::new(0),
            wr: Mutex::new(()),
            mailbox: Mutex::new(Mailbox::default()),
            cancelled: OnceLock::new(),
            failure: OnceLock::new(),
            reader_done: (Mutex::new(false), Condvar::new()),
            frozen: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            config: config.clone(),
        });
        let weak = Arc::downgrade(&core);
        device.attach(weak);
        let reader_core = core.clone();
        let reader = std::thread::Builder::new()
            .name(format!("chorus-cuda-{me}-{peer}"))
            .spawn(move || reader_core.read_loop())
            .map_err(|e| link_err(format!("cannot start the reader thread: {e}")))?;
        Ok(DeviceLink {
            core,
            reader: Some(reader),
        })
    }

    /// The rank at this end.
    pub fn rank(&self) -> Rank {
        self.core.me
    }

    /// Stop taking messages out of the peer's slots, as a frozen process would (tests and
    /// the device check use it to leave the peer's waits with nobody to release them).
    /// Test support: only with the `testkit` feature.
    #[cfg(feature = "testkit")]
    pub fn freeze_for_test(&self) {
        self.core.frozen.store(true, Ordering::SeqCst);
    }

    /// The stream this end takes the peer's messages out on (tests and the device check stall
    /// it, to leave the peer's sends waiting on the device for slots never freed).
    /// Test support: only with the `testkit` feature.
    #[cfg(feature = "testkit")]
    pub fn receive_stream_for_test(&self) -> &Arc<CudaStream> {
        &self.core.recv_stream
    }

    /// Wait (at most `timeout`) until this link's streams have run what is queued on them.
    pub fn flush(&self, timeout: Duration) -> Result<(), CudaError> {
        sync::drain(
            &[&self.core.send_stream, &self.core.recv_stream],
            timeout,
            &format!("device link {} to {}", self.core.me, self.core.peer),
        )
    }

    /// The first message whose wait this end retired by abort, on the send and the receive
    /// side (generations from 1; 0: none).
    pub fn retired(&self) -> (u64, u64) {
        (
            self.core.health.first_retired(RETIRED_SEND),
            self.core.health.first_retired(RETIRED_RECV),
        )
    }
}

impl Link<GpuPayload> for DeviceLink {
    fn peer(&self) -> Rank {
        self.core.peer
    }

    fn send(&self, tag: Tag, payload: GpuPayload) -> LinkFuture<'_, ()> {
        Box::pin(self.core.send_op(tag, payload))
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, GpuPayload> {
        Box::pin(Recv {
            core: &self.core,
            tag,
        })
    }

    fn cancel(&self, reason: CancelReason) {
        self.core.cancel(reason);
    }
}

impl LinkCore {
    fn abort_word_set(&self) -> bool {
        self.health.abort_set()
    }

    fn set_abort(&self) {
        self.health.set_abort();
    }

    /// Fail the link for good: later operations report `err`, device waits retire.
    fn fail(&self, err: LinkError) {
        let _ = self.failure.set(err.clone());
        self.set_abort();
        let _ = self.socket.shutdown(Shutdown::Both);
        self.close_mailbox(err);
        self.wake_senders();
    }

    fn close_mailbox(&self, err: LinkError) {
        let wakers = {
            let mut m = self.mailbox.lock();
            if m.closed.is_none() {
                m.closed = Some(err);
            }
            std::mem::take(&mut m.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    fn unusable(&self) -> Option<LinkError> {
        if let Some(r) = self.cancelled.get() {
            return Some(LinkError::Cancelled(r.clone()));
        }
        if let Some(e) = self.failure.get() {
            return Some(e.clone());
        }
        self.mailbox.lock().closed.clone()
    }

    fn cancel(&self, reason: CancelReason) {
        if self.cancelled.set(reason.clone()).is_err() {
            return;
        }
        // First, so kernels waiting on the peer return while the rest happens.
        self.set_abort();
        // Best effort and never blocking: if a send holds the socket, the peer sees the
        // shutdown instead of the departure frame.
        if let Some(_guard) = self.wr.try_lock() {
            let _ = self
                .socket
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = (HostFrame::Depart {
                code: reason.code,
                detail: reason.detail.to_string(),
            })
            .write_to(&mut &self.socket);
        }
        let _ = self.socket.shutdown(Shutdown::Both);
        self.close_mailbox(LinkError::Cancelled(reason));
        self.wake_senders();
    }

    fn drain(&self, timeout: Duration) -> Result<(), CudaError> {
        sync::drain(
            &[&self.send_stream, &self.recv_stream],
            timeout,
            &format!("device link {} to {}", self.me, self.peer),
        )
    }
}

impl Attached for LinkCore {
    fn streams(&self) -> Vec<Arc<CudaStream>> {
        vec![self.send_stream.clone(), self.recv_stream.clone()]
    }

    fn take_failure(&self) -> Option<(Rank, String)> {
        let why = match (self.cancelled.get(), self.failure.get()) {
            (Some(r), _) => format!("link cancelled: {r}"),
            (None, Some(e)) => e.to_string(),
            (None, None) => return None,
        };
        let (send, recv) = (
            self.health.first_retired(RETIRED_SEND),
            self.health.first_retired(RETIRED_RECV),
        );
        // A link that ended with every wait satisfied carried whole data; one that retired
        // waits is reported, once: a later synchronisation answers for later work.
        if (send, recv) == (0, 0) || self.reported.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some((
            self.peer,
            format!("{why}; waits retired from send {send}, receive {recv}"),
        ))
    }
}

/// `recv`'s future: resolves when the reader thread has filed a payload with the tag's
/// `(op, step)`, or the link can deliver no more.
struct Recv<'a> {
    core: &'a LinkCore,
    tag: Tag,
}

impl Future for Recv<'_> {
    type Output = Result<GpuPayload, LinkError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = self.core;
        if let Some(r) = core.cancelled.get() {
            return Poll::Ready(Err(LinkError::Cancelled(r.clone())));
        }
        let mut m = core.mailbox.lock();
        let want = self.tag;
        let at = m
            .held
            .iter()
            .position(|(t, _)| t.op == want.op && t.step == want.step);
        if let Some(i) = at
            && let Some((got, payload)) = m.held.remove(i)
        {
            {
                m.held_bytes -= held_cost(payload.len as u64);
                return Poll::Ready(if got == want {
                    Ok(payload)
                } else {
                    Err(LinkError::TagMismatch {
                        expected: want,
                        got,
                    })
                });
            }
        }
        if let Some(e) = &m.closed {
            return Poll::Ready(Err(e.clone()));
        }
        if let Some(e) = core.failure.get() {
            return Poll::Ready(Err(e.clone()));
        }
        m.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for DeviceLink {
    fn drop(&mut self) {
        let core = &self.core;
        let t = core.config.teardown_timeout;
        let healthy = core.cancelled.get().is_none() && core.failure.get().is_none();
        let mut drained = core.drain(t);
        if drained.is_err() {
            // Something on our streams waits for a peer that is not coming: retire it.
            core.set_abort();
            drained = core.drain(t);
        }
        if healthy && !core.abort_word_set() {
            let _w = core.wr.lock();
            let _ = (HostFrame::Depart {
                code: CloseCode::NORMAL,
                detail: "link closed".into(),
            })
            .write_to(&mut &core.socket);
        }
        // A peer in another process reads our region until it has drained its own streams,
        // which its departure (or its death) tells us.
        if matches!(core.theirs, PeerRegion::Mapped { .. }) {
            let (lock, cv) = &core.reader_done;
            let mut done = lock.lock();
            cv.wait_while_for(&mut done, |d| !*d, t);
            if !*done {
                tracing::warn!(peer = %core.peer, "peer did not depart in time; leaking the link's region");
                std::mem::forget(core.own.clone());
            }
        }
        core.set_abort();
        let _ = core.socket.shutdown(Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            // The shutdown ends the reader's read; join only if it has finished, so a
            // reader stuck in a driver call cannot hold the drop.
            let (lock, cv) = &core.reader_done;
            let mut done = lock.lock();
            cv.wait_while_for(&mut done, |d| !*d, t);
            if *done {
                let _ = reader.join();
            }
        }
        if let Err(e) = drained {
            // Kernels may still touch this link's memory: keep all of it.
            tracing::warn!(error = %e, "device link streams did not drain; leaking the link");
            std::mem::forget(self.core.clone());
        }
    }
}

/// Read one handshake frame, failing at `deadline`.
fn read_before(socket: &UnixStream, deadline: Instant) -> Result<HostFrame, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("handshake timed out".into());
    }
    socket
        .set_read_timeout(Some(left))
        .map_err(|e| format!("socket: {e}"))?;
    match HostFrame::read_from(&mut &*socket) {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err("the peer closed the socket during the handshake".into()),
        Err(e) => Err(format!("handshake: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{GpuBuffer, GpuMem};
    use crate::testing::{Stall, block_on, gpu_or_skip};
    use chorus_engine::device::Device;
    use chorus_protocol::{Collective, DType, OpSeq};

    const T: Duration = Duration::from_secs(20);

    fn small() -> LinkConfig {
        LinkConfig {
            slot_bytes: 64 << 10,
            slots: 2,
            ..LinkConfig::default()
        }
    }

    fn tag(step: u32) -> Tag {
        Tag {
            collective: Collective::SendRecv,
            op: OpSeq(1),
            step,
            offset: 0,
            dtype: DType::U8,
        }
    }

    fn pair() -> Option<(Vec<CudaDevice>, Vec<Vec<DeviceLink>>)> {
        let gpu = gpu_or_skip("GPU tests")?;
        let devs: Vec<CudaDevice> = (0..2)
            .map(|_| CudaDevice::on(gpu.clone()).unwrap())
            .collect();
        let links = crate::local::connect_all(&devs, &small()).unwrap();
        Some((devs, links))
    }

    /// Rank 1 sends bytes queued behind a kernel that will not end until released; rank 0
    /// receives the payload (its frames) but not its bytes, and reads it anyway.
    fn a_read_of_bytes_that_have_not_come(
        devs: &[CudaDevice],
        l0: &DeviceLink,
        l1: &DeviceLink,
    ) -> (Stall, GpuPayload, GpuBuffer, GpuBuffer) {
        let stall = Stall::on(devs[1].gpu(), &devs[1].inner.stream).unwrap();
        let src = devs[1].buffer(64 << 10).unwrap();
        let p = devs[1].pack(&src, 0, 64 << 10).unwrap();
        block_on(l1.send(tag(0), p)).unwrap();
        let got = block_on(l0.recv(tag(0))).unwrap();
        let mut dst = devs[0].buffer(64 << 10).unwrap();
        devs[0].unpack(&mut dst, 0, &got).unwrap();
        (stall, got, dst, src)
    }

    #[test]
    fn a_payload_an_abort_kept_from_arriving_fails_the_settle() {
        let Some((devs, links)) = pair() else {
            return;
        };
        let (l0, l1) = (&links[0][0], &links[1][0]);
        let (stall, got, dst, src) = a_read_of_bytes_that_have_not_come(&devs, l0, l1);
        // Rank 0 aborts: its wait retires, and the settle says the data is not rank 1's.
        l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
        devs[0].set_settle_timeout(T);
        let err = devs[0].settle_unless(&|| false).unwrap_err();
        assert!(
            matches!(err, CudaError::Aborted { peer: Rank(1), .. }),
            "{err}"
        );
        assert_eq!(l0.retired(), (0, 1));
        // Reported once: the next settle has nothing left to blame.
        devs[0].settle_unless(&|| false).unwrap();
        stall.release();
        l1.cancel(CancelReason::new(CloseCode::ABORTED, "test over"));
        drop((got, dst, src, stall));
        for d in &devs {
            let _ = d.synchronize(T);
        }
    }

    #[test]
    fn a_failed_settle_takes_its_reads_with_it() {
        let Some((devs, links)) = pair() else {
            return;
        };
        let (l0, l1) = (&links[0][0], &links[1][0]);
        let (stall, got, dst, src) = a_read_of_bytes_that_have_not_come(&devs, l0, l1);
        devs[0].set_settle_timeout(Duration::from_millis(100));
        let err = devs[0].settle_unless(&|| false).unwrap_err();
        assert!(matches!(err, CudaError::Timeout { .. }), "{err}");
        // That operation failed, and said so. The abort then spoils what it read, but the
        // next settle answers for its own reads (none), not for the failed one's.
        l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
        devs[0].set_settle_timeout(T);
        devs[0].settle_unless(&|| false).unwrap();
        assert_eq!(l0.retired(), (0, 1));
        stall.release();
        l1.cancel(CancelReason::new(CloseCode::ABORTED, "test over"));
        drop((got, dst, src, stall));
        for d in &devs {
            let _ = d.synchronize(T);
        }
    }

    #[test]
    fn a_send_short_of_credit_waits_on_the_host_and_never_on_the_device() {
        let Some((devs, links)) = pair() else {
            return;
        };
        let (l0, l1) = (&links[0][0], &links[1][0]);
        // Rank 1 stops reading: it takes nothing out and grants no credit.
        l1.freeze_for_test();
        let src = devs[0].buffer(64 << 10).unwrap();
        // Two sends fill both slots; the third has no credit.
        for step in 0..2 {
            let p = devs[0].pack(&src, 0, 64 << 10).unwrap();
            block_on(l0.send(tag(step), p)).unwrap();
        }
        let p = devs[0].pack(&src, 0, 64 << 10).unwrap();
        let mut third = l0.send(tag(2), p);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            third.as_mut().poll(&mut cx).is_pending(),
            "sent without credit"
        );
        // Nothing waits on the device: no wait was queued for a slot not yet freed.
        l0.flush(T).unwrap();
        assert_eq!(l0.core.queued.load(Ordering::Acquire), 2);
        l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
        let Poll::Ready(Err(LinkError::Cancelled(_))) = third.as_mut().poll(&mut cx) else {
            panic!("the pending send did not end with the cancel");
        };
        assert_eq!(l0.retired(), (0, 0), "no device wait had to retire");
        drop(third);
        l1.cancel(CancelReason::new(CloseCode::ABORTED, "test over"));
        drop(src);
        for d in &devs {
            let _ = d.synchronize(T);
        }
    }

    #[test]
    fn a_retired_send_puts_and_signals_nothing_more() {
        let Some((devs, links)) = pair() else {
            return;
        };
        let (l0, l1) = (&links[0][0], &links[1][0]);
        // Rank 1 grants credit, but the take-outs it queued never run: rank 0's third
        // message waits on the device for a slot that is never freed.
        let stall = Stall::on(devs[1].gpu(), &l1.core.recv_stream).unwrap();
        let src = devs[0].buffer(64 << 10).unwrap();
        for step in 0..3 {
            let p = devs[0].pack(&src, 0, 64 << 10).unwrap();
            block_on(l0.send(tag(step), p)).unwrap();
        }
        let t = Instant::now();
        while l0.flush(Duration::from_micros(1)).is_ok() {
            assert!(
                t.elapsed() < T,
                "the third message never waited on the device"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
        l0.flush(T).unwrap();
        assert_eq!(l0.retired().0, 3, "the third message's wait retired first");
        // SAFETY: the link's own region, alive while the link is; only read here.
        let own = unsafe { GpuMem::from_raw(l0.core.own.ptr, SLOTS as usize) };
        let words = devs[0].download(&own, 0, SLOTS as usize, T).unwrap();
        let word = |at: u64| u64::from_le_bytes(words[at as usize..][..8].try_into().unwrap());
        assert_eq!(word(READY), 2, "nothing signalled past the retired wait");
        assert_eq!(word(SEND_SKIP), 3);
        l1.cancel(CancelReason::new(CloseCode::ABORTED, "test over"));
        stall.release();
        drop(stall);
        drop(src);
        for d in &devs {
            let _ = d.synchronize(T);
        }
    }

    #[test]
    fn slot_geometry_is_checked() {
        let ok = LinkConfig::default();
        assert!(ok.check().is_ok());
        assert_eq!(ok.region_bytes(), 256 + 4 * (8 << 20));
        let bad = LinkConfig {
            slot_bytes: 1000,
            ..LinkConfig::default()
        };
        assert!(matches!(bad.check(), Err(CudaError::Invalid(_))));
        let none = LinkConfig {
            slots: 0,
            ..LinkConfig::default()
        };
        assert!(matches!(none.check(), Err(CudaError::Invalid(_))));
    }

    #[test]
    fn a_silent_peer_fails_the_handshake_in_time() {
        let (a, _b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let err = read_before(&a, Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(err.contains("handshake"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_peer_that_hangs_up_during_the_handshake_is_named() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let err = read_before(&a, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(err.contains("closed"), "{err}");
    }
}
