//! The targets of chorus's Python package against `chorus bench` and Gloo (one more
//! block of the summary's targets, kept apart so the summary stays about the peers).

use crate::peer::summary::{Latency, SizeRow, TARGET_FROM, Target, in_place};
use crate::peer::sweep::Bytes;
use crate::peer::system::System;

/// The Python package's targets: the call adds at most 3 µs to the smallest all-reduce,
/// stays within 1.05× of `chorus bench`'s time from 64 KiB up, and keeps at least 3× Gloo's
/// bus bandwidth at every size up to 1 MiB.
pub(crate) fn targets(rows: &[SizeRow], latency: &[Latency]) -> Vec<Target> {
    let mut targets = Vec::new();
    let time_of = |s: System| latency.iter().find(|l| l.system == s);
    if let (Some(py), Some(bench)) = (time_of(System::ChorusPy), time_of(System::ChorusTcp)) {
        let added = py.time_us - bench.time_us;
        targets.push(Target {
            what: format!(
                "{} from Python adds ≤ 3 µs to {}",
                py.size,
                System::ChorusTcp.label()
            ),
            met: added <= 3.0,
            detail: format!(
                "{:.1} µs vs {:.1} µs (+{added:.1} µs)",
                py.time_us, bench.time_us
            ),
        });
    }
    let pairs = |a: System, b: System, keep: &dyn Fn(Bytes) -> bool| -> Vec<(Bytes, f64, f64)> {
        rows.iter()
            .filter(|r| keep(r.size))
            .filter_map(|r| {
                let (x, y) = (in_place(&r.cells, a)?, in_place(&r.cells, b)?);
                Some((r.size, x.time_us, y.time_us))
            })
            .collect()
    };
    let slower = pairs(System::ChorusPy, System::ChorusTcp, &|s| s >= TARGET_FROM);
    if let Some(&(size, py, bench)) = slower
        .iter()
        .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))
    {
        targets.push(Target {
            what: format!(
                "{} within 1.05× of {}'s time from {TARGET_FROM}",
                System::ChorusPy.label(),
                System::ChorusTcp.label()
            ),
            met: py / bench <= 1.05,
            detail: format!("worst {:.3}× (at {size})", py / bench),
        });
    }
    // Bus bandwidth ratios are time ratios inverted (same size, same factor).
    let against_gloo = pairs(System::ChorusPy, System::GlooTcp, &|s| s <= Bytes(1 << 20));
    if let Some(&(size, py, gloo)) = against_gloo
        .iter()
        .min_by(|a, b| (a.2 / a.1).total_cmp(&(b.2 / b.1)))
    {
        targets.push(Target {
            what: format!(
                "{} bus bandwidth ≥ 3× {} at every size up to 1 MiB",
                System::ChorusPy.label(),
                System::GlooTcp.label()
            ),
            met: gloo / py >= 3.0,
            detail: format!("worst {:.2}× (at {size})", gloo / py),
        });
    }
    targets
}

#[cfg(test)]
mod tests {
    use crate::peer::record::tests::meta;
    use crate::peer::summary::summarize;
    use crate::peer::summary::tests::{measured, records};
    use crate::peer::system::System;

    /// chorus (python) one µs over chorus bench at 8 B, within 1.05× from 64 KiB, but only
    /// 1.6× Gloo at 1 MiB.
    #[test]
    fn python_targets_compare_with_chorus_bench_and_gloo() {
        let mut recs = records();
        recs.push(measured(1, System::ChorusPy, 2, [11.0, 52.0, 610.0]));
        recs.push(measured(2, System::ChorusPy, 2, [13.0, 72.0, 610.0]));
        let s = summarize(meta(), &recs);
        let t = &s.worlds[0].targets;
        let find = |what: &str| t.iter().find(|x| x.what.contains(what)).unwrap();
        let added = find("from Python adds");
        assert!(added.met && added.detail.contains("+1.0 µs"), "{added:?}");
        let within = find("within 1.05×");
        assert!(within.met, "{within:?}");
        let gloo = find("≥ 3× Gloo");
        assert!(!gloo.met && gloo.detail.contains("at 1 MiB"), "{gloo:?}");
        // 4 ranks measured no chorus (python): no python targets there
        assert!(
            s.worlds[1]
                .targets
                .iter()
                .all(|x| !x.what.contains("python"))
        );
    }
}
