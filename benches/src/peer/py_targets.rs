//! The targets of chorus's Python package (issue 13) and of its torch backend (issue 14)
//! against `chorus bench` over the same transport (TCP: both columns run over it) and Gloo
//! (one more block of the summary's targets, kept apart so the summary stays about the
//! peers).

use crate::peer::summary::{Latency, SizeRow, TARGET_FROM, Target, in_place};
use crate::peer::sweep::Bytes;
use crate::peer::system::System;

/// The Python package's targets: the call adds at most 3 µs to the smallest all-reduce,
/// stays within 1.05× of `chorus bench`'s time from 64 KiB up, and keeps at least 3× Gloo's
/// bus bandwidth at every size up to 1 MiB. The torch backend's: within 1.1× of `chorus
/// bench` from 64 KiB up, at least 3× Gloo's bus bandwidth up to 1 MiB and 1.3× above.
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
    let up_to_1m = |s: Bytes| s <= Bytes(1 << 20);
    targets.extend(within(rows, System::ChorusPy, 1.05));
    targets.extend(against_gloo(
        rows,
        System::ChorusPy,
        3.0,
        "up to 1 MiB",
        &up_to_1m,
    ));
    targets.extend(within(rows, System::ChorusTorch, 1.1));
    targets.extend(against_gloo(
        rows,
        System::ChorusTorch,
        3.0,
        "up to 1 MiB",
        &up_to_1m,
    ));
    let above_1m = |s: Bytes| s > Bytes(1 << 20);
    targets.extend(against_gloo(
        rows,
        System::ChorusTorch,
        1.3,
        "above 1 MiB",
        &above_1m,
    ));
    targets
}

/// `(size, a's time, b's time)` in place at every size `keep` accepts that both measured.
fn pairs(
    rows: &[SizeRow],
    a: System,
    b: System,
    keep: &dyn Fn(Bytes) -> bool,
) -> Vec<(Bytes, f64, f64)> {
    rows.iter()
        .filter(|r| keep(r.size))
        .filter_map(|r| {
            let (x, y) = (in_place(&r.cells, a)?, in_place(&r.cells, b)?);
            Some((r.size, x.time_us, y.time_us))
        })
        .collect()
}

/// `system`'s time within `bound`× of `chorus bench`'s (TCP) at every size from 64 KiB.
fn within(rows: &[SizeRow], system: System, bound: f64) -> Option<Target> {
    let slower = pairs(rows, system, System::ChorusTcp, &|s| s >= TARGET_FROM);
    let &(size, t, bench) = slower
        .iter()
        .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))?;
    Some(Target {
        what: format!(
            "{} within {bound}× of {}'s time from {TARGET_FROM}",
            system.label(),
            System::ChorusTcp.label()
        ),
        met: t / bench <= bound,
        detail: format!("worst {:.3}× (at {size})", t / bench),
    })
}

/// `system`'s bus bandwidth at least `factor`× Gloo's at every size `keep` accepts
/// (`range` says which, in words). Bus bandwidth ratios are time ratios inverted (same
/// size, same factor).
fn against_gloo(
    rows: &[SizeRow],
    system: System,
    factor: f64,
    range: &str,
    keep: &dyn Fn(Bytes) -> bool,
) -> Option<Target> {
    let ratios = pairs(rows, system, System::GlooTcp, keep);
    let &(size, t, gloo) = ratios
        .iter()
        .min_by(|a, b| (a.2 / a.1).total_cmp(&(b.2 / b.1)))?;
    Some(Target {
        what: format!(
            "{} bus bandwidth ≥ {factor}× {} at every size {range}",
            system.label(),
            System::GlooTcp.label()
        ),
        met: gloo / t >= factor,
        detail: format!("worst {:.2}× (at {size})", gloo / t),
    })
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

    /// chorus (torch) within 1.1× of chorus bench from 64 KiB, 4× Gloo up to 1 MiB, but
    /// only 1.2× Gloo above it.
    #[test]
    fn torch_targets_compare_with_chorus_bench_and_gloo() {
        let mut recs = records();
        recs.push(measured(1, System::ChorusTorch, 2, [25.0, 50.0, 650.0]));
        recs.push(measured(2, System::ChorusTorch, 2, [25.0, 70.0, 650.0]));
        let s = summarize(meta(), &recs);
        let t = &s.worlds[0].targets;
        let find = |what: &str| {
            t.iter()
                .find(|x| x.what.starts_with("chorus (torch)") && x.what.contains(what))
                .unwrap()
        };
        let within = find("within 1.1×");
        assert!(within.met && within.detail.contains("1.083×"), "{within:?}");
        let gloo = find("≥ 3× Gloo");
        assert!(!gloo.met && gloo.detail.contains("at 1 MiB"), "{gloo:?}");
        // the test's rows stop at 1 MiB: nothing above it to judge
        assert!(t.iter().all(|x| !x.what.contains("above 1 MiB")), "{t:?}");
        assert!(t.iter().all(|x| !x.what.contains("from Python")), "{t:?}");
    }
}
