//! The simulated network: one-way latency with jitter, loss, and partitions.

use std::time::Duration;

use chorus_protocol::message::Kind;

use super::rng::Rng;
use crate::time::Instant;

/// How frames travel between simulated processes.
#[derive(Clone, Debug, PartialEq)]
pub struct Net {
    /// Fixed one-way latency.
    pub latency: Duration,
    /// Mean of the exponential extra delay added to each frame independently (so frames
    /// overtake each other: reordering).
    pub jitter: Duration,
    /// Cap on the extra delay; `latency + jitter_cap` is the worst one-way latency.
    pub jitter_cap: Duration,
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Network partitions.
    pub partitions: Vec<Partition>,
    /// Frame kinds lost on every link, always (agreement traffic that never arrives, to
    /// prove that a request's wait ends at its own deadline).
    pub drop: Vec<Kind>,
    /// Extra delay for frames of a kind arriving at one process (`Slow`): a member whose
    /// commits come late installs an epoch after the others.
    pub slow: Vec<Slow>,
}

/// Frames of `kind` to process `to` (by its initial rank) arrive `extra` later than the
/// network's own latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slow {
    pub to: u32,
    pub kind: Kind,
    pub extra: Duration,
}

/// Processes `lo..hi` (by their initial rank) are cut off from all others between `from`
/// and `until`: frames sent across the cut in that window are lost. With `only_to`, the loss
/// is one-way: only frames from `lo..hi` to the processes in `only_to` are lost, and every
/// other direction flows (a firewall dropping one host's packets at another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub lo: u32,
    pub hi: u32,
    pub from: Instant,
    pub until: Instant,
    pub only_to: Option<std::ops::Range<u32>>,
}

impl Partition {
    /// Whether the window lasts at least `d`.
    pub fn lasts(&self, d: Duration) -> bool {
        self.until.saturating_since(self.from) >= d
    }

    fn inside(&self, proc: u32) -> bool {
        (self.lo..self.hi).contains(&proc)
    }

    /// Whether a frame (or a connection-level signal) from `a` to `b` sent at `at` is lost.
    fn cuts(&self, a: u32, b: u32, at: Instant) -> bool {
        if at < self.from || at >= self.until {
            return false;
        }
        match &self.only_to {
            Some(to) => self.inside(a) && to.contains(&b),
            None => self.inside(a) != self.inside(b),
        }
    }
}

impl Net {
    /// A loss-free network with a fixed latency.
    pub fn fixed(latency: Duration) -> Net {
        Net {
            latency,
            jitter: Duration::ZERO,
            jitter_cap: Duration::ZERO,
            loss: 0.0,
            partitions: Vec::new(),
            drop: Vec::new(),
            slow: Vec::new(),
        }
    }

    /// The worst one-way latency.
    pub fn max_latency(&self) -> Duration {
        self.latency + self.jitter_cap
    }

    /// The delay of one frame from `a` to `b` sent at `at`, or `None` if it is lost.
    pub(crate) fn delay(
        &self,
        rng: &mut Rng,
        a: u32,
        b: u32,
        at: Instant,
        kind: Kind,
    ) -> Option<Duration> {
        if self.drop.contains(&kind) {
            return None;
        }
        if self.partitions.iter().any(|p| p.cuts(a, b, at)) {
            return None;
        }
        if self.loss > 0.0 && rng.chance(self.loss) {
            return None;
        }
        let slow: Duration = self
            .slow
            .iter()
            .filter(|s| s.to == b && s.kind == kind)
            .map(|s| s.extra)
            .sum();
        Some(self.latency + self.extra(rng) + slow)
    }

    /// Whether a partition stops what `a` sends to `b` at `at` (then no frame and no
    /// connection-level signal crosses: a cut network carries no close either).
    pub(crate) fn cut(&self, a: u32, b: u32, at: Instant) -> bool {
        self.partitions.iter().any(|p| p.cuts(a, b, at))
    }

    /// A delay for a connection-level signal (not subject to loss: the transport retries).
    pub(crate) fn signal_delay(&self, rng: &mut Rng) -> Duration {
        self.latency + self.extra(rng)
    }

    fn extra(&self, rng: &mut Rng) -> Duration {
        if self.jitter.is_zero() {
            return Duration::ZERO;
        }
        let micros = rng.exponential(self.jitter.as_micros() as f64);
        Duration::from_micros(micros as u64).min(self.jitter_cap)
    }
}
