//! The producing half of one shm link: copies a frame's bytes into our ring, in pieces, so
//! the peer copies one piece out while we copy the next one in (a large frame is
//! pipelined through the ring rather than stored and forwarded).

use std::sync::atomic::Ordering;

use chorus_engine::link::LinkError;
use chorus_protocol::CloseCode;

use super::ring::Producer;
use super::shared::Shared;

/// Bytes copied in before the tail is published: small enough that the consumer starts
/// early, large enough that the publishing costs nothing next to the copy.
const PIECE: usize = 64 << 10;

impl Shared {
    /// Copies as much of `parts` (in order) as our ring has room for; returns how many
    /// bytes it took. A head the peer moved out of range is a protocol violation.
    pub(super) fn write_some(
        &self,
        producer: &mut Producer,
        parts: [&[u8]; 2],
    ) -> Result<usize, LinkError> {
        let me = self.me;
        let mut written = 0;
        for mut part in parts {
            while !part.is_empty() {
                let head = self.head(me).load(Ordering::Acquire);
                let spans = producer
                    .writable(head, part.len().min(PIECE))
                    .map_err(|e| LinkError::Protocol {
                        code: CloseCode::PROTOCOL_VIOLATION,
                        detail: format!("shm ring: {e}"),
                    })?;
                if spans.is_empty() {
                    return Ok(written);
                }
                let n = spans.len();
                self.seg.copy_in(me, &spans, &part[..n]);
                let tail = producer.produce(n);
                self.tail(me).store(tail, Ordering::SeqCst);
                self.notify_peer();
                written += n;
                part = &part[n..];
            }
        }
        Ok(written)
    }

    /// Whether the peer has taken everything we wrote.
    pub(super) fn ring_drained(&self) -> bool {
        let head = self.head(self.me).load(Ordering::Acquire);
        self.producer.lock().is_drained(head)
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
