//! A segment handed out raw, for callers that speak the ring themselves (tests, tools): the
//! far end of a link as nothing but the segment's words and bytes, including the ones a
//! well-behaved peer never writes (an index out of range, a closed word).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::{Decoder, Encoder, Envelope};

use super::futex;
use super::ring::{Consumer, Producer, Side};
use super::segment::Segment;

/// One end of a segment, driven by hand. The caller owns the close ([`RawShm::close`]).
#[derive(Debug)]
pub struct RawShm {
    seg: Segment,
    side: Side,
    producer: Producer,
    consumer: Consumer,
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
            me,
            encoder,
            decoder,
        }
    }

    /// Writes all of `bytes` into our ring, waiting (at most `within`) for room; returns
    /// how many it wrote.
    pub fn write(&mut self, bytes: &[u8], within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let layout = *self.seg.layout();
        let mut done = 0;
        while done < bytes.len() && Instant::now() < deadline {
            let head = self
                .seg
                .word64(layout.head(self.side))
                .load(Ordering::Acquire);
            let Ok(spans) = self.producer.writable(head, bytes.len() - done) else {
                return done;
            };
            if spans.is_empty() {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            let n = spans.len();
            self.seg.copy_in(self.side, &spans, &bytes[done..done + n]);
            let tail = self.producer.produce(n);
            self.set_tail(tail);
            done += n;
        }
        done
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
