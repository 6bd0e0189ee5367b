//! Heartbeat lateness: how much later than one heartbeat interval each heartbeat from a
//! watched peer arrived after the previous one, kept as a fixed-size log-linear histogram
//! (no allocation per sample, a few percent of resolution), so the runtime can report
//! p50/p99/max of what its deadline must absorb.

use std::time::Duration;

/// Sub-buckets per power of two: values are kept within 1/8 (12.5 %) of their size.
const SUB: usize = 8;
/// Octaves of microseconds kept: up to 2^30 µs (about 18 minutes); more is clamped.
const OCTAVES: usize = 30;
const BUCKETS: usize = SUB + OCTAVES * SUB;

/// See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lateness {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    max: Duration,
}

impl Default for Lateness {
    fn default() -> Self {
        Lateness {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            max: Duration::ZERO,
        }
    }
}

impl Lateness {
    /// Records one heartbeat that arrived `late` past its interval (zero if on time).
    pub fn record(&mut self, late: Duration) {
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)] += 1;
        self.count += 1;
        self.max = self.max.max(late);
    }

    /// Heartbeats recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The largest lateness recorded, exactly.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The lateness at quantile `q` (0..=1), to the histogram's resolution: the upper
    /// edge of the bucket holding it, capped by the maximum. Zero with no samples.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        // The rank of the sample wanted, 1-based.
        let want = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= want {
                if i == BUCKETS - 1 {
                    return self.max; // the clamped bucket: only the maximum is exact
                }
                return Duration::from_micros(upper_edge(i)).min(self.max);
            }
        }
        self.max
    }

    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: &Lateness) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.max = self.max.max(other.max);
    }
}

/// Values below `SUB` µs get a bucket each; above, each power of two is cut in `SUB`.
fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize; // >= 3
    let sub = ((us >> (octave - 3)) & (SUB as u64 - 1)) as usize;
    (SUB + (octave - 3) * SUB + sub).min(BUCKETS - 1)
}

/// The largest value (µs) bucket `i` holds.
fn upper_edge(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let octave = (i - SUB) / SUB + 3;
    let sub = ((i - SUB) % SUB) as u64;
    let low = (SUB as u64 + sub) << (octave - 3);
    low + (1u64 << (octave - 3)) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values_within_an_eighth() {
        for us in [0u64, 1, 7, 8, 9, 15, 16, 100, 999, 1000, 123_456, 2_000_000] {
            let i = bucket(us);
            let edge = upper_edge(i);
            assert!(edge >= us, "{us}: edge {edge}");
            assert!(edge - us <= us / 8 + 1, "{us}: edge {edge}");
            if i > 0 {
                assert!(upper_edge(i - 1) < us, "{us}: previous edge");
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let mut l = Lateness::default();
        assert_eq!(l.quantile(0.5), Duration::ZERO);
        for ms in 1..=100u64 {
            l.record(Duration::from_millis(ms));
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        assert_eq!(l.count(), 100);
        assert!(
            (50.0..=57.0).contains(&ms(l.quantile(0.5))),
            "{:?}",
            l.quantile(0.5)
        );
        assert!(
            (99.0..=100.0).contains(&ms(l.quantile(0.99))),
            "{:?}",
            l.quantile(0.99)
        );
        assert_eq!(l.quantile(1.0), Duration::from_millis(100));
        assert_eq!(l.max(), Duration::from_millis(100));
        let mut m = Lateness::default();
        m.record(Duration::from_secs(3));
        m.merge(&l);
        assert_eq!((m.count(), m.max()), (101, Duration::from_secs(3)));
        // A day late is clamped into the last bucket, not lost.
        m.record(Duration::from_secs(86_400));
        assert_eq!(m.quantile(1.0), Duration::from_secs(86_400));
    }
}
