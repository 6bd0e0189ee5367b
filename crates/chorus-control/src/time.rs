//! Time as an input: a point on the caller's clock, in microseconds since an origin the
//! caller chooses. The node never reads a clock; the runtime converts `std::time::Instant`
//! (by subtracting its own origin), the simulator counts simulated microseconds.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time: microseconds since the caller's origin. Arithmetic saturates, so a
/// caller that hands in a time earlier than one it handed before never causes a panic.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The caller's origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `micros` microseconds after the origin.
    pub const fn from_micros(micros: u64) -> Instant {
        Instant(micros)
    }

    /// Microseconds since the origin.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, rhs: Duration) -> Instant {
        let micros = u64::try_from(rhs.as_micros()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(micros))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;

    fn sub(self, rhs: Duration) -> Instant {
        let micros = u64::try_from(rhs.as_micros()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_sub(micros))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Milliseconds in `d`, saturating, for wire fields that count milliseconds.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        let t = Instant::from_micros(5);
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(
            Instant::from_micros(u64::MAX) + Duration::from_secs(1),
            Instant::from_micros(u64::MAX)
        );
        assert_eq!(t.saturating_since(Instant::from_micros(9)), Duration::ZERO);
        assert_eq!(
            Instant::from_micros(1_500).saturating_since(t),
            Duration::from_micros(1_495)
        );
    }

    #[test]
    fn displays_seconds_with_micro_precision() {
        assert_eq!(Instant::from_micros(2_000_123).to_string(), "2.000123s");
    }
}
