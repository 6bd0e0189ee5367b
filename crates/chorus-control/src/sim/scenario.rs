//! Scenarios: everything a simulated run depends on, derived from one seed.

use std::time::Duration;

use chorus_protocol::message::Kind;

use super::network::{Net, Partition};
use super::rng::Rng;
use crate::config::{Config, Quorum};
use crate::time::Instant;

/// One simulated run: the world, the configuration, the network, the faults and the
/// application's behaviour. `Scenario::random(seed)` derives all of it from the seed, and
/// the run itself draws every random number from the same seed, so a seed replays exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub seed: u64,
    /// Initial world size.
    pub ranks: u32,
    pub config: Config,
    pub net: Net,
    pub faults: Vec<Fault>,
    /// If set, each member's application calls `Shrink` within this delay of learning that
    /// a peer is absent (as a training loop that catches the error would).
    pub shrink: Option<Duration>,
    /// Steady-state measurement window (no faults inside).
    pub measure: (Instant, Instant),
    /// When the run stops.
    pub end: Instant,
}

/// One fault: at `at`, process `proc` (its initial rank; joiners are numbered after the
/// initial world) suffers `kind`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub at: Instant,
    pub proc: u32,
    pub kind: FaultKind,
}

/// What can happen to a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Stops silently: no frames, no connection events.
    Crash,
    /// Stops, and the peers it was connected to see their connections fail (a killed process
    /// whose sockets are reset), and a same-host peer sees the exit through a pidfd.
    Kill,
    /// Stops processing for the duration (SIGSTOP, a long GC, a swapped-out host), then
    /// resumes with everything that arrived meanwhile.
    Freeze(Duration),
    /// Leaves gracefully (`Command::Depart`).
    Depart,
    /// Aborts (`Command::Abort`).
    Abort,
    /// Revokes the communicator (`Command::Revoke`).
    Revoke,
    /// From `at` on, the first process to send a frame of this kind (an agreement
    /// coordinator) crashes after sending a random part of that batch. `proc` is ignored.
    CrashCoordinator(Kind),
    /// Asks this process to admit this many new processes (`Command::Admit`).
    Admit(u32),
}

impl Scenario {
    /// A fault-free scenario of `ranks` members with default configuration on a 200 µs
    /// network with jitter.
    pub fn quiet(seed: u64, ranks: u32) -> Scenario {
        let config = Config::default();
        let net = Net {
            latency: Duration::from_micros(200),
            jitter: Duration::from_micros(100),
            jitter_cap: Duration::from_millis(2),
            loss: 0.0,
            partitions: Vec::new(),
            drop: Vec::new(),
            slow: Vec::new(),
        };
        Scenario {
            seed,
            ranks,
            config,
            net,
            faults: Vec::new(),
            shrink: None,
            measure: (secs(1.0), secs(3.0)),
            end: secs(6.0),
        }
    }

    /// The scale run of the `sim` example: `crashes` silent crashes and `freezes` long
    /// freezes at random ranks and times after the steady-state window.
    pub fn scale(seed: u64, ranks: u32, crashes: u32, freezes: u32) -> Scenario {
        let mut s = Scenario::quiet(seed, ranks);
        let mut rng = Rng::new(seed ^ 0x5ca1e);
        let d = s.config.deadline;
        let mut used = std::collections::BTreeSet::new();
        for i in 0..crashes + freezes {
            let proc = loop {
                let p = rng.below(u64::from(ranks)) as u32;
                if used.insert(p) || used.len() as u32 >= ranks {
                    break p;
                }
            };
            let at = secs(3.0) + Duration::from_micros(rng.below(1_000_000));
            let kind = if i < crashes {
                FaultKind::Crash
            } else {
                FaultKind::Freeze(d * 2)
            };
            s.faults.push(Fault { at, proc, kind });
        }
        s.end = secs(4.0) + d * 3;
        s
    }

    /// A random scenario at 8–256 ranks: network, configuration, faults and application
    /// behaviour all drawn from `seed`.
    pub fn random(seed: u64) -> Scenario {
        let mut rng = Rng::new(seed);
        let ranks = *rng.pick(&[
            8u32, 8, 9, 12, 16, 16, 24, 32, 33, 48, 64, 100, 128, 200, 256,
        ]);
        let mut s = Scenario::quiet(seed, ranks);
        if rng.chance(0.25) {
            // Faster timing and more observers, to cover the relations rather than one point.
            let interval = Duration::from_millis(rng.range(50, 150));
            s.config = Config::from_timing(interval, interval * rng.range(6, 12) as u32);
            s.config.observers = rng.range(1, 3) as u32;
        }
        let latency = *rng.pick(&[50u64, 200, 1_000, 5_000]);
        s.net.latency = Duration::from_micros(latency);
        s.net.jitter = Duration::from_micros(rng.below(latency + 1));
        s.net.jitter_cap = s.net.jitter * 4 + Duration::from_micros(500);
        s.net.loss = *rng.pick(&[0.0, 0.0, 0.0, 0.001, 0.01, 0.03]);
        let survivors_quorum = rng.chance(0.2);
        if survivors_quorum {
            s.config.quorum = Quorum::Survivors;
        }
        s.shrink = rng
            .chance(0.7)
            .then(|| Duration::from_millis(rng.below(50)));

        let d = s.config.deadline;
        let i = s.config.heartbeat_interval;
        let tolerated = tolerated_freeze(&s);
        let start = secs(2.0);
        let spread = Duration::from_micros(rng.below(5_000_000));
        // Majority quorum needs more than half the members to survive, counting joiners
        // (who grow the world and may never start if their admitter dies).
        let mut gone = 0u32;
        let mut joiners = 0u32;
        let mut longest = Duration::ZERO;

        match rng.below(10) {
            0 => {
                // Fault-free except short stalls: nobody may be declared dead.
                for _ in 0..rng.range(0, 3) {
                    let t = Duration::from_micros(rng.range(1, tolerated.as_micros() as u64));
                    s.faults.push(Fault {
                        at: start + jitter_in(&mut rng, spread),
                        proc: proc_of(&mut rng, ranks),
                        kind: FaultKind::Freeze(t),
                    });
                }
            }
            1 if !survivors_quorum => {
                // A partition: short (tolerated, nobody declared) or long (safety only).
                let len = 1 + rng.below(u64::from(ranks / 3).max(1)) as u32;
                let lo = rng.below(u64::from(ranks - len)) as u32;
                let dur = if rng.chance(0.5) {
                    Duration::from_micros(rng.range(1, s.tolerated_partition().as_micros() as u64))
                } else {
                    d * 2 + Duration::from_micros(rng.below(2_000_000))
                };
                longest = longest.max(dur);
                let hi = lo + len;
                // Sometimes one-way: only what the cut-off side sends to the ranks below it
                // (or above it) is lost.
                let only_to = rng
                    .chance(0.3)
                    .then_some(if lo > 0 { 0..lo } else { hi..ranks });
                s.net.partitions.push(Partition {
                    lo,
                    hi,
                    from: start,
                    until: start + dur,
                    only_to,
                });
            }
            _ => {
                let count = rng.range(1, 4);
                let mut used = std::collections::BTreeSet::new();
                for _ in 0..count {
                    let proc = proc_of(&mut rng, ranks);
                    if !used.insert(proc) {
                        continue;
                    }
                    let at = start + jitter_in(&mut rng, spread);
                    let kind = match rng.below(12) {
                        0 | 1 => FaultKind::Crash,
                        2 => FaultKind::Kill,
                        3 | 4 => {
                            let t = d + i * 2 + Duration::from_micros(rng.below(3_000_000));
                            longest = longest.max(t);
                            FaultKind::Freeze(t)
                        }
                        5 => FaultKind::Freeze(Duration::from_micros(
                            rng.range(1, tolerated.as_micros() as u64),
                        )),
                        6 => FaultKind::Depart,
                        7 => FaultKind::Abort,
                        8 => FaultKind::Revoke,
                        9 if s.shrink.is_some() => FaultKind::CrashCoordinator(*rng.pick(&[
                            Kind::Prepare,
                            Kind::Propose,
                            Kind::Commit,
                        ])),
                        10 => FaultKind::Admit(rng.range(1, 3) as u32),
                        _ => FaultKind::Crash,
                    };
                    let goes = matches!(
                        kind,
                        FaultKind::Crash
                            | FaultKind::Kill
                            | FaultKind::Depart
                            | FaultKind::Abort
                            | FaultKind::CrashCoordinator(_)
                    ) || matches!(kind, FaultKind::Freeze(t) if t > tolerated);
                    let (more_gone, more_joiners) = match kind {
                        FaultKind::Admit(n) => (0, n),
                        _ => (u32::from(goes), 0),
                    };
                    if (ranks - gone - more_gone) * 2 <= ranks + joiners + more_joiners {
                        continue;
                    }
                    gone += more_gone;
                    joiners += more_joiners;
                    s.faults.push(Fault { at, proc, kind });
                }
            }
        }
        s.faults.sort_by_key(|f| f.at);
        let last = s.faults.iter().map(|f| f.at).max().unwrap_or(start);
        let last = s
            .net
            .partitions
            .iter()
            .map(|p| p.until)
            .fold(last, Instant::max);
        // Long enough for chains of detections, a coordinator takeover and a second round.
        let settle = (d + i) * 4 + s.config.agreement_timeout * 4 + longest;
        s.end = last + settle;
        s
    }

    /// The longest freeze that must not get a process declared dead: its observers hear
    /// nothing for the freeze, plus up to one heartbeat interval, plus latency variation.
    pub fn tolerated_freeze(&self) -> Duration {
        tolerated_freeze(self)
    }

    /// The longest partition that must not get anybody declared dead: as a freeze, but the
    /// cut-off side keeps its heartbeat schedule, so the first heartbeat after the cut heals
    /// can come up to one more interval late.
    pub fn tolerated_partition(&self) -> Duration {
        tolerated_freeze(self).saturating_sub(self.config.heartbeat_interval)
    }

    /// A one-line summary for failure messages.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|f| format!("{:?}@{}:{:?}", f.kind, f.at, f.proc))
            .collect();
        format!(
            "seed {} ranks {} interval {:?} deadline {:?} k {} quorum {:?} latency {:?}+{:?}(cap {:?}) loss {} partitions {:?} shrink {:?} faults [{}] end {}",
            self.seed,
            self.ranks,
            self.config.heartbeat_interval,
            self.config.deadline,
            self.config.observers,
            self.config.quorum,
            self.net.latency,
            self.net.jitter,
            self.net.jitter_cap,
            self.net.loss,
            self.net.partitions,
            self.shrink,
            faults.join(", "),
            self.end,
        )
    }
}

fn tolerated_freeze(s: &Scenario) -> Duration {
    // On a lossy network a heartbeat or two around the stall may be lost as well.
    let lost = if s.net.loss > 0.0 {
        s.config.heartbeat_interval * 2
    } else {
        Duration::ZERO
    };
    let margin = s.net.max_latency() * 2
        + s.config.heartbeat_interval
        + s.config.stall_tolerance
        + lost
        + Duration::from_millis(10);
    s.config.deadline.saturating_sub(margin)
}

fn proc_of(rng: &mut Rng, ranks: u32) -> u32 {
    rng.below(u64::from(ranks)) as u32
}

fn jitter_in(rng: &mut Rng, spread: Duration) -> Duration {
    Duration::from_micros(rng.below(spread.as_micros() as u64 + 1))
}

/// `s` seconds after the origin.
pub fn secs(s: f64) -> Instant {
    Instant::from_micros((s * 1e6) as u64)
}
