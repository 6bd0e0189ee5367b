//! What a data link does with each frame it reads, whatever carried it (io_uring, tokio,
//! a QUIC stream): validate the route, hand chunks to the matcher, turn a `Depart` into the
//! peer's departure, and turn anything else into a protocol violation.

use bytes::Bytes;
use chorus_engine::link::{LinkError, Tag};
use chorus_protocol::message::{Chunk, Depart, Message};
use chorus_protocol::{CloseCode, Collective, DType};

use crate::matcher::Matcher;
use crate::wire::{self, Frame, Route, WireError};

/// What the reader does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// Stop reading and close; send a departure with this code first if `Some`.
    Close(Option<(CloseCode, String)>),
}

/// Handles one decoded frame for the link whose peer speaks with `peer_route`.
pub(crate) fn on_frame(matcher: &Matcher, peer_route: Route, frame: Frame) -> Flow {
    let route = frame.header.route;
    if route.comm != peer_route.comm {
        return violation(
            matcher,
            CloseCode::UNKNOWN_COMM,
            format!("frame for {} on a link of {}", route.comm, peer_route.comm),
        );
    }
    if route.epoch != peer_route.epoch {
        let code = if route.epoch < peer_route.epoch {
            CloseCode::STALE_EPOCH
        } else {
            CloseCode::PROTOCOL_VIOLATION
        };
        return violation(
            matcher,
            code,
            format!("frame of {} on a link of {}", route.epoch, peer_route.epoch),
        );
    }
    if route.sender != peer_route.sender {
        return violation(
            matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!(
                "frame from {} on the link to {}",
                route.sender, peer_route.sender
            ),
        );
    }
    match frame.message {
        Message::Chunk(chunk) => on_chunk(matcher, chunk),
        Message::Depart(Depart { code, detail }) => {
            matcher.fail(LinkError::PeerDeparted { code, detail });
            Flow::Close(None)
        }
        other => violation(
            matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!("unexpected {:?} on a data link", other.kind()),
        ),
    }
}

/// The decoder failed: fail the link and close with the error's code.
pub(crate) fn on_wire_error(matcher: &Matcher, err: WireError) -> Flow {
    violation(matcher, err.code(), err.to_string())
}

/// The byte stream ended or failed. Without a prior departure that is a lost connection.
pub(crate) fn on_lost(matcher: &Matcher, detail: String) {
    matcher.fail(LinkError::ConnectionLost { detail });
}

fn on_chunk(matcher: &Matcher, chunk: Chunk) -> Flow {
    let h = chunk.header;
    let (Some(collective), Some(dtype)) = (
        Collective::from_code(h.collective),
        DType::from_code(h.dtype),
    ) else {
        return violation(
            matcher,
            CloseCode::PROTOCOL_VIOLATION,
            format!(
                "chunk with unknown collective {} or dtype {}",
                h.collective, h.dtype
            ),
        );
    };
    let tag = Tag {
        collective,
        op: h.op,
        step: h.step,
        offset: h.offset,
        dtype,
    };
    match matcher.deliver(tag, chunk.payload) {
        Ok(()) => Flow::Continue,
        Err(err) => {
            matcher.fail(err.clone());
            Flow::Close(Some((CloseCode::PROTOCOL_VIOLATION, err.to_string())))
        }
    }
}

fn violation(matcher: &Matcher, code: CloseCode, detail: String) -> Flow {
    matcher.fail(LinkError::Protocol {
        code,
        detail: detail.clone(),
    });
    Flow::Close(Some((code, detail)))
}

/// The departure frame a link sends before it closes.
pub(crate) fn depart_frame(route: Route, code: CloseCode, detail: &str) -> Option<Bytes> {
    // The spec bounds details; a long one is cut rather than refused.
    let detail: String = detail.chars().take(256).collect();
    wire::encode(route, 0, &Message::Depart(Depart { code, detail })).ok()
}
