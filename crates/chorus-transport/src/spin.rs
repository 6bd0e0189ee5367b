//! How long a link's receives read the socket themselves before they park: an adaptive
//! budget, as adaptive mutexes spin.
//!
//! Spinning pays when the message lands within the window (no thread hop, no wake-up) and
//! wastes a core when it does not: on a loaded or oversubscribed machine, a rank waiting for
//! a large transfer takes cycles from the very ranks that produce it. So the budget halves
//! after every receive that had to park anyway, down to a sixteenth of the configured one,
//! and doubles back after every receive the spin caught.
//!
//! A spin also watches whether its core is crowded (a `sched_yield` that ran another
//! thread) and, after enough crowded receives in a row, sleeps once instead of yielding:
//! see [`SpinBudget::nap_now`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A `sched_yield` that took this long ran another thread on this core meanwhile.
const CROWDED_YIELD: Duration = Duration::from_micros(3);
/// Receives in a row that found their core crowded before the first nap (see
/// [`SpinBudget::nap_now`]); each nap doubles it, up to `CROWDED_MAX_STREAK`.
const CROWDED_FIRST_STREAK: u32 = 4;
const CROWDED_MAX_STREAK: u32 = 4096;
/// How long a crowded spin sleeps (the kernel's timer slack makes it tens of µs).
pub(crate) const CROWDED_NAP: Duration = Duration::from_micros(1);

#[derive(Debug)]
pub(crate) struct SpinBudget {
    max_ns: u64,
    min_ns: u64,
    now_ns: AtomicU64,
    /// Receives in a row whose spin found the core crowded.
    streak: AtomicU32,
    /// The streak at which a crowded spin naps.
    need: AtomicU32,
}

impl SpinBudget {
    pub(crate) fn new(max: Duration) -> Self {
        let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        SpinBudget {
            max_ns,
            min_ns: max_ns / 16,
            now_ns: AtomicU64::new(max_ns),
            streak: AtomicU32::new(0),
            need: AtomicU32::new(CROWDED_FIRST_STREAK),
        }
    }

    /// Whether a spin whose `sched_yield` took `yielded` found its core crowded: another
    /// thread ran on it meanwhile.
    pub(crate) fn crowded(yielded: Duration) -> bool {
        yielded >= CROWDED_YIELD
    }

    /// Whether a crowded spin should sleep now (for [`CROWDED_NAP`]) rather than yield
    /// again: after enough receives in a row found the core crowded.
    ///
    /// Two ranks started together are often placed on the same core, and while both spin
    /// (yielding to each other) the scheduler can leave them there for many milliseconds
    /// with the other core idle (seen with `perf sched`: whole 8 B to 8 KiB sweeps): a
    /// running thread is moved only by the periodic balancer, which spares threads that
    /// are cache-hot, whereas a thread that sleeps is placed afresh, preferably on an idle
    /// core, when it wakes. Sharing a core doubles a small operation's latency (2 ranks,
    /// 8 B all-reduce: 15 µs instead of 7). Ranks that must share cores (more ranks than
    /// cores) find every core crowded: a nap cannot help them and costs tens of µs, so it
    /// is taken only if `core_free` (see [`a_core_is_free`]) says a core is idle, and each
    /// streak doubles the next one needed, so that even asking soon becomes rare.
    pub(crate) fn nap_now(&self, core_free: impl FnOnce() -> bool) -> bool {
        let need = self.need.load(Ordering::Relaxed);
        if self.streak.load(Ordering::Relaxed) < need {
            return false;
        }
        self.streak.store(0, Ordering::Relaxed);
        self.need
            .store((need * 2).min(CROWDED_MAX_STREAK), Ordering::Relaxed);
        core_free()
    }

    /// A receive's spin ended; `crowded`: whether it found the core crowded.
    pub(crate) fn spun(&self, crowded: bool) {
        if crowded {
            let streak = self.streak.load(Ordering::Relaxed);
            self.streak
                .store(streak.saturating_add(1), Ordering::Relaxed);
        } else {
            self.streak.store(0, Ordering::Relaxed);
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

/// Whether the machine has fewer runnable threads than this process may use cores: the
/// instantaneous count of `/proc/loadavg` (which includes the caller) against the available
/// parallelism. Unknown (no procfs): no, so that nobody naps for nothing.
pub(crate) fn a_core_is_free() -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/loadavg") else {
        return false;
    };
    let Some(runnable) = runnable(&text) else {
        return false;
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    runnable < cores.saturating_add(1)
}

/// The runnable count of a `/proc/loadavg` line: the part before the slash of its fourth
/// field ("0.50 0.40 0.30 2/120 4242").
fn runnable(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
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

    #[test]
    fn naps_after_a_crowded_streak_and_ever_more_rarely() {
        assert!(!SpinBudget::crowded(Duration::from_nanos(500)));
        assert!(SpinBudget::crowded(Duration::from_micros(20)));
        let b = SpinBudget::new(Duration::from_micros(50));
        // A calm receive breaks the streak.
        for _ in 0..CROWDED_FIRST_STREAK - 1 {
            b.spun(true);
        }
        b.spun(false);
        assert!(!b.nap_now(|| true));
        let mut naps = Vec::new();
        for receive in 0..20_000u32 {
            if b.nap_now(|| true) {
                naps.push(receive);
            }
            b.spun(true);
        }
        // The first after CROWDED_FIRST_STREAK crowded receives, then each after twice as
        // many as the last, up to CROWDED_MAX_STREAK apart.
        let gaps: Vec<u32> = naps.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(naps[0], CROWDED_FIRST_STREAK);
        assert_eq!(&gaps[..4], &[8, 16, 32, 64]);
        assert!(gaps.iter().all(|&g| g <= CROWDED_MAX_STREAK));
        assert_eq!(gaps.last(), Some(&CROWDED_MAX_STREAK));
    }

    #[test]
    fn no_nap_without_a_free_core_yet_the_next_streak_is_still_longer() {
        let b = SpinBudget::new(Duration::from_micros(50));
        let mut asked = 0;
        for _ in 0..CROWDED_FIRST_STREAK {
            b.spun(true);
        }
        assert!(!b.nap_now(|| {
            asked += 1;
            false
        }));
        assert_eq!(asked, 1);
        for _ in 0..CROWDED_FIRST_STREAK {
            b.spun(true);
        }
        assert!(!b.nap_now(|| unreachable!("asked before the doubled streak")));
    }

    #[test]
    fn reads_the_runnable_count_of_proc_loadavg() {
        assert_eq!(runnable("0.50 0.40 0.30 2/120 4242\n"), Some(2));
        assert_eq!(runnable("0.50 0.40 0.30 17/1200 4242"), Some(17));
        assert_eq!(runnable(""), None);
        assert_eq!(runnable("0.50 0.40 0.30 x/120 1"), None);
        assert_eq!(runnable("0.50 0.40 0.30 120 1"), None);
        // On this machine it answers at all (either way), without panicking.
        let _ = a_core_is_free();
    }
}
