//! The streaming decoder: bytes in, in any slicing, frames or one typed error out.
//!
//! It holds the receiving half of one byte stream's framing state: the buffer, the gate
//! (which kinds may arrive), the version, and the next expected sequence number. Garbage is
//! refused on the first byte that gives it away; a claimed body length is checked against
//! the limit for its kind before a single byte of body is reserved; a chunk's payload is
//! split off the buffer as `Bytes` without a copy. After an error the decoder is poisoned
//! and repeats that error: a stream is never resynchronised (SPEC.md, "Bad frames").
//!
//! Two ways to feed it: [`Decoder::push`] copies a slice in; [`Decoder::recv_buf`] lends the
//! internal buffer, with room reserved for the frame in progress, so a transport can read
//! from its socket straight into it.

use bytes::{Buf, BytesMut};

use crate::body::{SizeRule, decode_body};
use crate::error::DecodeError;
use crate::frame::{Frame, frame_version};
use crate::gate::{Gate, Side};
use crate::header::{BASE_VERSION, HEADER_LEN, Header, check_prefix};
use crate::ids::Rank;
use crate::limits::Limits;
use crate::message::{ChunkHeader, Kind, Message, Role};
use crate::validation::{Invalid, validate_chunk_header};

/// Reserve at least this much when lending the buffer, so small frames are read in batches.
const MIN_READ: usize = 64 * 1024;

/// The head of a chunk frame whose payload has not been buffered (see
/// [`Decoder::chunk_head`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHead {
    /// The frame's header (its envelope: epoch, sender, sequence).
    pub frame: Header,
    /// The chunk's own header, validated against the payload's length.
    pub chunk: ChunkHeader,
    /// The payload's length in bytes, within the limits.
    pub payload_len: usize,
}

/// The receiving half of one byte stream's framing state.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    limits: Limits,
    version: u8,
    gate: Gate,
    next_seq: u64,
    /// The header of the frame in progress, already checked.
    pending: Option<Header>,
    /// The peer sent `Depart`: nothing may follow it.
    departed: bool,
    poisoned: Option<DecodeError>,
}

impl Decoder {
    /// A decoder for a new stream at `local`'s end, in the handshake phase.
    pub fn new(local: Side, limits: Limits) -> Self {
        Decoder::with_gate(Gate::Handshake { local }, limits)
    }

    /// A decoder with an explicit gate ([`Gate::Open`] for tests and tools).
    pub fn with_gate(gate: Gate, limits: Limits) -> Self {
        Decoder {
            buf: BytesMut::new(),
            limits,
            version: BASE_VERSION,
            gate,
            next_seq: 0,
            pending: None,
            departed: false,
            poisoned: None,
        }
    }

    /// Ends the handshake phase: frames must now carry `version` and the kinds `role`
    /// allows the peer's side, from `peer` in `comm` (the handshake's `Established`).
    pub fn establish(
        &mut self,
        version: u8,
        role: Role,
        local: Side,
        comm: crate::ids::CommId,
        peer: Rank,
    ) {
        self.version = version;
        self.gate = Gate::Established {
            role,
            local,
            comm,
            peer,
        };
    }

    /// Replaces the gate.
    pub fn set_gate(&mut self, gate: Gate) {
        self.gate = gate;
    }

    /// The current gate.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The limits this decoder enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The sequence number the next frame must carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The error that poisoned this decoder, if any.
    pub fn error(&self) -> Option<&DecodeError> {
        self.poisoned.as_ref()
    }

    /// Copies `bytes` into the buffer. Call [`Decoder::next`] until it returns `Ok(None)`
    /// after each push: the buffer holds what the caller pushes, so memory stays bounded by
    /// the frame in progress only if frames are drained as they complete.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.poisoned.is_some() {
            return;
        }
        let wanted = self.wanted();
        if bytes.len() > self.buf.capacity() - self.buf.len() && wanted > 0 {
            // One reservation for the whole frame in progress (bounded by its checked
            // length), instead of repeated growth copying a large chunk several times.
            self.buf.reserve(bytes.len().max(wanted));
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes still missing before the frame in progress is complete (0 when a complete
    /// frame is buffered). Before its header is checked, this counts only header bytes.
    pub fn wanted(&self) -> usize {
        let total = match &self.pending {
            Some(h) => HEADER_LEN + h.body_len as usize,
            None => HEADER_LEN,
        };
        total.saturating_sub(self.buf.len())
    }

    /// The internal buffer, with spare capacity for at least the rest of the frame in
    /// progress (and never less than 64 KiB), for a transport to read into. Append only
    /// (e.g. `BufMut` writes or a read into `spare_capacity_mut` then `set_len`); then call
    /// [`Decoder::next`]. The reservation is bounded by the limits: a header is checked
    /// before its body length is ever used to reserve.
    pub fn recv_buf(&mut self) -> &mut BytesMut {
        if self.poisoned.is_some() {
            // The stream is dead: lend the (empty) buffer without reserving for it.
            return &mut self.buf;
        }
        if self.pending.is_none() && self.buf.len() >= HEADER_LEN {
            // Learn the claimed length (and check it) before reserving for it.
            let _ = self.take_header();
        }
        let want = self.wanted().max(MIN_READ);
        self.buf.reserve(want);
        &mut self.buf
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that
    /// poisons this stream.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Frame>, DecodeError> {
        let Some(header) = self.frame_header()? else {
            return Ok(None);
        };
        let total = HEADER_LEN + header.body_len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(total);
        frame.advance(HEADER_LEN);
        self.pending = None;
        let message = decode_body(header.kind, frame.freeze(), &self.limits)
            .and_then(|m| self.check_role_rules(&header, m))
            .map_err(|e| self.poison(e))?;
        self.next_seq += 1;
        // Lifecycle rules belong to live streams; an open gate decodes any sequence.
        self.departed =
            header.kind == Kind::Depart && matches!(self.gate, Gate::Established { .. });
        Ok(Some(Frame { header, message }))
    }

    /// The header of the frame in progress, taken from the buffer if it is complete;
    /// `Ok(None)` while it is not, the poisoning error once the stream is poisoned.
    fn frame_header(&mut self) -> Result<Option<Header>, DecodeError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        match self.pending {
            Some(h) => Ok(Some(h)),
            None => self.take_header(),
        }
    }

    /// Bytes still missing before [`Decoder::chunk_head`] can answer for the frame in
    /// progress: what is missing of its frame header and, for a chunk, of its chunk header.
    /// A transport that wants to place a payload itself pushes no more than this, so no
    /// payload byte enters the buffer before it has decided. For frames that are not
    /// chunks, the rest of the frame, as [`Decoder::wanted`].
    pub fn head_wanted(&self) -> usize {
        match &self.pending {
            Some(h) if h.kind == Kind::Chunk => {
                (HEADER_LEN + ChunkHeader::LEN).saturating_sub(self.buf.len())
            }
            Some(_) => self.wanted(),
            None => HEADER_LEN.saturating_sub(self.buf.len()),
        }
    }

    /// If the frame in progress is a chunk whose frame header and chunk header are
    /// buffered and none of whose payload is, its head, checked as [`Decoder::next`] would
    /// check the whole frame (the payload's length included). The caller may then take the
    /// payload's bytes from its stream itself and end the frame with
    /// [`Decoder::skip_placed`], or push them as usual. `Ok(None)` otherwise; an error
    /// poisons the stream.
    pub fn chunk_head(&mut self) -> Result<Option<ChunkHead>, DecodeError> {
        let Some(header) = self.frame_header()? else {
            return Ok(None);
        };
        if header.kind != Kind::Chunk || self.buf.len() != HEADER_LEN + ChunkHeader::LEN {
            return Ok(None);
        }
        let mut fixed = [0u8; ChunkHeader::LEN];
        fixed.copy_from_slice(&self.buf[HEADER_LEN..]);
        let payload_len = header.body_len as usize - ChunkHeader::LEN;
        let chunk = ChunkHeader::parse(&fixed)
            .and_then(|c| validate_chunk_header(&c, payload_len as u64).map(|()| c))
            .map_err(|reason| {
                self.poison(DecodeError::Invalid {
                    kind: Kind::Chunk,
                    reason,
                })
            })?;
        Ok(Some(ChunkHead {
            frame: header,
            chunk,
            payload_len,
        }))
    }

    /// Ends the frame in progress, a chunk whose head [`Decoder::chunk_head`] returned and
    /// whose payload the caller has taken from the stream itself (all `payload_len` bytes
    /// of it, pushing none). The stream goes on with the next frame.
    pub fn skip_placed(&mut self) -> Result<(), DecodeError> {
        if self.chunk_head()?.is_none() {
            return Err(self.poison(DecodeError::Invalid {
                kind: Kind::Chunk,
                reason: Invalid::RoleRule("a placed payload without its chunk's head"),
            }));
        }
        self.buf.advance(HEADER_LEN + ChunkHeader::LEN);
        self.pending = None;
        self.next_seq += 1;
        Ok(())
    }

    /// Parses and checks the header at the front of the buffer once it is complete, or
    /// checks the part that has arrived.
    fn take_header(&mut self) -> Result<Option<Header>, DecodeError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let Some(bytes) = self.buf.get(..HEADER_LEN) else {
            self.check_partial().map_err(|e| self.poison(e))?;
            return Ok(None);
        };
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(bytes);
        let header = Header::parse(&raw)
            .and_then(|h| self.check(&h).map(|()| h))
            .map_err(|e| self.poison(e))?;
        self.pending = Some(header);
        Ok(Some(header))
    }

    /// Checks whatever prefix of a header has arrived, so garbage fails fast.
    fn check_partial(&self) -> Result<(), DecodeError> {
        check_prefix(&self.buf)?;
        if let (Some(&version), Some(&code)) = (self.buf.get(4), self.buf.get(5))
            && let Some(kind) = Kind::from_code(code)
        {
            self.check_version(kind, version)?;
            self.check_gate(kind)?;
        }
        Ok(())
    }

    /// The connection-state checks of a parsed header: version, gate, route, sequence,
    /// length.
    fn check(&self, h: &Header) -> Result<(), DecodeError> {
        self.check_version(h.kind, h.version)?;
        self.check_gate(h.kind)?;
        if let Gate::Established { comm, peer, .. } = self.gate {
            if h.comm != comm {
                return Err(DecodeError::WrongComm {
                    expected: comm,
                    found: h.comm,
                });
            }
            if h.sender != peer {
                return Err(DecodeError::WrongSender {
                    expected: peer,
                    found: h.sender,
                });
            }
        }
        if h.seq != self.next_seq {
            return Err(DecodeError::SequenceGap {
                expected: self.next_seq,
                found: h.seq,
            });
        }
        SizeRule::of(h.kind).check(h.kind, h.body_len, &self.limits)
    }

    fn check_version(&self, kind: Kind, version: u8) -> Result<(), DecodeError> {
        let expected = frame_version(kind, self.version);
        if version != expected {
            return Err(DecodeError::UnsupportedVersion { version, expected });
        }
        Ok(())
    }

    fn check_gate(&self, kind: Kind) -> Result<(), DecodeError> {
        if self.departed {
            return Err(DecodeError::Unexpected {
                kind,
                phase: "after depart",
            });
        }
        if !self.gate.admits(kind) {
            return Err(DecodeError::Unexpected {
                kind,
                phase: self.gate.phase(),
            });
        }
        Ok(())
    }

    /// The rules that depend on the stream's role and on the header as well as the body
    /// (SPEC.md, sections 4, 8 and 11.3).
    fn check_role_rules(&self, header: &Header, message: Message) -> Result<Message, DecodeError> {
        let Gate::Established { role, local, .. } = self.gate else {
            return Ok(message);
        };
        let broken = match (&message, role) {
            // A launcher speaks for nobody; members re-originate its witness before
            // spreading it, so no member stream carries an origin-less notice.
            (Message::Notice(n), Role::Launcher) if n.origin != Rank::NONE => {
                Some("a launcher's notice has no origin rank")
            }
            (Message::Notice(n), Role::Member) if n.origin == Rank::NONE => {
                Some("a member's notice names its origin rank")
            }
            (Message::Join(j), Role::Bootstrap) if local == Side::Acceptor => (j.world == 0
                || j.peer.rank != header.sender)
                .then_some("a bootstrap join names the sender's own rank"),
            (Message::Join(j), Role::Joiner) if local == Side::Acceptor => (j.world != 0
                || header.sender != Rank::NONE)
                .then_some("a grow joiner has no rank and no world"),
            _ => None,
        };
        match broken {
            Some(rule) => Err(DecodeError::Invalid {
                kind: header.kind,
                reason: Invalid::RoleRule(rule),
            }),
            None => Ok(message),
        }
    }

    /// Records `e` as the stream's fate and drops what was buffered.
    fn poison(&mut self, e: DecodeError) -> DecodeError {
        self.poisoned = Some(e.clone());
        self.pending = None;
        self.buf = BytesMut::new();
        e
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::code::CloseCode;
    use crate::dtype::{Collective, DType};
    use crate::frame::Encoder;
    use crate::header::Envelope;
    use crate::ids::{CommId, Epoch, OpSeq, Rank};
    use crate::message::{Chunk, ChunkHeader, Depart, Heartbeat, Message};

    fn env() -> Envelope {
        Envelope::new(CommId(1), Epoch(0), Rank(2))
    }

    fn open() -> Decoder {
        Decoder::with_gate(Gate::Open, Limits::DEFAULT)
    }

    fn stream(messages: &[Message]) -> BytesMut {
        let mut enc = Encoder::default();
        let mut out = BytesMut::new();
        for m in messages {
            enc.encode(&env(), m, &mut out).unwrap();
        }
        out
    }

    fn drain(d: &mut Decoder) -> Result<Vec<Frame>, DecodeError> {
        let mut frames = Vec::new();
        while let Some(f) = d.next()? {
            frames.push(f);
        }
        Ok(frames)
    }

    fn sample() -> Vec<Message> {
        vec![
            Message::Heartbeat(Heartbeat { seq: 1, digest: 0 }),
            Message::Depart(Depart::new(CloseCode::LEFT, "bye")),
            Message::Chunk(Chunk {
                header: ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(4), 2, 16),
                payload: Bytes::from(vec![1u8; 64]),
            }),
            Message::Heartbeat(Heartbeat { seq: 2, digest: 0 }),
        ]
    }

    #[test]
    fn many_frames_in_one_push_come_out_in_order() {
        let msgs = sample();
        let mut d = open();
        d.push(&stream(&msgs));
        let frames = drain(&mut d).unwrap();
        let got: Vec<_> = frames.iter().map(|f| f.message.clone()).collect();
        assert_eq!(got, msgs);
        assert_eq!(
            frames.iter().map(|f| f.header.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn byte_at_a_time_gives_the_same_frames() {
        let msgs = sample();
        let bytes = stream(&msgs);
        let mut d = open();
        let mut got = Vec::new();
        for b in bytes.iter() {
            d.push(&[*b]);
            got.extend(drain(&mut d).unwrap().into_iter().map(|f| f.message));
        }
        assert_eq!(got, msgs);
    }

    #[test]
    fn chunk_payload_is_split_from_the_receive_buffer_without_a_copy() {
        let msgs = sample();
        let bytes = stream(&msgs);
        let mut d = open();
        let buf = d.recv_buf();
        buf.extend_from_slice(&bytes);
        let base = buf.as_ptr() as usize;
        let frames = drain(&mut d).unwrap();
        let Message::Chunk(c) = &frames[2].message else {
            panic!("not a chunk")
        };
        let at = c.payload.as_ptr() as usize;
        assert!(at >= base && at < base + bytes.len(), "payload was copied");
    }

    #[test]
    fn recv_buf_reserves_the_whole_frame_once_the_header_is_checked() {
        let big = Message::Chunk(Chunk {
            header: ChunkHeader::new(Collective::Broadcast, DType::U8, OpSeq(0), 0, 0),
            payload: Bytes::from(vec![9u8; 1 << 20]),
        });
        let bytes = stream(std::slice::from_ref(&big));
        let mut d = open();
        d.recv_buf().extend_from_slice(&bytes[..HEADER_LEN]);
        assert_eq!(d.next().unwrap(), None);
        assert_eq!(d.wanted(), ChunkHeader::LEN + (1 << 20));
        let buf = d.recv_buf();
        assert!(buf.capacity() - buf.len() >= ChunkHeader::LEN + (1 << 20));
        buf.extend_from_slice(&bytes[HEADER_LEN..]);
        assert_eq!(d.next().unwrap().unwrap().message, big);
    }

    #[test]
    fn a_placed_payload_skips_the_buffer_and_the_stream_goes_on() {
        let head = ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(3), 1, 8);
        let chunk = Message::Chunk(Chunk {
            header: head,
            payload: Bytes::from(vec![7u8; 4096]),
        });
        let after = Message::Heartbeat(Heartbeat { seq: 5, digest: 9 });
        let bytes = stream(&[chunk, after.clone()]);
        let mut d = open();
        let mut at = 0;
        // Fed no more than it asks for, the decoder stops at the chunk's head.
        while d.head_wanted() > 0 {
            let n = d.head_wanted().min(7);
            d.push(&bytes[at..at + n]);
            at += n;
            assert_eq!(d.next().unwrap(), None);
        }
        let got = d.chunk_head().unwrap().unwrap();
        assert_eq!((got.chunk, got.payload_len), (head, 4096));
        assert_eq!(at, HEADER_LEN + ChunkHeader::LEN);
        at += got.payload_len;
        d.skip_placed().unwrap();
        assert_eq!(d.buffered(), 0);
        d.push(&bytes[at..]);
        assert_eq!(d.next().unwrap().unwrap().message, after);
        assert_eq!(d.next_seq(), 2);
    }

    #[test]
    fn a_chunk_head_is_validated_and_a_partly_buffered_payload_is_not_placed() {
        // The encoder refuses a misaligned chunk: write a byte chunk, then claim f32.
        let bytes_chunk = Message::Chunk(Chunk {
            header: ChunkHeader::new(Collective::AllReduce, DType::U8, OpSeq(0), 0, 0),
            payload: Bytes::from(vec![0u8; 6]),
        });
        let mut bytes = stream(&[bytes_chunk]);
        bytes[HEADER_LEN + 1] = DType::F32.code();
        let mut d = open();
        d.push(&bytes[..HEADER_LEN + ChunkHeader::LEN]);
        assert!(matches!(d.chunk_head(), Err(DecodeError::Invalid { .. })));
        assert!(d.next().is_err(), "the refusal poisons the stream");

        let fine = Message::Chunk(Chunk {
            header: ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(0), 0, 0),
            payload: Bytes::from(vec![0u8; 8]),
        });
        let bytes = stream(std::slice::from_ref(&fine));
        let mut d = open();
        d.push(&bytes[..HEADER_LEN + ChunkHeader::LEN + 1]);
        assert_eq!(d.chunk_head().unwrap(), None);
        assert!(
            d.skip_placed().is_err(),
            "nothing to skip once a payload byte is in"
        );
    }

    #[test]
    fn garbage_fails_on_the_first_byte_and_poisons() {
        let mut d = open();
        d.push(b"G");
        let e = d.next().unwrap_err();
        assert!(matches!(e, DecodeError::BadMagic { .. }));
        assert_eq!(e.code(), CloseCode::PROTOCOL_VIOLATION);
        // A valid frame afterwards does not resynchronise the stream.
        d.push(&stream(&sample()));
        assert_eq!(d.next().unwrap_err(), e);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn oversize_claim_fails_before_the_body_arrives_and_reserves_nothing() {
        let mut h = Header::parse(
            stream(&[Message::Depart(Depart::new(CloseCode::NORMAL, ""))])[..HEADER_LEN]
                .try_into()
                .unwrap(),
        )
        .unwrap();
        h.body_len = u32::MAX;
        let mut d = open();
        d.push(&h.to_bytes());
        let e = d.next().unwrap_err();
        assert!(
            matches!(
                e,
                DecodeError::Oversize {
                    kind: Kind::Depart,
                    ..
                }
            ),
            "{e}"
        );
        assert!(d.recv_buf().capacity() < 1 << 20);
    }

    #[test]
    fn fixed_size_kind_with_another_length_is_refused() {
        let mut bytes = stream(&[Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })]);
        bytes[28] = 17;
        bytes.extend_from_slice(&[0]);
        let mut d = open();
        d.push(&bytes);
        assert!(matches!(
            d.next(),
            Err(DecodeError::BadLength {
                kind: Kind::Heartbeat,
                len: 17,
                expected: 16
            })
        ));
    }

    #[test]
    fn sequence_gap_and_repeat_are_violations() {
        let mut enc = Encoder::default();
        let mut out = BytesMut::new();
        let hb = Message::Heartbeat(Heartbeat { seq: 0, digest: 0 });
        enc.encode(&env(), &hb, &mut out).unwrap();
        let first = out.clone();
        // Repeat frame 0.
        out.extend_from_slice(&first);
        let mut d = open();
        d.push(&out);
        assert!(d.next().unwrap().is_some());
        assert_eq!(
            d.next(),
            Err(DecodeError::SequenceGap {
                expected: 1,
                found: 0
            })
        );
    }

    #[test]
    fn wrong_version_closes_with_version_mismatch() {
        let mut bytes = stream(&[Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })]);
        bytes[4] = 2;
        let mut d = open();
        d.push(&bytes[..6]);
        let e = d.next().unwrap_err();
        assert_eq!(
            e,
            DecodeError::UnsupportedVersion {
                version: 2,
                expected: 1
            }
        );
        assert_eq!(e.code(), CloseCode::VERSION_MISMATCH);
    }

    #[test]
    fn acceptor_refuses_anything_but_hello_before_the_handshake() {
        let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
        d.push(&stream(&[Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })])[..6]);
        assert!(matches!(
            d.next(),
            Err(DecodeError::Unexpected {
                kind: Kind::Heartbeat,
                ..
            })
        ));
    }

    #[test]
    fn established_stream_refuses_other_comm_and_sender() {
        let bytes = stream(&[Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })]);
        let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
        d.establish(1, Role::Member, Side::Acceptor, CommId(1), Rank(3));
        d.push(&bytes);
        assert_eq!(
            d.next(),
            Err(DecodeError::WrongSender {
                expected: Rank(3),
                found: Rank(2)
            })
        );
        let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
        d.establish(1, Role::Member, Side::Acceptor, CommId(7), Rank(2));
        d.push(&bytes);
        let e = d.next().unwrap_err();
        assert_eq!(e.code(), CloseCode::UNKNOWN_COMM);
    }

    #[test]
    fn data_stream_refuses_control_frames() {
        let bytes = stream(&[Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })]);
        let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
        d.establish(1, Role::Data, Side::Acceptor, CommId(1), Rank(2));
        d.push(&bytes);
        assert!(matches!(d.next(), Err(DecodeError::Unexpected { .. })));
    }

    #[test]
    fn nothing_may_follow_a_depart() {
        let bytes = stream(&[
            Message::Depart(Depart::new(CloseCode::NORMAL, "done")),
            Message::Heartbeat(Heartbeat { seq: 1, digest: 0 }),
        ]);
        let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
        d.establish(1, Role::Member, Side::Acceptor, CommId(1), Rank(2));
        d.push(&bytes);
        assert!(matches!(
            d.next().unwrap().unwrap().message,
            Message::Depart(_)
        ));
        assert_eq!(
            d.next(),
            Err(DecodeError::Unexpected {
                kind: Kind::Heartbeat,
                phase: "after depart"
            })
        );
    }

    #[test]
    fn role_rules_bind_joins_and_notices_to_the_stream() {
        use crate::samples;
        let decode = |role, sample: &str| {
            let s = samples::named(sample).unwrap();
            let mut out = BytesMut::new();
            Encoder::default()
                .encode(&s.envelope, &s.message, &mut out)
                .unwrap();
            let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
            d.establish(1, role, Side::Acceptor, s.envelope.comm, s.envelope.sender);
            d.push(&out);
            d.next().map(|f| f.is_some())
        };
        assert_eq!(decode(Role::Bootstrap, "join"), Ok(true));
        assert!(decode(Role::Bootstrap, "join-grow").is_err());
        assert_eq!(decode(Role::Joiner, "join-grow"), Ok(true));
        assert!(decode(Role::Joiner, "join").is_err());
        assert_eq!(decode(Role::Launcher, "notice-launcher"), Ok(true));
        assert!(decode(Role::Member, "notice-launcher").is_err());
        assert_eq!(decode(Role::Member, "notice"), Ok(true));
    }

    #[test]
    fn trailing_bytes_in_a_body_are_refused() {
        let mut bytes = stream(&[Message::Depart(Depart::new(CloseCode::LEFT, "bye"))]);
        let len = u32::from_le_bytes(bytes[28..32].try_into().unwrap()) + 4;
        bytes[28..32].copy_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        let mut d = open();
        d.push(&bytes);
        let e = d.next().unwrap_err();
        assert!(
            matches!(
                e,
                DecodeError::NonCanonical { .. } | DecodeError::Malformed { .. }
            ),
            "{e}"
        );
    }
}
