//! How long a link's receives read the socket themselves before they park: an adaptive
//! budget, as adaptive mutexes spin.
//!
//! Spinning pays when the message lands within the window (no thread hop, no wake-up) and
//! wastes a core when it does not: on a loaded or oversubscribed machine, a rank waiting for
//! a large transfer takes cycles from the very ranks that produce it. So the budget halves
//! after every receive that had to park anyway, down to a sixteenth of the configured one,
//! and doubles back after every receive the spin caught.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct SpinBudget {
    max_ns: u64,
    min_ns: u64,
    now_ns: AtomicU64,
}

impl SpinBudget {
    pub(crate) fn new(max: Duration) -> Self {
        let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        SpinBudget {
            max_ns,
            min_ns: max_ns / 16,
            now_ns: AtomicU64::new(max_ns),
        }
    }

    /// The window for the next receive.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::Relaxed))
    }

    /// The spin caught its message: widen the window again.
    pub(crate) fn caught(&self) {
        let now = self.now_ns.load(Ordering::Relaxed);
        if now < self.max_ns {
            let wider = now.saturating_mul(2).max(1).min(self.max_ns);
            self.now_ns.store(wider, Ordering::Relaxed);
        }
    }

    /// The receive parked after spinning for nothing: narrow the window.
    pub(crate) fn missed(&self) {
        let now = self.now_ns.load(Ordering::Relaxed);
        self.now_ns
            .store((now / 2).max(self.min_ns), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_narrow_the_window_to_a_floor_and_catches_restore_it() {
        let b = SpinBudget::new(Duration::from_micros(64));
        for _ in 0..10 {
            b.missed();
        }
        assert_eq!(b.window(), Duration::from_micros(4));
        for _ in 0..3 {
            b.caught();
        }
        assert_eq!(b.window(), Duration::from_micros(32));
        b.caught();
        b.caught();
        assert_eq!(b.window(), Duration::from_micros(64));
        let off = SpinBudget::new(Duration::ZERO);
        off.caught();
        off.missed();
        assert_eq!(off.window(), Duration::ZERO);
    }
}
