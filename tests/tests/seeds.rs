//! Tests 4–6: the seed incidents (`docs/ARCHITECTURE.md`) as real processes.
//!
//! - 000: every rank forks a sleeping child that holds all its descriptors, then one rank
//!   aborts: the others see the departure at once (no one waits for a FIN that the holder
//!   withholds), and abort and destroy end within their bounds everywhere.
//! - 001: aborting a parent communicator releases an operation blocked on a split child.
//! - 002: `destroy()` completes within its budget while a peer is frozen.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::print_stdout)] // measurements, shown with --nocapture

use std::path::Path;
use std::time::Duration;

use chorus_tests::clock::ms_between;
use chorus_tests::reap;
use chorus_tests::{Job, JobSpec, LOAD_MARGIN};
use rand::{Rng, SeedableRng};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

const WAIT: Duration = Duration::from_secs(20);
/// `Config::default().teardown_budget`.
const TEARDOWN_MS: f64 = 2000.0;
/// Departure and abort are conclusive evidence: seen as fast as a SIGKILL on this host.
const DEPARTURE_MS: f64 = 100.0;

fn spec(world: u32) -> JobSpec {
    JobSpec::new(world)
        .env("CHORUS_HEARTBEAT_INTERVAL", "100ms")
        .env("CHORUS_HEARTBEAT_DEADLINE", "1s")
}

/// Seed 000 (test 4).
#[test]
fn t4_seed_000_abort_and_destroy_are_bounded_with_forked_descriptor_holders() {
    for seed in [41, 42] {
        let mut job = Job::start(
            bin(),
            spec(4).env("CT_FORK_HOLDER", "1").env("CT_START", "loop"),
        );
        let mut holders = Vec::new();
        for s in 0..4 {
            let f = job.wait_for(s, "forked", WAIT);
            let child = f.u64("child").unwrap() as i32;
            let info = reap::stat(child).expect("the holder runs");
            assert_eq!(info.pgrp, job.pid(s), "the holder is in its rank's group");
            holders.push(child);
            job.wait_for(s, "looping", WAIT);
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        job.send(1, "abort");
        let a = job.wait_for(1, "aborted", WAIT);
        let aborted = a.u64("t_start").unwrap();
        println!("seed {seed}: abort() took {} us", a.u64("us").unwrap());
        assert!(
            a.u64("us").unwrap() < (50_000.0 * LOAD_MARGIN) as u64,
            "abort is local and immediate: {a}"
        );
        let after = job.wait_for(1, "after-abort", WAIT);
        assert_eq!(
            after.kind(),
            "destroyed",
            "an aborted communicator refuses work: {after}"
        );
        for s in [0, 2, 3] {
            let f = job.wait_for(s, "failed", WAIT);
            let latency = ms_between(aborted, f.t());
            println!(
                "seed {seed}: slot {s} failed {latency:.1} ms after the abort: {}",
                f.str("detail").unwrap_or("")
            );
            if f.kind() != "peer-departed"
                || f.peer() != Some(1)
                || latency > DEPARTURE_MS * LOAD_MARGIN
            {
                job.fail(&format!(
                    "seed {seed}: slot {s} should fail with peer-departed naming r1 within \
                     {DEPARTURE_MS} ms (x{LOAD_MARGIN} for load) of its abort, forked holders notwithstanding; got {f} \
                     after {latency:.1} ms"
                ));
            }
        }
        // Everyone destroys: the aborted rank, and the others with their holders alive.
        job.send_all(&[0, 1, 2, 3], "destroy");
        for s in 0..4 {
            let d = job.wait_for(s, "destroyed", WAIT);
            let ms = d.f64("ms").unwrap();
            println!("seed {seed}: slot {s} destroy took {ms:.1} ms");
            assert!(
                ms <= TEARDOWN_MS * 1.2,
                "seed {seed}: slot {s} destroy took {ms} ms"
            );
            assert!(job.wait_exit(s, WAIT).success());
        }
        // The holders outlive their ranks (they sleep for minutes): the harness reaps them.
        assert!(
            holders.iter().any(|&h| reap::stat(h).is_some()),
            "holders still hold"
        );
        assert_eq!(job.close(), vec![], "seed {seed}: processes left behind");
        assert!(
            holders.iter().all(|&h| reap::stat(h).is_none()),
            "holders reaped"
        );
    }
}

/// Seed 001 (test 5): parent rank 0 blocks on a child all-reduce its child peer never joins;
/// another thread aborts the parent; the child operation returns `Aborted` at once.
#[test]
fn t5_seed_001_aborting_the_parent_releases_an_operation_on_a_split_child() {
    let mut job = Job::start(bin(), spec(4));
    job.send_all(&[0, 1, 2, 3], "split-abort 100");
    for s in 0..4 {
        let split = job.wait_for(s, "split", WAIT);
        assert_eq!(split.u64("child_world"), Some(2), "{split}");
        assert_eq!(split.u64("child_rank"), Some(s as u64 / 2), "{split}");
        assert_eq!(split.bool("sum_ok"), Some(true), "{split}");
    }
    let r = job.wait_for(0, "released", WAIT);
    let latency = ms_between(r.u64("t_abort").unwrap(), r.t());
    println!(
        "abort-to-release {latency:.2} ms: {}",
        r.str("detail").unwrap_or("")
    );
    assert_eq!(r.kind(), "aborted", "{r}");
    assert!(
        latency < 50.0 * LOAD_MARGIN,
        "released {latency} ms after the parent's abort: {r}"
    );
    job.send_all(&[0, 1, 2, 3], "destroy");
    for s in 0..4 {
        let d = job.wait_for(s, "destroyed", WAIT);
        assert!(d.f64("ms").unwrap() <= TEARDOWN_MS * 1.2, "{d}");
        assert!(job.wait_exit(s, WAIT).success());
    }
    assert_eq!(job.close(), vec![]);
}

/// Seed 002 (test 6), idle: a peer is frozen while the others destroy.
#[test]
fn t6_seed_002_destroy_is_bounded_while_a_peer_is_stopped() {
    let mut job = Job::start(bin(), spec(4).env("CT_START", "loop"));
    job.send_all(&[0, 1, 2, 3], "finish");
    for s in 0..4 {
        job.wait_for(s, "finished", WAIT);
    }
    job.signal(3, libc::SIGSTOP);
    job.send_all(&[0, 1, 2], "destroy");
    for s in 0..3 {
        let d = job.wait_for(s, "destroyed", WAIT);
        let ms = d.f64("ms").unwrap();
        println!("idle: slot {s} destroy took {ms:.1} ms with r3 stopped");
        assert!(
            ms <= TEARDOWN_MS * 1.2,
            "slot {s} destroy took {ms} ms: {d}"
        );
        assert!(job.wait_exit(s, WAIT).success());
    }
    job.signal(3, libc::SIGCONT);
    job.send(3, "destroy");
    let d = job.wait_for(3, "destroyed", WAIT);
    assert!(d.f64("ms").unwrap() <= TEARDOWN_MS * 1.2, "{d}");
    assert!(job.wait_exit(3, WAIT).success());
    assert_eq!(job.close(), vec![]);
}

/// Seed 002 (test 6), busy: a peer is frozen under large all-reduces (its socket buffers
/// fill); the others fail by the deadline and destroy within the budget, queued data and
/// all.
#[test]
fn t6_seed_002_destroy_is_bounded_after_a_peer_froze_mid_transfer() {
    let mut job = Job::start(
        bin(),
        spec(4)
            .env("CT_START", "loop")
            .env("CT_ON_FAIL", "destroy")
            .env("CT_SIZES", "1048576"),
    );
    for s in 0..4 {
        job.wait_for(s, "looping", WAIT);
    }
    std::thread::sleep(Duration::from_millis(300));
    job.signal(3, libc::SIGSTOP);
    for s in 0..3 {
        // The frozen rank is declared dead; a survivor whose destroy came first may be seen
        // departing by one still waiting for it.
        let f = job.wait_for(s, "failed", WAIT);
        let frozen = f.kind() == "peer-failed" && f.peer() == Some(3);
        let departed = f.kind() == "peer-departed" && f.peer() != Some(3);
        assert!(frozen || departed, "{f}");
        let d = job.wait_for(s, "destroyed", WAIT);
        let ms = d.f64("ms").unwrap();
        println!("busy: slot {s} destroy took {ms:.1} ms with r3 stopped");
        assert!(
            ms <= TEARDOWN_MS * 1.2,
            "slot {s} destroy took {ms} ms: {d}"
        );
        assert!(job.wait_exit(s, WAIT).success());
    }
    assert_eq!(job.close(), vec![], "the stopped rank is reaped too");
}

/// What a member sent before it destroyed reaches the peer: destroy flushes the data links
/// (bounded by the teardown budget) before it closes them. Rank 1 is frozen while rank 0
/// sends it twelve 768 KiB messages (each small enough to need no flow-control credit, so
/// each send returns once its link owns the payload: the later ones are still queued, the
/// kernel's buffers being full) and destroys at once; rank 1 resumes 300 ms later and must
/// receive all twelve intact.
#[test]
fn destroy_delivers_what_was_sent_before_it() {
    let mut job = Job::start(bin(), spec(2));
    let (n, times) = (96 << 10, 12);
    job.signal(1, libc::SIGSTOP);
    job.send(1, &format!("recv 0 {n} 0 {times}"));
    job.send(0, &format!("send 1 {n} {times}"));
    job.send(0, "destroy");
    job.wait_for(0, "sent", WAIT);
    std::thread::sleep(Duration::from_millis(300));
    job.signal(1, libc::SIGCONT);
    let d = job.wait_for(0, "destroyed", WAIT);
    println!(
        "destroy with data queued took {:.1} ms",
        d.f64("ms").unwrap()
    );
    assert!(d.f64("ms").unwrap() <= TEARDOWN_MS * 1.2, "{d}");
    let r = job.wait_any(1, &["received", "failed"], WAIT);
    assert_eq!(
        r.ev(),
        "received",
        "the peer lost data sent before destroy: {r}"
    );
    assert_eq!(r.bool("intact"), Some(true), "{r}");
    job.send(1, "destroy");
    job.wait_for(1, "destroyed", WAIT);
    assert_eq!(job.close(), vec![]);
}
