//! The attempts under way to open one control stream, and when a frame waiting for the
//! stream starts another (hedging).
//!
//! An attempt opened into a cut backs its handshake packets off exponentially, so when the
//! cut heals the first packet through may be a second away, and the frames queued behind
//! it (a knock, an agreement's prepare: how a healed minority learns it was evicted) wait
//! with it. A frame that finds the newest attempt older than the hedge interval starts
//! another, which sends at once. At most [`MAX_ATTEMPTS`] run side by side, the oldest
//! abandoned for a new one, so a slow but sound path (a handshake of several round trips
//! on a lossy link) still completes one; the first to complete ends the others. That is at
//! most one handshake per hedge interval per peer.

use std::time::Duration;

use chorus_control::Instant;

/// How many attempts to open one stream run side by side.
pub(super) const MAX_ATTEMPTS: usize = 3;

/// The attempts of one stream, oldest first; `H` ends its attempt when dropped.
pub(super) struct Attempts<H> {
    list: Vec<(u64, Instant, H)>,
}

impl<H> Default for Attempts<H> {
    fn default() -> Self {
        Attempts { list: Vec::new() }
    }
}

impl<H> Attempts<H> {
    /// Whether a frame waiting at `now` should start an attempt: none is under way, or the
    /// newest has gone `hedge_after` without a stream.
    pub(super) fn due(&self, now: Instant, hedge_after: Duration) -> bool {
        self.list
            .last()
            .is_none_or(|(_, started, _)| now >= *started + hedge_after)
    }

    /// Attempt `id`, started at `now`, joins; the oldest is dropped if that makes one too
    /// many.
    pub(super) fn push(&mut self, id: u64, now: Instant, handle: H) {
        if self.list.len() >= MAX_ATTEMPTS {
            self.list.remove(0);
        }
        self.list.push((id, now, handle));
    }

    /// Attempt `id` gave up; true when none is left.
    pub(super) fn failed(&mut self, id: u64) -> bool {
        self.list.retain(|(i, _, _)| *i != id);
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    /// Records its id when dropped, as an aborted attempt would end.
    struct Handle(u64, Rc<RefCell<Vec<u64>>>);

    impl Drop for Handle {
        fn drop(&mut self) {
            self.1.borrow_mut().push(self.0);
        }
    }

    #[test]
    fn a_waiting_frame_hedges_once_per_interval_and_abandons_the_oldest() {
        let every = Duration::from_millis(100);
        let ended = Rc::new(RefCell::new(Vec::new()));
        let mut a = Attempts::default();
        assert!(a.due(ms(0), every), "nothing under way");
        a.push(0, ms(0), Handle(0, ended.clone()));
        assert!(!a.due(ms(99), every), "the attempt is young");
        for (id, at) in [(1, 100), (2, 250)] {
            assert!(a.due(ms(at), every));
            a.push(id, ms(at), Handle(id, ended.clone()));
        }
        assert!(ended.borrow().is_empty(), "three side by side");
        assert!(
            !a.due(ms(349), every),
            "one per interval: the newest counts"
        );
        a.push(3, ms(350), Handle(3, ended.clone()));
        assert_eq!(*ended.borrow(), [0], "a fourth ends the oldest");
        assert!(!a.failed(2));
        assert!(!a.failed(2), "an id already gone changes nothing");
        assert!(!a.failed(1));
        assert!(a.failed(3), "the last one gave up");
        assert_eq!(*ended.borrow(), [0, 2, 1, 3]);
    }

    #[test]
    fn dropping_the_attempts_ends_every_one() {
        let ended = Rc::new(RefCell::new(Vec::new()));
        let mut a = Attempts::default();
        a.push(7, ms(0), Handle(7, ended.clone()));
        a.push(8, ms(500), Handle(8, ended.clone()));
        drop(a);
        assert_eq!(*ended.borrow(), [7, 8], "a stream came: the others stop");
    }
}
