//! Frame bodies: rkyv archives for every kind but `Chunk`, which is a fixed header followed
//! by raw payload (SPEC.md, "Bodies"). This file owns the size rules per kind, and the
//! encode, check and decode of a body.
//!
//! Decoding a body is: length against the kind's rule (done by the decoder before the body
//! is buffered), bytecheck of the archive, deserialize, a canonical-encoding check (the body
//! must be exactly what encoding the decoded value produces: no trailing bytes, no stray
//! padding), then the semantic rules of `validation.rs`.

use std::mem::size_of;

use bytes::{BufMut, Bytes, BytesMut};
use rkyv::rancor;
use rkyv::ser::{Positional, Writer};

use crate::error::{DecodeError, EncodeError};
use crate::limits::Limits;
use crate::message::{
    Accept, Chunk, ChunkHeader, Commit, Depart, Heartbeat, Hello, HelloAck, Join, Kind, Message,
    Notice, Prepare, Promise, Propose, Reject, Revoke, StatusReply, StatusRequest, Welcome,
};
use crate::validation::validate_chunk_header;

/// How long a kind's body may be.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum SizeRule {
    /// Exactly this many bytes (a fixed-layout archive).
    Exact(u32),
    /// Up to `Limits::max_small_body`.
    Small,
    /// Up to `Limits::max_table_body`.
    Table,
    /// `ChunkHeader::LEN` plus up to `Limits::max_chunk_payload`.
    Chunk,
}

impl SizeRule {
    pub(crate) const fn of(kind: Kind) -> SizeRule {
        match kind {
            Kind::Hello => SizeRule::Exact(size_of::<rkyv::Archived<Hello>>() as u32),
            Kind::HelloAck => SizeRule::Exact(size_of::<rkyv::Archived<HelloAck>>() as u32),
            Kind::Heartbeat => SizeRule::Exact(size_of::<rkyv::Archived<Heartbeat>>() as u32),
            Kind::Notice => SizeRule::Exact(size_of::<rkyv::Archived<Notice>>() as u32),
            Kind::Revoke => SizeRule::Exact(size_of::<rkyv::Archived<Revoke>>() as u32),
            Kind::Prepare => SizeRule::Exact(size_of::<rkyv::Archived<Prepare>>() as u32),
            Kind::StatusRequest => {
                SizeRule::Exact(size_of::<rkyv::Archived<StatusRequest>>() as u32)
            }
            Kind::Reject | Kind::Join | Kind::Depart => SizeRule::Small,
            Kind::Welcome
            | Kind::Promise
            | Kind::Propose
            | Kind::Accept
            | Kind::Commit
            | Kind::StatusReply => SizeRule::Table,
            Kind::Chunk => SizeRule::Chunk,
        }
    }

    /// Checks a body length against this rule under `limits`.
    pub(crate) fn check(self, kind: Kind, len: u32, limits: &Limits) -> Result<(), DecodeError> {
        let limit = match self {
            SizeRule::Exact(expected) => {
                if len != expected {
                    return Err(DecodeError::BadLength {
                        kind,
                        len,
                        expected,
                    });
                }
                return Ok(());
            }
            SizeRule::Small => limits.max_small_body,
            SizeRule::Table => limits.max_table_body,
            SizeRule::Chunk => {
                if len < ChunkHeader::LEN as u32 {
                    return Err(DecodeError::BadLength {
                        kind,
                        len,
                        expected: ChunkHeader::LEN as u32,
                    });
                }
                limits
                    .max_chunk_payload
                    .saturating_add(ChunkHeader::LEN as u32)
            }
        };
        if len > limit {
            return Err(DecodeError::Oversize { kind, len, limit });
        }
        Ok(())
    }

    /// The largest body this rule allows under `limits`.
    pub(crate) fn max(self, limits: &Limits) -> u32 {
        match self {
            SizeRule::Exact(n) => n,
            SizeRule::Small => limits.max_small_body,
            SizeRule::Table => limits.max_table_body,
            SizeRule::Chunk => limits
                .max_chunk_payload
                .saturating_add(ChunkHeader::LEN as u32),
        }
    }
}

/// Appends the body of `message` to `out`. On error `out` may hold a partial body; the
/// caller truncates.
pub(crate) fn encode_body(message: &Message, out: &mut BytesMut) -> Result<(), EncodeError> {
    macro_rules! archive {
        ($m:expr) => {{
            let start = out.len();
            rkyv::api::high::to_bytes_in::<_, rancor::Error>($m, BodyWriter { out, start })
                .map(|_| ())
                .map_err(|e| EncodeError::Serialize {
                    kind: message.kind(),
                    detail: e.to_string(),
                })
        }};
    }
    match message {
        Message::Hello(m) => archive!(m),
        Message::HelloAck(m) => archive!(m),
        Message::Reject(m) => archive!(m),
        Message::Join(m) => archive!(m),
        Message::Welcome(m) => archive!(m),
        Message::Heartbeat(m) => archive!(m),
        Message::Depart(m) => archive!(m),
        Message::Notice(m) => archive!(m),
        Message::Revoke(m) => archive!(m),
        Message::Prepare(m) => archive!(m),
        Message::Promise(m) => archive!(m),
        Message::Propose(m) => archive!(m),
        Message::Accept(m) => archive!(m),
        Message::Commit(m) => archive!(m),
        Message::StatusRequest(m) => archive!(m),
        Message::StatusReply(m) => archive!(m),
        Message::Chunk(c) => {
            out.put_slice(&c.header.to_bytes());
            out.put_slice(&c.payload);
            Ok(())
        }
    }
}

/// Decodes, checks and validates a body of `kind` whose length already passed
/// [`SizeRule::check`]. A chunk's payload is a slice of `body`, not a copy.
pub(crate) fn decode_body(
    kind: Kind,
    body: Bytes,
    limits: &Limits,
) -> Result<Message, DecodeError> {
    macro_rules! archive {
        ($ty:ty, $variant:ident, canonical_by_length) => {{
            let value = access::<$ty>(kind, &body)?;
            check_and_wrap(kind, Message::$variant(value), limits)
        }};
        ($ty:ty, $variant:ident) => {{
            let value = access::<$ty>(kind, &body)?;
            let message = Message::$variant(value);
            canonical(kind, &message, &body)?;
            check_and_wrap(kind, message, limits)
        }};
    }
    match kind {
        // Every byte of these fixed layouts is meaningful and checked by bytecheck (ints,
        // byte arrays, enum tags, bools), so an exact length implies the canonical encoding.
        Kind::Hello => archive!(Hello, Hello, canonical_by_length),
        Kind::HelloAck => archive!(HelloAck, HelloAck, canonical_by_length),
        Kind::Heartbeat => archive!(Heartbeat, Heartbeat, canonical_by_length),
        Kind::Prepare => archive!(Prepare, Prepare, canonical_by_length),
        Kind::StatusRequest => archive!(StatusRequest, StatusRequest, canonical_by_length),
        // These hold an enum with payloads of different sizes: padding must be checked.
        Kind::Notice => archive!(Notice, Notice),
        Kind::Revoke => archive!(Revoke, Revoke),
        Kind::Reject => archive!(Reject, Reject),
        Kind::Join => archive!(Join, Join),
        Kind::Welcome => archive!(Welcome, Welcome),
        Kind::Depart => archive!(Depart, Depart),
        Kind::Promise => archive!(Promise, Promise),
        Kind::Propose => archive!(Propose, Propose),
        Kind::Accept => archive!(Accept, Accept),
        Kind::Commit => archive!(Commit, Commit),
        Kind::StatusReply => archive!(StatusReply, StatusReply),
        Kind::Chunk => {
            let fixed: &[u8; ChunkHeader::LEN] = body
                .get(..ChunkHeader::LEN)
                .and_then(|b| b.try_into().ok())
                .ok_or(DecodeError::BadLength {
                    kind,
                    len: body.len() as u32,
                    expected: ChunkHeader::LEN as u32,
                })?;
            let header = ChunkHeader::parse(fixed)
                .map_err(|reason| DecodeError::Invalid { kind, reason })?;
            let payload_len = (body.len() - ChunkHeader::LEN) as u64;
            validate_chunk_header(&header, payload_len)
                .map_err(|reason| DecodeError::Invalid { kind, reason })?;
            Ok(Message::Chunk(Chunk {
                header,
                payload: body.slice(ChunkHeader::LEN..),
            }))
        }
    }
}

/// Bytechecks and deserializes an archive of `T`. The low-level validator suffices (no body
/// holds a shared pointer) and allocates nothing.
fn access<T>(kind: Kind, bytes: &[u8]) -> Result<T, DecodeError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::low::LowValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rancor::Strategy<rkyv::de::Unpool, rancor::Error>>,
{
    rkyv::api::low::from_bytes::<T, rancor::Error>(bytes).map_err(|e| DecodeError::Malformed {
        kind,
        detail: e.to_string(),
    })
}

/// Fails unless `body` is exactly the encoding of `message`.
fn canonical(kind: Kind, message: &Message, body: &[u8]) -> Result<(), DecodeError> {
    let mut again = BytesMut::with_capacity(body.len());
    encode_body(message, &mut again).map_err(|_| DecodeError::NonCanonical { kind })?;
    if again[..] != body[..] {
        return Err(DecodeError::NonCanonical { kind });
    }
    Ok(())
}

fn check_and_wrap(kind: Kind, message: Message, limits: &Limits) -> Result<Message, DecodeError> {
    message
        .validate(limits)
        .map_err(|reason| DecodeError::Invalid { kind, reason })?;
    Ok(message)
}

/// An rkyv writer appending to a `BytesMut`, with positions relative to the body's start
/// (rkyv's relative pointers and root position are computed from them).
struct BodyWriter<'a> {
    out: &'a mut BytesMut,
    start: usize,
}

impl Positional for BodyWriter<'_> {
    fn pos(&self) -> usize {
        self.out.len() - self.start
    }
}

impl<E> Writer<E> for BodyWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.out.extend_from_slice(bytes);
        Ok(())
    }
}
