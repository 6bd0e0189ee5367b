//! A running job under attack (issue 18, section 3): 4 ranks all-reduce in a loop (every
//! result checked exactly by the ranks) at the default heartbeat and deadline, while a
//! stream of mutated first frames — golden vectors and the job's own `Hello`s flipped, cut
//! short, lengthened, with a wrong communicator, epoch, role or secret, and replayed
//! handshakes — goes at every rank's TCP data and QUIC control ports and at the root's.
//!
//! Asserted: every connection answered as the spec says (code, and on QUIC the same close
//! code; see `chorus_tests::mutate`), no rank crashed, no all-reduce failed or was wrong, no
//! rank was declared dead, and each rank's resident memory grew by less than
//! [`RSS_GROWTH_LIMIT_KIB`]. The per-port answers are printed (`--nocapture`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::print_stdout)] // the report, shown with --nocapture

use std::path::Path;
use std::time::Duration;

use chorus_tests::attack::{self, Outcome};
use chorus_tests::mutate::Port;
use chorus_tests::{Job, JobSpec};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

const WAIT: Duration = Duration::from_secs(30);

/// How long the attack runs (the whole test stays near a minute).
const ATTACK: Duration = Duration::from_secs(30);

/// Connections in flight at once: enough to keep every port busy, few enough that the
/// attacker's TLS handshakes leave the ranks the CPU of a loaded 2-core machine.
const CONCURRENCY: usize = 6;

/// The most a rank's resident memory may grow over the attack. A rank keeps nothing per
/// refused connection; what grows is allocator slack and the runtime's buffers, a few MiB.
/// A leak of even a few hundred bytes per refused connection (thousands of them) would show.
const RSS_GROWTH_LIMIT_KIB: u64 = 32 * 1024;

#[test]
fn a_job_under_a_stream_of_mutated_frames_answers_each_by_the_spec_and_runs_on() {
    let mut job = Job::start(
        bin(),
        JobSpec::new(4)
            .env("CT_START", "loop")
            .env("CT_ON_FAIL", "idle"),
    );
    for s in 0..4 {
        job.wait_for(s, "looping", WAIT);
    }
    // Every data link of the loop exists (the replays claim live ranks).
    std::thread::sleep(Duration::from_secs(1));
    let before: Vec<u64> = (0..4)
        .map(|s| attack::rss_kib(job.pid(s)).unwrap())
        .collect();
    let listeners = attack::listeners(&job, 0);
    let seed = 0x5eed_0018;
    let report = attack::run(
        &listeners,
        &job.token().secret.clone(),
        seed,
        ATTACK,
        CONCURRENCY,
    );
    let after: Vec<u64> = (0..4)
        .map(|s| attack::rss_kib(job.pid(s)).unwrap())
        .collect();
    println!("{report}");
    println!("rss before {before:?} KiB, after {after:?} KiB");

    for port in [Port::Data, Port::Control, Port::Root] {
        let seen = report.by_port().remove(&port).unwrap_or_default();
        let refused: u64 = seen
            .iter()
            .filter(|(o, _)| matches!(o, Outcome::Refused { .. }))
            .map(|(_, n)| n)
            .sum();
        // Enough to judge even on a machine loaded far past its cores (about 70 refusals
        // per port are typical; 360 connections in all were seen at a load of 24).
        assert!(
            refused > 5,
            "{}: too few refusals to judge: {seen:?}",
            port.name()
        );
    }
    assert!(
        report.attempts > 100,
        "too few connections: {}",
        report.attempts
    );
    assert_eq!(
        report.wrong_count, 0,
        "answers differ from the spec (seed {seed:#x}):\n{report}"
    );
    for s in 0..4 {
        let failures = job.pending(s, "failed");
        assert!(failures.is_empty(), "slot {s} was disturbed: {failures:?}");
        let grew = after[s].saturating_sub(before[s]);
        assert!(
            grew < RSS_GROWTH_LIMIT_KIB,
            "slot {s}: resident memory grew {grew} KiB under attack (limit {RSS_GROWTH_LIMIT_KIB})"
        );
    }
    job.send_all(&[0, 1, 2, 3], "finish");
    for s in 0..4 {
        let f = job.wait_for(s, "finished", WAIT);
        assert_eq!((f.u64("epoch"), f.u64("world")), (Some(0), Some(4)), "{f}");
        assert_eq!(f.bool("peers_alive"), Some(true), "no false death: {f}");
    }
    job.send_all(&[0, 1, 2, 3], "destroy");
    for s in 0..4 {
        assert_eq!(job.wait_for(s, "destroyed", WAIT).bool("ok"), Some(true));
    }
    assert_eq!(job.close(), vec![]);
}
