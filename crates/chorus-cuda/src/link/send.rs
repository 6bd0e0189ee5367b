//! A device link's send: a future that queues a payload's slot messages on the send stream
//! as the peer's credit allows (`credit.rs`), in the order the sends were made.
//!
//! Sends take a ticket when they are made and queue strictly in ticket order, so payloads
//! leave in call order even when the engine keeps several sends pending. A send announces
//! its payload (`Sent`), queues the parts the credit leaves room for, says so (`Queued`), and
//! is pending until the peer's `Credit` (read by the reader thread, which wakes it) makes
//! room for the rest. The host waits here; the device never waits for credit it was not
//! yet given.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use chorus_engine::link::{LinkError, Tag};
use cudarc::driver::result;

use super::LinkCore;
use crate::credit::room;
use crate::error::CudaError;
use crate::health::{ABORT, RETIRED_SEND};
use crate::host_frame::HostFrame;
use crate::payload::GpuPayload;
use crate::region::{CONSUMED, READY, SEND_SKIP, SLOTS};

/// The sends of one link end: whose turn it is and how many slot messages are queued.
#[derive(Default)]
pub(super) struct Sends {
    /// The ticket the next send made gets.
    next_ticket: u64,
    /// The ticket of the send queueing now.
    serving: u64,
    /// Slot messages queued so far (the next one's number).
    seq: u64,
    /// Sends waiting for their turn.
    waiting: Vec<Waker>,
}

/// `send`'s future.
pub(super) struct SendOp<'a> {
    core: &'a LinkCore,
    ticket: u64,
    tag: Tag,
    /// Until its turn: the payload, freed by its own drop if the send never starts.
    payload: Option<GpuPayload>,
    /// From its turn on: the payload's allocation and how much of it is queued.
    started: Option<Started>,
    finished: bool,
}

struct Started {
    ptr: u64,
    len: u64,
    done: u64,
}

impl LinkCore {
    /// A send of `payload` under `tag`, queued after every send made before it.
    pub(super) fn send_op(&self, tag: Tag, payload: GpuPayload) -> SendOp<'_> {
        let ticket = {
            let mut sends = self.sends.lock();
            sends.next_ticket += 1;
            sends.next_ticket - 1
        };
        SendOp {
            core: self,
            ticket,
            tag,
            payload: Some(payload),
            started: None,
            finished: false,
        }
    }

    /// Wake every send waiting for its turn or for credit: the link can carry no more.
    pub(super) fn wake_senders(&self) {
        let waiting = std::mem::take(&mut self.sends.lock().waiting);
        waiting.into_iter().for_each(Waker::wake);
        self.wake_credit_waiters();
    }

    /// Wake the send waiting for credit (the peer granted some). Never takes the sends'
    /// lock, which a send holds while it writes to the socket: the reader must not wait for
    /// a write that may wait for the peer's reader.
    pub(super) fn wake_credit_waiters(&self) {
        let credit = std::mem::take(&mut *self.credit_wakers.lock());
        credit.into_iter().for_each(Waker::wake);
    }

    /// Queue what the credit allows of `op`'s payload and tell the peer; `true` once all of
    /// it is queued.
    fn advance(&self, sends: &mut Sends, op: &mut SendOp<'_>) -> Result<bool, CudaError> {
        let mut frames = Vec::new();
        if op.started.is_none()
            && let Some(payload) = op.payload.take()
        {
            let (ptr, len, ready, origin) = payload.take();
            op.started = Some(Started {
                ptr,
                len: len as u64,
                done: 0,
            });
            self.prepare(ready.as_ref(), origin, len as u64)?;
            frames.extend(
                HostFrame::Sent {
                    tag: op.tag,
                    len: len as u64,
                }
                .encode(),
            );
        }
        let Some(st) = op.started.as_mut() else {
            return Ok(true);
        };
        let taken = self.credit.load(Ordering::Acquire);
        let mut free = room(self.slots, sends.seq, taken);
        let before = sends.seq;
        while st.done < st.len && free > 0 {
            let part = (st.len - st.done).min(self.slot_bytes);
            self.queue_part(sends.seq, st.ptr + st.done, part)?;
            sends.seq += 1;
            st.done += part;
            free -= 1;
        }
        if sends.seq > before {
            // Before the frame: the peer's credit is checked against this.
            self.queued.store(sends.seq, Ordering::Release);
            frames.extend(HostFrame::Queued { upto: sends.seq }.encode());
        }
        let whole = st.done == st.len;
        if whole {
            free_behind_sends(self, std::mem::take(&mut st.ptr));
        }
        if !frames.is_empty() {
            let _w = self.wr.lock();
            (&self.socket)
                .write_all(&frames)
                .map_err(|e| CudaError::Link {
                    peer: self.peer,
                    detail: format!("telling the peer about a send: {e}"),
                })?;
        }
        Ok(whole)
    }

    /// Queue, on the send stream, what comes before a payload's parts: the wait for its
    /// bytes and, for a payload forwarded from another link, the gate that stops the sends
    /// if that link's receive retired.
    fn prepare(
        &self,
        ready: Option<&cudarc::driver::CudaEvent>,
        origin: Option<crate::payload::Origin>,
        len: u64,
    ) -> Result<(), CudaError> {
        let gpu = self.device.gpu();
        gpu.bind()?;
        let s = &*self.send_stream;
        if let Some(ev) = ready {
            s.wait(ev)
                .map_err(|e| CudaError::driver("cuStreamWaitEvent", e))?;
        }
        if len > 0
            && let Some((from, last)) = origin
        {
            // Forwarding what another link received: if an abort retired a wait for its
            // bytes, stop sending here rather than pass them on as data.
            gpu.kernels
                .gate(s, self.own.ptr + SEND_SKIP, from.recv_retired_dev(), last)?;
            self.origins.hold(&from);
        }
        Ok(())
    }

    /// Queue slot message `n` (`len` bytes from `src`): wait until the peer has taken the
    /// slot's previous message out (credit says that take-out is queued, so the wait ends
    /// unless the peer dies), copy in, raise `ready`.
    fn queue_part(&self, n: u64, src: u64, len: u64) -> Result<(), CudaError> {
        let k = &self.device.gpu().kernels;
        let s = &*self.send_stream;
        let skip = self.own.ptr + SEND_SKIP;
        if n >= self.slots {
            k.wait(
                s,
                self.theirs.ptr() + CONSUMED,
                n + 1 - self.slots,
                self.health.word_ptr(ABORT),
                self.health.word_ptr(RETIRED_SEND),
                n + 1,
                skip,
            )?;
        }
        let slot = self.own.ptr + SLOTS + (n % self.slots) * self.slot_bytes;
        k.put(s, slot, src, len, skip)?;
        k.signal(s, self.own.ptr + READY, n + 1, skip)
    }
}

/// Free a sent payload's allocation behind the copies on the send stream (which waited
/// for the payload before reading it).
fn free_behind_sends(core: &LinkCore, ptr: u64) {
    if ptr == 0 {
        return;
    }
    // SAFETY: allocated from the pool (cuMemAllocFromPoolAsync), freed once (the caller gives up the pointer),
    // every use of it queued before on the send stream.
    if let Err(e) = unsafe { result::free_async(ptr, core.send_stream.cu_stream()) } {
        tracing::warn!(error = ?e, "freeing a sent payload failed");
    }
}

impl Future for SendOp<'_> {
    type Output = Result<(), LinkError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let op = self.get_mut();
        let core = op.core;
        if let Some(e) = core.unusable() {
            op.finished = true;
            return Poll::Ready(Err(e));
        }
        let mut sends = core.sends.lock();
        if sends.serving != op.ticket {
            sends.waiting.push(cx.waker().clone());
            return Poll::Pending;
        }
        match core.advance(&mut sends, op) {
            Ok(true) => {
                sends.serving += 1;
                let waiting = std::mem::take(&mut sends.waiting);
                drop(sends);
                waiting.into_iter().for_each(Waker::wake);
                op.finished = true;
                Poll::Ready(Ok(()))
            }
            Ok(false) => {
                let seq = sends.seq;
                drop(sends);
                core.credit_wakers.lock().push(cx.waker().clone());
                // Credit that arrived before the waker was filed would wake nobody.
                if room(core.slots, seq, core.credit.load(Ordering::Acquire)) > 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Err(e) => {
                drop(sends);
                let err = LinkError::ConnectionLost {
                    detail: format!("queueing a send failed: {e}"),
                };
                core.fail(err.clone());
                op.finished = true;
                Poll::Ready(Err(err))
            }
        }
    }
}

impl Drop for SendOp<'_> {
    fn drop(&mut self) {
        if let Some(st) = self.started.as_mut() {
            free_behind_sends(self.core, std::mem::take(&mut st.ptr));
        }
        if !self.finished && self.core.unusable().is_none() {
            // Later sends wait for this one's turn, and the peer may hold part of its
            // payload: the link cannot go on (the engine drops a pending send only when its
            // operation failed, which poisons the communicator anyway).
            self.core.fail(LinkError::ConnectionLost {
                detail: "a send was dropped before all of it was queued".into(),
            });
        }
    }
}
