//! The runtime's clock: the control plane takes time as an input in microseconds since an
//! origin the runtime chooses; this is that origin and the conversions both ways. It is the
//! one clock the runtime reads: timers on the control thread are set from it (`tokio`),
//! and the flight recorder's instants are read from it (`process_now`).

use std::time::{Duration, Instant};

/// Converts between `std::time::Instant` and the control plane's `Instant`.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Clock {
    origin: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Now, on the control plane's scale.
    pub(crate) fn now(&self) -> chorus_control::Instant {
        self.control(Instant::now())
    }

    /// `t` on the control plane's scale (the origin if `t` is earlier).
    pub(crate) fn control(&self, t: Instant) -> chorus_control::Instant {
        let micros = t.saturating_duration_since(self.origin).as_micros();
        chorus_control::Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// A control-plane instant on the process clock.
    pub(crate) fn std(&self, t: chorus_control::Instant) -> Instant {
        self.origin + Duration::from_micros(t.as_micros())
    }

    /// A control-plane instant as a timer deadline on the control thread's runtime.
    pub(crate) fn tokio(&self, t: chorus_control::Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.std(t))
    }

    /// Now, on the process clock (the scale of the flight recorder's instants).
    pub(crate) fn process_now(&self) -> Instant {
        Instant::now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_both_ways() {
        let clock = Clock::new();
        let later = Instant::now() + Duration::from_millis(1500);
        let back = clock.std(clock.control(later));
        assert!(back <= later && later - back < Duration::from_micros(2));
        assert!(clock.now() <= clock.control(later));
    }
}
