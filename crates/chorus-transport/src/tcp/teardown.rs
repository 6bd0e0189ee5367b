//! The close sequence of one connection's byte stream, as decisions with no IO: finish the
//! frame on the wire, send the departure, then `shutdown(SHUT_RDWR)` and cancel what is
//! still in flight. Both backends carry it out (the io_uring ring, the epoll writer task);
//! it only says what comes next.
//!
//! The whole sequence has one deadline, set when the close begins: the frame part-way out
//! and the departure after it must be on the wire by then, or the connection is shut
//! regardless (the bound in "best effort, bounded"). A stream torn by a failed write gets
//! no departure: the peer's decoder would read it as the middle of a frame.

use std::time::Duration;

/// Where one closing stream stands. `T` is the driver's clock's instant (`std` for the
/// ring thread, tokio's for the epoll tasks), given as an input, never read here.
#[derive(Debug)]
pub(crate) struct Teardown<T> {
    deadline: T,
    step: Step,
}

/// The steps of the sequence, in order; none is ever left for an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The frame part-way out (if any) is finishing, so the departure starts on a boundary.
    Finish,
    /// The departure frame is being written.
    Depart,
    /// Shut: nothing more is written.
    Shut,
}

/// What the driver saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Nothing is part-way out: the stream is on a frame boundary. `departure` says whether
    /// the link left a departure to send.
    Boundary { departure: bool },
    /// The departure frame is all on the wire.
    Departed,
    /// A write failed: the stream is broken, possibly mid-frame.
    WriteFailed,
    /// Time passed (the driver's timer for [`Teardown::deadline`] fired, or it looked).
    Tick,
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Keep writing what is on the wire, until the next event or the deadline.
    Continue,
    /// Write the departure frame now.
    Depart,
    /// Principle 1: `shutdown(SHUT_RDWR)`, which reaches the peer whoever else holds the
    /// descriptor; then cancel whatever still names the connection and let go once it
    /// retires. Given exactly once.
    Shut,
    /// Already shut: nothing more to do.
    Done,
}

impl<T: Copy + Ord + std::ops::Add<Duration, Output = T>> Teardown<T> {
    /// A close that begins at `now` and gets `budget` to finish its frame and depart.
    pub(crate) fn new(now: T, budget: Duration) -> Self {
        Teardown {
            deadline: now + budget,
            step: Step::Finish,
        }
    }

    /// When the driver must come back with [`Event::Tick`]; `None` once shut.
    pub(crate) fn deadline(&self) -> Option<T> {
        (self.step != Step::Shut).then_some(self.deadline)
    }

    pub(crate) fn is_shut(&self) -> bool {
        self.step == Step::Shut
    }

    /// Takes in what the driver saw at `now` and says what it does next.
    pub(crate) fn handle(&mut self, now: T, event: Event) -> Action {
        if self.step == Step::Shut {
            return Action::Done;
        }
        let next = if now >= self.deadline {
            Step::Shut
        } else {
            match (self.step, event) {
                (_, Event::WriteFailed) => Step::Shut,
                (Step::Finish, Event::Boundary { departure: true }) => Step::Depart,
                (Step::Finish, Event::Boundary { departure: false }) => Step::Shut,
                (Step::Depart, Event::Departed) => Step::Shut,
                (step, _) => step,
            }
        };
        if next == self.step {
            return Action::Continue;
        }
        self.step = next;
        match next {
            Step::Depart => Action::Depart,
            Step::Shut => Action::Shut,
            Step::Finish => Action::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Action, Event, Teardown};

    const BUDGET: Duration = Duration::from_millis(500);

    fn boundary(departure: bool) -> Event {
        Event::Boundary { departure }
    }

    #[test]
    fn the_departure_follows_the_frame_on_the_wire_then_the_stream_is_shut() {
        let t0 = Instant::now();
        let mut t = Teardown::new(t0, BUDGET);
        assert_eq!(t.deadline(), Some(t0 + BUDGET));
        assert_eq!(t.handle(t0, Event::Tick), Action::Continue);
        assert_eq!(
            t.handle(t0, Event::Departed),
            Action::Continue,
            "not yet departing"
        );
        assert_eq!(t.handle(t0, boundary(true)), Action::Depart);
        assert_eq!(
            t.handle(t0, boundary(true)),
            Action::Continue,
            "departs once"
        );
        assert!(!t.is_shut());
        assert_eq!(t.handle(t0 + BUDGET / 2, Event::Departed), Action::Shut);
        assert!(t.is_shut());
        assert_eq!(t.deadline(), None, "a shut stream needs no timer");
    }

    #[test]
    fn without_a_departure_the_boundary_shuts() {
        let t0 = Instant::now();
        let mut t = Teardown::new(t0, BUDGET);
        assert_eq!(t.handle(t0, boundary(false)), Action::Shut);
    }

    #[test]
    fn the_deadline_shuts_whatever_is_still_being_written() {
        let t0 = Instant::now();
        let mut finishing = Teardown::new(t0, BUDGET);
        assert_eq!(
            finishing.handle(t0 + BUDGET, boundary(true)),
            Action::Shut,
            "a boundary reached too late gets no departure"
        );
        let mut departing = Teardown::new(t0, BUDGET);
        assert_eq!(departing.handle(t0, boundary(true)), Action::Depart);
        assert_eq!(
            departing.handle(t0 + BUDGET - Duration::from_millis(1), Event::Tick),
            Action::Continue
        );
        assert_eq!(
            departing.handle(t0 + BUDGET, Event::Tick),
            Action::Shut,
            "one deadline covers the frame and the departure"
        );
    }

    #[test]
    fn a_failed_write_shuts_at_once_without_a_departure() {
        let t0 = Instant::now();
        for departing in [false, true] {
            let mut t = Teardown::new(t0, BUDGET);
            if departing {
                assert_eq!(t.handle(t0, boundary(true)), Action::Depart);
            }
            assert_eq!(t.handle(t0, Event::WriteFailed), Action::Shut);
        }
    }

    #[test]
    fn shut_is_given_once_and_then_nothing_more() {
        let t0 = Instant::now();
        let mut t = Teardown::new(t0, BUDGET);
        assert_eq!(t.handle(t0, Event::WriteFailed), Action::Shut);
        for event in [
            boundary(true),
            boundary(false),
            Event::Departed,
            Event::WriteFailed,
            Event::Tick,
        ] {
            assert_eq!(t.handle(t0 + BUDGET * 2, event), Action::Done);
        }
    }
}
