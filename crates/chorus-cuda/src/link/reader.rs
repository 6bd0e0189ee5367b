//! A device link's reader thread: it reads the peer's frames, queues the take-out of each
//! slot message once the peer says it is queued (`credit::Intake`), files whole payloads for
//! `recv`, answers with credit, and passes the peer's credit on to the waiting sends.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Duration;

use chorus_engine::link::{LinkError, Tag};
use chorus_protocol::CloseCode;

use super::{LinkCore, held_cost};
use crate::credit::{Intake, Step, check_credit};
use crate::error::CudaError;
use crate::health::{ABORT, RETIRED_RECV};
use crate::host_frame::HostFrame;
use crate::payload::GpuPayload;
use crate::region::{CONSUMED, READY, RECV_RETIRED, SLOTS};
use crate::sync;

/// Payloads announced but not yet whole, oldest first, with their announcement numbers.
type Open = VecDeque<(u64, Tag, GpuPayload)>;

impl LinkCore {
    pub(super) fn read_loop(self: Arc<Self>) {
        let mut open = Open::new();
        self.read_frames(&mut open);
        // Frees of payloads never filed go behind the take-outs already queued into them.
        for (_, _, mut payload) in open.drain(..) {
            payload.ready = sync::mark(&self.recv_stream).ok();
            drop(payload);
        }
        let (lock, cv) = &self.reader_done;
        *lock.lock() = true;
        cv.notify_all();
    }

    fn read_frames(&self, open: &mut Open) {
        let mut intake = Intake::new(self.slot_bytes);
        loop {
            let frame = HostFrame::read_from(&mut &self.socket);
            if self.cancelled.get().is_some() {
                return;
            }
            while self.frozen.load(Ordering::SeqCst) && !self.abort_word_set() {
                std::thread::sleep(Duration::from_millis(1));
            }
            if self.cancelled.get().is_some() || self.frozen.load(Ordering::SeqCst) {
                return;
            }
            let handled = match frame {
                Ok(Some(HostFrame::Sent { tag, len })) => {
                    self.announced(&mut intake, open, tag, len)
                }
                Ok(Some(HostFrame::Queued { upto })) => match intake.queued(upto) {
                    Ok(steps) => self.take_out(open, steps).and_then(|()| {
                        let _w = self.wr.lock();
                        (&self.socket)
                            .write_all(
                                &HostFrame::Credit {
                                    upto: intake.taken(),
                                }
                                .encode(),
                            )
                            .map_err(|e| LinkError::ConnectionLost {
                                detail: format!("sending credit: {e}"),
                            })
                    }),
                    Err(e) => Err(self.violation(e.to_string())),
                },
                Ok(Some(HostFrame::Credit { upto })) => {
                    let was = self.credit.load(Ordering::Acquire);
                    match check_credit(was, upto, self.queued.load(Ordering::Acquire)) {
                        Ok(()) => {
                            self.credit.store(upto, Ordering::Release);
                            self.wake_credit_waiters();
                            Ok(())
                        }
                        Err(e) => Err(self.violation(e.to_string())),
                    }
                }
                Ok(Some(HostFrame::Depart { code, detail })) => {
                    let err = LinkError::PeerDeparted { code, detail };
                    if code != CloseCode::NORMAL {
                        let _ = self.failure.set(err.clone());
                    }
                    // Waits for messages the peer queued are already satisfied (it drained
                    // before departing); any later wait on it must not spin.
                    self.set_abort();
                    self.close_mailbox(err);
                    self.wake_senders();
                    return;
                }
                Ok(None) => Err(LinkError::ConnectionLost {
                    detail: "the peer closed its socket without departing".into(),
                }),
                Ok(Some(other)) => {
                    Err(self.violation(format!("unexpected frame after the handshake: {other:?}")))
                }
                Err(e) => Err(LinkError::Protocol {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    detail: e.to_string(),
                }),
            };
            if let Err(e) = handled {
                self.fail(e);
                return;
            }
        }
    }

    /// Tell the peer it broke the protocol (best effort) and name the breach.
    fn violation(&self, detail: String) -> LinkError {
        if let Some(_w) = self.wr.try_lock() {
            let _ = (&self.socket).write_all(
                &HostFrame::Depart {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    detail: "unexpected frame".into(),
                }
                .encode(),
            );
        }
        LinkError::Protocol {
            code: CloseCode::PROTOCOL_VIOLATION,
            detail,
        }
    }

    /// A payload of `len` bytes was announced: reserve its bytes against the bound, give it
    /// memory (stream-ordered on the receive stream) and open it.
    fn announced(
        &self,
        intake: &mut Intake,
        open: &mut Open,
        tag: Tag,
        len: u64,
    ) -> Result<(), LinkError> {
        {
            let mut m = self.mailbox.lock();
            let held = m.held_bytes.saturating_add(held_cost(len));
            if held > self.config.max_held_bytes {
                return Err(LinkError::Overflow {
                    bytes: held,
                    limit: self.config.max_held_bytes,
                });
            }
            m.held_bytes = held;
        }
        let payload = self
            .receive_buffer(len)
            .map_err(|e| LinkError::ConnectionLost {
                detail: format!("allocating a receive failed: {e}"),
            })?;
        let (msg, steps) = intake.announce(len);
        open.push_back((msg, tag, payload));
        self.take_out(open, steps)
    }

    /// Queue the take-outs of `steps` and file the payloads they make whole.
    fn take_out(&self, open: &mut Open, steps: Vec<Step>) -> Result<(), LinkError> {
        let queueing = |e: CudaError| LinkError::ConnectionLost {
            detail: format!("queueing a receive failed: {e}"),
        };
        for step in steps {
            match step {
                Step::Part {
                    msg,
                    seq,
                    offset,
                    len,
                } => {
                    let Some((_, _, payload)) = open.iter_mut().find(|(m, _, _)| *m == msg) else {
                        return Err(self.violation(format!("no open payload {msg}")));
                    };
                    self.queue_take_out(seq, payload.ptr + offset, len)
                        .map_err(queueing)?;
                    payload.origin = Some((self.health.clone(), seq + 1));
                }
                Step::Done { msg } => {
                    let Some(at) = open.iter().position(|(m, _, _)| *m == msg) else {
                        return Err(self.violation(format!("no open payload {msg}")));
                    };
                    let Some((_, tag, mut payload)) = open.remove(at) else {
                        return Err(self.violation(format!("no open payload {msg}")));
                    };
                    if payload.len > 0 {
                        payload.ready = Some(sync::mark(&self.recv_stream).map_err(queueing)?);
                    }
                    let wakers = {
                        let mut m = self.mailbox.lock();
                        m.held.push_back((tag, payload));
                        std::mem::take(&mut m.wakers)
                    };
                    wakers.into_iter().for_each(Waker::wake);
                }
            }
        }
        Ok(())
    }

    /// Memory for a `len`-byte payload, allocated on the receive stream (used there and then
    /// by streams that wait for the payload's event; freed once by the payload).
    fn receive_buffer(&self, len: u64) -> Result<GpuPayload, CudaError> {
        let gpu = self.device.gpu();
        gpu.bind()?;
        let ptr = if len == 0 {
            0
        } else {
            // SAFETY: a stream-ordered allocation in this context, owned by the payload.
            unsafe { gpu.pool.alloc(&self.recv_stream, len as usize) }.map_err(|e| {
                CudaError::OutOfMemory {
                    bytes: len as usize,
                    detail: format!("cuMemAllocFromPoolAsync: {e:?}"),
                }
            })?
        };
        Ok(GpuPayload {
            ptr,
            len: len as usize,
            ready: None,
            alloc: self.device.inner.alloc.clone(),
            origin: None,
        })
    }

    /// Queue taking slot message `n` (`len` bytes) out of the peer's slots into `dst`.
    fn queue_take_out(&self, n: u64, dst: u64, len: u64) -> Result<(), CudaError> {
        let gpu = self.device.gpu();
        let k = &gpu.kernels;
        let s = &*self.recv_stream;
        gpu.bind()?;
        k.wait(
            s,
            self.theirs.ptr() + READY,
            n + 1,
            self.health.word_ptr(ABORT),
            self.health.word_ptr(RETIRED_RECV),
            n + 1,
            self.own.ptr + RECV_RETIRED,
        )?;
        let slot = self.theirs.ptr() + SLOTS + (n % self.slots) * self.slot_bytes;
        k.copy(s, dst, slot, len)?;
        // Even after a retired wait: the slot is free for the peer (its bytes are not used as
        // data here), so the peer's own waits for space do not stall on us.
        k.signal(s, self.own.ptr + CONSUMED, n + 1, 0)
    }
}
