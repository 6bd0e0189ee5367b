//! The run's table (in-place, median over rounds, with chorus ÷ Open MPI ratios) and its
//! JSON (every document, every round).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chorus_benches::peer::bench_doc::Measure;
use chorus_benches::peer::summary::{busbw_factor, median};
use chorus_benches::peer::sweep::Sweep;

use crate::{Case, System};

pub(crate) fn json(cases: &[Case]) -> String {
    let items: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            let (doc, error) = match &c.result {
                Ok(doc) => (serde_json::to_value(doc).unwrap_or_default(), None),
                Err(e) => (serde_json::Value::Null, Some(e.clone())),
            };
            serde_json::json!({
                "round": c.round,
                "system": c.system.label(),
                "ranks": c.ranks,
                "doc": doc,
                "error": error,
            })
        })
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_default()
}

/// In-place figures of one system at one rank count and size, over rounds.
#[derive(Default)]
struct Cell {
    times: Vec<f64>,
    wrong: u64,
}

pub(crate) fn markdown(
    cases: &[Case],
    systems: &[System],
    ranks: &[u32],
    sweep: &Sweep,
    rounds: u32,
) -> String {
    let mut cells: BTreeMap<(u32, System, u64), Cell> = BTreeMap::new();
    for c in cases {
        let Ok(doc) = &c.result else { continue };
        for row in &doc.rows {
            if let Some(Measure { time_us, wrong, .. }) = row.in_place {
                let cell = cells.entry((c.ranks, c.system, row.size.0)).or_default();
                cell.times.push(time_us);
                cell.wrong += wrong;
            }
        }
    }
    let mpi = systems.iter().copied().find(|s| *s == System::OpenMpiTcp);
    let chorus: Vec<System> = systems.iter().copied().filter(|s| s.is_chorus()).collect();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# chorus data plane vs Open MPI, all-reduce float32 sum, in place\n\n\
         {rounds} rounds interleaved, median shown; {} warm-up and {} timed calls per size. \
         busbw = size / time × 2(n−1)/n. Ratios: chorus busbw ÷ Open MPI tcp busbw \
         (> 1: chorus faster).",
        sweep.warmup(),
        sweep.iters()
    );
    for &n in ranks {
        let _ = writeln!(md, "\n## {n} ranks (busbw factor {:.2})\n", busbw_factor(n));
        let mut head = String::from("| size |");
        let mut rule = String::from("|---:|");
        for s in systems {
            let _ = write!(head, " {} µs |", s.label());
            rule.push_str("---:|");
        }
        for s in systems {
            let _ = write!(head, " {} GB/s |", s.label());
            rule.push_str("---:|");
        }
        if mpi.is_some() {
            for s in &chorus {
                let _ = write!(head, " {} ÷ MPI |", s.label());
                rule.push_str("---:|");
            }
        }
        let _ = writeln!(md, "{head}\n{rule}");
        for size in sweep.sizes() {
            let time = |s: System| {
                cells
                    .get(&(n, s, size.0))
                    .and_then(|c| median(c.times.clone()).map(|t| (t, c.wrong, c.times.clone())))
            };
            let mut line = format!("| {size} |");
            for &s in systems {
                match time(s) {
                    Some((_, wrong, _)) if wrong > 0 => {
                        let _ = write!(line, " WRONG ({wrong}) |");
                    }
                    Some((t, _, all)) => {
                        let spread = spread(&all);
                        let _ = write!(line, " {}{spread} |", fmt_time(t));
                    }
                    None => line.push_str(" – |"),
                }
            }
            let busbw = |t: f64| size.0 as f64 / (t * 1e-6) / 1e9 * busbw_factor(n);
            for &s in systems {
                match time(s) {
                    Some((t, 0, _)) => {
                        let _ = write!(line, " {:.3} |", busbw(t));
                    }
                    _ => line.push_str(" – |"),
                }
            }
            if let Some(m) = mpi {
                for &s in &chorus {
                    match (time(s), time(m)) {
                        (Some((tc, 0, _)), Some((tm, 0, _))) => {
                            let _ = write!(line, " {:.2} |", tm / tc);
                        }
                        _ => line.push_str(" – |"),
                    }
                }
            }
            let _ = writeln!(md, "{line}");
        }
    }
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            c.result.as_ref().err().map(|e| {
                format!(
                    "- round {}, {}, {} ranks: {e}",
                    c.round,
                    c.system.label(),
                    c.ranks
                )
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(md, "\n## Not measured\n\n{}", failures.join("\n"));
    }
    md
}

/// ` (×k)` when the slowest round took k ≥ 1.1 times the fastest.
fn spread(times: &[f64]) -> String {
    let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = times.iter().copied().fold(0.0, f64::max);
    if times.len() > 1 && lo > 0.0 && hi / lo >= 1.1 {
        format!(" (×{:.1})", hi / lo)
    } else {
        String::new()
    }
}

fn fmt_time(us: f64) -> String {
    if us >= 1000.0 {
        format!("{us:.0}")
    } else {
        format!("{us:.1}")
    }
}
