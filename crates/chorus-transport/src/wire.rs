//! The framing seam: how this crate turns messages into bytes and bytes into messages.
//!
//! Everything the links and endpoints need from the wire goes through this file, so that
//! swapping in `chorus_protocol`'s codec (being written on the `protocol` branch) touches
//! only here. Until it lands this is a faithful, minimal implementation of the frame layout
//! described for that codec: a 40-byte fixed header (magic `CHRS`, version, kind, flags,
//! comm, epoch, sender rank, body length, sequence), rkyv bodies validated with bytecheck,
//! and `Chunk` bodies as a fixed 24-byte prefix followed by raw payload, decoded without a
//! copy (the payload is a `Bytes` slice of the receive buffer).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use chorus_protocol::message::{
    Accept, Chunk, ChunkHeader, Commit, Depart, Heartbeat, Hello, HelloAck, Join, Kind, Message,
    Notice, Prepare, Promise, Propose, Reject, Revoke, StatusReply, StatusRequest, Welcome,
};
use chorus_protocol::{CloseCode, CommId, Epoch, OpSeq, Rank};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CHRS";
/// The only frame-layout version this build speaks.
pub const VERSION: u16 = 1;
/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 40;
/// Length of the fixed chunk prefix that precedes a chunk's payload.
pub const CHUNK_PREFIX_LEN: usize = 24;

/// The addressing fields every frame header carries.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Route {
    pub comm: CommId,
    pub epoch: Epoch,
    /// The rank of the frame's sender.
    pub sender: Rank,
}

/// A decoded frame header.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct FrameHeader {
    pub version: u16,
    pub kind: Kind,
    pub flags: u8,
    pub route: Route,
    pub body_len: u32,
    pub seq: u64,
}

/// One decoded frame.
#[derive(Clone, PartialEq, Debug)]
pub struct Frame {
    pub header: FrameHeader,
    pub message: Message,
}

/// Why bytes failed to decode; each maps to the close code the connection closes with.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported frame version {0}")]
    Version(u16),
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("frame body of {len} bytes exceeds the {limit}-byte limit")]
    Oversize { len: u64, limit: u64 },
    #[error("malformed {kind:?} body: {detail}")]
    Malformed { kind: Kind, detail: String },
    #[error("cannot encode {kind:?}: {detail}")]
    Encode { kind: Kind, detail: String },
}

impl WireError {
    /// The close code the spec assigns to this failure.
    pub fn code(&self) -> CloseCode {
        match self {
            WireError::Version(_) => CloseCode::VERSION_MISMATCH,
            WireError::Encode { .. } => CloseCode::INTERNAL,
            _ => CloseCode::PROTOCOL_VIOLATION,
        }
    }
}

/// Bounds on what a peer may announce; checked before any allocation.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Limits {
    /// Largest chunk payload.
    pub max_chunk: u32,
    /// Largest non-chunk message body.
    pub max_message: u32,
}

impl Limits {
    /// What an unauthenticated peer may send: a `Hello` and nothing big.
    pub const HANDSHAKE: Limits = Limits {
        max_chunk: 0,
        max_message: 4 << 10,
    };

    /// What an authenticated peer may send.
    pub fn data(max_chunk: u32) -> Limits {
        Limits {
            max_chunk,
            max_message: 16 << 20,
        }
    }
}

/// Encodes a non-chunk message into a complete frame.
pub fn encode(route: Route, seq: u64, message: &Message) -> Result<Bytes, WireError> {
    if let Message::Chunk(chunk) = message {
        let mut out = encode_chunk_prefix(route, seq, &chunk.header, chunk.payload.len())?;
        out.extend_from_slice(&chunk.payload);
        return Ok(out.freeze());
    }
    let body = archive(message)?;
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    put_header(&mut out, message.kind(), route, body.len(), seq)?;
    out.extend_from_slice(&body);
    Ok(out.freeze())
}

/// The frame header and chunk prefix for a chunk whose `payload_len` payload bytes follow,
/// so the payload itself can be written from its own buffer (no copy).
pub fn encode_chunk_prefix(
    route: Route,
    seq: u64,
    header: &ChunkHeader,
    payload_len: usize,
) -> Result<BytesMut, WireError> {
    let mut out = BytesMut::with_capacity(HEADER_LEN + CHUNK_PREFIX_LEN);
    put_header(
        &mut out,
        Kind::Chunk,
        route,
        CHUNK_PREFIX_LEN + payload_len,
        seq,
    )?;
    out.put_u8(header.collective);
    out.put_u8(header.dtype);
    out.put_u16_le(0);
    out.put_u32_le(header.step);
    out.put_u64_le(header.op.get());
    out.put_u64_le(header.offset);
    Ok(out)
}

fn put_header(
    out: &mut BytesMut,
    kind: Kind,
    route: Route,
    body_len: usize,
    seq: u64,
) -> Result<(), WireError> {
    let body_len = u32::try_from(body_len).map_err(|_| WireError::Encode {
        kind,
        detail: format!("body of {body_len} bytes does not fit a frame"),
    })?;
    out.put_slice(&MAGIC);
    out.put_u16_le(VERSION);
    out.put_u8(kind as u8);
    out.put_u8(0);
    out.put_u64_le(route.comm.get());
    out.put_u64_le(route.epoch.get());
    out.put_u32_le(route.sender.get());
    out.put_u32_le(body_len);
    out.put_u64_le(seq);
    Ok(())
}

/// A streaming decoder. Read straight into [`Decoder::buffer`] (reserve [`Decoder::wanted`]
/// first) so a large chunk lands in its final allocation and leaves as `Bytes` uncopied.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    limits: Limits,
    pending: Option<FrameHeader>,
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Self {
            buf: BytesMut::new(),
            limits,
            pending: None,
        }
    }

    /// Raise or lower the limits (after the handshake authenticates the peer).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// The receive buffer: append what the socket delivered.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes still missing before the next frame can be decoded (at least 1).
    pub fn wanted(&self) -> usize {
        let need = match &self.pending {
            Some(h) => h.body_len as usize,
            None => HEADER_LEN,
        };
        need.saturating_sub(self.buf.len()).max(1)
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed. An error is final: the
    /// connection must be closed with [`WireError::code`].
    pub fn decode(&mut self) -> Result<Option<Frame>, WireError> {
        let header = match self.pending {
            Some(h) => h,
            None => {
                if self.buf.len() < HEADER_LEN {
                    return Ok(None);
                }
                let h = parse_header(&self.buf[..HEADER_LEN], &self.limits)?;
                self.buf.advance(HEADER_LEN);
                // Bounded by the limits checked in parse_header, so a lying length costs at
                // most one limit's worth of memory.
                self.buf.reserve(h.body_len as usize);
                self.pending = Some(h);
                h
            }
        };
        if self.buf.len() < header.body_len as usize {
            return Ok(None);
        }
        let body = self.buf.split_to(header.body_len as usize).freeze();
        self.pending = None;
        let message = decode_body(header.kind, body)?;
        Ok(Some(Frame { header, message }))
    }
}

fn parse_header(b: &[u8], limits: &Limits) -> Result<FrameHeader, WireError> {
    let mut b = b;
    let mut magic = [0u8; 4];
    b.copy_to_slice(&mut magic);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = b.get_u16_le();
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let kind_code = b.get_u8();
    let kind = kind_from_code(kind_code).ok_or(WireError::UnknownKind(kind_code))?;
    let flags = b.get_u8();
    let comm = CommId(b.get_u64_le());
    let epoch = Epoch(b.get_u64_le());
    let sender = Rank(b.get_u32_le());
    let body_len = b.get_u32_le();
    let seq = b.get_u64_le();
    let limit = match kind {
        Kind::Chunk => u64::from(limits.max_chunk) + CHUNK_PREFIX_LEN as u64,
        _ => u64::from(limits.max_message),
    };
    if u64::from(body_len) > limit {
        return Err(WireError::Oversize {
            len: body_len.into(),
            limit,
        });
    }
    Ok(FrameHeader {
        version,
        kind,
        flags,
        route: Route {
            comm,
            epoch,
            sender,
        },
        body_len,
        seq,
    })
}

fn decode_chunk(mut body: Bytes) -> Result<Message, WireError> {
    if body.len() < CHUNK_PREFIX_LEN {
        return Err(WireError::Malformed {
            kind: Kind::Chunk,
            detail: format!("{} bytes, shorter than the chunk prefix", body.len()),
        });
    }
    let collective = body.get_u8();
    let dtype = body.get_u8();
    let _reserved = body.get_u16_le();
    let step = body.get_u32_le();
    let op = OpSeq(body.get_u64_le());
    let offset = body.get_u64_le();
    Ok(Message::Chunk(Chunk {
        header: ChunkHeader {
            collective,
            dtype,
            op,
            step,
            offset,
        },
        payload: body,
    }))
}

macro_rules! archived_kinds {
    ($($kind:ident),* $(,)?) => {
        fn kind_from_code(code: u8) -> Option<Kind> {
            $(if code == Kind::$kind as u8 { return Some(Kind::$kind); })*
            if code == Kind::Chunk as u8 { return Some(Kind::Chunk); }
            None
        }

        fn archive(message: &Message) -> Result<rkyv::util::AlignedVec, WireError> {
            let encoded = match message {
                $(Message::$kind(m) => rkyv::to_bytes::<rkyv::rancor::Error>(m),)*
                Message::Chunk(_) => return Err(WireError::Encode {
                    kind: Kind::Chunk,
                    detail: "chunks are encoded by prefix".into(),
                }),
            };
            encoded.map_err(|e| WireError::Encode { kind: message.kind(), detail: e.to_string() })
        }

        fn decode_body(kind: Kind, body: Bytes) -> Result<Message, WireError> {
            let malformed = |e: rkyv::rancor::Error| WireError::Malformed {
                kind,
                detail: e.to_string(),
            };
            match kind {
                $(Kind::$kind => rkyv::from_bytes::<$kind, rkyv::rancor::Error>(&body)
                    .map(Message::$kind)
                    .map_err(malformed),)*
                Kind::Chunk => decode_chunk(body),
            }
        }
    };
}

archived_kinds!(
    Hello,
    HelloAck,
    Reject,
    Join,
    Welcome,
    Heartbeat,
    Depart,
    Notice,
    Revoke,
    Prepare,
    Promise,
    Propose,
    Accept,
    Commit,
    StatusRequest,
    StatusReply,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route {
            comm: CommId(7),
            epoch: Epoch(3),
            sender: Rank(2),
        }
    }

    #[test]
    fn chunk_round_trips_without_copying_the_payload() {
        let header = ChunkHeader {
            collective: 0,
            dtype: 0,
            op: OpSeq(9),
            step: 4,
            offset: 1024,
        };
        let payload = Bytes::from(vec![5u8; 1000]);
        let mut dec = Decoder::new(Limits::data(1 << 20));
        let prefix = encode_chunk_prefix(route(), 1, &header, payload.len()).unwrap();
        dec.buffer().extend_from_slice(&prefix);
        assert_eq!(dec.decode().unwrap(), None);
        assert_eq!(dec.wanted(), 1000);
        let cap_ptr = dec.buffer().as_ptr();
        dec.buffer().extend_from_slice(&payload);
        let frame = dec.decode().unwrap().unwrap();
        assert_eq!(frame.header.route, route());
        let Message::Chunk(c) = frame.message else {
            panic!("not a chunk")
        };
        assert_eq!(c.header, header);
        assert_eq!(c.payload, payload);
        // The payload is a view of the receive buffer the bytes were read into.
        assert_eq!(c.payload.as_ptr(), cap_ptr.wrapping_add(CHUNK_PREFIX_LEN));
    }

    #[test]
    fn messages_round_trip_byte_by_byte() {
        let msg = Message::Depart(Depart {
            code: CloseCode::ABORTED,
            detail: "bye".into(),
        });
        let bytes = encode(route(), 5, &msg).unwrap();
        let mut dec = Decoder::new(Limits::HANDSHAKE);
        for (i, b) in bytes.iter().enumerate() {
            dec.buffer().put_u8(*b);
            let got = dec.decode().unwrap();
            if i + 1 < bytes.len() {
                assert_eq!(got, None);
            } else {
                assert_eq!(got.unwrap().message, msg);
            }
        }
    }

    #[test]
    fn bad_headers_name_their_code_before_allocating() {
        let good = encode(route(), 0, &Message::Heartbeat(Heartbeat { seq: 1 })).unwrap();
        let mut bad_magic = good.to_vec();
        bad_magic[0] = b'X';
        let mut bad_version = good.to_vec();
        bad_version[4] = 9;
        let mut oversize = good.to_vec();
        oversize[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut bad_kind = good.to_vec();
        bad_kind[6] = 0xee;
        for (bytes, code) in [
            (bad_magic, CloseCode::PROTOCOL_VIOLATION),
            (bad_version, CloseCode::VERSION_MISMATCH),
            (oversize, CloseCode::PROTOCOL_VIOLATION),
            (bad_kind, CloseCode::PROTOCOL_VIOLATION),
        ] {
            let mut dec = Decoder::new(Limits::HANDSHAKE);
            dec.buffer().extend_from_slice(&bytes);
            let err = dec.decode().unwrap_err();
            assert_eq!(err.code(), code, "{err}");
            assert!(dec.buffer().capacity() < 64 << 10);
        }
    }

    #[test]
    fn garbage_bodies_are_errors_not_panics() {
        let mut frame = BytesMut::new();
        put_header(&mut frame, Kind::Welcome, route(), 64, 0).unwrap();
        frame.extend_from_slice(&[0xffu8; 64]);
        let mut dec = Decoder::new(Limits::HANDSHAKE);
        dec.buffer().extend_from_slice(&frame);
        assert_eq!(
            dec.decode().unwrap_err().code(),
            CloseCode::PROTOCOL_VIOLATION
        );
    }
}
