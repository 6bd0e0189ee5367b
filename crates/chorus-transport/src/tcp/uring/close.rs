//! The ring's part in a connection's close: it feeds what it sees to the connection's
//! [`Teardown`] (the close sequence, decided with no IO) and carries out what that says:
//! finish the frame on the wire, send the departure, shut, cancel, and let go of the
//! connection once nothing in flight names it.

use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use chorus_protocol::message::Depart;
use io_uring::opcode;
use io_uring::types::{CancelBuilder, Fd};

use super::send::Sending;
use super::thread::{Op, RingThread};
use crate::inbound;
use crate::outbound;
use crate::tcp::socket;
use crate::tcp::teardown::{Action, Event, Teardown};

impl RingThread {
    /// Enforces departure deadlines: a connection whose departure could not be written in
    /// time is shut regardless (the bound in "best effort, bounded"); one in its flush
    /// looks again at what the peer has not acknowledged.
    pub(super) fn tick(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.closing
                    .as_ref()
                    .and_then(Teardown::deadline)
                    .is_some_and(|d| now >= d)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            let flushing = self
                .conns
                .get(&id)
                .and_then(|c| c.closing.as_ref())
                .is_some_and(Teardown::is_flushing);
            if flushing {
                self.look(id);
            } else {
                self.teardown(id, Event::Tick);
            }
        }
    }

    /// Marks the link's stream closing (first request wins: its departure is the one
    /// sent) and starts the close here.
    pub(super) fn request_close(&mut self, id: u64, depart: Option<Depart>) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        outbound::request_close(&c.outbound, &c.matcher, depart);
        self.begin_close(id);
    }

    /// Begins the connection's teardown, unless it has begun.
    pub(super) fn begin_close(&mut self, id: u64) {
        let teardown = Teardown::new(Instant::now(), self.depart_timeout);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.closing.is_some() {
            return;
        }
        c.closing = Some(teardown);
        // A closing connection reads no more input for its callers.
        if let Some(ud) = c.poll {
            let e = opcode::AsyncCancel2::new(CancelBuilder::user_data(ud)).build();
            self.push(e, Op::Cancel);
        }
        self.advance_close(id);
    }

    /// Moves a closing connection on once nothing is in flight: a frame part-way out (ours,
    /// or one a caller started) is finished first, so the departure lands on a frame
    /// boundary; at the boundary the teardown says whether to depart or shut.
    pub(super) fn advance_close(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(teardown) = c.closing.as_ref() else {
            return;
        };
        if teardown.is_shut() || c.send.is_some() {
            return;
        }
        if self.pump_send(id) {
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let depart = c.outbound.lock().departure();
        let event = Event::Boundary {
            departure: depart.is_some(),
        };
        if self.teardown(id, event) == Action::Depart
            && let Some(frame) = depart
            && let Some(c) = self.conns.get_mut(&id)
        {
            c.cur = Some(Sending {
                frame,
                slot: None,
                depart: true,
            });
            self.pump_send(id);
        }
    }

    /// A write failed: the stream is broken mid-frame, so it is closed with no departure.
    pub(super) fn torn(&mut self, id: u64) {
        let teardown = Teardown::new(Instant::now(), self.depart_timeout);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        outbound::request_close(&c.outbound, &c.matcher, None);
        c.closing.get_or_insert(teardown);
        self.teardown(id, Event::WriteFailed);
    }

    /// Feeds `event` to the connection's teardown and carries out a shut it decides on.
    pub(super) fn teardown(&mut self, id: u64, event: Event) -> Action {
        let action = match self.conns.get_mut(&id).and_then(|c| c.closing.as_mut()) {
            Some(teardown) => teardown.handle(Instant::now(), event),
            None => Action::Done,
        };
        match action {
            Action::Shut => self.shut(id),
            Action::HalfClose => {
                if let Some(c) = self.conns.get(&id) {
                    socket::shutdown_write(c.fd.as_fd());
                }
                self.look(id);
            }
            Action::Continue | Action::Depart | Action::Done => {}
        }
        action
    }

    /// A look in the flush: what the peer has not acknowledged, fed to the teardown (which
    /// shuts once nothing is left, or asks for the next look by its deadline).
    fn look(&mut self, id: u64) {
        let Some(left) = self
            .conns
            .get(&id)
            .map(|c| socket::unacknowledged(c.fd.as_fd()))
        else {
            return;
        };
        self.teardown(id, Event::Unacked(left));
    }

    /// Carries out [`Action::Shut`] (principle 1): `shutdown(SHUT_RDWR)` reaches the peer
    /// whoever else holds the descriptor; then cancel whatever is still in flight and let
    /// go once it retires.
    fn shut(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        socket::shutdown_of(&*c.fd);
        let fd = c.fd.as_raw_fd();
        if c.inflight > 0 {
            let e = opcode::AsyncCancel2::new(CancelBuilder::fd(Fd(fd)).all()).build();
            self.push(e, Op::Cancel);
        }
        self.maybe_reap(id);
    }

    pub(super) fn maybe_reap(&mut self, id: u64) {
        let reap = self
            .conns
            .get(&id)
            .is_some_and(|c| c.inflight == 0 && c.closing.as_ref().is_some_and(Teardown::is_shut));
        if reap && let Some(mut c) = self.conns.remove(&id) {
            if let Some(mut cur) = c.cur.take() {
                if let Some((slot, _)) = cur.slot.take() {
                    self.slots.give(slot);
                }
                cur.frame.release(&c.matcher);
            }
            let _ = c.outbound.lock().close(None);
            loop {
                let Some(frame) = c.outbound.lock().pop() else {
                    break;
                };
                frame.release(&c.matcher);
            }
            inbound::on_lost(&c.matcher, "connection closed".into());
            tracing::trace!(fd = c.fd.as_raw_fd(), "io_uring connection closed");
        }
    }
}
