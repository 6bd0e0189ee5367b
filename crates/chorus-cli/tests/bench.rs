//! `chorus bench` with real chorus ranks (processes on loopback): the table and the JSON
//! document for every collective with every element right, exact checks across types and
//! reductions, and recovery from a rank killed or frozen mid-sweep.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{assert_all_gone, rank_pids, run};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

/// A small, quick sweep (the test binary is a debug build).
const SMALL: [&str; 10] = ["-b", "64", "-e", "16K", "-f", "16", "-w", "1", "-i", "2"];

fn bench_json(extra: &[&str]) -> (Value, common::Done) {
    let mut args = vec!["bench"];
    args.extend_from_slice(extra);
    args.push("--json");
    let done = run(&args, LIMIT);
    let doc: Value = serde_json::from_str(&done.stdout)
        .unwrap_or_else(|e| panic!("no JSON document ({e}):\n{}\n{}", done.stdout, done.stderr));
    (doc, done)
}

/// The schema's invariants, every row checked with no wrong element.
fn check_doc(doc: &Value, collective: &str, ranks: u64, factor: f64) {
    assert_eq!(doc["chorus_bench"], 1);
    assert_eq!(doc["collective"], collective);
    assert_eq!(doc["ranks"], ranks);
    // The default: shared memory between the ranks of this host.
    assert_eq!(doc["transport"], "auto");
    let rows = doc["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let mut busbw = Vec::new();
    for row in rows {
        let size = row["size"].as_u64().unwrap();
        let count = row["count"].as_u64().unwrap();
        assert!(count * 4 <= size || size == 0, "{row}");
        for mode in ["out_of_place", "in_place"] {
            let m = &row[mode];
            if m.is_null() {
                assert_eq!(collective, "send-recv", "only send-recv has no in-place");
                continue;
            }
            assert_eq!(m["wrong"], 0, "{collective} {mode} {row}");
            let t = m["time_us"].as_f64().unwrap();
            assert!(t.is_finite() && t > 0.0, "{row}");
            let alg = m["algbw_gbs"].as_f64().unwrap();
            let bus = m["busbw_gbs"].as_f64().unwrap();
            assert!(
                (alg - size as f64 / t / 1e3).abs() <= 1e-9 * alg.max(1.0),
                "{row}"
            );
            assert!((bus - alg * factor).abs() <= 1e-9 * bus.max(1.0), "{row}");
            busbw.push(bus);
        }
    }
    let avg = busbw.iter().sum::<f64>() / busbw.len() as f64;
    assert!((doc["avg_busbw_gbs"].as_f64().unwrap() - avg).abs() < 1e-9);
}

#[test]
fn every_collective_gives_the_agreed_document_with_no_wrong_element() {
    // nccl-tests' bus factors on 3 ranks.
    let cases = [
        ("all-reduce", 4.0 / 3.0),
        ("all-gather", 2.0 / 3.0),
        ("reduce-scatter", 2.0 / 3.0),
        ("broadcast", 1.0),
        ("reduce", 1.0),
        ("all-to-all", 2.0 / 3.0),
        ("send-recv", 1.0),
    ];
    for (collective, factor) in cases {
        let mut args = vec![collective, "-n", "3", "-r", "2"];
        args.extend_from_slice(&SMALL);
        let (doc, done) = bench_json(&args);
        assert_eq!(done.code(), 0, "{collective}: {}", done.stderr);
        check_doc(&doc, collective, 3, factor);
        let rooted = matches!(collective, "broadcast" | "reduce");
        assert_eq!(doc["rows"][0]["root"], if rooted { 2 } else { -1 });
        assert_eq!(
            doc["rows"].as_array().unwrap().len(),
            3,
            "64 B, 1 KiB, 16 KiB"
        );
    }
}

#[test]
fn a_forced_transport_is_used_and_named_in_the_document() {
    for transport in ["shm", "tcp"] {
        let mut args = vec!["all-reduce", "-n", "2", "--transport", transport];
        args.extend_from_slice(&SMALL);
        let (doc, done) = bench_json(&args);
        assert_eq!(done.code(), 0, "{transport}: {}", done.stderr);
        assert_eq!(doc["transport"], transport);
        for row in doc["rows"].as_array().unwrap() {
            assert_eq!(row["in_place"]["wrong"], 0, "{transport}: {row}");
        }
    }
}

#[test]
fn results_are_exact_across_types_and_reductions() {
    for (collective, dtype, op) in [
        ("all-reduce", "half", "max"),
        ("all-reduce", "int8", "prod"),
        ("all-reduce", "f8e4m3", "avg"),
        ("reduce-scatter", "bfloat16", "sum"),
        ("all-reduce", "uint64", "min"),
        ("reduce", "double", "avg"),
    ] {
        let mut args = vec![collective, "-n", "4", "-d", dtype, "-o", op];
        args.extend_from_slice(&SMALL);
        let (doc, done) = bench_json(&args);
        assert_eq!(done.code(), 0, "{collective} {dtype} {op}: {}", done.stderr);
        assert_eq!(doc["dtype"], dtype);
        assert_eq!(doc["op"], op);
        for row in doc["rows"].as_array().unwrap() {
            assert_eq!(row["type"], dtype);
            assert_eq!(
                row["out_of_place"]["wrong"], 0,
                "{collective} {dtype} {op}: {row}"
            );
            assert_eq!(
                row["in_place"]["wrong"], 0,
                "{collective} {dtype} {op}: {row}"
            );
        }
    }
}

#[test]
fn the_table_is_nccl_tests_table() {
    let mut args = vec!["bench", "all-gather", "-n", "2"];
    args.extend_from_slice(&SMALL);
    let done = run(&args, LIMIT);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    let out = &done.stdout;
    assert!(
        out.contains("out-of-place                       in-place"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with(
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        )),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    // size, count, type, redop, root, then time algbw busbw #wrong twice.
    assert_eq!(&rows[0][..5], ["64", "8", "float", "none", "-1"], "{out}");
    assert_eq!(rows[0].len(), 13, "{out}");
    assert_eq!(rows[0][8], "0");
    assert_eq!(rows[0][12], "0");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth    : "), "{out}");
}

#[test]
fn a_killed_rank_is_detected_and_the_sweep_goes_on_without_it() {
    // Two timed calls per mode: call 5 is the second size's second out-of-place call.
    let mut args = vec!["all-reduce", "-n", "4", "--inject", "kill:2@5"];
    args.extend_from_slice(&SMALL);
    let (doc, done) = bench_json(&args);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert_eq!(doc["ranks"], 4);
    check_rows_after_shrink(&doc);
    let incident = &doc["incidents"][0];
    assert_eq!(incident["kind"], "kill");
    assert_eq!(incident["rank"], 2);
    assert_eq!(incident["world_after"], 3);
    assert_eq!(
        incident["detect_ms"].as_array().unwrap().len(),
        3,
        "{incident}"
    );
    assert_eq!(
        incident["shrink_ms"].as_array().unwrap().len(),
        3,
        "{incident}"
    );
    for d in incident["detect_ms"].as_array().unwrap() {
        // Conclusive evidence (the process is gone), not silence: below the heartbeat
        // deadline (2 s), which is how a frozen rank is found.
        assert!(d["ms"].as_f64().unwrap() < 2000.0, "{incident}");
    }
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["ranks"], 4);
    assert_eq!(incident["size"], 1024);
    assert_eq!(incident["mode"], "out-of-place");
    assert_eq!(
        rows[1]["ranks"], 3,
        "the size it failed at, measured again on 3 ranks"
    );
    assert_eq!(rows[2]["ranks"], 3, "the sweep went on, on 3 ranks");
    // Shown live on stderr.
    for needle in [
        "rank 2 killed (SIGKILL)",
        "detected by 3/3 survivors",
        "shrunk to 3 ranks",
    ] {
        assert!(done.stderr.contains(needle), "{needle}:\n{}", done.stderr);
    }
    assert_all_gone(&rank_pids(&done.stderr));
}

/// `check_doc` with the bus factor of each row's own world.
fn check_rows_after_shrink(doc: &Value) {
    for row in doc["rows"].as_array().unwrap() {
        let n = row["ranks"].as_f64().unwrap();
        for mode in ["out_of_place", "in_place"] {
            let m = &row[mode];
            assert_eq!(m["wrong"], 0, "{row}");
            let (alg, bus) = (
                m["algbw_gbs"].as_f64().unwrap(),
                m["busbw_gbs"].as_f64().unwrap(),
            );
            assert!(
                (bus - alg * 2.0 * (n - 1.0) / n).abs() <= 1e-9 * bus.max(1.0),
                "{row}"
            );
        }
    }
}

#[test]
fn a_frozen_rank_is_detected_by_silence_and_killed_by_the_launcher_at_the_end() {
    let mut args = vec!["reduce-scatter", "-n", "4", "--inject", "stop:1@2"];
    args.extend_from_slice(&SMALL);
    let (doc, done) = bench_json(&args);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    let incident = &doc["incidents"][0];
    assert_eq!(incident["kind"], "stop");
    assert_eq!(incident["world_after"], 3);
    for d in incident["detect_ms"].as_array().unwrap() {
        // Only silence gives a frozen rank away: the heartbeat deadline (2 s by default).
        let ms = d["ms"].as_f64().unwrap();
        assert!((1000.0..30_000.0).contains(&ms), "{incident}");
    }
    assert!(
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["out_of_place"]["wrong"] == 0)
    );
    let frozen = done
        .stderr
        .lines()
        .find(|l| l.contains("rank 1 (pid"))
        .unwrap_or_else(|| panic!("{}", done.stderr));
    assert!(
        frozen.contains("killed by SIGKILL") && frozen.contains("frozen by --inject"),
        "{frozen}"
    );
    assert_all_gone(&rank_pids(&done.stderr));
}

#[test]
fn all_reduce_survives_a_kill_with_every_row_right() {
    let mut args = vec!["-n", "3", "--inject", "kill:0@1"];
    args.extend_from_slice(&SMALL);
    let (doc, done) = bench_json(&args);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert_eq!(doc["collective"], "all-reduce", "the default collective");
    assert_eq!(doc["incidents"][0]["world_after"], 2);
    check_rows_after_shrink(&doc);
}

#[test]
fn wrong_results_are_counted_and_fail_the_bench() {
    // The check is not vacuous: one spoiled element per checked call on rank 0 (the last
    // byte of its result buffer, which every collective's check covers).
    for collective in ["all-reduce", "all-gather", "broadcast", "all-to-all"] {
        let mut cmd = common::chorus(&["bench", collective, "-n", "2"]);
        cmd.args(SMALL).env("CHORUS_BENCH_CORRUPT", "1");
        let done = common::Proc::start(cmd).finish(LIMIT);
        assert_eq!(done.code(), 1, "{collective}: {}", done.stderr);
        assert!(
            done.stdout.contains("# Out of bounds values : 6 FAILED"),
            "{collective}:\n{}",
            done.stdout
        );
    }
}

#[test]
fn bad_options_are_refused_with_the_reason() {
    for (args, needle) in [
        (vec!["bench", "-n", "2", "-r", "5"], "not a rank"),
        (
            vec!["bench", "-n", "2", "--inject", "kill:7@1"],
            "no rank 7",
        ),
        (vec!["bench", "-b", "1M", "-e", "1K"], "below"),
        (vec!["bench", "-d", "quad"], "not a type"),
        (vec!["bench", "--transport", "carrier-pigeon"], "tcp"),
        (vec!["bench", "scatter-gather"], "invalid value"),
    ] {
        let done = run(&args, LIMIT);
        assert_eq!(done.code(), 2, "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains(needle), "{args:?}: {}", done.stderr);
    }
}
