//! A run's raw records reduced to what the report shows: per rank count, size and system,
//! the median over rounds; the machine's limits; chorus's ratio to each peer; the issue's
//! targets; and every failure with its reason.
//!
//! The systems are compared on the in-place all-reduce: torch.distributed (Gloo) has no
//! other, and it is what data-parallel training does. The out-of-place medians are kept in
//! the JSON for the systems that report them. Bus bandwidth is recomputed from the median
//! time with nccl-tests' all-reduce factor, busbw = size / time × 2(n−1)/n.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::peer::bench_doc::Measure;
use crate::peer::loopback::TcpLimit;
use crate::peer::memcpy::MemcpyPoint;
use crate::peer::record::{Meta, Record, RunOutcome, RunRecord};
use crate::peer::sweep::Bytes;
use crate::peer::system::System;

/// The size from which the bandwidth targets apply.
pub const TARGET_FROM: Bytes = Bytes(64 << 10);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub meta: Meta,
    pub limits: Limits,
    pub worlds: Vec<World>,
    pub failures: Vec<Failure>,
}

/// The machine's limits, medians over the rounds that measured them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memcpy: Vec<MemcpyPoint>,
    pub tcp: Option<TcpLimit>,
}

impl Limits {
    /// The memcpy rate at the largest size measured: the out-of-cache figure.
    pub fn memcpy_largest(&self) -> Option<MemcpyPoint> {
        self.memcpy.iter().max_by_key(|p| p.size).copied()
    }
}

/// Everything measured at one rank count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct World {
    pub ranks: u32,
    /// nccl-tests' all-reduce bus bandwidth factor, 2(n−1)/n.
    pub busbw_factor: f64,
    /// One per system the run was asked for, in [`System::ALL`]'s order.
    pub systems: Vec<SystemStatus>,
    pub rows: Vec<SizeRow>,
    /// Each measured system's time at the smallest size (8 B in both presets).
    pub latency: Vec<Latency>,
    /// The targets; empty while chorus is not measured.
    pub targets: Vec<Target>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SystemStatus {
    pub system: System,
    pub measured_rounds: u32,
    /// What the documents said produced them (`Open MPI v4.1.4 …`, `torch 2.15.0 gloo`).
    pub library: Option<String>,
    /// Why there are no numbers, when there are none.
    pub not_measured: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeRow {
    pub size: Bytes,
    /// One per [`System::ALL`], `None` where that system has no numbers at this size.
    pub cells: Vec<Option<Cell>>,
    /// chorus's bus bandwidth over each measured peer's (in-place), > 1 when chorus is faster,
    /// for each of [`System::PAIRS`] with both sides measured.
    pub ratios: Vec<Ratio>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub system: System,
    pub in_place: Option<Stat>,
    pub out_of_place: Option<Stat>,
}

/// One mode's figures at one size, over the rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Median over rounds of the time per call.
    pub time_us: f64,
    /// From the median time.
    pub busbw_gbs: f64,
    pub rounds: u32,
    /// Slowest round's time over the fastest's: how much the machine's noise moved it.
    pub spread: f64,
    /// Wrong elements, summed over rounds: anything but 0 disqualifies the numbers.
    pub wrong: u64,
    /// Every round's time, in the order of the rounds, for other statistics than the median.
    pub times_us: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// The chorus column (reports from before the shm column have only chorus (tcp)).
    #[serde(default = "chorus_tcp")]
    pub chorus: System,
    pub peer: System,
    pub chorus_over_peer: f64,
}

fn chorus_tcp() -> System {
    System::ChorusTcp
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub system: System,
    pub size: Bytes,
    /// Median over rounds.
    pub time_us: f64,
    /// The fastest round: what the system does when the machine leaves it alone.
    pub fastest_us: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub what: String,
    pub met: bool,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub round: u32,
    /// A system's key, or `memcpy` / `tcp` for the limits.
    pub what: String,
    pub ranks: Option<u32>,
    pub status: String,
    pub reason: String,
}

/// Reduces a run's records.
pub fn summarize(meta: Meta, records: &[Record]) -> Summary {
    let runs: Vec<&RunRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Run(run) => Some(run),
            _ => None,
        })
        .collect();
    let mut ranks: Vec<u32> = meta.ranks.clone();
    ranks.extend(runs.iter().map(|r| r.ranks));
    ranks.sort_unstable();
    ranks.dedup();
    let limits = limits(records);
    let memcpy = limits.memcpy_largest();
    Summary {
        limits,
        worlds: ranks
            .into_iter()
            .map(|n| world(n, &runs, &meta.systems, memcpy))
            .collect(),
        failures: failures(records),
        meta,
    }
}

fn limits(records: &[Record]) -> Limits {
    let mut memcpy: BTreeMap<Bytes, Vec<f64>> = BTreeMap::new();
    let (mut stream, mut pingpong) = (Vec::new(), Vec::new());
    for record in records {
        match record {
            Record::Memcpy { points, .. } => {
                for p in points {
                    memcpy.entry(p.size).or_default().push(p.gbs);
                }
            }
            Record::Tcp { limit, .. } => {
                stream.push(limit.stream_gbs);
                pingpong.push(limit.pingpong_8b_us);
            }
            _ => {}
        }
    }
    Limits {
        memcpy: memcpy
            .into_iter()
            .filter_map(|(size, rates)| {
                Some(MemcpyPoint {
                    size,
                    gbs: median(rates)?,
                })
            })
            .collect(),
        tcp: Some(TcpLimit {
            stream_gbs: median(stream).unwrap_or(f64::NAN),
            pingpong_8b_us: median(pingpong).unwrap_or(f64::NAN),
        })
        .filter(|t| t.stream_gbs.is_finite()),
    }
}

fn world(ranks: u32, runs: &[&RunRecord], asked: &[System], memcpy: Option<MemcpyPoint>) -> World {
    let factor = busbw_factor(ranks);
    let mut systems = Vec::new();
    // (system, size) -> per-round measures of each mode.
    let mut samples: BTreeMap<(System, Bytes), (Vec<Measure>, Vec<Measure>)> = BTreeMap::new();
    // Systems the run was not asked for get no status line; any that have records anyway
    // (a hand-merged raw folder) still count.
    let wanted = System::ALL
        .into_iter()
        .filter(|s| asked.contains(s) || runs.iter().any(|r| r.system == *s));
    for system in wanted {
        let mine: Vec<&&RunRecord> = runs
            .iter()
            .filter(|r| r.ranks == ranks && r.system == system)
            .collect();
        let mut status = SystemStatus {
            system,
            measured_rounds: 0,
            library: None,
            not_measured: None,
        };
        for run in &mine {
            match &run.outcome {
                RunOutcome::Measured { doc } => {
                    status.measured_rounds += 1;
                    status.library = status.library.take().or_else(|| doc.library.clone());
                    for row in &doc.rows {
                        let entry = samples.entry((system, row.size)).or_default();
                        entry.0.extend(row.in_place);
                        entry.1.extend(row.out_of_place);
                    }
                }
                RunOutcome::Failed { reason }
                | RunOutcome::Unavailable { reason }
                | RunOutcome::Skipped { reason } => {
                    if status.not_measured.is_none() {
                        status.not_measured = Some(reason.clone());
                    }
                }
            }
        }
        if status.measured_rounds > 0 {
            status.not_measured = None;
        } else if status.not_measured.is_none() {
            status.not_measured = Some("not run".to_owned());
        }
        systems.push(status);
    }

    let mut sizes: Vec<Bytes> = samples.keys().map(|(_, size)| *size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let rows: Vec<SizeRow> = sizes
        .into_iter()
        .map(|size| {
            let cells: Vec<Option<Cell>> = System::ALL
                .iter()
                .map(|&system| {
                    let (ip, oop) = samples.get(&(system, size))?;
                    Some(Cell {
                        system,
                        in_place: stat(size, factor, ip),
                        out_of_place: stat(size, factor, oop),
                    })
                })
                .collect();
            let ratios = ratios(&cells);
            SizeRow {
                size,
                cells,
                ratios,
            }
        })
        .collect();

    let latency: Vec<Latency> = rows
        .first()
        .map(|row| {
            row.cells
                .iter()
                .flatten()
                .filter_map(|c| {
                    Some(Latency {
                        system: c.system,
                        size: row.size,
                        time_us: c.in_place.as_ref()?.time_us,
                        fastest_us: c
                            .in_place
                            .as_ref()?
                            .times_us
                            .iter()
                            .copied()
                            .fold(f64::INFINITY, f64::min),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let mut targets = targets(&rows, &latency);
    targets.extend(crate::peer::plane_targets::targets(
        ranks, &rows, &latency, memcpy,
    ));
    World {
        ranks,
        busbw_factor: factor,
        systems,
        rows,
        latency,
        targets,
    }
}

/// nccl-tests' all-reduce bus bandwidth factor.
pub fn busbw_factor(ranks: u32) -> f64 {
    if ranks == 0 {
        0.0
    } else {
        2.0 * f64::from(ranks - 1) / f64::from(ranks)
    }
}

fn stat(size: Bytes, factor: f64, measures: &[Measure]) -> Option<Stat> {
    let times: Vec<f64> = measures.iter().map(|m| m.time_us).collect();
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    let slowest = times.iter().copied().fold(0.0, f64::max);
    let time_us = median(times.clone())?;
    Some(Stat {
        time_us,
        busbw_gbs: size.0 as f64 / (time_us * 1e-6) / 1e9 * factor,
        rounds: u32::try_from(measures.len()).unwrap_or(u32::MAX),
        spread: slowest / fastest,
        wrong: measures.iter().map(|m| m.wrong).sum(),
        times_us: measures.iter().map(|m| m.time_us).collect(),
    })
}

/// A system's in-place figures at one size, if it has some and they were right.
pub(crate) fn in_place(cells: &[Option<Cell>], system: System) -> Option<&Stat> {
    cells
        .iter()
        .flatten()
        .find(|c| c.system == system)?
        .in_place
        .as_ref()
        .filter(|st| st.wrong == 0)
}

fn ratios(cells: &[Option<Cell>]) -> Vec<Ratio> {
    System::PAIRS
        .iter()
        .filter_map(|&(chorus, peer)| {
            let (ours, theirs) = (in_place(cells, chorus)?, in_place(cells, peer)?);
            Some(Ratio {
                chorus,
                peer,
                chorus_over_peer: ours.busbw_gbs / theirs.busbw_gbs,
            })
        })
        .collect()
}

/// The first-round targets: chorus over TCP at least as fast as Open MPI over TCP
/// and as Gloo from 64 KiB up; its smallest-size latency no worse than Open MPI over TCP's;
/// and where it stands against Open MPI's shared memory (reported, not yet a target).
fn targets(rows: &[SizeRow], latency: &[Latency]) -> Vec<Target> {
    let mut targets = Vec::new();
    for peer in System::PEERS {
        let from: Vec<(Bytes, f64)> = rows
            .iter()
            .filter(|r| r.size >= TARGET_FROM)
            .filter_map(|r| {
                let ratio = r
                    .ratios
                    .iter()
                    .find(|x| x.chorus == System::ChorusTcp && x.peer == peer)?;
                Some((r.size, ratio.chorus_over_peer))
            })
            .collect();
        let Some(&(worst_size, worst)) = from.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
            continue;
        };
        let best = from.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let what = if peer == System::OpenMpiShm {
            format!(
                "standing of {} against {} from {TARGET_FROM} (its targets are {}'s)",
                System::ChorusTcp.label(),
                peer.label(),
                System::ChorusShm.label()
            )
        } else {
            format!(
                "bus bandwidth ≥ {} at every size from {TARGET_FROM}",
                peer.label()
            )
        };
        targets.push(Target {
            what,
            met: worst >= 1.0,
            detail: format!("chorus ÷ peer from {worst:.2}× (at {worst_size}) to {best:.2}×"),
        });
    }
    let time_of = |s: System| latency.iter().find(|l| l.system == s);
    if let (Some(chorus), Some(mpi)) = (time_of(System::ChorusTcp), time_of(System::OpenMpiTcp)) {
        targets.push(Target {
            what: format!("{} latency ≤ {}", chorus.size, System::OpenMpiTcp.label()),
            met: chorus.time_us <= mpi.time_us,
            detail: format!("{:.1} µs vs {:.1} µs", chorus.time_us, mpi.time_us),
        });
    }
    targets.extend(crate::peer::py_targets::targets(rows, latency));
    targets
}

fn failures(records: &[Record]) -> Vec<Failure> {
    records
        .iter()
        .filter_map(|record| match record {
            Record::Run(run) => {
                let (status, reason) = match &run.outcome {
                    RunOutcome::Measured { .. } => return None,
                    RunOutcome::Failed { reason } => ("failed", reason),
                    RunOutcome::Unavailable { reason } => ("unavailable", reason),
                    RunOutcome::Skipped { reason } => ("skipped", reason),
                };
                Some(Failure {
                    round: run.round,
                    what: run.system.key().to_owned(),
                    ranks: Some(run.ranks),
                    status: status.to_owned(),
                    reason: reason.clone(),
                })
            }
            Record::LimitFailed {
                round,
                which,
                reason,
            } => Some(Failure {
                round: *round,
                what: which.clone(),
                ranks: None,
                status: "failed".to_owned(),
                reason: reason.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The median of finite values (the mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::peer::bench_doc::{BenchDoc, Row};
    use crate::peer::record::tests::meta;

    fn measure(time_us: f64) -> Measure {
        Measure {
            time_us,
            algbw_gbs: 0.0,
            busbw_gbs: 0.0,
            wrong: 0,
        }
    }

    /// A document with the given in-place times (µs) at 8 B, 64 KiB and 1 MiB.
    pub(crate) fn doc(ranks: u32, times: [f64; 3], out_of_place: bool) -> BenchDoc {
        let rows = [8u64, 64 << 10, 1 << 20]
            .iter()
            .zip(times)
            .map(|(&size, t)| Row {
                size: Bytes(size),
                count: size / 4,
                dtype: "float".to_owned(),
                redop: "sum".to_owned(),
                root: -1,
                out_of_place: out_of_place.then(|| measure(t * 1.1)),
                in_place: Some(measure(t)),
            })
            .collect();
        BenchDoc {
            chorus_bench: 1,
            collective: "all-reduce".to_owned(),
            ranks,
            transport: "tcp".to_owned(),
            dtype: "float".to_owned(),
            op: "sum".to_owned(),
            warmup: 1,
            iters: 1,
            library: Some("lib 1.0".to_owned()),
            rows,
            avg_busbw_gbs: 0.0,
        }
    }

    pub(crate) fn run(round: u32, system: System, ranks: u32, outcome: RunOutcome) -> Record {
        Record::Run(RunRecord {
            round,
            system,
            ranks,
            elapsed_s: 1.0,
            outcome,
        })
    }

    pub(crate) fn measured(round: u32, system: System, ranks: u32, times: [f64; 3]) -> Record {
        run(
            round,
            system,
            ranks,
            RunOutcome::Measured {
                doc: doc(ranks, times, system != System::GlooTcp),
            },
        )
    }

    /// Two rounds at 2 ranks: chorus faster than Gloo everywhere, slower than Open MPI over
    /// TCP at 1 MiB; Open MPI's shm failed in round 2; 4 ranks has only Gloo.
    pub(crate) fn records() -> Vec<Record> {
        vec![
            Record::Memcpy {
                round: 1,
                points: vec![MemcpyPoint {
                    size: Bytes(1 << 20),
                    gbs: 10.0,
                }],
            },
            Record::Memcpy {
                round: 2,
                points: vec![MemcpyPoint {
                    size: Bytes(1 << 20),
                    gbs: 12.0,
                }],
            },
            Record::Tcp {
                round: 1,
                limit: TcpLimit {
                    stream_gbs: 4.0,
                    pingpong_8b_us: 10.0,
                },
            },
            measured(1, System::ChorusTcp, 2, [10.0, 50.0, 600.0]),
            measured(2, System::ChorusTcp, 2, [12.0, 70.0, 600.0]),
            measured(1, System::GlooTcp, 2, [100.0, 200.0, 1000.0]),
            measured(2, System::GlooTcp, 2, [100.0, 200.0, 1000.0]),
            measured(1, System::OpenMpiTcp, 2, [20.0, 60.0, 500.0]),
            measured(2, System::OpenMpiTcp, 2, [20.0, 60.0, 500.0]),
            measured(1, System::OpenMpiShm, 2, [1.0, 10.0, 100.0]),
            run(
                2,
                System::OpenMpiShm,
                2,
                RunOutcome::Failed {
                    reason: "timed out after 60 s".to_owned(),
                },
            ),
            measured(1, System::GlooTcp, 4, [300.0, 400.0, 2000.0]),
            run(
                1,
                System::ChorusTcp,
                4,
                RunOutcome::Failed {
                    reason: "printed nothing on stdout".to_owned(),
                },
            ),
        ]
    }

    #[test]
    fn medians_over_rounds_and_busbw_from_the_median_time() {
        let s = summarize(meta(), &records());
        let two = &s.worlds[0];
        assert_eq!(two.ranks, 2);
        let row = two.rows.iter().find(|r| r.size == Bytes(64 << 10)).unwrap();
        let chorus = row.cells[0].as_ref().unwrap().in_place.clone().unwrap();
        assert_eq!(chorus.time_us, 60.0);
        assert_eq!(chorus.rounds, 2);
        assert!((chorus.spread - 70.0 / 50.0).abs() < 1e-12);
        // 64 KiB in 60 µs, factor 2(2-1)/2 = 1.
        assert!((chorus.busbw_gbs - 65536.0 / 60e-6 / 1e9).abs() < 1e-9);
        let gloo = row.cells[1].as_ref().unwrap();
        assert!(gloo.out_of_place.is_none());
        assert!(row.cells[0].as_ref().unwrap().out_of_place.is_some());
    }

    #[test]
    fn ratios_are_chorus_busbw_over_each_peers() {
        let s = summarize(meta(), &records());
        let row = s.worlds[0]
            .rows
            .iter()
            .find(|r| r.size == Bytes(1 << 20))
            .unwrap();
        let r = |p: System| {
            row.ratios
                .iter()
                .find(|x| x.peer == p)
                .unwrap()
                .chorus_over_peer
        };
        assert!((r(System::GlooTcp) - 1000.0 / 600.0).abs() < 1e-9);
        assert!((r(System::OpenMpiTcp) - 500.0 / 600.0).abs() < 1e-9);
        assert!((r(System::OpenMpiShm) - 100.0 / 600.0).abs() < 1e-9);
    }

    #[test]
    fn targets_say_which_peer_chorus_does_not_yet_beat_and_where() {
        let s = summarize(meta(), &records());
        let targets = &s.worlds[0].targets;
        let gloo = targets.iter().find(|t| t.what.contains("Gloo")).unwrap();
        assert!(gloo.met, "{gloo:?}");
        let mpi = targets
            .iter()
            .find(|t| t.what.contains("≥ Open MPI (tcp)"))
            .unwrap();
        assert!(!mpi.met);
        assert!(mpi.detail.contains("0.83× (at 1 MiB)"), "{}", mpi.detail);
        let latency = targets.iter().find(|t| t.what.contains("latency")).unwrap();
        assert!(latency.met, "{latency:?}");
        assert!(latency.what.starts_with("8 B"), "{}", latency.what);
    }

    #[test]
    fn systems_without_numbers_carry_their_reason_and_no_targets_are_claimed() {
        let s = summarize(meta(), &records());
        let four = &s.worlds[1];
        assert_eq!(four.ranks, 4);
        assert_eq!(
            four.systems[0].not_measured.as_deref(),
            Some("printed nothing on stdout")
        );
        assert_eq!(four.systems[2].not_measured.as_deref(), Some("not run"));
        assert!(four.targets.is_empty());
        assert!(four.rows.iter().all(|r| r.ratios.is_empty()));
        // Open MPI shm at 2 ranks failed once but was measured once: it has numbers.
        assert_eq!(s.worlds[0].systems[3].measured_rounds, 1);
        assert_eq!(s.worlds[0].systems[3].not_measured, None);
        assert_eq!(s.failures.len(), 2);
    }

    #[test]
    fn limits_are_medians_and_latency_is_the_smallest_size() {
        let s = summarize(meta(), &records());
        assert_eq!(s.limits.memcpy_largest().unwrap().gbs, 11.0);
        assert_eq!(s.limits.tcp.unwrap().stream_gbs, 4.0);
        let lat = &s.worlds[0].latency;
        assert_eq!(
            lat.iter()
                .find(|l| l.system == System::GlooTcp)
                .unwrap()
                .time_us,
            100.0
        );
        assert_eq!(lat.len(), 4);
    }

    #[test]
    fn systems_left_out_of_the_run_are_not_reported_missing() {
        let mut m = meta();
        m.systems = vec![System::ChorusTcp, System::GlooTcp];
        let recs: Vec<Record> = records()
            .into_iter()
            .filter(|r| matches!(r, Record::Run(x) if m.systems.contains(&x.system)))
            .collect();
        let s = summarize(m, &recs);
        let four: Vec<System> = s.worlds[1].systems.iter().map(|x| x.system).collect();
        assert_eq!(four, vec![System::ChorusTcp, System::GlooTcp]);
    }

    #[test]
    fn medians_ignore_non_finite_values() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]), Some(2.5));
        assert_eq!(busbw_factor(4), 1.5);
    }
}
