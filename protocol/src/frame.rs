//! Frames and the encoder: a header, then the body of one message (SPEC.md, "Framing").
//!
//! An [`Encoder`] belongs to the sending side of one byte stream (a TCP connection, a QUIC
//! stream): it numbers frames from 0 and stamps the connection's protocol version. For a
//! data chunk whose payload should not be copied, [`Encoder::encode_chunk_prefix`] writes
//! only the frame header and chunk header; the caller sends the payload right after them
//! (writev, zero-copy send) with nothing in between.

use bytes::{BufMut, BytesMut};

use crate::body::{SizeRule, encode_body};
use crate::error::EncodeError;
use crate::header::{BASE_VERSION, Envelope, HEADER_LEN, Header};
use crate::limits::Limits;
use crate::message::{ChunkHeader, Kind, Message};
use crate::validation::validate_chunk_header;

/// Bytes before a chunk's payload: the frame header, then the chunk header.
pub const CHUNK_PREFIX_LEN: usize = HEADER_LEN + ChunkHeader::LEN;

/// One decoded frame.
#[derive(Clone, PartialEq, Debug)]
pub struct Frame {
    /// The fixed header as received: kind, routing (communicator, epoch, sender), sequence.
    pub header: Header,
    /// The body, decoded and validated against the spec's rules for its kind.
    pub message: Message,
}

/// The sending half of one byte stream's framing state.
#[derive(Clone, Debug)]
pub struct Encoder {
    version: u8,
    next_seq: u64,
    limits: Limits,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new(Limits::DEFAULT)
    }
}

impl Encoder {
    /// An encoder for a new stream: sequence 0, version [`BASE_VERSION`] until the
    /// handshake negotiates another. It refuses messages `limits` would refuse to decode.
    pub fn new(limits: Limits) -> Self {
        Encoder {
            version: BASE_VERSION,
            next_seq: 0,
            limits,
        }
    }

    /// Switches to the version the handshake negotiated.
    pub fn set_version(&mut self, version: u8) {
        self.version = version;
    }

    /// The version stamped on frames other than `Hello` and `HelloAck`.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The sequence number the next frame will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The limits this encoder enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Appends one frame carrying `message` to `out` and returns its header. On error
    /// nothing is appended and the sequence number is not consumed.
    pub fn encode(
        &mut self,
        envelope: &Envelope,
        message: &Message,
        out: &mut BytesMut,
    ) -> Result<Header, EncodeError> {
        let kind = message.kind();
        message
            .validate(&self.limits)
            .map_err(|reason| EncodeError::Invalid { kind, reason })?;
        let start = out.len();
        out.put_bytes(0, HEADER_LEN);
        if let Err(e) = encode_body(message, out) {
            out.truncate(start);
            return Err(e);
        }
        let body_len = out.len() - start - HEADER_LEN;
        let header = match self.header(kind, envelope, body_len as u64) {
            Ok(h) => h,
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        };
        out[start..start + HEADER_LEN].copy_from_slice(&header.to_bytes());
        self.next_seq += 1;
        Ok(header)
    }

    /// Appends the frame header and the chunk header of a chunk whose `payload_len` payload
    /// bytes the caller sends immediately after, without copying them into `out`.
    pub fn encode_chunk_prefix(
        &mut self,
        envelope: &Envelope,
        chunk: &ChunkHeader,
        payload_len: usize,
        out: &mut BytesMut,
    ) -> Result<Header, EncodeError> {
        let (header, prefix) = self.chunk_prefix(envelope, chunk, payload_len)?;
        out.put_slice(&prefix);
        Ok(header)
    }

    /// [`Encoder::encode_chunk_prefix`] into an array: the prefix a sender writes straight
    /// to its stream, with no buffer to allocate.
    pub fn chunk_prefix(
        &mut self,
        envelope: &Envelope,
        chunk: &ChunkHeader,
        payload_len: usize,
    ) -> Result<(Header, [u8; CHUNK_PREFIX_LEN]), EncodeError> {
        let kind = Kind::Chunk;
        validate_chunk_header(chunk, payload_len as u64)
            .map_err(|reason| EncodeError::Invalid { kind, reason })?;
        let header = self.header(
            kind,
            envelope,
            (ChunkHeader::LEN as u64).saturating_add(payload_len as u64),
        )?;
        let mut prefix = [0u8; CHUNK_PREFIX_LEN];
        prefix[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        prefix[HEADER_LEN..].copy_from_slice(&chunk.to_bytes());
        self.next_seq += 1;
        Ok((header, prefix))
    }

    /// The header for the next frame, after checking the body length against the limits.
    fn header(&self, kind: Kind, envelope: &Envelope, len: u64) -> Result<Header, EncodeError> {
        let rule = SizeRule::of(kind);
        let limit = rule.max(&self.limits);
        let body_len = u32::try_from(len)
            .ok()
            .filter(|&l| rule.check(kind, l, &self.limits).is_ok())
            .ok_or(EncodeError::Oversize { kind, len, limit })?;
        Ok(Header {
            version: frame_version(kind, self.version),
            kind,
            flags: 0,
            comm: envelope.comm,
            epoch: envelope.epoch,
            sender: envelope.sender,
            body_len,
            seq: self.next_seq,
        })
    }
}

/// The version a frame of `kind` carries on a stream that speaks `version`: `Hello` and
/// `HelloAck` are the negotiation itself, so they always carry the base version.
pub(crate) fn frame_version(kind: Kind, version: u8) -> u8 {
    match kind {
        Kind::Hello | Kind::HelloAck => BASE_VERSION,
        _ => version,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::code::CloseCode;
    use crate::dtype::{Collective, DType};
    use crate::ids::{CommId, Epoch, OpSeq, Rank};
    use crate::message::{Chunk, Depart, Heartbeat};

    fn env() -> Envelope {
        Envelope::new(CommId(5), Epoch(2), Rank(1))
    }

    #[test]
    fn encode_fills_in_length_kind_and_sequence() {
        let mut enc = Encoder::default();
        let mut out = BytesMut::new();
        let h0 = enc
            .encode(
                &env(),
                &Message::Heartbeat(Heartbeat { seq: 9, digest: 0 }),
                &mut out,
            )
            .unwrap();
        let h1 = enc
            .encode(
                &env(),
                &Message::Heartbeat(Heartbeat { seq: 10, digest: 0 }),
                &mut out,
            )
            .unwrap();
        assert_eq!(h0.seq, 0);
        assert_eq!(h1.seq, 1);
        assert_eq!(h0.kind, Kind::Heartbeat);
        assert_eq!(h0.body_len, 16);
        assert_eq!(out.len(), 2 * (HEADER_LEN + 16));
        assert_eq!(&out[HEADER_LEN..HEADER_LEN + 8], &9u64.to_le_bytes());
        assert_eq!(Header::parse(out[..HEADER_LEN].try_into().unwrap()), Ok(h0));
    }

    #[test]
    fn invalid_message_appends_nothing_and_keeps_the_sequence() {
        let mut enc = Encoder::default();
        let mut out = BytesMut::from(&b"keep"[..]);
        let long = Message::Depart(Depart {
            code: CloseCode::NORMAL,
            detail: "x".repeat(10_000),
        });
        assert!(matches!(
            enc.encode(&env(), &long, &mut out),
            Err(EncodeError::Invalid { .. })
        ));
        assert_eq!(&out[..], b"keep");
        assert_eq!(enc.next_seq(), 0);
    }

    #[test]
    fn depart_new_truncates_so_a_long_reason_never_blocks_departure() {
        let mut enc = Encoder::default();
        let mut out = BytesMut::new();
        let d = Depart::new(CloseCode::ABORTED, "é".repeat(1000));
        assert!(d.detail.len() <= crate::limits::MAX_DETAIL);
        enc.encode(&env(), &Message::Depart(d), &mut out).unwrap();
    }

    #[test]
    fn chunk_prefix_plus_payload_equals_the_whole_chunk_frame() {
        let header = ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(3), 1, 64);
        let payload = Bytes::from(vec![7u8; 256]);
        let mut whole = BytesMut::new();
        Encoder::default()
            .encode(
                &env(),
                &Message::Chunk(Chunk {
                    header,
                    payload: payload.clone(),
                }),
                &mut whole,
            )
            .unwrap();
        let mut prefix = BytesMut::new();
        Encoder::default()
            .encode_chunk_prefix(&env(), &header, payload.len(), &mut prefix)
            .unwrap();
        assert_eq!(prefix.len(), CHUNK_PREFIX_LEN);
        // The array form writes the same bytes and numbers the frame the same way.
        let mut enc = Encoder::default();
        let (h, array) = enc.chunk_prefix(&env(), &header, payload.len()).unwrap();
        assert_eq!(&array[..], &prefix[..]);
        assert_eq!(h.seq, 0);
        let (h, _) = enc.chunk_prefix(&env(), &header, payload.len()).unwrap();
        assert_eq!(h.seq, 1);
        prefix.extend_from_slice(&payload);
        assert_eq!(prefix, whole);
    }

    #[test]
    fn oversize_chunk_is_refused_before_anything_is_written() {
        let limits = Limits {
            max_chunk_payload: 1024,
            ..Limits::DEFAULT
        };
        let mut enc = Encoder::new(limits);
        let header = ChunkHeader::new(Collective::Broadcast, DType::U8, OpSeq(0), 0, 0);
        let mut out = BytesMut::new();
        assert!(matches!(
            enc.encode_chunk_prefix(&env(), &header, 1025, &mut out),
            Err(EncodeError::Oversize { .. })
        ));
        assert!(out.is_empty());
        enc.encode_chunk_prefix(&env(), &header, 1024, &mut out)
            .unwrap();
    }

    #[test]
    fn misaligned_chunk_is_refused() {
        let header = ChunkHeader::new(Collective::AllReduce, DType::F64, OpSeq(0), 0, 4);
        let mut out = BytesMut::new();
        assert!(matches!(
            Encoder::default().encode_chunk_prefix(&env(), &header, 8, &mut out),
            Err(EncodeError::Invalid { .. })
        ));
    }

    #[test]
    fn handshake_frames_keep_the_base_version() {
        assert_eq!(frame_version(Kind::Hello, 7), BASE_VERSION);
        assert_eq!(frame_version(Kind::HelloAck, 7), BASE_VERSION);
        assert_eq!(frame_version(Kind::Heartbeat, 7), 7);
    }
}
