//! The sending half of one link's byte stream, shared by the link's callers and its writer
//! (the io_uring ring, a tokio task, a QUIC stream task).
//!
//! The stream's protocol `Encoder` lives here, behind the same lock as the queue, so frames
//! are numbered in exactly the order they join the stream. A caller that finds the stream
//! idle (nothing queued, the writer not busy) may write its frame itself with one
//! non-blocking system call; only what the socket does not take at once is queued, and the
//! writer is woken only then. That keeps a small message on the caller's thread from `send`
//! to the kernel, with no hop through a progress thread.
//!
//! Closing drops the frames nobody has started writing and rewinds the encoder to the first
//! of them, so the departure frame takes the next sequence number the peer expects (a
//! dropped frame must not leave a gap: the peer's decoder would call it a violation).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use chorus_engine::link::{LinkError, Tag};
use chorus_protocol::frame::CHUNK_PREFIX_LEN;
use chorus_protocol::message::{ChunkHeader, Depart, Message};
use chorus_protocol::{CloseCode, EncodeError, Encoder, Envelope};
use parking_lot::{Mutex, MutexGuard};

use crate::matcher::{Credit, Matcher};

/// The shared sending state of one stream.
#[derive(Debug)]
pub(crate) struct Outbound {
    encoder: Encoder,
    /// Our envelope on the stream: every frame we send carries it.
    me: Envelope,
    queue: VecDeque<OutFrame>,
    /// The writer owns the wire: callers queue behind it. Invariant: a non-empty queue
    /// implies `writing`.
    writing: bool,
    /// A close was requested (one-way): no frame joins the stream any more.
    closing: bool,
    /// The departure to send once the frame on the wire is finished, if any.
    departure: Option<Depart>,
}

/// A frame on its way out: header bytes in a small buffer, the payload in the caller's own
/// buffer (never copied on the way), and how much of it the wire has taken.
#[derive(Debug)]
pub(crate) struct OutFrame {
    /// Frame header plus chunk header, or a whole small frame.
    pub(crate) head: Bytes,
    pub(crate) payload: Bytes,
    /// Bytes of `head` then `payload` already written.
    pub(crate) off: usize,
    /// Send-window credit returned once the frame is on the wire (none for departures).
    pub(crate) credit: Option<Credit>,
    /// The encoder as it was before this frame was numbered (none for departures).
    rewind: Option<Encoder>,
}

/// A chunk numbered for a payload its sender still holds (see [`Outbound::number_len`]).
#[derive(Debug)]
pub(crate) struct Numbered {
    prefix: [u8; CHUNK_PREFIX_LEN],
    /// The encoder as it was before this chunk was numbered.
    rewind: Encoder,
}

impl Numbered {
    /// The frame header and chunk header, to be written before the payload.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The frame to queue once the first `written` bytes of the prefix, then of `data`
    /// (the whole payload), are on the wire.
    pub(crate) fn into_frame(self, data: &[u8], written: usize) -> OutFrame {
        let mut frame = OutFrame {
            head: Bytes::copy_from_slice(&self.prefix),
            payload: Bytes::new(),
            off: 0,
            credit: None,
            rewind: Some(self.rewind),
        };
        frame.rest_of(data, written);
        frame
    }
}

/// A frame numbered under the stream's lock, which is still held, with its credit.
pub(crate) type Admitted<'a, F> = (MutexGuard<'a, Outbound>, F, Credit);

/// Waits for `len` bytes of send-window credit, then numbers a frame with `admit` under the
/// lock and returns it with the lock still held, so the caller writes it at once or queues
/// it. Awaiting credit is the only suspension point, before anything is numbered: a future
/// dropped there leaves no trace, and once it is past, the frame is written or queued whole.
/// A refused frame gives its credit back.
pub(crate) async fn admit_under_credit<'a, F>(
    outbound: &'a Mutex<Outbound>,
    matcher: &Matcher,
    len: usize,
    admit: impl FnOnce(&mut Outbound) -> Result<F, LinkError>,
) -> Result<Admitted<'a, F>, LinkError> {
    // A failed link refuses here, before any credit is taken.
    let credit = matcher.acquire(len).await?;
    admit_with(outbound, matcher, credit, admit)
}

/// [`admit_under_credit`] without waiting: `None`, with nothing numbered, when the credit
/// is not there at once (the caller then takes the waiting path).
pub(crate) fn admit_now<'a, F>(
    outbound: &'a Mutex<Outbound>,
    matcher: &Matcher,
    len: usize,
    admit: impl FnOnce(&mut Outbound) -> Result<F, LinkError>,
) -> Option<Result<Admitted<'a, F>, LinkError>> {
    Some(
        matcher
            .try_acquire(len)?
            .and_then(|credit| admit_with(outbound, matcher, credit, admit)),
    )
}

/// Numbers a frame with `admit` under the lock, holding `credit`, which a refused frame
/// gives back.
fn admit_with<'a, F>(
    outbound: &'a Mutex<Outbound>,
    matcher: &Matcher,
    credit: Credit,
    admit: impl FnOnce(&mut Outbound) -> Result<F, LinkError>,
) -> Result<Admitted<'a, F>, LinkError> {
    let mut out = outbound.lock();
    match admit(&mut out) {
        Ok(frame) => Ok((out, frame, credit)),
        Err(e) => {
            drop(out);
            matcher.release(credit);
            Err(e)
        }
    }
}

/// Requests the close of the stream behind `outbound` (first request wins) and returns the
/// dropped frames' credit. True if this request was the first: the caller then wakes the
/// writer, which carries the close out.
pub(crate) fn request_close(
    outbound: &Mutex<Outbound>,
    matcher: &Matcher,
    depart: Option<Depart>,
) -> bool {
    let dropped = outbound.lock().close(depart);
    let first = dropped.is_some();
    for frame in dropped.into_iter().flatten() {
        frame.release(matcher);
    }
    first
}

/// The writer's next step (see [`Outbound::next`]).
#[derive(Debug)]
pub(crate) enum Next {
    Frame(OutFrame),
    /// Nothing queued: wait for a wake-up.
    Wait,
    /// Nothing queued and a close requested: depart (if possible) and shut.
    Close,
}

impl OutFrame {
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.off >= self.len()
    }

    /// What is left to write: the rest of the head, then the rest of the payload.
    pub(crate) fn rest(&self) -> (&[u8], &[u8]) {
        let head = self.head.get(self.off..).unwrap_or_default();
        let payload_off = self.off.saturating_sub(self.head.len());
        let payload = self.payload.get(payload_off..).unwrap_or_default();
        (head, payload)
    }

    /// What is left to write, as shared slices of the frame's buffers (no copy).
    pub(crate) fn rest_bytes(&self) -> [Bytes; 2] {
        let head_off = self.off.min(self.head.len());
        let payload_off = self
            .off
            .saturating_sub(self.head.len())
            .min(self.payload.len());
        [
            self.head.slice(head_off..),
            self.payload.slice(payload_off..),
        ]
    }

    /// Completes a frame from [`Numbered::into_frame`] whose first `written` bytes (of the
    /// head, then of `data`, the whole payload) are on the wire: the rest of `data` is copied
    /// into a payload the frame owns, and the frame resumes where the wire stopped.
    pub(crate) fn rest_of(&mut self, data: &[u8], written: usize) {
        let head = self.head.len();
        if written < head {
            self.payload = Bytes::copy_from_slice(data);
            self.off = written;
        } else {
            // The frame now holds only the unwritten tail of the payload; its offset says
            // the head is done, so what is left to write is exactly that tail.
            self.payload = Bytes::copy_from_slice(data.get(written - head..).unwrap_or_default());
            self.off = head;
        }
    }

    /// Returns the frame's send-window credit, whatever became of the frame.
    pub(crate) fn release(mut self, matcher: &Matcher) {
        if let Some(credit) = self.credit.take() {
            matcher.release(credit);
        }
    }
}

impl Outbound {
    pub(crate) fn new(encoder: Encoder, me: Envelope) -> Self {
        Outbound {
            encoder,
            me,
            queue: VecDeque::new(),
            writing: false,
            closing: false,
            departure: None,
        }
    }

    /// Numbers a chunk frame whose payload follows its prefix uncopied. On error nothing
    /// is consumed.
    pub(crate) fn chunk(
        &mut self,
        header: &ChunkHeader,
        payload: Bytes,
    ) -> Result<OutFrame, EncodeError> {
        let rewind = self.encoder.clone();
        let mut head = BytesMut::with_capacity(chorus_protocol::HEADER_LEN + ChunkHeader::LEN);
        self.encoder
            .encode_chunk_prefix(&self.me, header, payload.len(), &mut head)?;
        Ok(OutFrame {
            head: head.freeze(),
            payload,
            off: 0,
            credit: None,
            rewind: Some(rewind),
        })
    }

    /// What a link's `send` does under the lock: numbers the chunk for `tag` unless the
    /// stream is closing. The error is the one `send` returns; nothing reached the stream.
    pub(crate) fn admit(
        &mut self,
        matcher: &Matcher,
        tag: &Tag,
        payload: Bytes,
    ) -> Result<OutFrame, LinkError> {
        if self.closing {
            return Err(matcher
                .terminal()
                .unwrap_or_else(|| LinkError::ConnectionLost {
                    detail: "link is closing".into(),
                }));
        }
        let header = ChunkHeader::new(tag.collective, tag.dtype, tag.op, tag.step, tag.offset);
        // A refused chunk (misaligned, over the limit) leaves the link usable.
        self.chunk(&header, payload)
            .map_err(|e| LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!("cannot send: {e}"),
            })
    }

    /// [`Outbound::admit`] for a payload of `len` bytes the caller still holds: the chunk's
    /// head comes back numbered, in an array, so a caller that writes the frame whole at
    /// once allocates nothing, and one that cannot makes the frame with
    /// [`Numbered::into_frame`] from whatever of its bytes the wire has not taken.
    pub(crate) fn number_len(
        &mut self,
        matcher: &Matcher,
        tag: &Tag,
        len: usize,
    ) -> Result<Numbered, LinkError> {
        if self.closing {
            return Err(matcher
                .terminal()
                .unwrap_or_else(|| LinkError::ConnectionLost {
                    detail: "link is closing".into(),
                }));
        }
        let header = ChunkHeader::new(tag.collective, tag.dtype, tag.op, tag.step, tag.offset);
        let rewind = self.encoder.clone();
        let (_, prefix) = self
            .encoder
            .chunk_prefix(&self.me, &header, len)
            .map_err(|e| LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!("cannot send: {e}"),
            })?;
        Ok(Numbered { prefix, rewind })
    }

    /// Nothing queued and the writer not busy: a caller may write to the wire itself.
    pub(crate) fn is_idle(&self) -> bool {
        !self.writing
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing
    }

    /// Queues `frame` for the writer; true if the writer was idle and must be woken.
    pub(crate) fn push(&mut self, frame: OutFrame) -> bool {
        let wake = !self.writing;
        self.writing = true;
        self.queue.push_back(frame);
        wake
    }

    /// The writer's next frame; `None` means the writer is idle from now on.
    pub(crate) fn pop(&mut self) -> Option<OutFrame> {
        let next = self.queue.pop_front();
        if next.is_none() {
            self.writing = false;
        }
        next
    }

    /// What the writer does next: write a frame, wait for one, or finish the close.
    pub(crate) fn next(&mut self) -> Next {
        match self.pop() {
            Some(frame) => Next::Frame(frame),
            None if self.closing => Next::Close,
            None => Next::Wait,
        }
    }

    /// Requests the close (first request wins; `departure` is sent after the frame on the
    /// wire, if the stream can still take it). Returns the frames dropped, for their credit,
    /// or `None` if a close was already requested.
    pub(crate) fn close(&mut self, departure: Option<Depart>) -> Option<Vec<OutFrame>> {
        if self.closing {
            return None;
        }
        self.closing = true;
        self.departure = departure;
        // A partly written frame (only ever at the front) must be finished, or the stream
        // is torn mid-frame; everything behind it has not touched the wire.
        let keep = usize::from(self.queue.front().is_some_and(|f| f.off > 0));
        let dropped: Vec<OutFrame> = self.queue.drain(keep..).collect();
        if let Some(rewind) = dropped.first().and_then(|f| f.rewind.clone()) {
            self.encoder = rewind;
        }
        Some(dropped)
    }

    /// The code and detail of the requested close: the departure's, or `NORMAL` when the
    /// close sends none (the peer left first, or the connection was lost).
    pub(crate) fn close_reason(&self) -> (CloseCode, String) {
        match &self.departure {
            Some(d) => (d.code, d.detail.clone()),
            None => (CloseCode::NORMAL, "link closed".into()),
        }
    }

    /// The departure frame, numbered after everything that reached the wire; at most once.
    pub(crate) fn departure(&mut self) -> Option<OutFrame> {
        let depart = self.departure.take()?;
        let mut head = BytesMut::new();
        // `Depart::new` bounds the detail, so the codec accepts it; if it refused anyway the
        // connection is still closed, just without the frame.
        self.encoder
            .encode(&self.me, &Message::Depart(depart), &mut head)
            .ok()?;
        Some(OutFrame {
            head: head.freeze(),
            payload: Bytes::new(),
            off: 0,
            credit: None,
            rewind: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use chorus_protocol::message::Chunk;
    use chorus_protocol::{Collective, CommId, DType, Decoder, Epoch, Gate, Limits, OpSeq, Rank};

    use super::*;

    fn outbound() -> Outbound {
        Outbound::new(
            Encoder::default(),
            Envelope::new(CommId(1), Epoch(0), Rank(3)),
        )
    }

    fn header(op: u64) -> ChunkHeader {
        ChunkHeader::new(Collective::AllReduce, DType::U8, OpSeq(op), 0, 0)
    }

    fn wire(frames: &[&OutFrame]) -> BytesMut {
        let mut out = BytesMut::new();
        for f in frames {
            out.extend_from_slice(&f.head);
            out.extend_from_slice(&f.payload);
        }
        out
    }

    #[test]
    fn the_departure_follows_the_last_written_frame_without_a_gap() {
        let mut o = outbound();
        let written = o
            .chunk(&header(1), Bytes::from_static(b"on the wire"))
            .unwrap();
        let mut partial = o.chunk(&header(2), Bytes::from_static(b"half")).unwrap();
        partial.off = 3;
        o.push(partial);
        for op in 3..6 {
            let f = o.chunk(&header(op), Bytes::from_static(b"queued")).unwrap();
            o.push(f);
        }
        let dropped = o
            .close(Some(Depart::new(CloseCode::ABORTED, "bye")))
            .unwrap();
        assert_eq!(dropped.len(), 3, "the unstarted frames are dropped");
        assert!(o.close(None).is_none(), "the first close wins");
        let kept = o.pop().unwrap();
        assert_eq!(kept.off, 3, "the partial frame is finished");
        let depart = o.departure().unwrap();
        assert!(o.departure().is_none());
        let mut d = Decoder::with_gate(Gate::Open, Limits::DEFAULT);
        d.push(&wire(&[&written, &kept, &depart]));
        let seqs: Vec<u64> = std::iter::from_fn(|| d.next().unwrap())
            .map(|f| {
                if let Message::Chunk(Chunk { payload, .. }) = &f.message {
                    assert!(!payload.is_empty());
                }
                f.header.seq
            })
            .collect();
        assert_eq!(seqs, [0, 1, 2]);
    }

    #[test]
    fn the_writer_is_woken_once_and_idles_when_drained() {
        let mut o = outbound();
        assert!(o.is_idle());
        let a = o.chunk(&header(1), Bytes::new()).unwrap();
        let b = o.chunk(&header(2), Bytes::new()).unwrap();
        assert!(o.push(a));
        assert!(!o.push(b));
        assert!(!o.is_idle());
        assert!(o.pop().is_some());
        assert!(o.pop().is_some());
        assert!(o.pop().is_none());
        assert!(o.is_idle());
    }

    #[test]
    fn a_borrowed_payload_resumes_where_the_wire_stopped() {
        let data: Vec<u8> = (0..100u8).collect();
        for written in [0, 10, 64, 64 + 30, 64 + 100] {
            let mut o = outbound();
            let m = Matcher::new(chorus_protocol::Rank(0), 1 << 20, 1 << 20);
            let t = Tag {
                collective: Collective::AllReduce,
                op: OpSeq(1),
                step: 0,
                offset: 0,
                dtype: DType::U8,
            };
            let numbered = o.number_len(&m, &t, data.len()).unwrap();
            let head = numbered.prefix().to_vec();
            assert!(written <= head.len() + data.len());
            let mut wire = BytesMut::new();
            wire.extend_from_slice(&head[..written.min(head.len())]);
            wire.extend_from_slice(&data[..written.saturating_sub(head.len())]);
            let f = numbered.into_frame(&data, written);
            let (h, p) = f.rest();
            wire.extend_from_slice(h);
            wire.extend_from_slice(p);
            let mut d = Decoder::with_gate(Gate::Open, Limits::DEFAULT);
            d.push(&wire);
            match d.next().unwrap().unwrap().message {
                Message::Chunk(Chunk { payload, .. }) => assert_eq!(&payload[..], &data[..]),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_invalid_chunk_consumes_no_sequence_number() {
        let mut o = outbound();
        let bad = ChunkHeader::new(Collective::AllReduce, DType::F64, OpSeq(1), 0, 3);
        assert!(o.chunk(&bad, Bytes::from_static(b"12345678")).is_err());
        let f = o.chunk(&header(1), Bytes::new()).unwrap();
        let mut d = Decoder::with_gate(Gate::Open, Limits::DEFAULT);
        d.push(&wire(&[&f]));
        assert_eq!(d.next().unwrap().unwrap().header.seq, 0);
    }
}
