//! The report as markdown: the limits, then per rank count the bus bandwidth table with
//! chorus's ratios, the time table, the smallest-size latency and the targets; failures last.

use std::fmt::Write as _;

use crate::peer::record::Meta;
use crate::peer::summary::{Cell, Stat, Summary, World};
use crate::peer::system::System;

/// How many calls each size made: the same at every size, or more up to `small_up_to`.
fn calls(m: &Meta) -> String {
    let flat = format!("{} warm-up and {} timed calls", m.warmup, m.iters);
    if !m.scaled {
        return format!("{flat} per size");
    }
    format!(
        "{} warm-up and {} timed calls per size up to {}, {flat} above",
        m.warmup.saturating_mul(m.small_calls),
        m.iters.saturating_mul(m.small_calls),
        m.small_up_to
    )
}

/// Renders the whole report.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let m = &s.meta;
    let _ = writeln!(out, "# Peer comparison: all-reduce, float32 sum\n");
    let _ = writeln!(
        out,
        "{} run{}: {} … {} in ×{} steps, {}, {} round{} \
         (median shown), the systems interleaved in every round. Machine: {}, {} cores, Linux {}.\n",
        if m.quick { "Quick" } else { "Full" },
        if m.quick { " (`--quick`)" } else { "" },
        m.min,
        m.max,
        m.factor,
        calls(m),
        m.rounds,
        if m.rounds == 1 { "" } else { "s" },
        m.cpu,
        m.cores,
        m.kernel
    );
    if !m.versions.is_empty() {
        let versions: Vec<String> = m.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "Versions: {}.\n", versions.join("; "));
    }

    let _ = writeln!(out, "## Machine limits (measured in the same run)\n");
    let _ = writeln!(out, "| limit | value |\n|---|---|");
    match s.limits.memcpy_largest() {
        Some(p) => {
            let _ = writeln!(out, "| memcpy, 1 thread, {} | {:.2} GB/s |", p.size, p.gbs);
        }
        None => {
            let _ = writeln!(out, "| memcpy, 1 thread | not measured |");
        }
    }
    match s.limits.tcp {
        Some(t) => {
            let _ = writeln!(
                out,
                "| TCP loopback stream, 1 connection, 1 MiB writes | {:.2} GB/s |",
                t.stream_gbs
            );
            let _ = writeln!(
                out,
                "| TCP loopback 8-byte ping-pong, one way | {:.1} µs |",
                t.pingpong_8b_us
            );
        }
        None => {
            let _ = writeln!(out, "| TCP loopback | not measured |");
        }
    }
    let _ = writeln!(out);

    for world in &s.worlds {
        render_world(&mut out, world);
    }

    if !s.failures.is_empty() {
        let _ = writeln!(out, "## Failures and skips\n");
        for f in &s.failures {
            let ranks = f.ranks.map(|n| format!(", {n} ranks")).unwrap_or_default();
            let _ = writeln!(
                out,
                "- round {}, {}{ranks}: {}: {}",
                f.round, f.what, f.status, f.reason
            );
        }
        let _ = writeln!(out);
    }
    out
}

fn render_world(out: &mut String, w: &World) {
    let _ = writeln!(out, "## {} ranks\n", w.ranks);
    for status in &w.systems {
        if let Some(why) = &status.not_measured {
            let _ = writeln!(out, "- **{}: not measured** — {why}", status.system.label());
        }
    }
    let measured: Vec<System> = w
        .systems
        .iter()
        .filter(|s| s.measured_rounds > 0)
        .map(|s| s.system)
        .collect();
    if measured.is_empty() {
        let _ = writeln!(out, "\nNo system was measured at {} ranks.\n", w.ranks);
        return;
    }
    let _ = writeln!(out);
    let pairs: Vec<(System, System)> = System::PAIRS
        .into_iter()
        .filter(|&(c, p)| {
            w.rows
                .iter()
                .any(|r| r.ratios.iter().any(|x| x.chorus == c && x.peer == p))
        })
        .collect();

    let _ = writeln!(
        out,
        "### Bus bandwidth, GB/s (in-place; busbw = size / time × 2(n−1)/n = × {:.2})\n",
        w.busbw_factor
    );
    let mut header = String::from("| size |");
    let mut rule = String::from("|---:|");
    for s in &measured {
        let _ = write!(header, " {} |", s.label());
        rule.push_str("---:|");
    }
    for (c, p) in &pairs {
        // "chorus ÷ peer" for the TCP column, as reports always said; the others by name.
        let ours = if *c == System::ChorusTcp {
            "chorus"
        } else {
            c.label()
        };
        let _ = write!(header, " {ours} ÷ {} |", p.label());
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for row in &w.rows {
        let _ = write!(out, "| {} |", row.size);
        for &s in &measured {
            let _ = write!(
                out,
                " {} |",
                cell(
                    row.cells.iter().flatten().find(|c| c.system == s),
                    |st| format!("{:.3}", st.busbw_gbs)
                )
            );
        }
        for (c, p) in &pairs {
            match row.ratios.iter().find(|x| x.chorus == *c && x.peer == *p) {
                Some(r) => {
                    let _ = write!(out, " {:.2}× |", r.chorus_over_peer);
                }
                None => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out);

    let _ = writeln!(
        out,
        "### Time per call, µs (in-place, median over rounds; (×k): the slowest round took k times the fastest)\n"
    );
    let mut header = String::from("| size |");
    let mut rule = String::from("|---:|");
    for s in &measured {
        let _ = write!(header, " {} |", s.label());
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for row in &w.rows {
        let _ = write!(out, "| {} |", row.size);
        for &s in &measured {
            let text = cell(row.cells.iter().flatten().find(|c| c.system == s), |st| {
                if st.rounds > 1 && st.spread >= 1.1 {
                    format!("{} (×{:.1})", time(st.time_us), st.spread)
                } else {
                    time(st.time_us)
                }
            });
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
    let _ = writeln!(out);

    if let Some(first) = w.latency.first() {
        let _ = writeln!(out, "### {} latency\n", first.size);
        let chorus = w.latency.iter().find(|l| l.system == System::ChorusTcp);
        match chorus {
            Some(_) => {
                let _ = writeln!(
                    out,
                    "| system | µs per call | fastest round | its time ÷ chorus's |\n|---|---:|---:|---:|"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "| system | µs per call | fastest round |\n|---|---:|---:|"
                );
            }
        }
        for l in &w.latency {
            let (median, fastest) = (time(l.time_us), time(l.fastest_us));
            let _ = write!(out, "| {} | {median} | {fastest} |", l.system.label());
            if let Some(c) = chorus {
                let _ = write!(out, " {:.2}× |", l.time_us / c.time_us);
            }
            out.push('\n');
        }
        let _ = writeln!(out);
    }

    if !w.targets.is_empty() {
        let _ = writeln!(out, "### Targets\n");
        for t in &w.targets {
            let mark = if t.what.starts_with("standing") {
                "info"
            } else if t.met {
                "met"
            } else {
                "NOT met"
            };
            let _ = writeln!(out, "- {mark}: {} — {}", t.what, t.detail);
        }
        let _ = writeln!(out);
    }
}

/// A cell's text, or why it has none; wrong results are shown instead of the number.
fn cell(c: Option<&Cell>, show: impl Fn(&Stat) -> String) -> String {
    match c.and_then(|c| c.in_place.as_ref()) {
        None => "–".to_owned(),
        Some(st) if st.wrong > 0 => format!("WRONG ({} elements)", st.wrong),
        Some(st) => show(st),
    }
}

fn time(us: f64) -> String {
    if us >= 1000.0 {
        format!("{us:.0}")
    } else {
        format!("{us:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::record::RunOutcome;
    use crate::peer::record::tests::meta;
    use crate::peer::summary::summarize;
    use crate::peer::summary::tests::{records, run};

    #[test]
    fn the_report_has_limits_tables_ratios_targets_and_failures() {
        let md = render(&summarize(meta(), &records()));
        assert!(
            md.contains("| memcpy, 1 thread, 1 MiB | 11.00 GB/s |"),
            "{md}"
        );
        assert!(
            md.contains("| TCP loopback stream, 1 connection, 1 MiB writes | 4.00 GB/s |"),
            "{md}"
        );
        assert!(md.contains("## 2 ranks"), "{md}");
        assert!(md.contains(
            "| size | chorus (tcp) | Gloo (tcp) | Open MPI (tcp) | Open MPI (shm) | chorus ÷ Gloo (tcp) | chorus ÷ Open MPI (tcp) | chorus ÷ Open MPI (shm) |"
        ), "{md}");
        assert!(
            md.contains("| 1 MiB | 1.748 | 1.049 | 2.097 | 10.486 | 1.67× | 0.83× | 0.17× |"),
            "{md}"
        );
        assert!(
            md.contains("- NOT met: bus bandwidth ≥ Open MPI (tcp) at every size from 64 KiB"),
            "{md}"
        );
        assert!(
            md.contains("| chorus (tcp) | 11.0 | 10.0 | 1.00× |"),
            "{md}"
        );
        assert!(
            md.contains("| Open MPI (tcp) | 20.0 | 20.0 | 1.82× |"),
            "{md}"
        );
        assert!(
            md.contains("- **chorus (tcp): not measured** — printed nothing on stdout"),
            "{md}"
        );
        assert!(
            md.contains("- round 2, openmpi-shm, 2 ranks: failed: timed out after 60 s"),
            "{md}"
        );
    }

    #[test]
    fn the_shm_column_gets_its_own_ratio_against_open_mpis_shared_memory() {
        let mut recs = records();
        recs.push(crate::peer::summary::tests::measured(
            1,
            System::ChorusShm,
            2,
            [20.0, 5.0, 50.0],
        ));
        let md = render(&summarize(meta(), &recs));
        assert!(md.contains(
            "| Open MPI (shm) | chorus (shm) | chorus ÷ Gloo (tcp) | chorus ÷ Open MPI (tcp) | chorus ÷ Open MPI (shm) | chorus (shm) ÷ Open MPI (shm) |"
        ), "{md}");
        assert!(md.contains(" | 0.17× | 2.00× |\n"), "{md}");
        assert!(
            md.contains("- met: chorus (shm) bus bandwidth ≥ 1.2× Open MPI (shm) from 64 KiB"),
            "{md}"
        );
    }

    #[test]
    fn without_chorus_the_peers_table_stands_alone() {
        let mut recs: Vec<_> = records().into_iter().filter(|r| !matches!(r, crate::peer::record::Record::Run(x) if x.system == System::ChorusTcp)).collect();
        recs.push(run(
            1,
            System::ChorusTcp,
            2,
            RunOutcome::Unavailable {
                reason: "target/release/chorus not found".to_owned(),
            },
        ));
        let md = render(&summarize(meta(), &recs));
        assert!(
            md.contains("| size | Gloo (tcp) | Open MPI (tcp) | Open MPI (shm) |\n"),
            "{md}"
        );
        assert!(!md.contains("chorus ÷"), "{md}");
        assert!(!md.contains("Targets"), "{md}");
        assert!(
            md.contains("| system | µs per call | fastest round |\n"),
            "{md}"
        );
        assert!(
            md.contains("**chorus (tcp): not measured** — target/release/chorus not found"),
            "{md}"
        );
    }

    #[test]
    fn wrong_results_replace_the_number() {
        let mut recs = records();
        if let crate::peer::record::Record::Run(r) = &mut recs[5]
            && let RunOutcome::Measured { doc } = &mut r.outcome
        {
            doc.rows[2].in_place.as_mut().unwrap().wrong = 7;
        }
        let md = render(&summarize(meta(), &recs));
        assert!(md.contains("WRONG (7 elements)"), "{md}");
    }
}
