//! `ShmLink`: the engine's `Link` over one segment shared with a peer on this host.
//!
//! A `send` that finds the stream idle copies its frame into our ring on the caller's
//! thread; only what the ring has no room for goes to the pump. A payload of at most 1 KiB
//! (`send_bytes_now`'s, or a token or credit handed to `send`) goes into our mailbox
//! instead when its slot is free (`mailbox.rs`): no frame at all. A `recv` that finds nothing
//! held reads the peer's ring itself for a while (the same adaptive, crowded-core-aware
//! window as TCP's, `spin.rs`, counted from the last bytes taken: `patience.rs`), then
//! parks and leaves the ring to the pump, which the peer wakes through the segment's futex.
//!
//! Leaving is a `Depart` frame in the ring, then the one-way closed word and a wake-up:
//! nothing depends on who else holds the segment's descriptor (principle 1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Reducer, Tag};
use chorus_protocol::frame::CHUNK_PREFIX_LEN;
use chorus_protocol::message::Depart;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use parking_lot::MutexGuard;

use super::patience::{Patience, near_miss};
use super::reader::{Place, Placed, Pumped};
use super::shared::Shared;
use crate::matcher::Credit;
use crate::outbound;
use crate::spin::{CROWDED_NAP, SpinBudget, a_core_is_free};

/// Payloads shorter than this are not placed by `recv_into` (read whole frames and copy):
/// placing stops the reader at every frame's head, which costs more than a small copy.
const PLACE_MIN: usize = 4096;

/// What a spin found for its tag.
enum Got {
    /// The frame's payload.
    Payload(Bytes),
    /// The payload is in the spin's destination.
    Placed,
}

/// A data link to one peer through shared memory. Cancel it (or drop it) to leave.
#[derive(Debug)]
pub struct ShmLink {
    pub(super) shared: Arc<Shared>,
    pub(super) spin: SpinBudget,
    /// A park answered within this long was a near miss (`patience::near_miss`).
    pub(super) near: Duration,
}

impl ShmLink {
    /// The communicator and epoch this link serves.
    pub fn comm(&self) -> (CommId, Epoch) {
        (self.shared.peer.comm, self.shared.peer.epoch)
    }

    /// The peer's process id, as the kernel gave it at the handshake.
    pub fn peer_pid(&self) -> i32 {
        self.shared.process.pid()
    }

    fn leave(&self, reason: CancelReason) {
        let depart = self
            .shared
            .matcher
            .fail(LinkError::Cancelled(reason.clone()))
            .then(|| Depart::new(reason.code, reason.detail.to_string()));
        self.shared.close(depart);
    }

    async fn recv_chunk(&self, tag: Tag) -> Result<Bytes, LinkError> {
        match self.spin(&tag, None) {
            Some(Ok(Got::Payload(p))) => return Ok(p),
            Some(Err(e)) => return Err(e),
            Some(Ok(Got::Placed)) | None => {}
        }
        self.park(tag).await
    }

    /// `recv_into`: the spin places a payload that has not reached the decoder yet
    /// straight into `dst`; a payload that did (the pump read it, or the spin gave up) is
    /// copied from the frame.
    async fn recv_chunk_into(&self, tag: Tag, dst: &mut [u8]) -> Result<usize, LinkError> {
        let payload = match self.spin_placing(tag, dst, None) {
            Some(Ok(Got::Placed)) => return Ok(dst.len()),
            Some(Ok(Got::Payload(p))) => p,
            Some(Err(e)) => return Err(e),
            None => self.park(tag).await?,
        };
        if payload.len() == dst.len() {
            dst.copy_from_slice(&payload);
        }
        Ok(payload.len())
    }

    /// `recv_reduce_into`: the spin reduces a payload that has not reached the decoder
    /// yet from the ring into `dst`; a payload that did is reduced from the frame, all of
    /// it or (when a placing pass gave up halfway) the part not reduced yet.
    async fn recv_chunk_reduce(
        &self,
        tag: Tag,
        dst: &mut [u8],
        reduce: Reducer<'_>,
    ) -> Result<usize, LinkError> {
        let mut reduced = 0;
        let payload = match self.spin_placing(tag, dst, Some((reduce, &mut reduced))) {
            Some(Ok(Got::Placed)) => return Ok(dst.len()),
            Some(Ok(Got::Payload(p))) => p,
            Some(Err(e)) => return Err(e),
            None => self.park(tag).await?,
        };
        // A pass gives up only on a payload of `dst`'s length, so `reduced` is in range.
        if payload.len() == dst.len() && reduced < dst.len() {
            reduce(&mut dst[reduced..], &payload[reduced..]);
        }
        Ok(payload.len())
    }

    /// The spin of a receive into `dst`: placing (copying, or reducing with `reduce`, which
    /// then records how much of `dst` a pass that gave up reduced) when `dst` is large
    /// enough for that to pay.
    fn spin_placing(
        &self,
        tag: Tag,
        dst: &mut [u8],
        reduce: Option<(Reducer<'_>, &mut usize)>,
    ) -> Option<Result<Got, LinkError>> {
        if dst.len() < PLACE_MIN {
            return self.spin(&tag, None);
        }
        let (reduce, reduced) = match reduce {
            Some((f, at)) => (Some(f), Some(at)),
            None => (None, None),
        };
        let mut place = Place {
            tag,
            dst,
            window: Duration::ZERO,
            reduce,
            reduced: 0,
            gave_up: false,
        };
        let spun = self.spin(&tag, Some(&mut place));
        if let Some(at) = reduced {
            *at = place.reduced;
        }
        spun
    }

    /// Registers the receive and waits for the pump to deliver it.
    async fn park(&self, tag: Tag) -> Result<Bytes, LinkError> {
        let s = &*self.shared;
        let mut waiting = match s.matcher.register(tag) {
            Ok(waiting) => waiting,
            Err(result) => return result,
        };
        self.read_ring();
        if let Some(result) = waiting.try_result() {
            return result;
        }
        if !s.watching.load(std::sync::atomic::Ordering::SeqCst) {
            s.kick();
        }
        let parked = Instant::now();
        let result = waiting.await;
        if near_miss(parked.elapsed(), self.near) {
            // Undo the spin's narrowing and widen: a longer spin would have caught it.
            self.spin.caught();
            self.spin.caught();
        }
        result
    }

    /// Reads the peer's ring on this thread until `tag`'s payload (or the link's failure)
    /// is here or the spin window has passed; `None` then. With `place`, a payload of its
    /// destination's length whose head the spin reads itself is placed there
    /// (`Got::Placed`).
    fn spin(&self, tag: &Tag, mut place: Option<&mut Place<'_>>) -> Option<Result<Got, LinkError>> {
        let matcher = &self.shared.matcher;
        if let Some(result) = matcher.take(tag) {
            return Some(result.map(Got::Payload));
        }
        let window = self.spin.window();
        if window.is_zero() {
            return None;
        }
        let mut patience = Patience::new(Instant::now(), window);
        let mut crowded = false;
        let mut tries = 0u32;
        let result = loop {
            let took = match place.as_deref_mut() {
                // A pass that gave up handed its part back to the decoder: the frame is
                // then read whole, and no later frame is placed for this receive.
                Some(place) if !place.gave_up => {
                    place.window = window;
                    match self.shared.try_place(place) {
                        Placed::Done => {
                            self.spin.caught();
                            break Some(Ok(Got::Placed));
                        }
                        Placed::Not(pumped) => self.pumped(pumped),
                    }
                }
                _ => {
                    let (pumped, got) = self.shared.try_pump_for(tag);
                    let took = self.pumped(pumped);
                    if let Some(payload) = got {
                        self.spin.caught();
                        break Some(Ok(Got::Payload(payload)));
                    }
                    took
                }
            };
            if let Some(result) = matcher.take(tag) {
                self.spin.caught();
                break Some(result.map(Got::Payload));
            }
            let now = Instant::now();
            patience.took(now, took);
            if patience.spent(now) {
                self.spin.missed();
                break None;
            }
            tries += 1;
            if !tries.is_multiple_of(16) {
                // A load of the peer's tail is cheap: look a few times before yielding.
                std::hint::spin_loop();
                continue;
            }
            let yielding = Instant::now();
            std::thread::yield_now();
            if SpinBudget::crowded(yielding.elapsed()) {
                crowded = true;
                if self.spin.nap_now(a_core_is_free) {
                    std::thread::sleep(CROWDED_NAP);
                }
            }
        };
        self.spin.spun(crowded);
        result
    }

    /// One pass over the peer's ring; the bytes it took.
    fn read_ring(&self) -> usize {
        self.pumped(self.shared.try_pump())
    }

    /// The bytes a pass took, carrying out the close it found.
    fn pumped(&self, pumped: Pumped) -> usize {
        match pumped {
            Pumped::Drained(n) => n,
            Pumped::Busy => 0,
            Pumped::Close(depart) => {
                self.shared.close(depart);
                0
            }
        }
    }

    /// Writes the frame on this thread if the stream is idle; queues the rest for the pump.
    async fn send_frame<'d>(
        &self,
        len: usize,
        admit: impl FnOnce(&mut outbound::Outbound) -> Result<Outgoing<'d>, LinkError>,
    ) -> Result<(), LinkError> {
        let s = &*self.shared;
        let (out, outgoing, credit) =
            outbound::admit_under_credit(&s.outbound, &s.matcher, len, admit).await?;
        self.write_or_queue(out, outgoing, credit)
    }

    /// Writes a numbered frame into the ring if the stream is idle, and queues what the ring
    /// did not take for the pump.
    fn write_or_queue(
        &self,
        mut out: MutexGuard<'_, outbound::Outbound>,
        outgoing: Outgoing<'_>,
        credit: Credit,
    ) -> Result<(), LinkError> {
        let s = &*self.shared;
        let mut written = 0;
        if out.is_idle() {
            let parts = outgoing.parts();
            let total = parts[0].len() + parts[1].len();
            let result = {
                let mut producer = s.producer.lock();
                s.write_some(&mut producer, parts)
            };
            match result {
                Ok(n) => written = n,
                Err(err) => {
                    drop(out);
                    s.matcher.release(credit);
                    s.matcher.fail(err.clone());
                    s.close(None);
                    return Err(err);
                }
            }
            if written == total {
                drop(out);
                s.matcher.release(credit);
                return Ok(());
            }
        }
        let mut frame = outgoing.into_frame(written);
        frame.credit = Some(credit);
        let wake = out.push(frame);
        drop(out);
        if wake {
            s.kick();
        }
        Ok(())
    }

    /// `send_bytes_now` of a frame our ring has room for whole, on an idle stream: numbered
    /// and written at once, under the stream's lock, without taking send-window credit and
    /// giving it straight back (the window bounds the bytes queued for the pump, and none
    /// are: the room only grows while the producer lock is held). A small frame goes in as
    /// one piece, so the peer sees it by one published tail. `None`, with nothing numbered,
    /// when the link has failed, sends wait for credit (this one must not overtake them),
    /// the stream is busy or closing, or the room is short: the general path then takes
    /// it, or says why not.
    fn write_whole(&self, tag: &Tag, data: &[u8]) -> Option<Result<(), LinkError>> {
        let s = &*self.shared;
        if s.matcher.has_failed() || s.matcher.has_queued() {
            return None;
        }
        let mut out = s.outbound.lock();
        if !out.is_idle() || out.is_closing() {
            return None;
        }
        let total = CHUNK_PREFIX_LEN + data.len();
        let mut producer = s.producer.lock();
        if !s.fits(&mut producer, total)? {
            return None;
        }
        let numbered = match out.number_len(&s.matcher, tag, data.len()) {
            Ok(numbered) => numbered,
            Err(e) => return Some(Err(e)),
        };
        let mut whole = [0u8; WHOLE_MAX];
        let parts = if total <= WHOLE_MAX {
            whole[..CHUNK_PREFIX_LEN].copy_from_slice(numbered.prefix());
            whole[CHUNK_PREFIX_LEN..total].copy_from_slice(data);
            [&whole[..total], &[][..]]
        } else {
            [numbered.prefix(), data]
        };
        let written = s.write_some(&mut producer, parts);
        drop(producer);
        match written {
            Ok(n) if n == total => Some(Ok(())),
            // Only a peer that moved its head backwards shrinks the room: the rest goes to
            // the pump, as on the general path.
            Ok(n) => {
                let wake = out.push(numbered.into_frame(data, n));
                drop(out);
                if wake {
                    s.kick();
                }
                Some(Ok(()))
            }
            Err(err) => {
                drop(out);
                s.matcher.fail(err.clone());
                s.close(None);
                Some(Err(err))
            }
        }
    }
}

/// Frames up to this long are written as one piece by `write_whole` (copied together on
/// the stack first), larger ones as their prefix and then their payload.
const WHOLE_MAX: usize = 512;

/// A numbered chunk on its way to the ring.
enum Outgoing<'d> {
    /// A frame that owns its payload (`send`).
    Frame(outbound::OutFrame),
    /// A head for bytes the caller still holds (`send_bytes`): only what the ring cannot
    /// take at once is copied, into a frame for the pump.
    Data(outbound::Numbered, &'d [u8]),
}

impl Outgoing<'_> {
    /// What to write: the head, then the payload.
    fn parts(&self) -> [&[u8]; 2] {
        match self {
            Outgoing::Frame(frame) => {
                let (h, p) = frame.rest();
                [h, p]
            }
            Outgoing::Data(numbered, data) => [numbered.prefix(), data],
        }
    }

    /// The frame to queue once the first `written` bytes are in the ring.
    fn into_frame(self, written: usize) -> outbound::OutFrame {
        match self {
            Outgoing::Frame(mut frame) => {
                frame.off += written;
                frame
            }
            Outgoing::Data(numbered, data) => numbered.into_frame(data, written),
        }
    }
}

impl Link<Bytes> for ShmLink {
    fn peer(&self) -> Rank {
        self.shared.matcher.peer()
    }

    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        // A payload that fits a slot (a barrier's token, a pipeline's credit): into the
        // mailbox, like a small exchange's bytes.
        if self.shared.post(&tag, &payload) {
            return Box::pin(std::future::ready(Ok(())));
        }
        Box::pin(async move {
            let matcher = &*self.shared.matcher;
            let len = payload.len();
            self.send_frame(len, |out| {
                out.admit(matcher, &tag, payload).map(Outgoing::Frame)
            })
            .await
        })
    }

    fn send_bytes<'a>(&'a self, tag: Tag, data: &'a [u8]) -> Option<LinkFuture<'a, ()>> {
        Some(Box::pin(async move {
            let matcher = &*self.shared.matcher;
            self.send_frame(data.len(), |out| {
                let numbered = out.number_len(matcher, &tag, data.len())?;
                Ok(Outgoing::Data(numbered, data))
            })
            .await
        }))
    }

    fn send_bytes_now(&self, tag: Tag, data: &[u8]) -> Option<Result<(), LinkError>> {
        if self.shared.post(&tag, data) {
            return Some(Ok(()));
        }
        if let Some(done) = self.write_whole(&tag, data) {
            return Some(done);
        }
        let s = &*self.shared;
        let admitted = outbound::admit_now(&s.outbound, &s.matcher, data.len(), |out| {
            out.number_len(&s.matcher, &tag, data.len())
        })?;
        Some(admitted.and_then(|(out, numbered, credit)| {
            self.write_or_queue(out, Outgoing::Data(numbered, data), credit)
        }))
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        Box::pin(self.recv_chunk(tag))
    }

    fn recv_into<'a>(&'a self, tag: Tag, dst: &'a mut [u8]) -> Option<LinkFuture<'a, usize>> {
        Some(Box::pin(self.recv_chunk_into(tag, dst)))
    }

    fn recv_reduce_into<'a>(
        &'a self,
        tag: Tag,
        dst: &'a mut [u8],
        reduce: Reducer<'a>,
    ) -> Option<LinkFuture<'a, usize>> {
        Some(Box::pin(self.recv_chunk_reduce(tag, dst, reduce)))
    }

    fn cancel(&self, reason: CancelReason) {
        self.leave(reason);
    }

    fn failure(&self) -> Option<LinkError> {
        self.shared.matcher.terminal()
    }

    fn shares_memory(&self) -> bool {
        true
    }

    fn is_flushed(&self) -> bool {
        let s = &*self.shared;
        if s.matcher.terminal().is_some() {
            return true;
        }
        s.outbound.lock().is_idle() && s.ring_drained()
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        self.leave(CancelReason::new(CloseCode::NORMAL, "link dropped"));
    }
}
