//! A segment handed out raw, for callers that speak the ring themselves (tests, tools): the
//! far end of a link as nothing but the segment's words and bytes, including the ones a
//! well-behaved peer never writes (an index out of range, a closed word).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::message::{Depart, Message};
use chorus_protocol::{CloseCode, Decoder, Encoder, Envelope};

use super::futex;
use super::ring::{Consumer, Producer, SLOT_BYTES, SLOTS, Side, SlotHead, offsets};
use super::segment::Segment;

/// One end of a segment, driven by hand. The caller owns the close ([`RawShm::close`]).
#[derive(Debug)]
pub struct RawShm {
    seg: Segment,
    side: Side,
    producer: Producer,
    consumer: Consumer,
    /// Payloads taken from each slot of the peer's mailbox.
    took: [u32; SLOTS],
    /// Our envelope on the stream.
    pub me: Envelope,
    /// Continues the sequence after our handshake frame.
    pub encoder: Encoder,
    /// Past the handshake, in the established role.
    pub decoder: Decoder,
}

impl RawShm {
    pub(super) fn new(
        seg: Segment,
        side: Side,
        me: Envelope,
        encoder: Encoder,
        decoder: Decoder,
    ) -> RawShm {
        let layout = *seg.layout();
        RawShm {
            seg,
            side,
            producer: Producer::new(&layout),
            consumer: Consumer::new(&layout),
            took: [0; SLOTS],
            me,
            encoder,
            decoder,
        }
    }

    /// Writes all of `bytes` into our ring, waiting (at most `within`) for room; returns
    /// how many it wrote.
    pub fn write(&mut self, bytes: &[u8], within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let mut done = 0;
        while done < bytes.len() && Instant::now() < deadline {
            match self.write_now(&bytes[done..], false) {
                None => return done,
                Some(0) => std::thread::sleep(Duration::from_micros(100)),
                Some(n) => done += n,
            }
        }
        done
    }

    /// Writes what fits of `bytes` into our ring now (with `whole`, all of it or nothing)
    /// and publishes it; `None` if the peer's head is out of range.
    fn write_now(&mut self, bytes: &[u8], whole: bool) -> Option<usize> {
        let layout = *self.seg.layout();
        let head = self
            .seg
            .word64(layout.head(self.side))
            .load(Ordering::Acquire);
        let spans = self.producer.writable(head, bytes.len()).ok()?;
        let n = spans.len();
        if n == 0 || (whole && n < bytes.len()) {
            return Some(0);
        }
        self.seg.copy_in(self.side, &spans, &bytes[..n]);
        let tail = self.producer.produce(n);
        self.set_tail(tail);
        Some(n)
    }

    /// Writes a `Depart` frame with `code` and `detail` if the ring has room for all of it
    /// now (a fresh ring always has), without waiting; nothing otherwise.
    pub(super) fn depart_now(&mut self, code: CloseCode, detail: &str) {
        let depart = Message::Depart(Depart::new(code, detail.to_owned()));
        let mut frame = BytesMut::new();
        if self.encoder.encode(&self.me, &depart, &mut frame).is_ok() {
            self.write_now(&frame, true);
        }
    }

    /// Publishes `tail` as our ring's tail, whatever it is, and wakes the peer.
    pub fn set_tail(&mut self, tail: u64) {
        let layout = *self.seg.layout();
        self.seg
            .word64(layout.tail(self.side))
            .store(tail, Ordering::SeqCst);
        self.wake_peer();
    }

    /// Our ring's tail as we last wrote it.
    pub fn tail(&self) -> u64 {
        self.producer.tail()
    }

    /// The bytes the peer wrote so far, waiting at most `within` for at least one.
    pub fn read(&mut self, within: Duration) -> BytesMut {
        let deadline = Instant::now() + within;
        let layout = *self.seg.layout();
        let peer = self.side.peer();
        let mut out = BytesMut::new();
        loop {
            let tail = self.seg.word64(layout.tail(peer)).load(Ordering::Acquire);
            if let Ok(spans) = self.consumer.readable(tail, usize::MAX)
                && !spans.is_empty()
            {
                self.seg.copy_out(peer, &spans, &mut out);
                let head = self.consumer.consume(spans.len());
                self.seg
                    .word64(layout.head(peer))
                    .store(head, Ordering::SeqCst);
                self.wake_peer();
                continue;
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Writes slot `k` of our mailbox, every field as given, whatever it holds (a
    /// well-behaved writer waits for the peer to take the last payload first), the count
    /// `put` last, and wakes the peer.
    pub fn write_slot(&mut self, k: usize, slot: &RawSlot, put: u32) {
        let at = self.seg.layout().slot(self.side, k);
        self.seg.store_slot_head(
            at,
            &SlotHead {
                len: slot.len,
                op: slot.op,
                step: slot.step,
                codes: slot.codes,
                offset: slot.offset,
            },
        );
        let n = slot.payload.len().min(SLOT_BYTES);
        self.seg
            .put_bytes(at + offsets::SLOT_PAYLOAD, &slot.payload[..n]);
        self.seg
            .word32(at + offsets::SLOT_PUT)
            .store(put, Ordering::SeqCst);
        self.wake_peer();
    }

    /// The peer's count of payloads taken from slot `k` of our mailbox.
    pub fn peer_took(&self, k: usize) -> u32 {
        let at = self.seg.layout().took(self.side, k);
        self.seg.word32(at).load(Ordering::SeqCst)
    }

    /// The first line of slot `k` of the peer's mailbox, byte for byte.
    pub fn peer_slot_line(&self, k: usize) -> [u8; 64] {
        let mut line = [0u8; 64];
        let at = self.seg.layout().slot(self.side.peer(), k);
        self.seg.get_bytes(at, &mut line);
        line
    }

    /// Takes the payload slot `k` of the peer's mailbox holds, if it holds one we have not
    /// taken (its payload cut to [`SLOT_BYTES`]), and counts it taken.
    pub fn take_slot(&mut self, k: usize) -> Option<RawSlot> {
        let at = self.seg.layout().slot(self.side.peer(), k);
        let put = self
            .seg
            .word32(at + offsets::SLOT_PUT)
            .load(Ordering::Acquire);
        if put == self.took[k % SLOTS] {
            return None;
        }
        let head = self.seg.load_slot_head(at);
        let mut payload = vec![0u8; (head.len as usize).min(SLOT_BYTES)];
        self.seg.get_bytes(at + offsets::SLOT_PAYLOAD, &mut payload);
        let slot = RawSlot {
            len: head.len,
            op: head.op,
            step: head.step,
            codes: head.codes,
            offset: head.offset,
            payload,
        };
        self.took[k % SLOTS] = put;
        let took = self.seg.layout().took(self.side.peer(), k);
        self.seg.word32(took).store(put, Ordering::Release);
        Some(slot)
    }

    /// Whether the peer has set its closed word.
    pub fn peer_closed(&self) -> bool {
        let layout = *self.seg.layout();
        self.seg
            .word32(layout.closed(self.side.peer()))
            .load(Ordering::SeqCst)
            != 0
    }

    /// Sets our closed word and wakes the peer.
    pub fn close(&mut self) {
        self.seg.close(self.side);
    }

    fn wake_peer(&self) {
        let layout = *self.seg.layout();
        let bell = self.seg.word32(layout.bell(self.side.peer()));
        bell.fetch_add(1, Ordering::SeqCst);
        futex::wake(bell);
    }
}

/// A mailbox slot's fields as raw words (`protocol/SPEC.md`, "Mailboxes"), as a raw end
/// writes or reads them: nothing is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSlot {
    /// The payload's length as written (a well-behaved writer keeps it to `SLOT_BYTES`).
    pub len: u32,
    pub op: u64,
    pub step: u32,
    /// The collective's code in the low byte, the dtype's in the next.
    pub codes: u32,
    pub offset: u64,
    pub payload: Vec<u8>,
}
