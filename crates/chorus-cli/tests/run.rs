//! `chorus run`: the launch environment, exit codes, signal forwarding, the no-progress
//! reaping budget, and that nothing outlives a job. Ranks are small shell programs, so
//! these tests exercise the launcher alone; `bench.rs` runs real chorus ranks.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Proc, assert_all_gone, chorus, rank_end, rank_pids, run, scratch};
use rustix::process::Signal;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn every_rank_gets_the_launch_environment_and_exit_0_means_all_ok() {
    let script = "echo \"env $CHORUS_RANK $CHORUS_WORLD_SIZE $RANK $WORLD_SIZE $LOCAL_RANK \
                  $LOCAL_WORLD_SIZE $CHORUS_LOCAL_RANK $CHORUS_LOCAL_WORLD_SIZE \
                  $CHORUS_DEPART_ON_SIGNAL $MASTER_ADDR $MASTER_PORT $CHORUS_UNIQUE_ID\"";
    let done = run(&["run", "-n", "3", "--", "sh", "-c", script], LIMIT);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    let mut lines: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.starts_with("env "))
        .collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{}", done.stdout);
    let token = lines[0].split(' ').next_back().unwrap();
    assert!(token.starts_with("chorus1-"), "{token}");
    for (rank, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        let r = rank.to_string();
        assert_eq!(
            &f[1..10],
            [&r, "3", &r, "3", &r, "3", &r, "3", "1"],
            "{line}"
        );
        assert_eq!(f[10], "127.0.0.1");
        assert!(f[11].parse::<u16>().unwrap() > 0);
        assert_eq!(f[12], token, "every rank has the same token");
    }
    // The token is printed for `chorus status`, and each rank gets one status line.
    assert!(done.stderr.contains(token), "{}", done.stderr);
    for rank in 0..3 {
        assert!(
            done.stderr.contains(&format!("rank {rank} (pid ")),
            "{}",
            done.stderr
        );
    }
    assert_eq!(
        done.stderr.matches("exited 0 at +").count(),
        3,
        "{}",
        done.stderr
    );
    assert!(done.stderr.contains("exit code 0 (all ranks ok)"));
}

#[test]
fn a_rank_that_exits_non_zero_makes_exit_code_1() {
    let done = run(
        &["run", "-n", "3", "--", "sh", "-c", "exit $CHORUS_RANK"],
        LIMIT,
    );
    assert_eq!(done.code(), 1, "{}", done.stderr);
    assert!(
        done.stderr.contains("exited with code 2 at +"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("exited with code 1 at +"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("exit code 1 (a rank failed)"),
        "{}",
        done.stderr
    );
}

#[test]
fn a_killed_rank_is_reported_with_its_signal_and_the_others_finish() {
    let script = "if [ $CHORUS_RANK = 1 ]; then kill -9 $$; fi; sleep 0.5";
    let done = run(&["run", "-n", "3", "--", "sh", "-c", script], LIMIT);
    assert_eq!(done.code(), 1, "{}", done.stderr);
    let line = done
        .stderr
        .lines()
        .find(|l| l.contains("rank 1 (pid"))
        .unwrap();
    assert!(line.contains("was killed by SIGKILL"), "{line}");
    assert_eq!(
        done.stderr.matches("exited 0 at +").count(),
        2,
        "{}",
        done.stderr
    );
}

#[test]
fn sigterm_to_the_launcher_reaches_each_rank_once_and_exits_143() {
    let dir = scratch("sigterm");
    let script = format!(
        "trap 'echo got-term-$CHORUS_RANK >> {0}/log; exit 7' TERM; \
         echo ready; sleep 30 & wait",
        dir.display()
    );
    let job = Proc::start(chorus(&["run", "-n", "3", "--", "sh", "-c", &script]));
    for _ in 0..3 {
        job.wait_for("ready", LIMIT);
    }
    // Let every shell reach `wait` with its trap set.
    std::thread::sleep(Duration::from_millis(300));
    job.signal(Signal::TERM);
    let done = job.finish(LIMIT);
    assert_eq!(done.code(), 143, "{}", done.stderr);
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    for rank in 0..3 {
        assert_eq!(
            log.matches(&format!("got-term-{rank}")).count(),
            1,
            "rank {rank} got SIGTERM exactly once:\n{log}"
        );
    }
    assert!(
        done.stderr.contains("[SIGTERM forwarded by the launcher]"),
        "{}",
        done.stderr
    );
    assert!(done.elapsed < Duration::from_secs(20), "{:?}", done.elapsed);
    assert_all_gone(&rank_pids(&done.stderr));
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_once_nothing_exits_for_the_budget() {
    // Rank 0 leaves at once on SIGTERM; rank 1 ignores it and is SIGKILLed when a whole
    // 1 s budget passes with no exit.
    let script = "if [ $CHORUS_RANK = 1 ]; then trap '' TERM; fi; echo ready; \
                  while true; do sleep 0.1; done";
    let job = Proc::start(chorus(&[
        "run",
        "-n",
        "2",
        "--reap-budget",
        "1s",
        "--",
        "sh",
        "-c",
        script,
    ]));
    job.wait_for("ready", LIMIT);
    job.wait_for("ready", LIMIT);
    std::thread::sleep(Duration::from_millis(200));
    job.signal(Signal::TERM);
    let done = job.finish(LIMIT);
    assert_eq!(done.code(), 143, "{}", done.stderr);
    let stubborn = done
        .stderr
        .lines()
        .find(|l| l.contains("rank 1 (pid"))
        .unwrap();
    assert!(
        stubborn.contains("was killed by SIGKILL") && stubborn.contains("no rank exited for 1s"),
        "{stubborn}"
    );
    // The budget runs from the last exit (rank 0's, at the SIGTERM) to the SIGKILL: on the
    // launcher's clock, so neither its start-up nor this harness's polling is in it. It
    // must not fire early, and it must not take twice as long.
    let budget = Duration::from_secs(1);
    let waited = rank_end(&done.stderr, 1).saturating_sub(rank_end(&done.stderr, 0));
    assert!(
        waited >= budget && waited < 2 * budget,
        "rank 1 was killed {waited:?} after the last exit; the budget is {budget:?}\n{}",
        done.stderr
    );
    assert_all_gone(&rank_pids(&done.stderr));
}

#[test]
fn timeout_stops_the_job_with_124() {
    let done = run(
        &[
            "run",
            "-n",
            "2",
            "--timeout",
            "500ms",
            "--reap-budget",
            "1s",
            "--",
            "sleep",
            "30",
        ],
        LIMIT,
    );
    assert_eq!(done.code(), 124, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("SIGTERM from the launcher at --timeout")
    );
    // On the launcher's clock, which starts with the job (its own start-up, the bootstrap
    // root's certificate included, is not in it): the ranks (`sleep`, which dies at once on
    // SIGTERM) end at the timeout, not before it and not twice as late.
    let timeout = Duration::from_millis(500);
    for rank in 0..2 {
        let at = rank_end(&done.stderr, rank);
        assert!(
            at >= timeout && at < 2 * timeout,
            "rank {rank} ended at +{at:?} with --timeout {timeout:?}\n{}",
            done.stderr
        );
    }
    assert_all_gone(&rank_pids(&done.stderr));
}

#[test]
fn on_failure_stop_ends_the_others() {
    let script = "if [ $CHORUS_RANK = 0 ]; then exit 3; fi; sleep 30";
    let done = run(
        &[
            "run",
            "-n",
            "3",
            "--on-failure",
            "stop",
            "--",
            "sh",
            "-c",
            script,
        ],
        LIMIT,
    );
    assert_eq!(done.code(), 1, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("SIGTERM from the launcher: another rank failed"),
        "{}",
        done.stderr
    );
    assert!(done.elapsed < Duration::from_secs(20), "{:?}", done.elapsed);
}

#[test]
fn nothing_a_rank_starts_outlives_the_job() {
    let dir = scratch("leftovers");
    // Each rank leaves a child in its group and a daemon in a session of its own (which
    // escapes the group; the launcher, a subreaper, still finds it).
    let script = format!(
        "sleep 300 & echo $! > {0}/group-$CHORUS_RANK; \
         setsid sh -c 'echo $$ > {0}/daemon-'$CHORUS_RANK'; exec sleep 300' & \
         while [ ! -s {0}/daemon-$CHORUS_RANK ]; do sleep 0.05; done; exit 0",
        dir.display()
    );
    let done = run(&["run", "-n", "2", "--", "sh", "-c", &script], LIMIT);
    assert_eq!(done.code(), 0, "{}", done.stderr);
    let mut pids = rank_pids(&done.stderr);
    for name in ["group-0", "group-1", "daemon-0", "daemon-1"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        pids.push(text.trim().parse().unwrap());
    }
    assert_all_gone(&pids);
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let dir = scratch("orphans");
    let script = format!(
        "echo $$ > {}/rank-$CHORUS_RANK; echo ready; exec sleep 300",
        dir.display()
    );
    let job = Proc::start(chorus(&["run", "-n", "2", "--", "sh", "-c", &script]));
    job.wait_for("ready", LIMIT);
    job.wait_for("ready", LIMIT);
    job.signal(Signal::KILL);
    let _ = job.finish(LIMIT);
    let pids: Vec<u32> = ["rank-0", "rank-1"]
        .iter()
        .map(|n| {
            std::fs::read_to_string(dir.join(n))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert_all_gone(&pids);
}

#[test]
fn a_program_that_cannot_start_is_a_launcher_error() {
    let done = run(&["run", "-n", "2", "--", "/nonexistent/program"], LIMIT);
    assert_eq!(done.code(), 3, "{}", done.stderr);
    assert!(
        done.stderr.contains("cannot start rank 0"),
        "{}",
        done.stderr
    );
}

#[test]
fn bad_command_lines_exit_2() {
    assert_eq!(run(&["run", "-n", "2"], LIMIT).code(), 2);
    assert_eq!(run(&["run", "-n", "0", "--", "true"], LIMIT).code(), 2);
    assert_eq!(
        run(
            &["run", "-n", "2", "--bind", "nowhere", "--", "true"],
            LIMIT
        )
        .code(),
        2
    );
    assert_eq!(
        run(
            &["run", "-n", "2", "--timeout", "soon", "--", "true"],
            LIMIT
        )
        .code(),
        2
    );
}

/// A rank that dies at start-up, before it joins: the launcher witnesses the exit to the
/// job's root, which ends bootstrap at once; the ranks waiting in init fail naming it,
/// long before the init deadline (60 s), and the job ends with exit code 1.
#[test]
fn a_rank_that_dies_before_joining_ends_everyone_s_init_at_once() {
    let exe = common::CHORUS;
    let script = format!(
        "if [ \"$CHORUS_RANK\" = 2 ]; then kill -9 $$; fi; \
         exec '{exe}' bench-rank all-reduce -b 8 -e 8 -w 1 -i 1"
    );
    let started = std::time::Instant::now();
    let done = run(&["run", "-n", "3", "--", "sh", "-c", &script], LIMIT);
    let took = started.elapsed();
    assert_eq!(done.code(), 1, "{}\n{}", done.stdout, done.stderr);
    assert!(
        took < Duration::from_secs(20),
        "the job took {took:?}: the ranks waited for the init deadline"
    );
    let fatal: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.contains("r2's process ended (signal 9)"))
        .collect();
    assert_eq!(
        fatal.len(),
        2,
        "both waiting ranks name r2:\n{}",
        done.stdout
    );
    assert!(done.stderr.contains("rank 2 (pid "), "{}", done.stderr);
}
