//! The mailboxes: a small payload's lane beside the ring. Each side of a segment owns one
//! mailbox of [`SLOTS`] slots; a payload of at most [`SLOT_BYTES`] goes into the slot its
//! tag picks ([`slot_of`]), with the tag beside it, published by one store of the slot's
//! count. The peer finds it with one load of a line it would read anyway and copies it out:
//! no frame to encode or decode, no sequence number, no bytes through the ring. A payload
//! of up to 32 bytes (a scalar's all-reduce, a token) shares the count's line, so it
//! travels as that one line.
//!
//! A slot is free again once the peer's count of payloads taken from it equals ours put.
//! A writer that finds its slot still full (a group of many small operations, a peer that
//! lags) sends through the ring instead: nobody ever waits for a slot. Payloads of one tag
//! are matched by tag, whichever way they came, so the two lanes need not keep each other's
//! order, with one exception: a departure. Every reading pass sweeps the mailbox right
//! after it reads the ring's tail and before it decodes the bytes that tail covers, so a
//! payload posted before a `Depart` frame is delivered before the departure fails the link.
//!
//! The peer may write any slot at any time: a length over [`SLOT_BYTES`] or codes the engine
//! does not know end the stream as a protocol violation, a bumped count delivers whatever
//! the slot holds (bounded like any arrival by the matcher's held limit), and the payload is
//! copied out before anything reads it. `protocol/SPEC.md` ("Mailboxes") is the format.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use chorus_engine::link::Tag;
use chorus_protocol::{CloseCode, Collective, DType, OpSeq};

use super::reader::Claim;
use super::ring::{SLOT_BYTES, SLOTS, SlotHead, check_slot, offsets, slot_of};
use super::shared::{ReadState, Shared};
use crate::inbound::{self, Flow};

/// The writing half's counts, behind their own lock.
#[derive(Debug, Default)]
pub(super) struct MailOut {
    /// Payloads put into each of our slots (the count published with the last).
    put: [u32; SLOTS],
    /// The peer's count of payloads taken from each, as last read (all at once): a slot
    /// whose count equals `put` is free without reading the peer's line again.
    took: [u32; SLOTS],
}

impl Shared {
    /// Puts `data` under `tag` into our mailbox if it fits a slot and its slot is free:
    /// true then, and the payload is the peer's (a sleeping peer is woken). False, with
    /// nothing written, when it is too long, the slot is full, the link has failed or
    /// sends wait for window credit (this one must not overtake them, as on the ring): the
    /// ring's path takes it, or says why not.
    pub(super) fn post(&self, tag: &Tag, data: &[u8]) -> bool {
        if data.len() > SLOT_BYTES || self.matcher.has_failed() || self.matcher.has_queued() {
            return false;
        }
        let k = slot_of(tag.op.0, tag.step);
        let layout = *self.seg.layout();
        let slot = layout.slot(self.me, k);
        let mut out = self.mail_out.lock();
        let put = out.put[k];
        if out.took[k] != put {
            // The peer's counts for all our slots share one line, which it writes on every
            // take: one read refreshes them all, so the slots of the next few operations
            // (taken long ago) are found free without another cross-core miss. Acquire:
            // the peer's copy of a slot's last payload is done before we overwrite it.
            for (j, took) in out.took.iter_mut().enumerate() {
                *took = self
                    .seg
                    .word32(layout.took(self.me, j))
                    .load(Ordering::Acquire);
            }
            if out.took[k] != put {
                return false;
            }
        }
        let head = SlotHead {
            // In range: `data.len() <= SLOT_BYTES`.
            len: data.len() as u32,
            op: tag.op.0,
            step: tag.step,
            codes: u32::from(tag.collective.code()) | u32::from(tag.dtype.code()) << 8,
            offset: tag.offset,
        };
        self.seg.store_slot_head(slot, &head);
        self.seg.put_bytes(slot + offsets::SLOT_PAYLOAD, data);
        let put = put.wrapping_add(1);
        // SeqCst, as the ring's tail: either the peer's re-check after it set `sleeping`
        // sees this count, or `notify_peer` sees its `sleeping`.
        self.seg
            .word32(slot + offsets::SLOT_PUT)
            .store(put, Ordering::SeqCst);
        out.put[k] = put;
        drop(out);
        self.notify_peer();
        true
    }

    /// Whether the peer's mailbox holds a payload we have not taken.
    pub(super) fn mail_waiting(&self, st: &ReadState) -> bool {
        let layout = *self.seg.layout();
        let peer = self.me.peer();
        (0..SLOTS).any(|k| {
            let put = self.seg.word32(layout.slot(peer, k) + offsets::SLOT_PUT);
            put.load(Ordering::SeqCst) != st.took[k]
        })
    }

    /// Takes every payload the peer's mailbox holds: the one `claim` wants is kept there,
    /// the others delivered to the matcher. The number taken; `Err` with the close when a
    /// slot breaks the format or the matcher refuses a payload.
    pub(super) fn sweep(&self, st: &mut ReadState, claim: &mut Claim) -> Result<usize, Flow> {
        let layout = *self.seg.layout();
        let peer = self.me.peer();
        let mut taken = 0;
        for k in 0..SLOTS {
            let slot = layout.slot(peer, k);
            let put = self
                .seg
                .word32(slot + offsets::SLOT_PUT)
                .load(Ordering::Acquire);
            if put == st.took[k] {
                continue;
            }
            let head = self.seg.load_slot_head(slot);
            let (len, collective, dtype) =
                check_slot(head.len, head.codes).map_err(|e| self.ring_violation(&e))?;
            let (Some(collective), Some(dtype)) =
                (Collective::from_code(collective), DType::from_code(dtype))
            else {
                return Err(inbound::on_violation(
                    &self.matcher,
                    CloseCode::PROTOCOL_VIOLATION,
                    format!(
                        "shm mailbox slot {k}: unknown collective {collective} or dtype {dtype}"
                    ),
                ));
            };
            let tag = Tag {
                collective,
                op: OpSeq(head.op),
                step: head.step,
                offset: head.offset,
                dtype,
            };
            let mut payload = vec![0u8; len];
            self.seg
                .get_bytes(slot + offsets::SLOT_PAYLOAD, &mut payload);
            st.took[k] = put;
            // Release: our copy is done before the peer may write the slot again.
            self.seg
                .word32(layout.took(peer, k))
                .store(put, Ordering::Release);
            taken += 1;
            let payload = Bytes::from(payload);
            match claim {
                Claim::Want(want) if *want == tag => *claim = Claim::Got(payload),
                _ => {
                    if let Flow::Close(depart) = inbound::deliver(&self.matcher, tag, payload) {
                        return Err(Flow::Close(depart));
                    }
                }
            }
        }
        Ok(taken)
    }
}
