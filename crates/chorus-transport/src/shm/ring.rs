//! The ring format and its arithmetic, with no IO: the segment's layout (where each word and
//! each ring lives), the check of a segment's header, and the index rules of one
//! single-producer/single-consumer byte ring.
//!
//! Everything the peer can write is an input here, never a trusted value: a consumer keeps
//! its own head and reads the producer's tail once per pass; a tail that claims more bytes
//! than the ring holds, or runs behind the head, is a [`RingError`] (the link closes with a
//! protocol violation). Spans are computed from the local index and the ring's capacity
//! only, so whatever the peer writes, every byte read or written lies inside the ring.
//! `protocol/SPEC.md` ("Shared-memory segments") is the normative description.

use std::ops::Range;

/// The segment's first eight bytes.
pub const MAGIC: [u8; 8] = *b"CHORSHM1";
/// The layout version this code writes and reads (2: the mailboxes; 3: slots of up to
/// 1 KiB, after the header page).
pub const VERSION: u32 = 3;
/// Bytes before the first ring's data: the header page (the header and the control words),
/// then the two mailboxes, rounded up to a page.
pub const DATA_OFFSET: usize = 24576;
/// The smallest ring capacity (one page: a frame header always fits many times).
pub const MIN_CAPACITY: u64 = 4096;
/// The largest ring capacity a segment may declare (per direction).
pub const MAX_CAPACITY: u64 = 1 << 30;

/// Byte offsets of the control words. Each sits on its own 128-byte line (two cache lines,
/// so the adjacent-line prefetcher does not make the producer and the consumer fight over
/// one pair of lines).
pub mod offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const CAPACITY: usize = 16;
    /// `closed[s]`, `bell[s]`, `sleeping[s]` of side `s` at `SIDE + s * SIDE_STRIDE`.
    pub const SIDE: usize = 128;
    pub const SIDE_STRIDE: usize = 128;
    pub const CLOSED: usize = 0;
    pub const BELL: usize = 4;
    pub const SLEEPING: usize = 8;
    /// The tail (producer's) and head (consumer's) of the ring side `s` writes, at
    /// `RING + s * RING_STRIDE` and one line later.
    pub const RING: usize = 384;
    pub const RING_STRIDE: usize = 256;
    pub const HEAD: usize = 128;
    /// Slot `k` of the mailbox side `s` writes, at `MAILBOX + s * MAILBOX_STRIDE + k *
    /// SLOT_STRIDE`: the `SLOT_*` fields and a payload of up to [`super::SLOT_BYTES`], on
    /// 128-byte lines of its own. A payload of up to 32 bytes shares the fields' line.
    pub const MAILBOX: usize = 4096;
    pub const MAILBOX_STRIDE: usize = super::SLOTS * SLOT_STRIDE;
    pub const SLOT_STRIDE: usize = 1152;
    /// A slot's fields: its producer's count of payloads put (published last), the
    /// payload's length, the tag's op, step, collective and dtype codes and offset, then
    /// the payload.
    pub const SLOT_PUT: usize = 0;
    pub const SLOT_LEN: usize = 4;
    pub const SLOT_OP: usize = 8;
    pub const SLOT_STEP: usize = 16;
    pub const SLOT_CODES: usize = 20;
    pub const SLOT_OFFSET: usize = 24;
    pub const SLOT_PAYLOAD: usize = 32;
    /// The count of payloads the consumer took from each slot of the mailbox side `s`
    /// writes, 4 bytes per slot, at `TOOK + s * TOOK_STRIDE + 4 k`.
    pub const TOOK: usize = 3072;
    pub const TOOK_STRIDE: usize = 128;
}

/// Slots in each mailbox.
pub const SLOTS: usize = 8;
/// The largest payload a mailbox slot carries.
pub const SLOT_BYTES: usize = 1024;

/// A slot's words before its payload, as stored (every one the writer's to choose: the
/// reader checks `len` and `codes` with [`check_slot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotHead {
    pub len: u32,
    pub op: u64,
    pub step: u32,
    /// The collective's code in the low byte, the dtype's in the next.
    pub codes: u32,
    pub offset: u64,
}

/// The slot a payload of operation `op`, step `step` goes through: both ends compute it
/// from the tag alone.
pub fn slot_of(op: u64, step: u32) -> usize {
    (op.wrapping_add(u64::from(step)) % SLOTS as u64) as usize
}

/// A slot's length and codes words as the peer wrote them, checked: the payload's length
/// (at most [`SLOT_BYTES`]), the collective's code and the dtype's (whether the engine
/// knows them is the caller's to check). Codes with any of the high 16 bits set are an
/// error.
pub fn check_slot(len: u32, codes: u32) -> Result<(usize, u8, u8), RingError> {
    let len = match usize::try_from(len) {
        Ok(n) if n <= SLOT_BYTES => n,
        _ => return Err(RingError::SlotLength(len)),
    };
    if codes >> 16 != 0 {
        return Err(RingError::SlotCodes(codes));
    }
    Ok((len, codes as u8, (codes >> 8) as u8))
}

/// One end of a segment: the connector creates the segment and is side 0.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Side {
    Connector = 0,
    Acceptor = 1,
}

impl Side {
    pub fn peer(self) -> Side {
        match self {
            Side::Connector => Side::Acceptor,
            Side::Acceptor => Side::Connector,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where everything lives in a segment whose rings each hold `capacity` bytes.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Layout {
    capacity: u64,
}

/// A segment or a ring index that breaks the format. (`Display` by hand: this file
/// depends on nothing but `std`, so the fuzz target can build it alone.)
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RingError {
    Short(usize),
    Magic,
    Version(u32),
    Capacity(u64),
    Length { len: u64, want: u64 },
    Index { index: u64, low: u64, high: u64 },
    SlotLength(u32),
    SlotCodes(u32),
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Short(n) => write!(f, "segment of {n} bytes is too small for its header"),
            RingError::Magic => f.write_str("segment magic is not chorus's"),
            RingError::Version(v) => write!(f, "segment layout version {v} is not {VERSION}"),
            RingError::Capacity(c) => write!(
                f,
                "ring capacity {c} is not a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}]"
            ),
            RingError::Length { len, want } => {
                write!(f, "segment is {len} bytes, its header implies {want}")
            }
            RingError::Index { index, low, high } => {
                write!(f, "peer's ring index {index} is outside [{low}, {high}]")
            }
            RingError::SlotLength(len) => {
                write!(f, "mailbox slot holds {len} bytes, more than {SLOT_BYTES}")
            }
            RingError::SlotCodes(codes) => {
                write!(f, "mailbox slot's codes {codes:#010x} set reserved bits")
            }
        }
    }
}

impl std::error::Error for RingError {}

impl Layout {
    /// The layout of a new segment; `capacity` is rounded up to a power of two within the
    /// bounds.
    pub fn new(capacity: usize) -> Layout {
        let c = (capacity as u64).clamp(MIN_CAPACITY, MAX_CAPACITY);
        Layout {
            capacity: c.next_power_of_two(),
        }
    }

    /// Reads and checks the header of a segment of `len` bytes whose first bytes are
    /// `header` (at least the first 24). The peer wrote it: every field is checked.
    pub fn parse(header: &[u8], len: u64) -> Result<Layout, RingError> {
        let field =
            |at: usize, n: usize| header.get(at..at + n).ok_or(RingError::Short(header.len()));
        if field(offsets::MAGIC, 8)? != MAGIC {
            return Err(RingError::Magic);
        }
        let version = u32::from_le_bytes(le(field(offsets::VERSION, 4)?));
        if version != VERSION {
            return Err(RingError::Version(version));
        }
        let capacity = u64::from_le_bytes(le(field(offsets::CAPACITY, 8)?));
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(RingError::Capacity(capacity));
        }
        let layout = Layout { capacity };
        let want = layout.size() as u64;
        if len != want {
            return Err(RingError::Length { len, want });
        }
        Ok(layout)
    }

    /// The header bytes a new segment starts with.
    pub fn header(&self) -> [u8; 24] {
        let mut h = [0u8; 24];
        h[..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        h
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The whole segment's length in bytes.
    pub fn size(&self) -> usize {
        // `capacity <= MAX_CAPACITY`, so this cannot overflow a 64-bit usize.
        DATA_OFFSET + 2 * self.capacity as usize
    }

    /// Offset of side `s`'s one-way closed word.
    pub fn closed(&self, s: Side) -> usize {
        offsets::SIDE + s.index() * offsets::SIDE_STRIDE + offsets::CLOSED
    }

    /// Offset of the futex word side `s` sleeps on.
    pub fn bell(&self, s: Side) -> usize {
        offsets::SIDE + s.index() * offsets::SIDE_STRIDE + offsets::BELL
    }

    /// Offset of the word side `s` sets while it sleeps wanting to be woken by progress.
    pub fn sleeping(&self, s: Side) -> usize {
        offsets::SIDE + s.index() * offsets::SIDE_STRIDE + offsets::SLEEPING
    }

    /// Offset of the tail of the ring side `s` writes.
    pub fn tail(&self, s: Side) -> usize {
        offsets::RING + s.index() * offsets::RING_STRIDE
    }

    /// Offset of the head of the ring side `s` writes (its consumer, the peer, owns it).
    pub fn head(&self, s: Side) -> usize {
        self.tail(s) + offsets::HEAD
    }

    /// Offset of slot `k` of the mailbox side `s` writes (`k < SLOTS`).
    pub fn slot(&self, s: Side, k: usize) -> usize {
        offsets::MAILBOX + s.index() * offsets::MAILBOX_STRIDE + (k % SLOTS) * offsets::SLOT_STRIDE
    }

    /// Offset of the count of payloads the other side took from slot `k` of the mailbox
    /// side `s` writes.
    pub fn took(&self, s: Side, k: usize) -> usize {
        offsets::TOOK + s.index() * offsets::TOOK_STRIDE + (k % SLOTS) * 4
    }

    /// The data bytes of the ring side `s` writes.
    pub fn data(&self, s: Side) -> Range<usize> {
        let start = DATA_OFFSET + s.index() * self.capacity as usize;
        start..start + self.capacity as usize
    }
}

fn le<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

/// Up to two ranges of a ring's data (the second after a wrap), relative to the ring's start.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Spans {
    pub first: Range<usize>,
    pub second: Range<usize>,
}

impl Spans {
    pub fn len(&self) -> usize {
        self.first.len() + self.second.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `n` bytes of a ring of `capacity` starting at the free-running index `at`.
fn spans(at: u64, n: u64, capacity: u64) -> Spans {
    let mask = capacity - 1;
    let start = (at & mask) as usize;
    let first = (n as usize).min(capacity as usize - start);
    Spans {
        first: start..start + first,
        second: 0..n as usize - first,
    }
}

/// The consuming end of one ring: its head, kept here (the copy in shared memory is only
/// for the producer to read, and never read back).
#[derive(Clone, Debug)]
pub struct Consumer {
    head: u64,
    capacity: u64,
}

impl Consumer {
    pub fn new(layout: &Layout) -> Consumer {
        Consumer {
            head: 0,
            capacity: layout.capacity,
        }
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    /// The bytes `tail` (the producer's index, read once) makes readable, at most `max`.
    /// A tail behind the head or more than a ring ahead of it is an error.
    pub fn readable(&self, tail: u64, max: usize) -> Result<Spans, RingError> {
        let n = tail.wrapping_sub(self.head);
        if n > self.capacity {
            return Err(RingError::Index {
                index: tail,
                low: self.head,
                high: self.head.wrapping_add(self.capacity),
            });
        }
        Ok(spans(self.head, n.min(max as u64), self.capacity))
    }

    /// `n` bytes were copied out; the new head to publish.
    pub fn consume(&mut self, n: usize) -> u64 {
        self.head = self.head.wrapping_add(n as u64);
        self.head
    }
}

/// The producing end of one ring: its tail, kept here, and the consumer's head as last read.
///
/// The consumer's head only moves forward, so the room the last head read leaves is never
/// more than the room there is: a writer that finds enough room by it need not read the
/// shared head again. That read is a cache miss on every small frame (the consumer has just
/// written the line), so the writer skips it until the room it knows of runs short.
#[derive(Clone, Debug)]
pub struct Producer {
    tail: u64,
    capacity: u64,
    /// The consumer's head as last read and checked (`tail - seen <= capacity`).
    seen: u64,
}

impl Producer {
    pub fn new(layout: &Layout) -> Producer {
        Producer {
            tail: 0,
            capacity: layout.capacity,
            seen: 0,
        }
    }

    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The free bytes `head` (the consumer's index, read once) leaves, at most `max`; the
    /// head is kept as the last one seen. A head ahead of the tail or more than a ring
    /// behind it is an error, and is not kept.
    pub fn writable(&mut self, head: u64, max: usize) -> Result<Spans, RingError> {
        let used = self.tail.wrapping_sub(head);
        if used > self.capacity {
            return Err(RingError::Index {
                index: head,
                low: self.tail.wrapping_sub(self.capacity),
                high: self.tail,
            });
        }
        self.seen = head;
        Ok(self.writable_seen(max))
    }

    /// The free bytes the last head seen leaves, at most `max`: no more than the ring has
    /// free now, since a head only advances.
    pub fn writable_seen(&self, max: usize) -> Spans {
        let free = self
            .capacity
            .saturating_sub(self.tail.wrapping_sub(self.seen));
        spans(self.tail, free.min(max as u64), self.capacity)
    }

    /// Whether the consumer at `head` has taken everything written.
    pub fn is_drained(&self, head: u64) -> bool {
        head == self.tail
    }

    /// `n` bytes were copied in; the new tail to publish.
    pub fn produce(&mut self, n: usize) -> u64 {
        self.tail = self.tail.wrapping_add(n as u64);
        self.tail
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(4096)
    }

    #[test]
    fn a_header_round_trips_and_every_field_is_checked() {
        let l = Layout::new(5000);
        assert_eq!(l.capacity(), 8192, "rounded up to a power of two");
        let h = l.header();
        assert_eq!(Layout::parse(&h, l.size() as u64).unwrap(), l);
        assert_eq!(
            Layout::parse(&h, l.size() as u64 - 1),
            Err(RingError::Length {
                len: l.size() as u64 - 1,
                want: l.size() as u64
            })
        );
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(Layout::parse(&bad, l.size() as u64), Err(RingError::Magic));
        let mut bad = h;
        bad[8] = 1;
        assert_eq!(
            Layout::parse(&bad, l.size() as u64),
            Err(RingError::Version(1)),
            "a segment without mailboxes is refused"
        );
        for cap in [0u64, 3, 2048, 4097, 1 << 40] {
            let mut bad = h;
            bad[16..24].copy_from_slice(&cap.to_le_bytes());
            assert_eq!(
                Layout::parse(&bad, l.size() as u64),
                Err(RingError::Capacity(cap))
            );
        }
        assert_eq!(Layout::parse(&h[..10], 0), Err(RingError::Short(10)));
    }

    /// The header is the spec's golden vector (`protocol/vectors/shm-segment.hex`), and
    /// the offsets are the spec's table.
    #[test]
    fn the_header_and_offsets_are_the_specs() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../protocol/vectors/shm-segment.hex"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let hex: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .flat_map(|l| l.chars().filter(char::is_ascii_hexdigit))
            .collect();
        let golden: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let l = Layout::new(4 << 20);
        assert_eq!(
            &l.header()[..],
            &golden[..],
            "the segment header changed: update SPEC.md"
        );
        assert_eq!(Layout::parse(&golden, l.size() as u64), Ok(l));
        let (c, a) = (Side::Connector, Side::Acceptor);
        assert_eq!([l.closed(c), l.bell(c), l.sleeping(c)], [128, 132, 136]);
        assert_eq!([l.closed(a), l.bell(a), l.sleeping(a)], [256, 260, 264]);
        assert_eq!(
            [l.tail(c), l.head(c), l.tail(a), l.head(a)],
            [384, 512, 640, 768]
        );
        assert_eq!(l.data(c).start, 24576);
        assert_eq!(l.data(a).start, 24576 + (4 << 20));
        assert_eq!(l.size(), 24576 + (8 << 20));
        assert_eq!(
            [l.slot(c, 0), l.slot(c, 7), l.slot(a, 0), l.slot(a, 7)],
            [4096, 12160, 13312, 21376]
        );
        assert_eq!(
            [l.took(c, 0), l.took(c, 7), l.took(a, 0)],
            [3072, 3100, 3200]
        );
    }

    #[test]
    fn mailboxes_lie_between_the_header_page_and_the_rings_apart_from_each_other() {
        let l = layout();
        // Where slot `k` of side `s` ends: its fields, then a payload of the most it takes.
        let end = |s, k| l.slot(s, k) + offsets::SLOT_PAYLOAD + SLOT_BYTES;
        for s in [Side::Connector, Side::Acceptor] {
            for k in 0..SLOTS {
                let slot = l.slot(s, k);
                assert!(slot >= 4096, "slot {k} after the header page");
                assert!(slot.is_multiple_of(128), "slot {k} starts a line pair");
                assert!(end(s, k) <= slot + offsets::SLOT_STRIDE);
                assert!(end(s, k) <= DATA_OFFSET, "slot {k} before the rings");
                assert!(
                    l.took(s, k) + 4 <= 4096,
                    "the counts stay in the header page"
                );
            }
            for k in 1..SLOTS {
                assert!(
                    end(s, k - 1).div_ceil(128) * 128 <= l.slot(s, k),
                    "slots share a line"
                );
            }
        }
        assert!(end(Side::Connector, SLOTS - 1) <= l.slot(Side::Acceptor, 0));
        assert!(DATA_OFFSET.is_multiple_of(4096));
        assert!(l.took(Side::Acceptor, 0) - l.took(Side::Connector, 0) >= 128);
    }

    #[test]
    fn a_slot_is_picked_by_the_tag_and_its_length_is_checked() {
        assert_eq!(slot_of(5, 0), 5);
        assert_eq!(slot_of(7, 2), 1);
        assert_eq!(slot_of(u64::MAX, 1), 0, "wraps");
        assert!((0..100).all(|op| slot_of(op, 3) < SLOTS));
        assert_eq!(check_slot(0, 0), Ok((0, 0, 0)));
        assert_eq!(check_slot(1024, 0x0109), Ok((1024, 9, 1)));
        assert_eq!(check_slot(1025, 0), Err(RingError::SlotLength(1025)));
        assert_eq!(
            check_slot(u32::MAX, 0),
            Err(RingError::SlotLength(u32::MAX))
        );
        assert_eq!(check_slot(8, 0x1_0000), Err(RingError::SlotCodes(0x1_0000)));
    }

    #[test]
    fn control_words_do_not_share_lines_and_rings_follow_the_header() {
        let l = layout();
        let words = [
            l.closed(Side::Connector),
            l.closed(Side::Acceptor),
            l.tail(Side::Connector),
            l.head(Side::Connector),
            l.tail(Side::Acceptor),
            l.head(Side::Acceptor),
        ];
        for (i, a) in words.iter().enumerate() {
            for b in &words[i + 1..] {
                assert!(a.abs_diff(*b) >= 128, "{a} and {b} share a line");
            }
            assert!(*a + 8 <= 4096);
        }
        assert_eq!(l.data(Side::Connector), 24576..28672);
        assert_eq!(l.data(Side::Acceptor), 28672..32768);
        assert_eq!(l.size(), 32768);
    }

    #[test]
    fn bytes_flow_through_a_wrap_in_two_spans() {
        let l = layout();
        let (mut p, mut c) = (Producer::new(&l), Consumer::new(&l));
        let w = p.writable(c.head(), 3000).unwrap();
        assert_eq!(w.first, 0..3000);
        c.consume(c.readable(p.produce(3000), usize::MAX).unwrap().len());
        let w = p.writable(c.head(), usize::MAX).unwrap();
        assert_eq!((w.first.clone(), w.second.clone()), (3000..4096, 0..3000));
        let tail = p.produce(w.len());
        let r = c.readable(tail, usize::MAX).unwrap();
        assert_eq!((r.first.clone(), r.second.clone()), (3000..4096, 0..3000));
        assert!(p.writable(c.head(), usize::MAX).unwrap().is_empty(), "full");
        c.consume(r.len());
        assert!(p.is_drained(c.head()));
    }

    #[test]
    fn the_room_by_the_last_head_seen_never_exceeds_the_room_there_is() {
        let l = layout();
        let (mut p, mut c) = (Producer::new(&l), Consumer::new(&l));
        assert_eq!(
            p.writable_seen(usize::MAX).len(),
            4096,
            "empty ring, head 0"
        );
        let tail = p.produce(4000);
        assert_eq!(p.writable_seen(usize::MAX).len(), 96);
        c.consume(c.readable(tail, usize::MAX).unwrap().len());
        assert_eq!(
            p.writable_seen(usize::MAX).len(),
            96,
            "the head moved unseen"
        );
        assert_eq!(p.writable(c.head(), usize::MAX).unwrap().len(), 4096);
        assert_eq!(p.writable_seen(usize::MAX).len(), 4096, "and is seen now");
        assert!(p.writable(c.head() + 1, 1).is_err());
        assert_eq!(
            p.writable_seen(usize::MAX).len(),
            4096,
            "a head out of range is not kept"
        );
    }

    #[test]
    fn indices_wrap_around_u64_without_error() {
        let l = layout();
        let mut p = Producer::new(&l);
        let mut c = Consumer::new(&l);
        p.tail = u64::MAX - 100;
        p.seen = p.tail;
        c.head = u64::MAX - 100;
        let tail = p.produce(1000);
        let r = c.readable(tail, usize::MAX).unwrap();
        assert_eq!(r.len(), 1000);
        c.consume(1000);
        assert!(p.is_drained(c.head()));
    }

    #[test]
    fn a_peer_index_out_of_range_is_an_error_never_a_span_outside_the_ring() {
        let l = layout();
        let c = Consumer::new(&l);
        for tail in [4097, u64::MAX, 1 << 40] {
            assert!(matches!(
                c.readable(tail, usize::MAX),
                Err(RingError::Index { .. })
            ));
        }
        let mut p = Producer::new(&l);
        p.produce(100);
        for head in [101, u64::MAX - 5000] {
            assert!(matches!(
                p.writable(head, usize::MAX),
                Err(RingError::Index { .. })
            ));
        }
    }

    #[test]
    fn every_span_lies_inside_the_ring_whatever_the_indices() {
        let l = layout();
        let cap = l.capacity() as usize;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let c = Consumer {
                head: seed.rotate_left(17),
                capacity: l.capacity(),
            };
            let tail = c.head.wrapping_add(seed % 9000);
            if let Ok(s) = c.readable(tail, (seed >> 40) as usize) {
                assert!(s.first.end <= cap && s.second.end <= cap && s.len() <= cap);
                assert!(s.second.is_empty() || s.first.end == cap);
            }
        }
    }
}
