//! One running operation: tagged sends and receives that race the operation's context,
//! flow control, progress publication and device calls that turn failures into
//! [`OpError`]s with the step and peer attached.
//!
//! # Flow control
//!
//! A link holds early arrivals only up to a bound, so an operation must not pour a whole
//! buffer at a peer that is not consuming it (a broadcast root, a scatter, a slow neighbour).
//! Each operation keeps at most `depth` data chunks per peer that the peer has not yet
//! acknowledged; the receiver returns an empty credit payload every `grant = depth / 2`
//! chunks it consumes (tag step `CREDIT | n`). At the end the sender claims every credit the
//! receiver will have sent, so nothing of the operation stays held on a link. Algorithms
//! interleave their sends and receives chunk by chunk, which with `grant < depth` keeps this
//! deadlock-free (a rank blocked on credit has consumed what its peers need from it).
//!
//! # Tags
//!
//! A data payload's tag step is its index among the operation's payloads on that link in
//! that direction (both ends enumerate them in the same order), not its place in the
//! schedule: the first payload two ranks exchange in an operation is always step 0, so a
//! rank that called a different collective, or passed a different count, is caught by the
//! receiver's tag check (collective, offset or dtype differ) instead of leaving both ranks
//! waiting on tags the other never sends. The schedule step, which says where the algorithm
//! is, goes to progress and errors.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Poll, Waker};

use chorus_protocol::{Collective, DType, OpSeq, Rank, ReduceOp};
use futures::stream::{FuturesUnordered, StreamExt};
use smallvec::SmallVec;

use crate::context::Aborted;
use crate::device::{Device, DeviceError};
use crate::error::{OpError, OpErrorKind};
use crate::idmap::IdMap;
use crate::link::{Link, LinkError, LinkFuture, Tag};
use crate::progress::OpProgress;

/// Tag steps with this bit are flow-control credits; data steps stay below it.
pub(crate) const CREDIT: u32 = 1 << 31;

type SendFut<'e> = Pin<Box<dyn Future<Output = (Rank, u32, Result<(), LinkError>)> + Send + 'e>>;

/// Flow-control state towards and from one peer, within one operation.
#[derive(Default)]
struct Flow {
    /// Data chunks sent to the peer.
    sent: u64,
    /// Credits received from the peer.
    credits_in: u32,
    /// Data chunks received from the peer.
    consumed: u64,
    /// Credits sent to the peer.
    credits_out: u32,
}

/// Flow state per peer of one operation. Most operations talk to a handful of peers
/// (two in a ring, `log2 n` in doubling), so a short list searched in order beats hashing;
/// past [`Flows::FEW`] peers (all-to-all, gather) a map takes over. The first
/// [`Flows::INLINE`] live in the `Run` itself: a small operation allocates nothing here.
#[derive(Default)]
struct Flows {
    few: SmallVec<[(u32, Flow); Flows::INLINE]>,
    many: IdMap<u32, Flow>,
}

impl Flows {
    const FEW: usize = 16;
    const INLINE: usize = 4;

    /// The flow towards and from `peer`, created empty on first use.
    fn get(&mut self, peer: u32) -> &mut Flow {
        if let Some(i) = self.few.iter().position(|(p, _)| *p == peer) {
            return &mut self.few[i].1;
        }
        if self.few.len() < Self::FEW {
            self.few.push((peer, Flow::default()));
            let last = self.few.len() - 1;
            return &mut self.few[last].1;
        }
        self.many.entry(peer).or_default()
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &Flow)> {
        self.few
            .iter()
            .map(|(p, f)| (*p, f))
            .chain(self.many.iter().map(|(p, f)| (*p, f)))
    }
}

pub(crate) struct Run<'e, D: Device, L: ?Sized> {
    pub(crate) dev: &'e D,
    links: &'e [Option<Arc<L>>],
    token: &'e D::Owned,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) chunk_bytes: usize,
    depth: u64,
    grant: u64,
    collective: Collective,
    seq: OpSeq,
    pub(crate) dtype: DType,
    progress: Arc<OpProgress>,
    aborted: Aborted,
    /// Sends the link has not finished taking (most finish when first polled and never
    /// get here); created on first use.
    sends: Option<FuturesUnordered<SendFut<'e>>>,
    flows: Flows,
    /// The output buffer has been written to.
    touched: bool,
    at_step: Option<u32>,
    at_peer: Option<Rank>,
}

/// What [`Run::new`] needs from the engine.
pub(crate) struct RunSetup<'e, D: Device, L: ?Sized> {
    pub(crate) dev: &'e D,
    pub(crate) links: &'e [Option<Arc<L>>],
    pub(crate) token: &'e D::Owned,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) chunk_bytes: usize,
    pub(crate) depth: usize,
}

impl<'e, D, L> Run<'e, D, L>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    pub(crate) fn new(
        setup: RunSetup<'e, D, L>,
        collective: Collective,
        seq: OpSeq,
        dtype: DType,
        progress: Arc<OpProgress>,
    ) -> Self {
        let depth = setup.depth.max(2) as u64;
        Run {
            dev: setup.dev,
            links: setup.links,
            token: setup.token,
            rank: setup.rank,
            world: setup.world,
            chunk_bytes: setup.chunk_bytes,
            depth,
            grant: (depth / 2).max(1),
            collective,
            seq,
            dtype,
            aborted: progress.context().aborted(),
            progress,
            sends: None,
            flows: Flows::default(),
            touched: false,
            at_step: None,
            at_peer: None,
        }
    }

    /// Element size in bytes.
    pub(crate) fn es(&self) -> usize {
        self.dtype.size()
    }

    /// Elements per chunk for a schedule of `phases` phases over at most `max_elems`
    /// elements per transfer: the configured chunk size, raised if needed so that every
    /// data step fits below [`CREDIT`].
    pub(crate) fn chunk_elems(&self, max_elems: usize, phases: usize) -> Result<usize, OpError> {
        let configured = (self.chunk_bytes / self.es()).max(1);
        let max_chunks = (CREDIT as usize - 1) / phases.max(1);
        if max_chunks == 0 {
            return Err(self.invalid("schedule has too many steps"));
        }
        Ok(configured.max(max_elems.div_ceil(max_chunks)))
    }

    /// The chunking of a schedule of `phases` phases over at most `max_elems` elements per
    /// transfer, `(elements per chunk, chunks per phase)`, with its step count published.
    pub(crate) fn schedule(
        &self,
        max_elems: usize,
        phases: usize,
    ) -> Result<(usize, usize), OpError> {
        let ce = self.chunk_elems(max_elems, phases)?;
        let k = max_elems.div_ceil(ce);
        self.plan(phases * k);
        Ok((ce, k))
    }

    /// How many chunks a schedule may send to a peer ahead of what it has received from
    /// it, without ever waiting on credit while the peer waits on it too: `depth - grant`.
    /// A rank blocked on credit at chunk `c + ahead` then has a peer that has not consumed
    /// chunk `c - grant`, so that peer is not itself blocked sending (see the module note).
    pub(crate) fn lookahead(&self) -> usize {
        (self.depth - self.grant) as usize
    }

    /// Publish the schedule's step count.
    pub(crate) fn plan(&self, steps: usize) {
        self.progress
            .set_steps(u32::try_from(steps).unwrap_or(u32::MAX));
    }

    /// Record that the output buffer is about to be written.
    pub(crate) fn touch(&mut self) {
        self.touched = true;
    }

    pub(crate) fn error(&self, kind: OpErrorKind) -> OpError {
        OpError {
            kind,
            collective: self.collective,
            op: self.seq,
            step: self.at_step,
            peer: self.at_peer,
            partial_output: self.touched,
        }
    }

    pub(crate) fn invalid(&self, what: impl Into<String>) -> OpError {
        self.error(OpErrorKind::InvalidArgument(what.into()))
    }

    pub(crate) fn device(&self, e: DeviceError) -> OpError {
        self.error(OpErrorKind::Device(e))
    }

    fn tag(&self, step: u32, offset: usize) -> Tag {
        Tag {
            collective: self.collective,
            op: self.seq,
            step,
            offset: offset as u64,
            dtype: self.dtype,
        }
    }

    fn link(&self, peer: u32) -> Result<&'e L, OpError> {
        match self.links.get(peer as usize) {
            Some(Some(l)) => Ok(&**l),
            _ => Err(self.invalid(format!("no link to r{peer}"))),
        }
    }

    /// Await `fut` (a link operation with `peer` at `step`) while racing the context and
    /// driving the pending sends.
    async fn wait<T>(
        &mut self,
        step: Option<u32>,
        peer: u32,
        mut fut: LinkFuture<'_, T>,
    ) -> Result<T, OpError> {
        if let Some(step) = step {
            self.at_step = Some(step);
        }
        self.at_peer = Some(Rank(peer));
        self.progress.enter(self.at_step.unwrap_or(0), Rank(peer));
        let aborted = &mut self.aborted;
        let sends = &mut self.sends;
        let result = poll_fn(|cx| {
            // The abort is looked at first, without a lock; its waker is registered only
            // when the wait is about to sleep (below), so a wait whose payload is already
            // here (most of a small operation's) costs no lock, allocation or hashing in
            // the context. An abort set before this poll still wins, as before.
            if let Some(reason) = aborted.now() {
                return Poll::Ready(Err(Failure::Aborted(reason)));
            }
            if let Some(sends) = sends.as_mut() {
                while let Poll::Ready(Some((to, s, r))) = sends.poll_next_unpin(cx) {
                    if let Err(e) = r {
                        return Poll::Ready(Err(Failure::Send(to, s, e)));
                    }
                }
            }
            if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                return Poll::Ready(r.map_err(Failure::Link));
            }
            // Registers the waker, re-checking the abort under the context's lock, so an
            // abort between the first look and here is not missed.
            match Pin::new(&mut *aborted).poll(cx) {
                Poll::Ready(reason) => Poll::Ready(Err(Failure::Aborted(reason))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        self.progress.leave();
        result.map_err(|f| self.failure(f))
    }

    fn failure(&mut self, f: Failure) -> OpError {
        match f {
            Failure::Aborted(reason) => self.error(OpErrorKind::Aborted(reason)),
            Failure::Link(e) => self.error(OpErrorKind::Link(e)),
            Failure::Send(to, step, e) => {
                self.at_peer = Some(to);
                self.at_step = Some(step);
                self.error(OpErrorKind::Link(e))
            }
        }
    }

    /// Send a data payload to `peer` at schedule step `step`, waiting for flow-control
    /// credit first. The tag's step is the payload's index among this operation's payloads
    /// to `peer`: the first payload between two ranks in an operation always carries step
    /// 0, so ranks that called different collectives (or the same one with a different
    /// schedule) meet on the same `(op, step)` and the receiver reports the mismatch,
    /// instead of both waiting for tags the other never sends.
    pub(crate) async fn send(
        &mut self,
        peer: u32,
        step: u32,
        offset: usize,
        payload: D::Payload,
    ) -> Result<(), OpError> {
        let link = self.link(peer)?;
        let tag = self.admit(link, peer, step, offset).await?;
        self.post(link, peer, tag, payload, step)
    }

    /// [`Run::send`] of `mem[off..][..len]`: handed to the link as borrowed host bytes
    /// when both the device and the link allow it (the link writes them, so the bytes are
    /// never copied into a payload first), packed into a payload otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn send_from(
        &mut self,
        peer: u32,
        step: u32,
        offset: usize,
        mem: &D::Mem,
        off: usize,
        len: usize,
    ) -> Result<(), OpError> {
        let link = self.link(peer)?;
        let tag = self.admit(link, peer, step, offset).await?;
        if let Some(bytes) = self.dev.host_bytes(mem, off, len) {
            let bytes = bytes.map_err(|e| self.device(e))?;
            if let Some(done) = link.send_bytes_now(tag, bytes) {
                return done.map_err(|e| self.failure(Failure::Send(Rank(peer), step, e)));
            }
            if let Some(mut fut) = link.send_bytes(tag, bytes) {
                // The borrow of `mem` ends here: a link that cannot take the bytes at once
                // (its send window is full) has written nothing, and gets a payload below.
                match fut
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(Waker::noop()))
                {
                    Poll::Ready(Ok(())) => return Ok(()),
                    Poll::Ready(Err(e)) => {
                        return Err(self.failure(Failure::Send(Rank(peer), step, e)));
                    }
                    Poll::Pending => {}
                }
            }
        }
        let payload = self.pack(mem, off, len)?;
        self.post(link, peer, tag, payload, step)
    }

    /// Waits for flow-control credit towards `peer` and numbers the next payload to it.
    async fn admit(
        &mut self,
        link: &'e L,
        peer: u32,
        step: u32,
        offset: usize,
    ) -> Result<Tag, OpError> {
        self.at_step = Some(step);
        let index = loop {
            let flow = self.flows.get(peer);
            if flow.sent < u64::from(flow.credits_in) * self.grant + self.depth {
                flow.sent += 1;
                break flow.sent - 1;
            }
            let n = flow.credits_in + 1;
            self.claim_credit(link, peer, n).await?;
        };
        Ok(self.tag(index as u32, offset))
    }

    async fn claim_credit(&mut self, link: &'e L, peer: u32, n: u32) -> Result<(), OpError> {
        let tag = self.tag(CREDIT | n, 0);
        let fut = link.recv(tag);
        self.wait(None, peer, fut).await?;
        self.flows.get(peer).credits_in = n;
        Ok(())
    }

    /// Hands `payload` to the link. A link takes most payloads at once (written or
    /// queued), so the send is polled here first and only kept for later if it waits.
    fn post(
        &mut self,
        link: &'e L,
        peer: u32,
        tag: Tag,
        payload: D::Payload,
        step: u32,
    ) -> Result<(), OpError> {
        let mut fut = link.send(tag, payload);
        match fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(())) => Ok(()),
            Poll::Ready(Err(e)) => Err(self.failure(Failure::Send(Rank(peer), step, e))),
            Poll::Pending => {
                self.sends
                    .get_or_insert_with(FuturesUnordered::new)
                    .push(Box::pin(async move { (Rank(peer), step, fut.await) }));
                Ok(())
            }
        }
    }

    /// Receive the data payload `peer` sends at schedule step `step`, which must be `len`
    /// bytes (tagged by its index, as in [`Run::send`]).
    pub(crate) async fn recv(
        &mut self,
        peer: u32,
        step: u32,
        offset: usize,
        len: usize,
    ) -> Result<D::Payload, OpError> {
        let link = self.link(peer)?;
        let index = self.flows.get(peer).consumed as u32;
        let fut = link.recv(self.tag(index, offset));
        let payload = self.wait(Some(step), peer, fut).await?;
        let got = self.dev.payload_len(&payload);
        self.consumed(link, peer, step, len, got)?;
        Ok(payload)
    }

    /// [`Run::recv`] of `len` bytes into `mem[off..]`: received straight into the memory
    /// when both the device and the link allow it (`None` then), received as a payload and
    /// unpacked otherwise (`Some(payload)`, which the caller may forward without packing it
    /// again).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn recv_into(
        &mut self,
        peer: u32,
        step: u32,
        offset: usize,
        mem: &mut D::Mem,
        off: usize,
        len: usize,
    ) -> Result<Option<D::Payload>, OpError> {
        let link = self.link(peer)?;
        let index = self.flows.get(peer).consumed as u32;
        let tag = self.tag(index, offset);
        match self.dev.host_bytes_mut(mem, off, len) {
            Some(Ok(dst)) => {
                if let Some(fut) = link.recv_into(tag, dst) {
                    let got = self.wait(Some(step), peer, fut).await?;
                    self.consumed(link, peer, step, len, got)?;
                    return Ok(None);
                }
            }
            Some(Err(e)) => return Err(self.device(e)),
            None => {}
        }
        let payload = self.recv(peer, step, offset, len).await?;
        self.unpack(mem, off, &payload)?;
        Ok(Some(payload))
    }

    /// [`Run::recv`] of `len` bytes reduced into `mem[off..]` with `op`: reduced by the
    /// link straight from its transport's buffers when the device has a host kernel for
    /// the operation and the link allows it, received as a payload and reduced by
    /// [`Device::unpack_reduce`] otherwise. With `output` (`mem` is the operation's
    /// output), the output counts as written from the moment it may be: when the link
    /// starts on it, or once the payload is here.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn recv_reduce_into(
        &mut self,
        peer: u32,
        step: u32,
        offset: usize,
        mem: &mut D::Mem,
        off: usize,
        len: usize,
        op: ReduceOp,
        output: bool,
    ) -> Result<(), OpError> {
        let link = self.link(peer)?;
        let dev = self.dev;
        let dtype = self.dtype;
        if dev.reduces_host(dtype, op) && len.is_multiple_of(dtype.size()) {
            let index = self.flows.get(peer).consumed as u32;
            let tag = self.tag(index, offset);
            match dev.host_bytes_mut(mem, off, len) {
                Some(Ok(dst)) => {
                    // The kernel's first error, if any (the link's reducer cannot fail).
                    let failed = std::sync::OnceLock::new();
                    let reduce = |d: &mut [u8], s: &[u8]| {
                        if let Err(e) = dev.host_reduce(d, s, dtype, op) {
                            let _ = failed.set(e);
                        }
                    };
                    if let Some(fut) = link.recv_reduce_into(tag, dst, &reduce) {
                        if output {
                            self.touch();
                        }
                        let got = self.wait(Some(step), peer, fut).await?;
                        if let Some(e) = failed.get().cloned() {
                            return Err(self.device(e));
                        }
                        return self.consumed(link, peer, step, len, got);
                    }
                }
                Some(Err(e)) => return Err(self.device(e)),
                None => {}
            }
        }
        let payload = self.recv(peer, step, offset, len).await?;
        if output {
            self.touch();
        }
        self.unpack_reduce(mem, off, &payload, op)
    }

    /// A payload of `got` bytes (`len` expected) from `peer` was received: count it, and
    /// return credit when a grant's worth has been consumed.
    fn consumed(
        &mut self,
        link: &'e L,
        peer: u32,
        step: u32,
        len: usize,
        got: usize,
    ) -> Result<(), OpError> {
        if got != len {
            return Err(self.error(OpErrorKind::SizeMismatch { expected: len, got }));
        }
        let flow = self.flows.get(peer);
        flow.consumed += 1;
        if flow.consumed.is_multiple_of(self.grant) {
            flow.credits_out += 1;
            let n = flow.credits_out;
            let tag = self.tag(CREDIT | n, 0);
            let empty = self.empty()?;
            self.post(link, peer, tag, empty, step)?;
        }
        Ok(())
    }

    /// Wait until every send has been handed to its link and every credit the peers will
    /// send for this operation has been claimed.
    pub(crate) async fn finish(&mut self) -> Result<(), OpError> {
        let mut owed: Vec<(u32, u32)> = self
            .flows
            .iter()
            .filter_map(|(peer, f)| {
                let total = u32::try_from(f.sent / self.grant).unwrap_or(u32::MAX);
                (total > f.credits_in).then_some((peer, total))
            })
            .collect();
        owed.sort_unstable();
        for (peer, total) in owed {
            let link = self.link(peer)?;
            let mut n = self.flows.get(peer).credits_in;
            while n < total {
                n += 1;
                self.claim_credit(link, peer, n).await?;
            }
        }
        while let Some(sends) = self.sends.as_mut().filter(|s| !s.is_empty()) {
            let aborted = &mut self.aborted;
            let r = poll_fn(|cx| {
                if let Poll::Ready(reason) = Pin::new(&mut *aborted).poll(cx) {
                    return Poll::Ready(Err(Failure::Aborted(reason)));
                }
                match sends.poll_next_unpin(cx) {
                    Poll::Ready(Some((to, s, Err(e)))) => Poll::Ready(Err(Failure::Send(to, s, e))),
                    Poll::Ready(_) => Poll::Ready(Ok(())),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            r.map_err(|f| self.failure(f))?;
        }
        Ok(())
    }

    /// Wait for the device to finish the operation's queued work ([`Device::settle`]). If
    /// the context was aborted meanwhile, the abort is the error, whatever the device says.
    pub(crate) fn settle(&self) -> Result<(), OpError> {
        let ctx = self.progress.context();
        self.dev.settle(ctx).map_err(|e| match ctx.reason() {
            Some(reason) => self.error(OpErrorKind::Aborted(reason)),
            None => self.device(e),
        })
    }

    /// An empty payload (barrier tokens, credits).
    pub(crate) fn empty(&self) -> Result<D::Payload, OpError> {
        self.dev.pack(self.token, 0, 0).map_err(|e| self.device(e))
    }

    /// Fail now if the context is already aborted (checked before touching any buffer).
    pub(crate) fn check_aborted(&self) -> Result<(), OpError> {
        match self.progress.context().reason() {
            Some(r) => Err(self.error(OpErrorKind::Aborted(r))),
            None => Ok(()),
        }
    }

    // Device calls with errors mapped. Offsets and lengths are in bytes.

    pub(crate) fn pack(&self, mem: &D::Mem, off: usize, len: usize) -> Result<D::Payload, OpError> {
        self.dev.pack(mem, off, len).map_err(|e| self.device(e))
    }

    pub(crate) fn unpack(
        &mut self,
        mem: &mut D::Mem,
        off: usize,
        p: &D::Payload,
    ) -> Result<(), OpError> {
        self.dev
            .unpack_for(self.progress.context(), mem, off, p)
            .map_err(|e| self.device(e))
    }

    pub(crate) fn unpack_reduce(
        &mut self,
        mem: &mut D::Mem,
        off: usize,
        p: &D::Payload,
        op: ReduceOp,
    ) -> Result<(), OpError> {
        self.dev
            .unpack_reduce_for(self.progress.context(), mem, off, p, self.dtype, op)
            .map_err(|e| self.device(e))
    }

    pub(crate) fn copy(
        &self,
        dst: &mut D::Mem,
        dst_off: usize,
        src: &D::Mem,
        src_off: usize,
        len: usize,
    ) -> Result<(), OpError> {
        if len == 0 {
            return Ok(());
        }
        self.dev
            .copy(dst, dst_off, src, src_off, len)
            .map_err(|e| self.device(e))
    }

    pub(crate) fn scale(
        &self,
        mem: &mut D::Mem,
        off: usize,
        len: usize,
        factor: f64,
    ) -> Result<(), OpError> {
        if len == 0 {
            return Ok(());
        }
        self.dev
            .scale(mem, off, len, self.dtype, factor)
            .map_err(|e| self.device(e))
    }

    pub(crate) fn divide(
        &self,
        mem: &mut D::Mem,
        off: usize,
        len: usize,
        divisor: u32,
    ) -> Result<(), OpError> {
        if len == 0 {
            return Ok(());
        }
        self.dev
            .divide(mem, off, len, self.dtype, divisor)
            .map_err(|e| self.device(e))
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<D::Owned, OpError> {
        self.dev.alloc(bytes).map_err(|e| self.device(e))
    }
}

enum Failure {
    Aborted(crate::context::AbortReason),
    Link(LinkError),
    Send(Rank, u32, LinkError),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use chorus_protocol::{Collective, DType, OpSeq, Rank};

    use super::*;
    use crate::config::Algorithm;
    use crate::context::{AbortReason, Context};
    use crate::host_device::HostDevice;
    use crate::local::{HeldLimit, LocalLink};

    /// A run of rank 0 in a world of two over `links` (`None` at rank 0), in `ctx`.
    fn run_in<'e>(
        dev: &'e HostDevice,
        links: &'e [Option<Arc<LocalLink<Bytes>>>],
        token: &'e <HostDevice as Device>::Owned,
        ctx: &Context,
    ) -> Run<'e, HostDevice, LocalLink<Bytes>> {
        let progress = Arc::new(OpProgress::new(
            OpSeq(0),
            Collective::AllReduce,
            Some(DType::F32),
            8,
            Algorithm::RecursiveDoubling,
            None,
            ctx.child(),
        ));
        let setup = RunSetup {
            dev,
            links,
            token,
            rank: 0,
            world: 2,
            chunk_bytes: 1 << 20,
            depth: 4,
        };
        Run::new(setup, Collective::AllReduce, OpSeq(0), DType::F32, progress)
    }

    fn data_tag() -> Tag {
        Tag {
            collective: Collective::AllReduce,
            op: OpSeq(0),
            step: 0,
            offset: 0,
            dtype: DType::F32,
        }
    }

    /// The wait looks at the abort before it takes a payload that is already here: an
    /// aborted operation is an error, never a silent success (principle 5), even though
    /// its waker is only registered when the wait would sleep.
    #[test]
    fn an_abort_beats_a_payload_that_is_already_here() {
        let (l0, l1) = LocalLink::<Bytes>::pair(Rank(0), Rank(1), HeldLimit::default());
        let links = [None, Some(Arc::new(l0))];
        let dev = HostDevice;
        let token = dev.alloc(8).unwrap();
        let ctx = Context::root();
        let mut run = run_in(&dev, &links, &token, &ctx);
        futures::executor::block_on(l1.send(data_tag(), Bytes::from_static(&[0; 8]))).unwrap();
        ctx.abort(AbortReason::requested("test"));
        let err = futures::executor::block_on(run.recv(1, 0, 0, 8))
            .expect_err("an aborted run must not take the payload");
        assert!(
            matches!(
                err.kind,
                OpErrorKind::Aborted(AbortReason::Requested { .. })
            ),
            "{err}"
        );
    }

    /// A wait that sleeps (nothing sent yet) registers its waker and ends at the abort,
    /// from another thread, within the test's generous bound.
    #[test]
    fn a_sleeping_wait_ends_at_an_abort_from_another_thread() {
        let (l0, _l1) = LocalLink::<Bytes>::pair(Rank(0), Rank(1), HeldLimit::default());
        let links = [None, Some(Arc::new(l0))];
        let dev = HostDevice;
        let token = dev.alloc(8).unwrap();
        let ctx = Context::root();
        let mut run = run_in(&dev, &links, &token, &ctx);
        let aborter = {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                ctx.abort(AbortReason::requested("test"));
            })
        };
        let started = std::time::Instant::now();
        let err = futures::executor::block_on(run.recv(1, 0, 0, 8))
            .expect_err("nothing was sent: the wait can only end at the abort");
        assert!(matches!(err.kind, OpErrorKind::Aborted(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        aborter.join().unwrap();
    }

    /// A payload that is here completes the wait on its first poll, and a run that talks
    /// to a few peers keeps their flow state inline.
    #[test]
    fn a_ready_payload_completes_without_sleeping() {
        let (l0, l1) = LocalLink::<Bytes>::pair(Rank(0), Rank(1), HeldLimit::default());
        let links = [None, Some(Arc::new(l0))];
        let dev = HostDevice;
        let token = dev.alloc(8).unwrap();
        let ctx = Context::root();
        let mut run = run_in(&dev, &links, &token, &ctx);
        futures::executor::block_on(l1.send(data_tag(), Bytes::from_static(&[7; 8]))).unwrap();
        let got = futures::executor::block_on(run.recv(1, 0, 0, 8)).unwrap();
        assert_eq!(&got[..], &[7; 8]);
        assert!(!run.flows.few.spilled());
    }
}
