//! The staging schedule: how one device payload crosses a host link (tcp, quic, shm) in
//! parts, with the device-to-host copy of a later part overlapping the send of an earlier one.
//!
//! No IO and no CUDA here: [`StagePlan`] cuts a payload into parts, [`Header`] is the few
//! bytes that open the first part on the wire, [`Parts`] names each part's tag, and
//! [`SendPipeline`] / [`RecvPipeline`] decide, step by step, what the driver
//! ([`crate::staged::StagedLink`]) does next with its `depth` pinned host slots. The driver
//! only carries the steps out, so the order and the slot reuse are tested here on the CPU.

use std::ops::Range;

use chorus_engine::link::Tag;
use chorus_protocol::OpSeq;

/// The most parts one payload may be cut into (the part index rides in the tag's op bits
/// [`PART_SHIFT`]..63, below the engine's point-to-point bit).
pub const MAX_PARTS: u32 = 1 << 15;

/// Where a part's index sits in its tag's op sequence number.
pub const PART_SHIFT: u32 = 48;

/// Parts are whole multiples of this many bytes (the last aside), so every part is whole
/// elements of any dtype: host links check that a message is.
pub const PART_ALIGN: usize = 16;

/// Bytes of the [`Header`] that opens every payload's first part.
pub const HEADER_BYTES: usize = 16;

const MAGIC: u32 = u32::from_le_bytes(*b"CGPU");

/// How payloads are cut: `chunk_bytes` per part, `depth` parts staged at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagePlan {
    chunk_bytes: usize,
    depth: u32,
}

/// Why a plan, a header or a part is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    /// The plan's numbers cannot work.
    #[error("staging plan: {0}")]
    Plan(String),
    /// A payload would need more parts than a tag can name.
    #[error("a payload of {len} bytes needs {parts} parts of {chunk} bytes (at most {MAX_PARTS})")]
    TooManyParts {
        /// The payload's length.
        len: u64,
        /// The part size.
        chunk: u64,
        /// Parts it would need.
        parts: u64,
    },
    /// The engine's sequence number already uses the bits a part index needs.
    #[error("operation {0} is too large a sequence number to stage")]
    SeqTooLarge(u64),
    /// The peer's first part does not start with a valid header.
    #[error("bad staging header: {0}")]
    Header(String),
    /// A part's length is not what the header announced.
    #[error("part {part} holds {got} bytes, the header announced {want}")]
    PartLength {
        /// The part's index.
        part: u32,
        /// Bytes it should hold.
        want: usize,
        /// Bytes it holds.
        got: usize,
    },
}

impl StagePlan {
    /// Parts of `chunk_bytes` (a positive multiple of [`PART_ALIGN`]), `depth` (at least 1)
    /// of them staged at once.
    pub fn new(chunk_bytes: usize, depth: u32) -> Result<StagePlan, StageError> {
        if chunk_bytes == 0
            || chunk_bytes > u32::MAX as usize
            || !chunk_bytes.is_multiple_of(PART_ALIGN)
        {
            return Err(StageError::Plan(format!(
                "chunk of {chunk_bytes} bytes is not a multiple of {PART_ALIGN} below 4 GiB"
            )));
        }
        if depth == 0 {
            return Err(StageError::Plan("depth must be at least 1".into()));
        }
        Ok(StagePlan { chunk_bytes, depth })
    }

    /// Bytes per part.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Parts staged at once (pinned host slots per direction).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The header for a payload of `len` bytes cut by this plan: parts of `chunk_bytes`,
    /// or larger ones where that would take more than [`MAX_PARTS`].
    pub fn header(&self, len: usize) -> Result<Header, StageError> {
        let chunk = if len.div_ceil(self.chunk_bytes) > MAX_PARTS as usize {
            let needed = len.div_ceil(MAX_PARTS as usize).div_ceil(PART_ALIGN) * PART_ALIGN;
            self.chunk_bytes.max(needed)
        } else {
            self.chunk_bytes
        };
        let h = Header {
            total: len as u64,
            chunk: u32::try_from(chunk).map_err(|_| StageError::TooManyParts {
                len: len as u64,
                chunk: self.chunk_bytes as u64,
                parts: (len as u64).div_ceil(self.chunk_bytes as u64),
            })?,
        };
        h.parts()?;
        Ok(h)
    }
}

/// What opens a payload's first part: its total length and the sender's part size, so the
/// receiver knows how many parts follow without trusting its own configuration to match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The payload's length in bytes.
    pub total: u64,
    /// Bytes per part (the last may be shorter).
    pub chunk: u32,
}

impl Header {
    /// `magic u32 | chunk u32 | total u64`, little-endian.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.chunk.to_le_bytes());
        b[8..].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// The header at the start of `bytes`, checked against `max_total` (the most a payload
    /// may hold on this link): a peer's bytes are parsed once, here.
    pub fn decode(bytes: &[u8], max_total: u64) -> Result<Header, StageError> {
        let Some(head) = bytes.get(..HEADER_BYTES) else {
            return Err(StageError::Header(format!(
                "{} bytes, shorter than a header",
                bytes.len()
            )));
        };
        let word = |r: Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&head[r]);
            u64::from_le_bytes(w)
        };
        if word(0..4) != u64::from(MAGIC) {
            return Err(StageError::Header("wrong magic".into()));
        }
        let h = Header {
            chunk: word(4..8) as u32,
            total: word(8..16),
        };
        if h.chunk == 0 {
            return Err(StageError::Header("zero part size".into()));
        }
        if h.total > max_total {
            return Err(StageError::Header(format!(
                "{} bytes announced, the link holds at most {max_total}",
                h.total
            )));
        }
        h.parts()?;
        Ok(h)
    }

    /// How many parts the payload travels in (one, even when empty).
    pub fn parts(&self) -> Result<u32, StageError> {
        let chunk = u64::from(self.chunk.max(1));
        let parts = self.total.div_ceil(chunk).max(1);
        if parts > u64::from(MAX_PARTS) {
            return Err(StageError::TooManyParts {
                len: self.total,
                chunk,
                parts,
            });
        }
        Ok(parts as u32)
    }

    /// The byte range of part `i` within the payload.
    pub fn range(&self, i: u32) -> Range<usize> {
        let chunk = self.chunk as u64;
        let start = (u64::from(i) * chunk).min(self.total);
        let end = (start + chunk).min(self.total);
        start as usize..end as usize
    }
}

/// The tags of one payload's parts: part 0 travels under the engine's own tag (a one-part
/// payload is an ordinary message), part `i` under the same tag with `i` in the op's
/// bits [`PART_SHIFT`].. , so both ends derive the same tags with no extra state.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    tag: Tag,
}

impl Parts {
    /// The parts of the payload the engine tagged `tag`; its sequence number must leave the
    /// part bits clear (it does below 2^48 operations).
    pub fn new(tag: Tag) -> Result<Parts, StageError> {
        let mask = (u64::from(MAX_PARTS) - 1) << PART_SHIFT;
        if tag.op.0 & mask != 0 {
            return Err(StageError::SeqTooLarge(tag.op.0));
        }
        Ok(Parts { tag })
    }

    /// The tag part `i` travels under.
    pub fn tag(&self, i: u32) -> Tag {
        Tag {
            op: OpSeq(self.tag.op.0 | (u64::from(i % MAX_PARTS) << PART_SHIFT)),
            ..self.tag
        }
    }
}

/// What the sending driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendStep {
    /// Queue the device-to-host copy of `range` into `slot`, and note its completion event.
    Copy {
        /// The part.
        part: u32,
        /// The pinned slot it goes into.
        slot: u32,
        /// Its bytes within the payload.
        range: Range<usize>,
    },
    /// Wait for the copy of `part` to complete (the host needs its bytes).
    AwaitCopy {
        /// The part.
        part: u32,
    },
    /// Hand the copied bytes of `part` in `slot` to the host link; the slot is then free.
    Send {
        /// The part.
        part: u32,
        /// The slot holding its bytes.
        slot: u32,
        /// Its bytes within the payload.
        range: Range<usize>,
    },
    /// Every part has been handed to the link.
    Done,
}

/// The sending side of one payload: copies are queued as far ahead as there are free slots,
/// so the device copies part `i + 1..i + depth` while the host sends part `i`.
#[derive(Debug)]
pub struct SendPipeline {
    header: Header,
    parts: u32,
    depth: u32,
    /// Copies queued (parts `0..issued`).
    issued: u32,
    /// Copies known complete (parts `0..copied`).
    copied: u32,
    /// Parts handed to the link (`0..sent`).
    sent: u32,
}

impl SendPipeline {
    /// The schedule for a payload of `len` bytes under `plan`.
    pub fn new(plan: &StagePlan, len: usize) -> Result<SendPipeline, StageError> {
        let header = plan.header(len)?;
        Ok(SendPipeline {
            parts: header.parts()?,
            header,
            depth: plan.depth,
            issued: 0,
            copied: 0,
            sent: 0,
        })
    }

    /// The payload's header (to open part 0).
    pub fn header(&self) -> Header {
        self.header
    }

    /// The next step. Repeating it without reporting progress returns the same step.
    pub fn next(&self) -> SendStep {
        if self.sent == self.parts {
            return SendStep::Done;
        }
        if self.issued < self.parts && self.issued - self.sent < self.depth {
            let part = self.issued;
            return SendStep::Copy {
                part,
                slot: part % self.depth,
                range: self.header.range(part),
            };
        }
        if self.copied > self.sent {
            let part = self.sent;
            return SendStep::Send {
                part,
                slot: part % self.depth,
                range: self.header.range(part),
            };
        }
        SendStep::AwaitCopy { part: self.copied }
    }

    /// The step [`SendPipeline::next`] returned has been carried out.
    pub fn done(&mut self, step: &SendStep) {
        match *step {
            SendStep::Copy { part, .. } if part == self.issued => self.issued += 1,
            SendStep::AwaitCopy { part } if part == self.copied && part < self.issued => {
                self.copied += 1
            }
            SendStep::Send { part, .. } if part == self.sent && part < self.copied => {
                self.sent += 1
            }
            _ => {}
        }
    }
}

/// What the receiving driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvStep {
    /// Receive part `part` from the host link (part 0 carries the header).
    Recv {
        /// The part.
        part: u32,
    },
    /// Wait until the host-to-device copy of `part` completes: its slot is needed again.
    AwaitSlot {
        /// The part whose copy holds the slot.
        part: u32,
    },
    /// Put the received bytes of `part` into `slot` and queue their copy to `range` of the
    /// device payload.
    Stage {
        /// The part.
        part: u32,
        /// The pinned slot.
        slot: u32,
        /// Its bytes within the payload.
        range: Range<usize>,
    },
    /// Every part is queued; the payload is ready once the last copy completes.
    Done,
}

/// The receiving side of one payload: part `i`'s copy to the device overlaps the arrival of
/// part `i + 1`; a slot is reused only after its previous copy completed.
#[derive(Debug)]
pub struct RecvPipeline {
    header: Option<Header>,
    parts: u32,
    depth: u32,
    /// Parts received from the link (`0..received`).
    received: u32,
    /// Parts whose copy is queued (`0..staged`).
    staged: u32,
    /// Parts whose copy is known complete (`0..freed`).
    freed: u32,
}

impl RecvPipeline {
    /// A receive with `depth` slots; the parts are known once part 0's header is read.
    pub fn new(plan: &StagePlan) -> RecvPipeline {
        RecvPipeline {
            header: None,
            parts: 1,
            depth: plan.depth,
            received: 0,
            staged: 0,
            freed: 0,
        }
    }

    /// Part 0 arrived with `header`: the number of parts is now known.
    pub fn opened(&mut self, header: Header) -> Result<(), StageError> {
        self.parts = header.parts()?;
        self.header = Some(header);
        Ok(())
    }

    /// The header, once part 0 arrived.
    pub fn header(&self) -> Option<Header> {
        self.header
    }

    /// Check that part `part` holds the bytes the header announced.
    pub fn check_len(&self, part: u32, got: usize) -> Result<(), StageError> {
        let want = self.header.map_or(0, |h| h.range(part).len());
        if got != want {
            return Err(StageError::PartLength { part, want, got });
        }
        Ok(())
    }

    /// The next step.
    pub fn next(&self) -> RecvStep {
        if self.staged == self.parts && self.header.is_some() {
            return RecvStep::Done;
        }
        if self.received == self.staged {
            return RecvStep::Recv {
                part: self.received,
            };
        }
        let part = self.staged;
        if part - self.freed >= self.depth {
            return RecvStep::AwaitSlot { part: self.freed };
        }
        RecvStep::Stage {
            part,
            slot: part % self.depth,
            range: self.header.map_or(0..0, |h| h.range(part)),
        }
    }

    /// The step [`RecvPipeline::next`] returned has been carried out.
    pub fn done(&mut self, step: &RecvStep) {
        match *step {
            RecvStep::Recv { part } if part == self.received => self.received += 1,
            RecvStep::Stage { part, .. } if part == self.staged && part < self.received => {
                self.staged += 1
            }
            RecvStep::AwaitSlot { part } if part == self.freed && part < self.staged => {
                self.freed += 1
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_protocol::{Collective, DType};

    /// A plan with any part size (the schedule's logic does not need aligned parts; the
    /// alignment rule is tested on its own).
    fn plan(chunk: usize, depth: u32) -> StagePlan {
        StagePlan {
            chunk_bytes: chunk,
            depth,
        }
    }

    /// Runs a send schedule to the end, copies completing at once when awaited; returns the
    /// steps in order.
    fn run_send(p: &StagePlan, len: usize) -> Vec<SendStep> {
        let mut s = SendPipeline::new(p, len).unwrap();
        let mut steps = Vec::new();
        loop {
            let step = s.next();
            steps.push(step.clone());
            if step == SendStep::Done {
                return steps;
            }
            s.done(&step);
            assert!(steps.len() < 10_000, "the schedule does not end");
        }
    }

    #[test]
    fn copies_run_ahead_of_sends_by_the_depth_and_slots_are_reused_only_when_sent() {
        let steps = run_send(&plan(100, 2), 450);
        let mut in_slot: [Option<u32>; 2] = [None, None];
        let mut bytes = 0;
        let mut order = Vec::new();
        for s in &steps {
            match s {
                SendStep::Copy { part, slot, range } => {
                    assert_eq!(
                        in_slot[*slot as usize], None,
                        "slot {slot} still holds a part"
                    );
                    in_slot[*slot as usize] = Some(*part);
                    order.push(format!("c{part}"));
                    assert_eq!(range.start, *part as usize * 100);
                }
                SendStep::Send { part, slot, range } => {
                    assert_eq!(in_slot[*slot as usize], Some(*part));
                    in_slot[*slot as usize] = None;
                    bytes += range.len();
                    order.push(format!("s{part}"));
                }
                SendStep::AwaitCopy { part } => order.push(format!("w{part}")),
                SendStep::Done => {}
            }
        }
        assert_eq!(bytes, 450, "every byte is sent once");
        assert_eq!(
            order.join(" "),
            "c0 c1 w0 s0 c2 w1 s1 c3 w2 s2 c4 w3 s3 w4 s4",
            "the copy of the next parts is queued before each send"
        );
    }

    #[test]
    fn a_send_waits_for_its_copy_and_never_runs_ahead_of_it() {
        let mut s = SendPipeline::new(&plan(10, 3), 30).unwrap();
        for part in 0..3 {
            let step = s.next();
            assert!(matches!(step, SendStep::Copy { part: p, .. } if p == part));
            s.done(&step);
        }
        // Copies queued, none known complete: the only step is to wait for part 0.
        assert_eq!(s.next(), SendStep::AwaitCopy { part: 0 });
        // A report for the wrong part changes nothing.
        s.done(&SendStep::Send {
            part: 0,
            slot: 0,
            range: 0..10,
        });
        assert_eq!(s.next(), SendStep::AwaitCopy { part: 0 });
        s.done(&SendStep::AwaitCopy { part: 0 });
        assert!(matches!(s.next(), SendStep::Send { part: 0, .. }));
    }

    #[test]
    fn empty_and_exact_payloads_have_the_right_parts() {
        assert_eq!(plan(100, 1).header(0).unwrap().parts(), Ok(1));
        assert_eq!(plan(100, 1).header(100).unwrap().parts(), Ok(1));
        assert_eq!(plan(100, 1).header(101).unwrap().parts(), Ok(2));
        let steps = run_send(&plan(100, 1), 0);
        assert_eq!(steps.len(), 4, "copy, wait, send, done: {steps:?}");
        let h = plan(100, 1).header(250).unwrap();
        assert_eq!(h.range(0), 0..100);
        assert_eq!(h.range(2), 200..250);
        assert_eq!(h.range(7), 250..250);
    }

    #[test]
    fn a_large_payload_travels_in_larger_parts_and_a_bad_plan_is_refused() {
        let h = plan(16, 1).header(MAX_PARTS as usize * 24 + 8).unwrap();
        assert_eq!(
            h.chunk, 32,
            "parts grow, in whole aligned units, to stay within MAX_PARTS"
        );
        assert!(h.parts().unwrap() <= MAX_PARTS);
        assert_eq!(
            plan(16, 1).header(MAX_PARTS as usize * 16).unwrap().chunk,
            16
        );
        assert!(
            StagePlan::new(24, 1).is_err(),
            "not a multiple of PART_ALIGN"
        );
        assert!(StagePlan::new(0, 1).is_err());
        assert!(StagePlan::new(1, 0).is_err());
    }

    #[test]
    fn headers_round_trip_and_bad_ones_are_errors() {
        let h = Header {
            total: 123_456,
            chunk: 4096,
        };
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(b"data");
        assert_eq!(Header::decode(&wire, 1 << 20), Ok(h));
        assert!(matches!(
            Header::decode(&wire, 1000),
            Err(StageError::Header(m)) if m.contains("at most")
        ));
        assert!(Header::decode(&wire[..8], 1 << 20).is_err());
        let mut bad = wire.clone();
        bad[0] ^= 1;
        assert!(Header::decode(&bad, 1 << 20).is_err());
        let zero = Header {
            total: 10,
            chunk: 0,
        }
        .encode();
        assert!(Header::decode(&zero, 1 << 20).is_err());
        let many = Header {
            total: u64::from(MAX_PARTS) * 2,
            chunk: 1,
        }
        .encode();
        assert!(matches!(
            Header::decode(&many, u64::MAX),
            Err(StageError::TooManyParts { .. })
        ));
    }

    #[test]
    fn part_tags_are_distinct_and_part_zero_is_the_engines_own() {
        let tag = Tag {
            collective: Collective::AllReduce,
            op: OpSeq(7 | chorus_engine::P2P_SEQ_BIT),
            step: 3,
            offset: 64,
            dtype: DType::F32,
        };
        let parts = Parts::new(tag).unwrap();
        assert_eq!(parts.tag(0), tag);
        let t5 = parts.tag(5);
        assert_ne!(t5.op, tag.op);
        assert_eq!(
            t5.op.0 & chorus_engine::P2P_SEQ_BIT,
            chorus_engine::P2P_SEQ_BIT
        );
        assert_eq!((t5.step, t5.offset), (3, 64));
        let big = Tag {
            op: OpSeq(1 << PART_SHIFT),
            ..tag
        };
        assert!(matches!(Parts::new(big), Err(StageError::SeqTooLarge(_))));
    }

    #[test]
    fn a_receive_reuses_a_slot_only_after_its_copy_completed() {
        let p = plan(10, 2);
        let mut r = RecvPipeline::new(&p);
        let mut order = Vec::new();
        let mut busy: [Option<u32>; 2] = [None, None];
        loop {
            let step = r.next();
            match &step {
                RecvStep::Recv { part } => {
                    if *part == 0 {
                        r.opened(Header {
                            total: 45,
                            chunk: 10,
                        })
                        .unwrap();
                    }
                    order.push(format!("r{part}"));
                }
                RecvStep::Stage { part, slot, range } => {
                    assert_eq!(busy[*slot as usize], None, "slot {slot} still copying");
                    busy[*slot as usize] = Some(*part);
                    assert_eq!(range.len(), if *part == 4 { 5 } else { 10 });
                    order.push(format!("q{part}"));
                }
                RecvStep::AwaitSlot { part } => {
                    let slot = part % 2;
                    assert_eq!(busy[slot as usize], Some(*part));
                    busy[slot as usize] = None;
                    order.push(format!("w{part}"));
                }
                RecvStep::Done => break,
            }
            r.done(&step);
            assert!(order.len() < 100, "the schedule does not end");
        }
        assert_eq!(order.join(" "), "r0 q0 r1 q1 r2 w0 q2 r3 w1 q3 r4 w2 q4");
        assert!(r.check_len(4, 5).is_ok());
        assert_eq!(
            r.check_len(1, 9),
            Err(StageError::PartLength {
                part: 1,
                want: 10,
                got: 9
            })
        );
    }
}
