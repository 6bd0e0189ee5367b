//! The pump: one thread per shm link that does what callers leave undone. It reads the
//! peer's ring for parked receives, writes the frames a `send` could not write at once,
//! carries out the close (departure frame, then the one-way closed word), and watches the
//! peer: its closed word, and its process through a pidfd.
//!
//! It sleeps on our bell in the segment. It sets `sleeping` only while it wants progress
//! from the peer (a parked receive, a frame waiting for room), so a peer that keeps up
//! with the callers never makes a system call to wake it; every sleep is bounded by
//! [`IDLE_WAIT`], which is also how often the peer's process is checked.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::futex;
use super::reader::Pumped;
use super::shared::Shared;
use crate::inbound;
use crate::outbound::{Next, OutFrame};

/// The longest the pump sleeps without looking at the peer's process.
pub(super) const IDLE_WAIT: Duration = Duration::from_millis(20);

/// Passes over the ring a departing peer's leftovers get before the link reports the loss.
const DRAIN_PASSES: usize = 64;

/// What the writer half found.
enum Wrote {
    /// Nothing left to write.
    Idle,
    /// A frame waits for room in the ring.
    Blocked,
    /// The close is due: the queue is empty (or the deadline passed).
    Close,
}

/// Runs the pump until the link is closed, after faulting in the segment
/// ([`Segment::prefault`](super::segment::Segment::prefault)).
pub(super) fn run(shared: Arc<Shared>) {
    shared.seg.prefault();
    let mut pump = Pump {
        shared,
        current: None,
        close_by: None,
        checked: Instant::now(),
    };
    pump.run();
}

struct Pump {
    shared: Arc<Shared>,
    /// The frame being written (out of the queue, so a close keeps it whole).
    current: Option<OutFrame>,
    /// Once a close is requested: when it happens regardless of what is left to write.
    close_by: Option<Instant>,
    checked: Instant,
}

impl Pump {
    fn run(&mut self) {
        let shared = self.shared.clone();
        let s = &*shared;
        loop {
            let seen = s.bell(s.me).load(Ordering::SeqCst);
            if let Some(detail) = self.peer_gone() {
                self.peer_left(detail);
                return;
            }
            if let Pumped::Close(depart) = s.try_pump() {
                s.close(depart);
            }
            let blocked = match self.write() {
                Wrote::Close => {
                    self.finish();
                    return;
                }
                Wrote::Blocked => true,
                Wrote::Idle => false,
            };
            self.sleep(seen, blocked);
        }
    }

    /// Why the peer is gone, if it is: it closed its side, or its process exited.
    fn peer_gone(&mut self) -> Option<String> {
        let s = &*self.shared;
        if s.peer_closed() {
            return Some("peer closed the segment without a departure".into());
        }
        if self.checked.elapsed() >= IDLE_WAIT {
            self.checked = Instant::now();
            if s.process.exited() {
                return Some(format!("peer process {} exited", s.process.pid()));
            }
        }
        None
    }

    /// The peer left: read what it wrote first (a departure, frames owed to receives),
    /// record the loss if it said nothing more final, and close our side.
    fn peer_left(&mut self, detail: String) {
        let s = &*self.shared;
        for _ in 0..DRAIN_PASSES {
            match s.pump() {
                Pumped::Drained(0) | Pumped::Close(_) => break,
                Pumped::Drained(_) | Pumped::Busy => {}
            }
        }
        inbound::on_lost(&s.matcher, detail);
        s.close(None);
        if let Some(frame) = self.current.take() {
            frame.release(&s.matcher);
        }
        s.set_closed();
    }

    /// Writes queued frames while the ring has room.
    fn write(&mut self) -> Wrote {
        let shared = self.shared.clone();
        let s = &*shared;
        loop {
            if self.current.is_none() {
                let next = s.outbound.lock().next();
                match next {
                    Next::Frame(f) => self.current = Some(f),
                    Next::Wait => return Wrote::Idle,
                    Next::Close => return Wrote::Close,
                }
            }
            if self.close_due() {
                return Wrote::Close;
            }
            let Some(frame) = self.current.as_mut() else {
                continue;
            };
            let (head, rest) = frame.rest();
            let written = {
                let mut producer = s.producer.lock();
                s.write_some(&mut producer, [head, rest])
            };
            match written {
                Ok(n) => frame.off += n,
                Err(err) => {
                    s.matcher.fail(err);
                    s.close(None);
                    return Wrote::Close;
                }
            }
            if !frame.is_done() {
                return Wrote::Blocked;
            }
            if let Some(done) = self.current.take() {
                done.release(&s.matcher);
            }
        }
    }

    /// Whether a requested close must happen now: its budget for finishing the frame on
    /// the wire has passed.
    fn close_due(&mut self) -> bool {
        let s = &*self.shared;
        if !s.outbound.lock().is_closing() {
            return false;
        }
        let by = *self
            .close_by
            .get_or_insert_with(|| Instant::now() + s.depart_timeout);
        Instant::now() >= by
    }

    /// The close: the departure frame if the ring takes it within the budget, then the
    /// closed word and the peer's wake-up.
    fn finish(&mut self) {
        let s = &*self.shared;
        if let Some(frame) = self.current.take() {
            frame.release(&s.matcher);
        }
        let depart = s.outbound.lock().departure();
        if let Some(mut frame) = depart {
            let by = self
                .close_by
                .unwrap_or_else(|| Instant::now() + s.depart_timeout);
            while !frame.is_done() && Instant::now() < by && !s.peer_closed() {
                let seen = s.bell(s.me).load(Ordering::SeqCst);
                let (head, rest) = frame.rest();
                let written = {
                    let mut producer = s.producer.lock();
                    s.write_some(&mut producer, [head, rest])
                };
                match written {
                    Ok(n) => frame.off += n,
                    Err(_) => break,
                }
                if !frame.is_done() {
                    self.sleep(seen, true);
                }
            }
        }
        s.set_closed();
    }

    /// Sleeps until something happens: a kick, the peer's progress (when we want it), a
    /// close, or [`IDLE_WAIT`].
    fn sleep(&self, seen: u32, blocked: bool) {
        let s = &*self.shared;
        let wants_data = s.matcher.has_waiters();
        let want = wants_data || blocked;
        if want {
            s.sleeping(s.me).store(1, Ordering::SeqCst);
            s.watching.store(true, Ordering::SeqCst);
        }
        // Re-check after announcing the sleep (see `Shared::notify_peer`).
        let ready = s.peer_closed() || (wants_data && s.readable()) || (blocked && s.has_room());
        if !ready {
            futex::wait(s.bell(s.me), seen, IDLE_WAIT);
        }
        if want {
            s.watching.store(false, Ordering::SeqCst);
            s.sleeping(s.me).store(0, Ordering::SeqCst);
        }
    }
}
