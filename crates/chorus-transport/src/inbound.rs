//! What a data link does with each frame its decoder yields, whatever carried it (io_uring,
//! tokio, a QUIC stream): hand chunks to the matcher, turn a `Depart` into the peer's
//! departure, and turn anything that fails the rules into a close with the spec's code.
//!
//! The protocol decoder has already checked the framing, the body, the sequence, and the
//! gate of the established role (kinds, communicator, sender); what is left here is the
//! epoch, which a data stream serves exactly.

use bytes::Bytes;
use chorus_engine::link::{LinkError, Tag};
use chorus_protocol::message::{Chunk, ChunkHeader, Depart, Message};
use chorus_protocol::{CloseCode, Collective, DType, DecodeError, Envelope, Frame};

use crate::matcher::Matcher;

/// What the reader does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// Stop reading and close; send this departure first if there is one.
    Close(Option<Depart>),
}

/// Handles one decoded frame of the link whose peer sends under `peer`.
pub(crate) fn on_frame(matcher: &Matcher, peer: &Envelope, frame: Frame) -> Flow {
    let epoch = frame.header.epoch;
    if epoch != peer.epoch {
        let code = if epoch < peer.epoch {
            CloseCode::STALE_EPOCH
        } else {
            CloseCode::PROTOCOL_VIOLATION
        };
        return violation(
            matcher,
            code,
            format!("frame of {epoch} on a link of {}", peer.epoch),
        );
    }
    match frame.message {
        Message::Chunk(chunk) => on_chunk(matcher, chunk),
        Message::Depart(Depart { code, detail }) => {
            matcher.fail(LinkError::PeerDeparted { code, detail });
            Flow::Close(None)
        }
        // The data gate admits nothing else; kept so a gate change cannot go unnoticed.
        other => violation(
            matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!("unexpected {} frame on a data link", other.kind()),
        ),
    }
}

/// The decoder refused the stream: fail the link and close with the error's code.
pub(crate) fn on_decode_error(matcher: &Matcher, err: &DecodeError) -> Flow {
    violation(matcher, err.code(), err.to_string())
}

/// The byte stream ended or failed. Without a prior departure that is a lost connection.
pub(crate) fn on_lost(matcher: &Matcher, detail: String) {
    matcher.fail(LinkError::ConnectionLost { detail });
}

/// The tag of `frame` if it is a chunk [`on_frame`] would deliver (the link's epoch, codes
/// the engine knows): a receive reading the stream itself may take such a chunk's payload
/// straight from the decoder when the tag is the one it waits for.
pub(crate) fn chunk_tag(peer: &Envelope, frame: &Frame) -> Option<Tag> {
    match &frame.message {
        Message::Chunk(chunk) if frame.header.epoch == peer.epoch => tag_of(&chunk.header),
        _ => None,
    }
}

fn tag_of(h: &ChunkHeader) -> Option<Tag> {
    Some(Tag {
        collective: Collective::from_code(h.collective)?,
        op: h.op,
        step: h.step,
        offset: h.offset,
        dtype: DType::from_code(h.dtype)?,
    })
}

fn on_chunk(matcher: &Matcher, chunk: Chunk) -> Flow {
    let h = chunk.header;
    // A decoded chunk header always has known codes (the codec validates them).
    let Some(tag) = tag_of(&h) else {
        return violation(
            matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!(
                "chunk with unknown collective {} or dtype {}",
                h.collective, h.dtype
            ),
        );
    };
    deliver(matcher, tag, chunk.payload)
}

/// Hands a payload that arrived under `tag` to the matcher; one it refuses (more held than
/// the limit allows) fails the link and closes it with a protocol violation.
pub(crate) fn deliver(matcher: &Matcher, tag: Tag, payload: Bytes) -> Flow {
    match matcher.deliver(tag, payload) {
        Ok(()) => Flow::Continue,
        Err(err) => {
            matcher.fail(err.clone());
            Flow::Close(Some(Depart::new(
                CloseCode::PROTOCOL_VIOLATION,
                err.to_string(),
            )))
        }
    }
}

/// The carrier found the stream broken below the frames (an shm ring index out of range):
/// fail the link and close with `code`, like a frame that fails the rules.
pub(crate) fn on_violation(matcher: &Matcher, code: CloseCode, detail: String) -> Flow {
    violation(matcher, code, detail)
}

fn violation(matcher: &Matcher, code: CloseCode, detail: String) -> Flow {
    let depart = Depart::new(code, detail.clone());
    matcher.fail(LinkError::Protocol { code, detail });
    Flow::Close(Some(depart))
}
