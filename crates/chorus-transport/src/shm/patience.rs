//! How long a spinning shm `recv` keeps reading the ring itself: its window counts time
//! without progress, not time in all.
//!
//! A large frame streams through the ring in pieces (`writer.rs`), and a receive that spins
//! copies each piece out as it lands: that is the copy the pump would otherwise do, so
//! spinning while bytes arrive wastes nothing. Measured against the whole transfer instead,
//! a window of tens of µs expires in the middle of every chunk of a large all-reduce (a
//! 256 KiB chunk takes longer than that to copy), the receive parks, the pump and then the
//! caller are woken for the rest, and the misses narrow the window until every receive
//! parks. So each pass that took bytes restarts the window; a hard cap (a multiple of
//! the window) still bounds the spin, whatever a peer trickles.
//!
//! No IO: the caller passes `now`.

use std::time::{Duration, Instant};

/// How many windows one spin may last in all, however steadily bytes arrive.
const CAP_WINDOWS: u32 = 64;

/// The deadline of one spinning receive.
#[derive(Clone, Copy, Debug)]
pub(super) struct Patience {
    window: Duration,
    /// When the spin started to wait for its next bytes.
    since: Instant,
    /// When it ends even if bytes keep arriving.
    cap: Instant,
}

impl Patience {
    /// A spin starting at `now` that parks after `window` without progress.
    pub(super) fn new(now: Instant, window: Duration) -> Patience {
        Patience {
            window,
            since: now,
            cap: now + window.saturating_mul(CAP_WINDOWS),
        }
    }

    /// A pass at `now` took `bytes` from the ring: bytes restart the window.
    pub(super) fn took(&mut self, now: Instant, bytes: usize) {
        if bytes > 0 {
            self.since = now;
        }
    }

    /// Whether the spin should park at `now`.
    pub(super) fn spent(&self, now: Instant) -> bool {
        now >= self.cap || now.duration_since(self.since) >= self.window
    }
}

/// Whether a receive that parked after its spin, and was answered `parked_for` later, missed
/// by little enough that the spin window should widen rather than narrow: the answer came
/// within `near` (twice the largest window), about what the park itself costs here (the
/// pump's wake-up, then the caller's).
///
/// Without this the narrowing is self-sustaining: two ranks whose windows have shrunk both
/// park, each answers the other only after its own wake-ups, so each next spin misses
/// again; 8-byte all-reduces then ran at ~100 µs in some runs and ~3 µs in others
/// (`benches/peer/results/quick.md`). A wait for a large or slow peer lasts far longer
/// than `near`, and still narrows the window.
pub(super) fn near_miss(parked_for: Duration, near: Duration) -> bool {
    parked_for <= near
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    #[test]
    fn without_progress_the_window_is_the_deadline() {
        let t0 = Instant::now();
        let mut p = Patience::new(t0, W);
        assert!(!p.spent(t0 + W / 2));
        p.took(t0 + W / 2, 0);
        assert!(p.spent(t0 + W), "no bytes: no extension");
    }

    #[test]
    fn bytes_restart_the_window() {
        let t0 = Instant::now();
        let mut p = Patience::new(t0, W);
        p.took(t0 + W * 3 / 4, 4096);
        assert!(!p.spent(t0 + W));
        assert!(!p.spent(t0 + W * 3 / 2));
        assert!(p.spent(t0 + W * 7 / 4));
    }

    #[test]
    fn a_steady_trickle_still_ends_at_the_cap() {
        let t0 = Instant::now();
        let mut p = Patience::new(t0, W);
        let mut now = t0;
        let mut passes = 0u32;
        while !p.spent(now) {
            now += W / 2;
            p.took(now, 1);
            passes += 1;
            assert!(passes < 10 * CAP_WINDOWS, "the spin never ended");
        }
        assert_eq!(now, t0 + W * CAP_WINDOWS);
    }

    #[test]
    fn a_short_park_is_a_near_miss_a_long_one_is_not() {
        let near = 2 * W;
        assert!(near_miss(Duration::from_micros(30), near));
        assert!(near_miss(near, near));
        assert!(!near_miss(near + Duration::from_nanos(1), near));
        assert!(!near_miss(Duration::from_millis(3), near));
    }

    #[test]
    fn a_zero_window_is_spent_at_once() {
        let t0 = Instant::now();
        assert!(Patience::new(t0, Duration::ZERO).spent(t0));
    }
}
