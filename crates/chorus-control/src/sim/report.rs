//! What a simulated run reports: the properties that failed, and the figures.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chorus_protocol::Epoch;

use crate::event::AgreementFailure;
use crate::time::Instant;

/// Summary statistics of a sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values` (sorted in place).
    pub fn of(values: &mut [f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Summary {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: values[values.len() - 1],
        }
    }
}

/// A shrink request a node gave up (`Event::AgreementFailed`).
#[derive(Clone, Debug, PartialEq)]
pub struct GaveUp {
    /// The process (by its initial rank).
    pub proc: u32,
    pub epoch: Epoch,
    /// When its application first asked to shrink at that epoch.
    pub asked: Instant,
    pub at: Instant,
    pub failure: AgreementFailure,
}

/// The outcome of one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub ranks: u32,
    /// Every property violation, one line each. Empty when the run is correct.
    pub violations: Vec<String>,
    /// Milliseconds from each fault (crash, kill, long freeze) to each healthy member
    /// learning of it.
    pub detection_ms: Summary,
    /// Forwarding hops of the notice by which each member first learned of an absence.
    pub hops: Summary,
    /// Control frames sent per rank per second in the fault-free window.
    pub steady_msgs_per_rank_per_s: f64,
    /// Frames sent / lost over the whole run.
    pub frames: u64,
    pub lost: u64,
    /// Simulator events processed.
    pub events: u64,
    /// Simulated time covered.
    pub simulated: Duration,
    /// Highest epoch any member installed.
    pub final_epoch: u64,
    /// Members evicted, agreement rounds that stalled.
    pub evictions: u64,
    pub stalls: u64,
    /// Shrink requests given up, in the order they were.
    pub gave_up: Vec<GaveUp>,
    /// The last epoch each process installed, by process.
    pub installed: Vec<u64>,
    /// When each process was evicted, and at which epoch, by process.
    pub evicted: Vec<Option<(Instant, Epoch)>>,
    /// When each process installed its last epoch (`None`: it never left epoch 0), by
    /// process.
    pub installed_at: Vec<Option<Instant>>,
    /// When each process first learned a process absent (by verdict or by an agreed
    /// removal): `learned[&subject][observer]`, by process, `None` if it never did; only
    /// subjects somebody learned. Partitions have no figure of their own; this is what a
    /// scenario computes one from.
    pub learned: BTreeMap<u32, Vec<Option<Instant>>>,
}

impl Report {
    /// Whether every property held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} ranks {} simulated {:?} events {}",
            self.seed, self.ranks, self.simulated, self.events
        )?;
        let d = &self.detection_ms;
        writeln!(
            f,
            "detection latency ms: n={} mean {:.1} p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
            d.count, d.mean, d.p50, d.p90, d.p99, d.max
        )?;
        let h = &self.hops;
        writeln!(
            f,
            "notice hops: n={} mean {:.2} p50 {} p99 {} max {}",
            h.count, h.mean, h.p50, h.p99, h.max
        )?;
        writeln!(
            f,
            "steady-state control frames per rank per second: {:.2}",
            self.steady_msgs_per_rank_per_s
        )?;
        writeln!(
            f,
            "frames {} lost {} final epoch {} evictions {} stalled rounds {}",
            self.frames, self.lost, self.final_epoch, self.evictions, self.stalls
        )?;
        if self.violations.is_empty() {
            write!(f, "all properties held")
        } else {
            writeln!(f, "{} violations:", self.violations.len())?;
            for v in self.violations.iter().take(20) {
                writeln!(f, "  {v}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_sample() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!((s.count, s.p50, s.max), (100, 51.0, 100.0));
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of(&mut []), Summary::default());
    }
}
