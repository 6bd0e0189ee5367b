//! The properties checked at the end of every run (the ones that can be checked on the spot
//! are checked in the cluster as events happen: false verdicts, stale frames accepted,
//! conflicting memberships, epochs going backwards, frames from non-members).
//!
//! Bounds are derived from the scenario, never hard-coded:
//!
//! - **Detection.** A crash (or a long freeze) of rank X is learned by every healthy member
//!   by `watched(X) + spread`. `watched(X)` is X's fault time plus one detection period
//!   if one of its first k successors on the ring stays up; otherwise the ring must first
//!   close over those successors, so it is one detection period after the latest of X's
//!   fault and those successors' own `watched` times (a frozen successor counts as watching
//!   again when it resumes). A detection period is the deadline plus a heartbeat interval
//!   plus two worst latencies (plus four intervals of anti-entropy when frames are lost, and
//!   an agreement timeout plus a deadline when epoch changes can re-arrange the ring); the
//!   spread is (⌈log2 N⌉ + 2) worst latencies.
//! - **Departure.** On a loss-free, partition-free network without epoch changes, every
//!   healthy member learns a departure within (⌈log2 N⌉ + 2) worst one-way latencies.
//!   Otherwise the detection bound applies: a `Depart` racing a commit arrives at members
//!   already at the new epoch, which refuse it as stale (principle 6), and the departed
//!   rank is then found silent by its new observers.
//! - **Revocation.** Same bound as a departure's spread, for members still at the revoked
//!   epoch.
//! - **Agreement.** With the application shrinking on every absence and no long partition,
//!   all surviving members end at the same epoch, whose membership holds exactly them.
//! - **Eviction.** A member frozen past the deadline and declared dead is evicted after it
//!   resumes.

use std::time::Duration;

use chorus_protocol::Epoch;

use super::cluster::Cluster;
use super::record::{NEVER, Record};
use super::report::{Report, Summary};
use super::scenario::FaultKind;
use crate::time::Instant;

pub(crate) fn finish(c: &Cluster) -> Report {
    let s = c.scenario();
    let r = &c.record;
    let mut violations = r.violations.clone();
    let n = s.ranks;
    let procs = c.proc_count();
    let log2 = u32::BITS - n.saturating_sub(1).leading_zeros();
    let max_lat = s.net.max_latency();
    let d = s.config.deadline;
    let i = s.config.heartbeat_interval;
    let k = s.config.observers.max(1);
    let spread = max_lat * (log2 + 2);
    let long_partition = r.long_partition_from.is_some();
    let any_partition = !s.net.partitions.is_empty();
    let lossy = s.net.loss > 0.0;
    let tolerated = s.tolerated_freeze();
    let stalls: Duration = s
        .faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::Freeze(t) if t <= tolerated => Some(t),
            _ => None,
        })
        .sum();
    let epoch_changes = s.shrink.is_some()
        || s.faults
            .iter()
            .any(|f| matches!(f.kind, FaultKind::Admit(_)));
    let per_level = d
        + i
        + max_lat * 2
        + if lossy { i * 4 } else { Duration::ZERO }
        + if epoch_changes {
            s.config.agreement_timeout + d
        } else {
            Duration::ZERO
        };
    let partition_len: Duration = s
        .net
        .partitions
        .iter()
        .map(|p| p.until.saturating_since(p.from))
        .sum();
    let healthy: Vec<u32> = (0..n)
        .filter(|p| !r.faulted(*p))
        .filter(|p| {
            !s.net
                .partitions
                .iter()
                .any(|part| (part.lo..part.hi).contains(p))
        })
        .collect();
    let end = c.now();
    let mut latencies = Vec::new();

    if !long_partition {
        for subject in 0..procs as u32 {
            let f = &r.faults[subject as usize];
            let crash = f.crashed;
            let long_freeze = f
                .freezes
                .iter()
                .find(|(a, b)| b.saturating_since(*a) > tolerated)
                .copied();
            let freeze = long_freeze.map(|(a, _)| a);
            let departed = f.departed;
            let (start, departure) = match (crash, freeze, departed) {
                (Some(t), _, _) => (t, false),
                (None, Some(t), _) => (t, false),
                (None, None, Some(t)) => (t, true),
                _ => continue,
            };
            let strict = departure && !lossy && !any_partition && !epoch_changes;
            let bound = if strict {
                start + spread + Duration::from_millis(1)
            } else {
                watched(r, subject, n, k, per_level, 0) + spread + stalls + partition_len
            };
            if bound > end {
                continue;
            }
            // A freeze that ended before the bound need not have been detected (its
            // observers may have been dead themselves), unless somebody did declare it.
            if crash.is_none()
                && let Some((_, until)) = long_freeze
                && until < bound
                && !r.declared.contains_key(&subject)
            {
                continue;
            }
            let row = r.learned.get(&subject);
            for &p in &healthy {
                let learned = row
                    .and_then(|row| row.get(p as usize))
                    .copied()
                    .unwrap_or(NEVER);
                if learned == NEVER {
                    violations.push(format!(
                        "proc {p} never learned that proc {subject} (fault at {start}) is gone"
                    ));
                } else if learned > bound.as_micros() {
                    violations.push(format!(
                        "proc {p} learned proc {subject} is gone at {}, after the bound {bound} (fault at {start})",
                        Instant::from_micros(learned)
                    ));
                }
                if learned != NEVER && !departure && subject < n {
                    latencies.push(
                        Instant::from_micros(learned)
                            .saturating_since(start)
                            .as_secs_f64()
                            * 1e3,
                    );
                }
            }
        }
    }

    if !any_partition {
        for rv in &r.revokes {
            let bound = rv.at
                + spread
                + Duration::from_millis(1)
                + if lossy { i * 4 } else { Duration::ZERO };
            if bound > end {
                continue;
            }
            for &p in &healthy {
                if r.epoch_at(p, rv.at) != rv.epoch || r.epoch_at(p, bound) != rv.epoch {
                    continue;
                }
                let learned = rv.learned.get(p as usize).copied().unwrap_or(NEVER);
                if learned > bound.as_micros() {
                    violations.push(format!(
                        "proc {p} did not learn the revocation of {} (at {}) by {bound}",
                        rv.epoch, rv.at
                    ));
                }
            }
        }
    }

    // Agreement traffic dropped on purpose cannot converge; the test asserts the timeout.
    if s.shrink.is_some() && !long_partition && s.net.drop.is_empty() {
        check_agreement(c, &mut violations);
    }

    if !long_partition {
        for (p, f) in r.faults.iter().enumerate() {
            let Some((from, until)) = f
                .freezes
                .iter()
                .find(|(a, b)| b.saturating_since(*a) > tolerated + d)
            else {
                continue;
            };
            let _ = from;
            if f.crashed.is_some() || f.departed.is_some() || !r.declared.contains_key(&(p as u32))
            {
                continue;
            }
            if *until + d * 2 + s.config.agreement_timeout < end && f.evicted.is_none() {
                violations.push(format!(
                    "proc {p} was declared dead while frozen until {until} but never evicted"
                ));
            }
        }
    }

    let window = s.measure.1.saturating_since(s.measure.0).as_secs_f64();
    let final_epoch = r
        .installs
        .iter()
        .filter_map(|v| v.last())
        .map(|(e, _)| e.get())
        .max()
        .unwrap_or(0);
    let mut hops = r.hops.clone();
    Report {
        seed: s.seed,
        ranks: n,
        violations,
        detection_ms: Summary::of(&mut latencies),
        hops: Summary::of(&mut hops),
        steady_msgs_per_rank_per_s: if window > 0.0 {
            r.window_frames as f64 / f64::from(n) / window
        } else {
            0.0
        },
        frames: r.frames,
        lost: r.lost,
        events: r.events,
        simulated: end.saturating_since(Instant::ZERO),
        final_epoch,
        evictions: r.evictions,
        stalls: r.stalls,
        gave_up: r.gave_up.clone(),
        installed: r
            .installs
            .iter()
            .map(|v| v.last().map_or(0, |(e, _)| e.get()))
            .collect(),
        evicted: r.faults.iter().map(|f| f.evicted).collect(),
        installed_at: r
            .installs
            .iter()
            .map(|v| v.last().filter(|(e, _)| e.get() > 0).map(|(_, t)| *t))
            .collect(),
        learned: r
            .learned
            .iter()
            .map(|(subject, row)| {
                let row = (0..procs)
                    .map(|o| {
                        row.get(o)
                            .filter(|t| **t != NEVER)
                            .map(|t| Instant::from_micros(*t))
                    })
                    .collect();
                (*subject, row)
            })
            .collect(),
    }
}

/// When a live member has been watching `x` long enough to declare it (see the module
/// docs), for a rank of the initial ring.
fn watched(r: &Record, x: u32, n: u32, k: u32, period: Duration, depth: u32) -> Instant {
    let start = down_since(r, x).unwrap_or(Instant::ZERO);
    if x >= n || depth > n {
        return start + period;
    }
    let successors: Vec<u32> = (1..=k.min(n - 1)).map(|step| (x + step) % n).collect();
    if successors.iter().any(|s| down_since(r, *s).is_none()) {
        return start + period;
    }
    let mut latest = start;
    for s in successors {
        let mut back = watched(r, s, n, k, period, depth + 1);
        if let Some(until) = resumes(r, s) {
            back = back.min(until);
        }
        latest = latest.max(back);
    }
    latest + period
}

/// When `p` stopped watching anyone for good or for long: crashed, left, or froze past the
/// tolerated stall (never, for a healthy process).
fn down_since(r: &Record, p: u32) -> Option<Instant> {
    let f = r.faults.get(p as usize)?;
    let long_freeze = f
        .freezes
        .iter()
        .find(|(a, b)| b.saturating_since(*a) > r.tolerated_freeze)
        .map(|(a, _)| *a);
    [f.crashed, f.departed, long_freeze]
        .into_iter()
        .flatten()
        .min()
}

/// When a frozen (never crashed or departed) process resumed.
fn resumes(r: &Record, p: u32) -> Option<Instant> {
    let f = r.faults.get(p as usize)?;
    if f.crashed.is_some() || f.departed.is_some() {
        return None;
    }
    f.freezes.iter().map(|(_, b)| *b).max()
}

/// Everyone who survived ends at one epoch whose membership is exactly the survivors.
fn check_agreement(c: &Cluster, violations: &mut Vec<String>) {
    let r = &c.record;
    let survivors: Vec<u32> = (0..c.proc_count() as u32)
        .filter(|p| !r.must_go(*p) && c.node(*p).is_some())
        .collect();
    let Some(epoch) = survivors
        .iter()
        .filter_map(|p| c.node(*p))
        .map(|n| n.epoch())
        .max()
    else {
        return;
    };
    for &p in &survivors {
        if let Some(node) = c.node(p)
            && node.epoch() != epoch
        {
            violations.push(format!(
                "survivor proc {p} ended at {} while others reached {epoch}",
                node.epoch()
            ));
        }
    }
    let Some(members) = c.members(epoch) else {
        violations.push(format!("no table for final {epoch}"));
        return;
    };
    for m in members {
        if r.must_go(*m) {
            violations.push(format!("final {epoch} still holds proc {m}, which is gone"));
        }
    }
    for p in &survivors {
        if !members.contains(p) {
            violations.push(format!("final {epoch} lost survivor proc {p}"));
        }
    }
    let _ = Epoch(0);
}
