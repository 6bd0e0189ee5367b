//! Test 9: no test leaves a process behind — not when it ends normally (every test asserts
//! `Job::close` is empty), not when it panics mid-job, and not when the test process itself
//! is killed (ranks die with their harness, descriptor holders with their rank).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_tests::busy::{self, WAIT};
use chorus_tests::{Job, reap};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

fn busy_job() -> Job {
    busy::busy_job(bin())
}

/// Waits (bounded) until no process of `pgids` is left, reaping the orphans that became
/// this process's children, without killing anything.
fn gone_by_themselves(pgids: &[i32], within: Duration) -> Vec<reap::ProcInfo> {
    let deadline = Instant::now() + within;
    let me = std::process::id() as i32;
    loop {
        let left = reap::group_members(pgids);
        for p in left.iter().filter(|p| p.ppid == me) {
            // SAFETY: waitpid on one of our own (adopted) children; WNOHANG never blocks.
            unsafe {
                libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn t9_closing_a_busy_job_removes_every_process_it_started() {
    let job = busy_job();
    let pgids = job.pgids();
    assert!(
        reap::group_members(&pgids).len() >= 6,
        "ranks and holders run"
    );
    assert_eq!(job.close(), vec![]);
    assert_eq!(reap::group_members(&pgids), vec![]);
}

#[test]
fn t9_a_test_that_panics_mid_job_leaves_nothing_behind() {
    let pgids = Arc::new(Mutex::new(Vec::new()));
    let seen = pgids.clone();
    let result = std::panic::catch_unwind(move || {
        let job = busy_job();
        *seen.lock().unwrap() = job.pgids();
        panic!("a test failing with its job running");
    });
    assert!(result.is_err());
    let pgids = pgids.lock().unwrap().clone();
    assert_eq!(pgids.len(), 3);
    assert_eq!(
        reap::group_members(&pgids),
        vec![],
        "the job's drop reaped everything"
    );
}

/// The test process itself is killed while its job runs (a CI timeout, a ^C): its ranks
/// die with it (parent-death signal) and their holders with them.
#[test]
fn t9_ranks_and_holders_die_with_a_killed_harness() {
    reap::become_subreaper();
    let mut harness = Command::new(env!("CARGO_BIN_EXE_chorus-test-harness"))
        .arg(bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = harness.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let pgids: Vec<i32> = loop {
        let line = lines
            .next()
            .expect("the harness child reports its job")
            .unwrap();
        if let Some(list) = line.strip_prefix("PGIDS ") {
            break list.split(',').map(|p| p.parse().unwrap()).collect();
        }
    };
    assert!(
        reap::group_members(&pgids).len() >= 6,
        "ranks and holders run"
    );
    // SAFETY: kill(2) on our own child; no memory involved.
    unsafe {
        libc::kill(harness.id() as i32, libc::SIGKILL);
    }
    harness.wait().unwrap();
    let left = gone_by_themselves(&pgids, WAIT);
    if !left.is_empty() {
        for &g in &pgids {
            reap::signal_group(g, libc::SIGKILL);
        }
        gone_by_themselves(&pgids, WAIT);
    }
    assert_eq!(left, vec![], "processes outlived their killed harness");
}
