//! `chorus status`: asked through a job's token, it names the rank a stalled job waits on
//! (a rank frozen with SIGSTOP), reports it unreachable rather than hanging, and says when
//! a job has not bootstrapped or has ended.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{CHORUS, Proc, assert_all_gone, chorus, run, scratch};
use rustix::process::Signal;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

/// `chorus status --token-file F --json`, bounded.
fn status_json(token_file: &Path) -> Value {
    let file = token_file.to_str().unwrap();
    let done = run(
        &["status", "--token-file", file, "--json", "--timeout", "2s"],
        LIMIT,
    );
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert!(
        done.elapsed < Duration::from_secs(20),
        "status took {:?}",
        done.elapsed
    );
    serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("{e}: {}", done.stdout))
}

/// Asks until every rank but `frozen` is inside the stalled operation (the others may need
/// a moment to reach it), and returns that answer.
fn stalled_status(token_file: &Path, frozen: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status_json(token_file);
        let stuck = s["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["rank"] != frozen)
            .all(|r| !r["in_flight"].is_null());
        if stuck || Instant::now() >= deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pids(status: &Value) -> Vec<u32> {
    status["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn status_names_the_frozen_rank_a_bench_waits_on() {
    let dir = scratch("status-bench");
    let token = dir.join("token");
    let mut cmd = chorus(&[
        "bench",
        "-n",
        "4",
        "-b",
        "8",
        "-e",
        "8",
        "-w",
        "1",
        "-i",
        "1000",
        "--inject",
        "stop:2@3",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    // Long enough that the detector does not end the stall while we look at it.
    cmd.env("CHORUS_HEARTBEAT_DEADLINE", "60s");
    let bench = Proc::start(cmd);
    bench.wait_for("rank 2 frozen (SIGSTOP)", LIMIT);
    let s = stalled_status(&token, 2);
    assert_eq!(s["world"], 4);
    assert_eq!(s["bootstrapped"], true);
    let stall = &s["waiting_on"];
    assert_eq!(stall["rank"], 2, "{s}");
    assert_eq!(stall["answered"], false, "{s}");
    assert_eq!(stall["waiters"], serde_json::json!([0, 1, 3]), "{s}");
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks[2]["answered"], false);
    assert!(
        ranks[2]["unreachable"]
            .as_str()
            .unwrap()
            .contains("no answer"),
        "{s}"
    );
    for r in [0, 1, 3] {
        assert_eq!(ranks[r]["answered"], true, "{s}");
        assert_eq!(ranks[r]["epoch"], 0);
        assert_eq!(ranks[r]["in_flight"]["collective"], "all-reduce", "{s}");
        assert_eq!(ranks[r]["in_flight"]["state"], "running", "{s}");
    }
    assert_eq!(
        ranks[2]["seen_as"], "alive",
        "not yet past the detector's deadline: {s}"
    );
    // The table a person reads says the same.
    let text = run(
        &[
            "status",
            "--token-file",
            token.to_str().unwrap(),
            "--timeout",
            "1s",
        ],
        LIMIT,
    );
    assert_eq!(text.code(), 0, "{}", text.stderr);
    assert!(
        text.stdout.contains("=> the job is waiting on rank 2")
            && text.stdout.contains("it does not answer"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("unreachable"), "{}", text.stdout);
    let all = pids(&s);
    bench.signal(Signal::TERM);
    let done = bench.finish(LIMIT);
    assert_eq!(done.code(), 143, "{}", done.stderr);
    assert_all_gone(&all);
}

#[test]
fn status_works_on_a_job_chorus_run_launched_and_the_frozen_rank_is_reaped() {
    let dir = scratch("status-run");
    let token = dir.join("token");
    let mut cmd = chorus(&[
        "run",
        "-n",
        "3",
        "--reap-budget",
        "1s",
        "--token-file",
        token.to_str().unwrap(),
        "--",
        CHORUS,
        "bench-rank",
        "all-reduce",
        "-b",
        "8",
        "-e",
        "8",
        "-w",
        "1",
        "-i",
        "100000",
        "--inject",
        "stop:1@3",
    ]);
    cmd.env("CHORUS_HEARTBEAT_DEADLINE", "60s");
    let job = Proc::start(cmd);
    job.wait_for("\"ev\":\"inject\"", LIMIT);
    let s = stalled_status(&token, 1);
    assert_eq!(s["waiting_on"]["rank"], 1, "{s}");
    let all = pids(&s);
    // SIGTERM: ranks 0 and 2 depart and exit; rank 1 is stopped and cannot, so once 1 s
    // passes with no exit the launcher SIGKILLs it.
    job.signal(Signal::TERM);
    let done = job.finish(LIMIT);
    assert_eq!(done.code(), 143, "{}", done.stderr);
    let frozen = done
        .stderr
        .lines()
        .find(|l| l.contains("rank 1 (pid"))
        .unwrap();
    assert!(
        frozen.contains("killed by SIGKILL") && frozen.contains("no rank exited for 1s"),
        "{frozen}"
    );
    assert_all_gone(&all);
}

#[test]
fn status_watches_a_job_until_it_ends_and_says_when_ranks_have_not_joined() {
    let dir = scratch("status-watch");
    let token = dir.join("token");
    // Ranks that never join: the root answers, with no peer table.
    let job = Proc::start(chorus(&[
        "run",
        "-n",
        "2",
        "--token-file",
        token.to_str().unwrap(),
        "--",
        "sleep",
        "3",
    ]));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !token.exists() {
        assert!(Instant::now() < deadline, "no token file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let watch = run(
        &[
            "status",
            "--token-file",
            token.to_str().unwrap(),
            "--watch",
            "300ms",
            "--timeout",
            "1s",
        ],
        LIMIT,
    );
    assert_eq!(watch.code(), 0, "{}", watch.stderr);
    assert!(
        watch.stdout.contains("not every rank has joined yet"),
        "{}",
        watch.stdout
    );
    assert!(
        watch.stderr.contains("no longer answers"),
        "{}",
        watch.stderr
    );
    let done = job.finish(LIMIT);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    // The job is gone: its token now names nobody, and asking fails promptly.
    let gone = run(
        &[
            "status",
            "--token-file",
            token.to_str().unwrap(),
            "--timeout",
            "1s",
        ],
        LIMIT,
    );
    assert_eq!(gone.code(), 1, "{}", gone.stdout);
    assert!(gone.elapsed < Duration::from_secs(15), "{:?}", gone.elapsed);
}

#[test]
fn bad_tokens_are_refused() {
    let done = run(&["status", "chorus1-nonsense"], LIMIT);
    assert_eq!(done.code(), 2, "{}", done.stderr);
    assert!(done.stderr.contains("bad token"), "{}", done.stderr);
    let mut cmd = chorus(&["status"]);
    cmd.env_remove("CHORUS_UNIQUE_ID");
    let done = Proc::start(cmd).finish(LIMIT);
    assert_eq!(done.code(), 2, "{}", done.stderr);
    assert!(done.stderr.contains("no token"), "{}", done.stderr);
}
