//! The producing half of one shm link: copies a frame's bytes into our ring, in pieces, so
//! the peer copies one piece out while we copy the next one in (a large frame is
//! pipelined through the ring rather than stored and forwarded).

use std::sync::atomic::Ordering;

use chorus_engine::link::LinkError;
use chorus_protocol::CloseCode;

use super::ring::{Producer, Spans};
use super::shared::Shared;

/// Bytes copied in before the tail is published: small enough that the consumer starts
/// early, large enough that the publishing costs nothing next to the copy.
const PIECE: usize = 64 << 10;

/// Bytes published before a sleeping peer is woken, unless the write ends first: a peer
/// that spins sees every piece's tail at once, but one that sleeps is woken once per batch
/// rather than once per piece (each wake-up is a system call here and a context switch
/// there, more than a piece's copy costs).
const WAKE_BATCH: usize = 4 * PIECE;

impl Shared {
    /// Copies as much of `parts` (in order) as our ring has room for; returns how many
    /// bytes it took. A head the peer moved out of range is a protocol violation.
    pub(super) fn write_some(
        &self,
        producer: &mut Producer,
        parts: [&[u8]; 2],
    ) -> Result<usize, LinkError> {
        let mut written = 0;
        let mut unannounced = 0;
        let result = self.write_pieces(producer, parts, &mut written, &mut unannounced);
        if unannounced > 0 {
            self.notify_peer();
        }
        result.map(|()| written)
    }

    fn write_pieces(
        &self,
        producer: &mut Producer,
        parts: [&[u8]; 2],
        written: &mut usize,
        unannounced: &mut usize,
    ) -> Result<(), LinkError> {
        let me = self.me;
        for mut part in parts {
            while !part.is_empty() {
                let spans = self.writable(producer, part.len().min(PIECE))?;
                if spans.is_empty() {
                    return Ok(());
                }
                let n = spans.len();
                self.seg.copy_in(me, &spans, &part[..n]);
                let tail = producer.produce(n);
                // `SeqCst` for `notify_peer`'s handshake with a sleeper. On x86 it is an
                // `xchg` that waits for the tail's line to leave the spinning peer's cache:
                // at 2 ranks, 8 B, most of this function's samples and ~6 % of all. The
                // bound on removing it (a `Release` store here and for the heads in
                // `reader.rs`, which can lose a wake-up) measured alike, 2026-12-05: 2 ranks
                // 8 B in place 0.86–0.93 µs either way over 4 interleaved rounds, 4 ranks
                // within the noise; the stall overlaps the wait for the peer's frame.
                self.tail(me).store(tail, Ordering::SeqCst);
                *written += n;
                *unannounced += n;
                if *unannounced >= WAKE_BATCH {
                    self.notify_peer();
                    *unannounced = 0;
                }
                part = &part[n..];
            }
        }
        Ok(())
    }

    /// Room for `want` bytes (or as many as there are, if fewer): by the head last seen
    /// when that leaves enough, else by the peer's head read now. A head the peer moved out
    /// of range is a protocol violation.
    fn writable(&self, producer: &mut Producer, want: usize) -> Result<Spans, LinkError> {
        let seen = producer.writable_seen(want);
        if seen.len() == want {
            return Ok(seen);
        }
        let head = self.head(self.me).load(Ordering::Acquire);
        producer
            .writable(head, want)
            .map_err(|e| LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!("shm ring: {e}"),
            })
    }

    /// Whether the peer has taken everything we wrote.
    pub(super) fn ring_drained(&self) -> bool {
        let head = self.head(self.me).load(Ordering::Acquire);
        self.producer.lock().is_drained(head)
    }

    /// Whether our ring has room for `n` bytes now (the room only grows while `producer`'s
    /// lock is held); `None` when the peer's head is out of range (the write path reports
    /// that).
    pub(super) fn fits(&self, producer: &mut Producer, n: usize) -> Option<bool> {
        Some(self.writable(producer, n).ok()?.len() == n)
    }

    /// Whether our ring has room for at least one byte.
    pub(super) fn has_room(&self) -> bool {
        let head = self.head(self.me).load(Ordering::Acquire);
        self.producer
            .lock()
            .writable(head, 1)
            .map_or(true, |s| !s.is_empty())
    }
}
