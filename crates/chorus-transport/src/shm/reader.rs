//! The consuming half of one shm link: copies what the peer's ring holds into the stream's
//! decoder and hands every whole frame to the matcher, under the reader lock (so the pump
//! thread and a spinning `recv` take turns, and the stream stays in order).
//!
//! The peer's tail is read once per pass and checked against our own head (`Consumer`);
//! a tail out of range is a protocol violation that ends the stream. Each pass copies at
//! most one ring's worth, and the decoder holds at most the frame in progress, whose length
//! it checks against the limits before it reserves for it: memory stays bounded whatever
//! the peer writes.

use std::sync::atomic::Ordering;

use chorus_protocol::CloseCode;
use chorus_protocol::message::Depart;

use super::shared::{ReadState, Shared};
use crate::inbound::{self, Flow};

/// What a pass over the peer's ring found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pumped {
    /// Everything the ring held is decoded; this many bytes were taken.
    Drained(usize),
    /// Another thread is reading right now.
    Busy,
    /// The stream is over: close the link with this departure, if any.
    Close(Option<Depart>),
}

impl ReadState {
    fn end(&mut self, depart: Option<Depart>) -> Pumped {
        self.ended = Some(depart.clone());
        Pumped::Close(depart)
    }
}

impl Shared {
    /// Reads the peer's ring, waiting for another reader to finish.
    pub(super) fn pump(&self) -> Pumped {
        let mut st = self.reader.lock();
        self.drain(&mut st)
    }

    /// Like [`Shared::pump`], but `Busy` at once if another thread is reading.
    pub(super) fn try_pump(&self) -> Pumped {
        match self.reader.try_lock() {
            Some(mut st) => self.drain(&mut st),
            None => Pumped::Busy,
        }
    }

    /// Whether the peer's ring holds bytes we have not taken (a bad index counts: the
    /// next pass reports it). A reader busy right now takes them itself: no.
    pub(super) fn readable(&self) -> bool {
        let tail = self.tail(self.me.peer()).load(Ordering::SeqCst);
        match self.reader.try_lock() {
            Some(st) => st.ended.is_none() && tail != st.consumer.head(),
            None => false,
        }
    }

    fn drain(&self, st: &mut ReadState) -> Pumped {
        if let Some(depart) = &st.ended {
            return Pumped::Close(depart.clone());
        }
        let peer = self.me.peer();
        let mut taken = 0;
        loop {
            let tail = self.tail(peer).load(Ordering::Acquire);
            let spans = match st.consumer.readable(tail, usize::MAX) {
                Ok(spans) => spans,
                Err(e) => {
                    let flow = inbound::on_violation(
                        &self.matcher,
                        CloseCode::PROTOCOL_VIOLATION,
                        format!("shm ring: {e}"),
                    );
                    return st.end(flow_depart(flow));
                }
            };
            if spans.is_empty() {
                return Pumped::Drained(taken);
            }
            self.seg.copy_out(peer, &spans, st.decoder.recv_buf());
            let head = st.consumer.consume(spans.len());
            taken += spans.len();
            self.head(peer).store(head, Ordering::SeqCst);
            self.notify_peer();
            if let Flow::Close(depart) = self.decode(st) {
                return st.end(depart);
            }
        }
    }

    fn decode(&self, st: &mut ReadState) -> Flow {
        loop {
            let flow = match st.decoder.next() {
                Ok(Some(frame)) => inbound::on_frame(&self.matcher, &self.peer, frame),
                Ok(None) => return Flow::Continue,
                Err(e) => inbound::on_decode_error(&self.matcher, &e),
            };
            if let Flow::Close(_) = flow {
                return flow;
            }
        }
    }
}

fn flow_depart(flow: Flow) -> Option<Depart> {
    match flow {
        Flow::Close(depart) => depart,
        Flow::Continue => None,
    }
}
