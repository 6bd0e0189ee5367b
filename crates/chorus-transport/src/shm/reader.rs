//! The consuming half of one shm link: copies what the peer's ring holds into the stream's
//! decoder and hands every whole frame to the matcher, under the reader lock (so the pump
//! thread and a spinning `recv` take turns, and the stream stays in order).
//!
//! The peer's tail is read once per pass and checked against our own head (`Consumer`);
//! a tail out of range is a protocol violation that ends the stream. Each pass copies at
//! most one ring's worth, and the decoder holds at most the frame in progress, whose length
//! it checks against the limits before it reserves for it: memory stays bounded whatever
//! the peer writes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::link::{Reducer, Tag};
use chorus_protocol::message::{Depart, Message};
use chorus_protocol::{ChunkHead, CloseCode, Collective, DType};

use super::patience::Patience;
use super::ring::RingError;
use super::shared::{ReadState, Shared};
use crate::inbound::{self, Flow};

/// What a pass over the peer's ring found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pumped {
    /// Everything the ring held is decoded; this many bytes were taken.
    Drained(usize),
    /// Another thread is reading right now.
    Busy,
    /// The stream is over: close the link with this departure, if any.
    Close(Option<Depart>),
}

impl ReadState {
    fn end(&mut self, depart: Option<Depart>) -> Pumped {
        self.ended = Some(depart.clone());
        Pumped::Close(depart)
    }
}

impl Shared {
    /// Reads the peer's ring, waiting for another reader to finish.
    pub(super) fn pump(&self) -> Pumped {
        let mut st = self.reader.lock();
        self.drain(&mut st, &mut Claim::None)
    }

    /// Like [`Shared::pump`], but `Busy` at once if another thread is reading.
    pub(super) fn try_pump(&self) -> Pumped {
        match self.reader.try_lock() {
            Some(mut st) => self.drain(&mut st, &mut Claim::None),
            None => Pumped::Busy,
        }
    }

    /// [`Shared::try_pump`] for a receive waiting for `tag` on this thread: the first chunk
    /// under `tag` is handed back (`Some`) rather than delivered to the matcher, which
    /// would only hold it for the receive to take at once.
    pub(super) fn try_pump_for(&self, tag: &Tag) -> (Pumped, Option<Bytes>) {
        let Some(mut st) = self.reader.try_lock() else {
            return (Pumped::Busy, None);
        };
        let mut claim = Claim::Want(*tag);
        let pumped = self.drain(&mut st, &mut claim);
        match claim {
            Claim::Got(payload) => (pumped, Some(payload)),
            _ => (pumped, None),
        }
    }

    /// Whether the peer's ring or mailbox holds bytes we have not taken (a bad index
    /// counts: the next pass reports it). A reader busy right now takes them itself: no.
    pub(super) fn readable(&self) -> bool {
        let tail = self.tail(self.me.peer()).load(Ordering::SeqCst);
        match self.reader.try_lock() {
            Some(st) => {
                st.ended.is_none() && (tail != st.consumer.head() || self.mail_waiting(&st))
            }
            None => false,
        }
    }

    fn drain(&self, st: &mut ReadState, claim: &mut Claim) -> Pumped {
        if let Some(depart) = &st.ended {
            return Pumped::Close(depart.clone());
        }
        let peer = self.me.peer();
        let mut taken = 0;
        loop {
            let tail = self.tail(peer).load(Ordering::Acquire);
            // After the tail, before its bytes: see `mailbox.rs` on departures.
            match self.sweep(st, claim) {
                Ok(n) => taken += n,
                Err(flow) => return st.end(flow_depart(flow)),
            }
            let spans = match st.consumer.readable(tail, usize::MAX) {
                Ok(spans) => spans,
                Err(e) => return st.end(flow_depart(self.ring_violation(&e))),
            };
            if spans.is_empty() {
                return Pumped::Drained(taken);
            }
            self.seg.copy_out(peer, &spans, st.decoder.recv_buf());
            let head = st.consumer.consume(spans.len());
            taken += spans.len();
            self.head(peer).store(head, Ordering::SeqCst);
            self.notify_peer();
            if let Flow::Close(depart) = self.decode(st, claim) {
                return st.end(depart);
            }
        }
    }

    fn decode(&self, st: &mut ReadState, claim: &mut Claim) -> Flow {
        loop {
            let flow = match st.decoder.next() {
                Ok(Some(frame)) => match claim {
                    Claim::Want(tag) if inbound::chunk_tag(&self.peer, &frame) == Some(*tag) => {
                        if let Message::Chunk(chunk) = frame.message {
                            *claim = Claim::Got(chunk.payload);
                        }
                        Flow::Continue
                    }
                    _ => inbound::on_frame(&self.matcher, &self.peer, frame),
                },
                Ok(None) => return Flow::Continue,
                Err(e) => inbound::on_decode_error(&self.matcher, &e),
            };
            if let Flow::Close(_) = flow {
                return flow;
            }
        }
    }
}

/// What a pass does with a chunk under the tag a receive on its thread waits for.
pub(super) enum Claim {
    /// Deliver every frame to the matcher (the pump, a placing pass).
    None,
    /// Keep the first chunk under this tag.
    Want(Tag),
    /// Kept.
    Got(Bytes),
}

fn flow_depart(flow: Flow) -> Option<Depart> {
    match flow {
        Flow::Close(depart) => depart,
        Flow::Continue => None,
    }
}

/// Bytes of ring a reducing placement stages at a time: well inside L1 with the
/// destination's block, and a bound on the staging whatever the payload's length.
pub(super) const BOUNCE: usize = 16 * 1024;

/// A placement publishes its head after every block, but wakes a sleeping peer (whose
/// pump sleeps with one flag for data and for room) only this often, before it waits and
/// when it is done: a wake per bounce block would cost the peer a futex wake-up per 16 KiB.
const WAKE_EVERY: usize = 256 * 1024;

/// A receive on this thread that takes its chunk's payload from the ring straight into
/// `dst` (`Link::recv_into`), skipping the decoder's buffer: one copy fewer. With
/// `reduce` (`Link::recv_reduce_into`), the payload is reduced into `dst` instead, block
/// by block through a small aligned bounce buffer (the kernel reads private, aligned
/// memory, and an element split by the ring's wrap is whole there), never buffered whole.
///
/// Only the thread that polls the receive ever writes `dst`, and only inside one pass that
/// holds the reader lock from the chunk's head to its last byte, so the borrow can never
/// outlive the bytes' arrival. A pass that must give up halfway (the peer stalls past
/// `window`, the link fails) hands the part it placed back to the decoder, which then holds
/// exactly what it would have read itself, and the pump finishes the frame as usual. A
/// reducing pass hands back `dst`'s bytes instead (their places in the payload, whose
/// contents the receive then ignores) and records in `reduced` how many it reduced: the
/// receive reduces only the rest of the payload the pump delivers.
pub(super) struct Place<'d> {
    pub(super) tag: Tag,
    pub(super) dst: &'d mut [u8],
    /// How long the placement waits without progress for the rest of the payload.
    pub(super) window: Duration,
    /// Reduce into `dst` rather than copy.
    pub(super) reduce: Option<Reducer<'d>>,
    /// Bytes at the front of `dst` already reduced by a pass that gave up.
    pub(super) reduced: usize,
    /// A pass gave up on this payload: the pump finishes it, and no later pass places.
    pub(super) gave_up: bool,
}

/// What a placing pass found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Placed {
    /// The chunk's payload is in `dst`.
    Done,
    /// It is not (yet): what the pass did otherwise.
    Not(Pumped),
}

impl Shared {
    /// Like [`Shared::try_pump`], but the chunk `place` waits for is placed straight into
    /// its destination if its payload has not been buffered yet. The pass copies no more
    /// from the ring than the frame in progress needs, so it stops at each frame's head.
    pub(super) fn try_place(&self, place: &mut Place<'_>) -> Placed {
        let Some(mut guard) = self.reader.try_lock() else {
            return Placed::Not(Pumped::Busy);
        };
        let st = &mut *guard;
        if let Some(depart) = &st.ended {
            return Placed::Not(Pumped::Close(depart.clone()));
        }
        let peer = self.me.peer();
        let mut taken = 0;
        loop {
            if let Flow::Close(depart) = self.decode(st, &mut Claim::None) {
                return Placed::Not(st.end(depart));
            }
            match st.decoder.chunk_head() {
                Ok(Some(head)) if self.is_for(&head, place) => {
                    return match self.place(st, place) {
                        Ok(true) => Placed::Done,
                        Ok(false) => Placed::Not(Pumped::Drained(taken)),
                        Err(flow) => Placed::Not(st.end(flow_depart(flow))),
                    };
                }
                Ok(_) => {}
                Err(e) => {
                    let flow = inbound::on_decode_error(&self.matcher, &e);
                    return Placed::Not(st.end(flow_depart(flow)));
                }
            }
            let want = match st.decoder.head_wanted() {
                0 => st.decoder.wanted(),
                n => n,
            };
            let tail = self.tail(peer).load(Ordering::Acquire);
            match self.sweep(st, &mut Claim::None) {
                Ok(n) => taken += n,
                Err(flow) => return Placed::Not(st.end(flow_depart(flow))),
            }
            let spans = match st.consumer.readable(tail, want) {
                Ok(spans) => spans,
                Err(e) => return Placed::Not(st.end(flow_depart(self.ring_violation(&e)))),
            };
            if spans.is_empty() {
                return Placed::Not(Pumped::Drained(taken));
            }
            self.seg.copy_out(peer, &spans, st.decoder.recv_buf());
            let head = st.consumer.consume(spans.len());
            taken += spans.len();
            self.head(peer).store(head, Ordering::SeqCst);
            self.notify_peer();
        }
    }

    /// Whether the chunk whose head is buffered is the one `place` waits for: the same tag,
    /// a payload of exactly its length, the link's epoch, and no failure recorded. Anything
    /// else takes the decoder's path, which reports what is wrong.
    fn is_for(&self, head: &ChunkHead, place: &Place<'_>) -> bool {
        let c = &head.chunk;
        let tag = Tag {
            collective: match Collective::from_code(c.collective) {
                Some(collective) => collective,
                None => return false,
            },
            op: c.op,
            step: c.step,
            offset: c.offset,
            dtype: match DType::from_code(c.dtype) {
                Some(dtype) => dtype,
                None => return false,
            },
        };
        tag == place.tag
            && head.payload_len == place.dst.len()
            && head.frame.epoch == self.peer.epoch
            && self.matcher.terminal().is_none()
    }

    /// Copies the payload of the chunk whose head is buffered from the ring into `place`:
    /// `Ok(true)` once all of it is there and the frame is ended; `Ok(false)` if it gave
    /// up, the part it placed handed back to the decoder.
    fn place(&self, st: &mut ReadState, place: &mut Place<'_>) -> Result<bool, Flow> {
        let peer = self.me.peer();
        let len = place.dst.len();
        // A reduction takes whole elements only; a copy takes any byte.
        let (unit, most) = match place.reduce {
            Some(_) => (place.tag.dtype.size(), BOUNCE),
            None => (1, usize::MAX),
        };
        if place.reduce.is_some() && st.bounce.len() < BOUNCE / 8 {
            st.bounce.resize(BOUNCE / 8, 0);
        }
        let mut filled = 0;
        let mut patience = Patience::new(Instant::now(), place.window);
        let mut tries = 0u32;
        // Bytes consumed since the peer was last told (see `WAKE_EVERY`).
        let mut unwoken = 0;
        while filled < len {
            let tail = self.tail(peer).load(Ordering::Acquire);
            let mut spans = st
                .consumer
                .readable(tail, (len - filled).min(most))
                .map_err(|e| self.ring_violation(&e))?;
            let whole = spans.len() - spans.len() % unit;
            if whole != spans.len() {
                // The same tail, fewer bytes: cannot fail where the wider call did not.
                spans = st
                    .consumer
                    .readable(tail, whole)
                    .map_err(|e| self.ring_violation(&e))?;
            }
            if !spans.is_empty() {
                let n = spans.len();
                // In range: `readable` returns at most `len - filled` bytes.
                let to = &mut place.dst[filled..filled + n];
                match place.reduce {
                    None => self.seg.copy_out_to(peer, &spans, to),
                    Some(reduce) => {
                        // At most `BOUNCE` bytes, and the buffer holds that many.
                        let staged = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut st.bounce)[..n];
                        self.seg.copy_out_to(peer, &spans, staged);
                        reduce(to, staged);
                    }
                }
                filled += n;
                let head = st.consumer.consume(n);
                self.head(peer).store(head, Ordering::SeqCst);
                unwoken += n;
                if unwoken >= WAKE_EVERY {
                    self.notify_peer();
                    unwoken = 0;
                }
                patience.took(Instant::now(), n);
                continue;
            }
            // About to wait: a peer asleep for room gets it now.
            if unwoken > 0 {
                self.notify_peer();
                unwoken = 0;
            }
            let now = Instant::now();
            if patience.spent(now) || self.peer_closed() || self.matcher.terminal().is_some() {
                st.decoder.push(&place.dst[..filled]);
                place.gave_up = true;
                if place.reduce.is_some() {
                    place.reduced = filled;
                }
                return Ok(false);
            }
            tries += 1;
            if tries.is_multiple_of(16) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if unwoken > 0 {
            self.notify_peer();
        }
        match st.decoder.skip_placed() {
            Ok(()) => Ok(true),
            Err(e) => Err(inbound::on_decode_error(&self.matcher, &e)),
        }
    }

    pub(super) fn ring_violation(&self, e: &RingError) -> Flow {
        inbound::on_violation(
            &self.matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!("shm ring: {e}"),
        )
    }
}
