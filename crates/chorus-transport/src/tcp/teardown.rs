//! The close sequence of one connection's byte stream, as decisions with no IO: finish the
//! frame on the wire, send the departure, half-close, wait until the peer has taken what
//! was written, then `shutdown(SHUT_RDWR)` and cancel what is still in flight. Both
//! backends carry it out (the io_uring ring, the epoll writer task); it only says what
//! comes next.
//!
//! The whole sequence has one deadline, set when the close begins (the transport's depart
//! budget, which the runtime derives from its teardown budget): the frame part-way out and
//! the departure after it must be on the wire by then, or the connection is shut
//! regardless (the bound in "best effort, bounded"). A stream torn by a failed write gets
//! no departure: the peer's decoder would read it as the middle of a frame.
//!
//! Why the flush step: a departure in the kernel's send queue is not yet a departure seen.
//! Closing a socket that still holds unread input sends a reset, and the reset drops the
//! send queue, so a departure queued behind data the peer has not made room for (a busy
//! reader) would be lost. After the departure the stream is half-closed (`SHUT_WR`: the
//! peer reads the departure, then its end of stream) and the driver looks at what the peer
//! has not acknowledged (`SIOCOUTQ`), at growing intervals, until it is nothing; only then
//! (or at the deadline) is the connection shut. On loopback the first look usually finds
//! nothing left, so a close with a reading peer costs one `ioctl` more.

use std::time::Duration;

/// In the flush, the driver looks again this long after a look that found bytes left,
/// twice as long after each further one, up to [`LOOK_MAX`].
const LOOK_FIRST: Duration = Duration::from_micros(200);
const LOOK_MAX: Duration = Duration::from_millis(10);

/// Where one closing stream stands. `T` is the driver's clock's instant (`std` for the
/// ring thread, tokio's for the epoll tasks), given as an input, never read here.
#[derive(Debug)]
pub(crate) struct Teardown<T> {
    deadline: T,
    step: Step,
    /// In the flush: when the driver looks next (`None` until a look found bytes left).
    next_look: Option<T>,
    /// In the flush: the wait after the next look that finds bytes left.
    interval: Duration,
}

/// The steps of the sequence, in order; none is ever left for an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The frame part-way out (if any) is finishing, so the departure starts on a boundary.
    Finish,
    /// The departure frame is being written.
    Depart,
    /// The departure is in the kernel and the stream half-closed; waiting until the peer
    /// has acknowledged every byte, so the shut cannot drop it.
    Flush,
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
    /// A look in the flush: the bytes written that the peer has not acknowledged yet
    /// (`SIOCOUTQ`); `None` if the kernel would not say.
    Unacked(Option<usize>),
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
    /// The departure is out: `shutdown(SHUT_WR)` (the peer reads its end of stream after
    /// the departure), then look at once and at every [`Teardown::deadline`] after, each
    /// time with [`Event::Unacked`].
    HalfClose,
    /// Principle 1: `shutdown(SHUT_RDWR)`, which reaches the peer whoever else holds the
    /// descriptor; then cancel whatever still names the connection and let go once it
    /// retires. Given exactly once.
    Shut,
    /// Already shut: nothing more to do.
    Done,
}

impl<T: Copy + Ord + std::ops::Add<Duration, Output = T>> Teardown<T> {
    /// A close that begins at `now` and gets `budget` to finish its frame, depart and see
    /// the departure taken.
    pub(crate) fn new(now: T, budget: Duration) -> Self {
        Teardown {
            deadline: now + budget,
            step: Step::Finish,
            next_look: None,
            interval: LOOK_FIRST,
        }
    }

    /// When the driver must come back (with [`Event::Unacked`] in the flush, else
    /// [`Event::Tick`]); `None` once shut.
    pub(crate) fn deadline(&self) -> Option<T> {
        match self.step {
            Step::Shut => None,
            Step::Flush => Some(
                self.next_look
                    .map_or(self.deadline, |l| l.min(self.deadline)),
            ),
            Step::Finish | Step::Depart => Some(self.deadline),
        }
    }

    pub(crate) fn is_shut(&self) -> bool {
        self.step == Step::Shut
    }

    /// Whether the driver's timer should look at the socket ([`Event::Unacked`]).
    pub(crate) fn is_flushing(&self) -> bool {
        self.step == Step::Flush
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
                (Step::Depart, Event::Departed) => Step::Flush,
                (Step::Flush, Event::Unacked(Some(left))) if left > 0 => {
                    self.next_look = Some(now + self.interval);
                    self.interval = (self.interval * 2).min(LOOK_MAX);
                    Step::Flush
                }
                // Nothing left unacknowledged (or no way to know): the peer has it all.
                (Step::Flush, Event::Unacked(_)) => Step::Shut,
                (step, _) => step,
            }
        };
        if next == self.step {
            return Action::Continue;
        }
        self.step = next;
        match next {
            Step::Depart => Action::Depart,
            Step::Flush => Action::HalfClose,
            Step::Shut => Action::Shut,
            Step::Finish => Action::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Action, Event, LOOK_FIRST, LOOK_MAX, Teardown};

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
        assert_eq!(
            t.handle(t0 + BUDGET / 2, Event::Departed),
            Action::HalfClose
        );
        assert!(t.is_flushing());
        assert_eq!(
            t.handle(t0 + BUDGET / 2, Event::Unacked(Some(0))),
            Action::Shut,
            "the peer has it all: shut at once"
        );
        assert!(t.is_shut());
        assert_eq!(t.deadline(), None, "a shut stream needs no timer");
    }

    /// A departure in the send queue behind bytes the peer has not made room for is not
    /// shut away: the teardown waits, looking at growing intervals, until the peer has
    /// acknowledged everything (a loaded reader catching up), within the one deadline.
    #[test]
    fn the_shut_waits_until_the_peer_has_taken_the_departure() {
        let t0 = Instant::now();
        let mut t = Teardown::new(t0, BUDGET);
        assert_eq!(t.handle(t0, boundary(true)), Action::Depart);
        assert_eq!(t.handle(t0, Event::Departed), Action::HalfClose);
        assert_eq!(
            t.deadline(),
            Some(t0 + BUDGET),
            "look at once after the half-close"
        );
        let mut now = t0;
        let mut gaps = Vec::new();
        for _ in 0..10 {
            assert_eq!(t.handle(now, Event::Unacked(Some(4096))), Action::Continue);
            let next = t.deadline().expect("still flushing");
            gaps.push(next - now);
            now = next;
        }
        assert_eq!(gaps[0], LOOK_FIRST);
        assert_eq!(gaps[1], LOOK_FIRST * 2, "each look waits twice as long");
        assert!(gaps.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*gaps.last().unwrap(), LOOK_MAX, "up to a cap");
        assert!(now < t0 + BUDGET);
        assert_eq!(
            t.handle(now, Event::Tick),
            Action::Continue,
            "only a look moves it"
        );
        assert_eq!(t.handle(now, Event::Unacked(Some(0))), Action::Shut);
    }

    #[test]
    fn the_flush_ends_at_the_deadline_or_when_the_kernel_will_not_say() {
        let t0 = Instant::now();
        let flushing = || {
            let mut t = Teardown::new(t0, BUDGET);
            assert_eq!(t.handle(t0, boundary(true)), Action::Depart);
            assert_eq!(t.handle(t0, Event::Departed), Action::HalfClose);
            t
        };
        let mut late = flushing();
        assert_eq!(late.handle(t0, Event::Unacked(Some(1))), Action::Continue);
        // Looks near the deadline are clamped to it.
        let mut now = t0;
        while let Some(d) = late.deadline() {
            assert!(d <= t0 + BUDGET);
            now = d;
            if late.handle(now, Event::Unacked(Some(1))) == Action::Shut {
                break;
            }
        }
        assert_eq!(
            now,
            t0 + BUDGET,
            "a peer that never takes it is shut at the deadline"
        );
        assert!(late.is_shut());
        let mut unknown = flushing();
        assert_eq!(unknown.handle(t0, Event::Unacked(None)), Action::Shut);
        let mut torn = flushing();
        assert_eq!(torn.handle(t0, Event::WriteFailed), Action::Shut);
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
            Event::Unacked(Some(1)),
            Event::WriteFailed,
            Event::Tick,
        ] {
            assert_eq!(t.handle(t0 + BUDGET * 2, event), Action::Done);
        }
    }
}
