//! Test 8: a new process joins a running 3-rank job (`grow` on the members, `join` on the
//! newcomer) and the 4-rank all-reduces that follow are correct.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::print_stdout)] // measurements, shown with --nocapture

use std::path::Path;
use std::time::Duration;

use chorus_tests::{Job, JobSpec};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn t8_a_new_process_joins_a_running_job_and_all_reduces_are_correct() {
    let mut job = Job::start(
        bin(),
        JobSpec::new(3)
            .env("CHORUS_HEARTBEAT_INTERVAL", "100ms")
            .env("CHORUS_HEARTBEAT_DEADLINE", "1s")
            .env("CT_START", "loop"),
    );
    let members = [0, 1, 2];
    for s in members {
        job.wait_for(s, "looping", WAIT);
    }
    std::thread::sleep(Duration::from_millis(200));
    job.send_all(&members, "finish");
    for s in members {
        let f = job.wait_for(s, "finished", WAIT);
        assert_eq!(f.u64("world"), Some(3), "{f}");
    }
    let token = job.ready(0).str("grow_token").unwrap().to_owned();
    let newcomer = job.spawn_joiner(&token);
    job.send_all(&members, "grow 1");
    let joined = job.wait_for(newcomer, "joined", WAIT);
    println!("joined: {joined}");
    assert_eq!(
        (joined.u64("rank"), joined.u64("world")),
        (Some(3), Some(4)),
        "{joined}"
    );
    assert_eq!(joined.u64("epoch"), Some(1), "{joined}");
    for s in members {
        let g = job.wait_for(s, "grown", WAIT);
        println!("slot {s} grew in {:.1} ms", g.f64("ms").unwrap());
        assert_eq!(g.u64("world"), Some(4), "{g}");
        assert_eq!(
            g.u64("rank"),
            Some(s as u64),
            "the members keep their ranks: {g}"
        );
        assert_eq!(g.u64("epoch"), Some(1), "{g}");
    }
    let all = [0, 1, 2, newcomer];
    job.send_all(&all, "loop");
    std::thread::sleep(Duration::from_millis(300));
    job.send_all(&all, "finish");
    for s in all {
        let f = job.wait_for(s, "finished", WAIT);
        assert_eq!((f.u64("world"), f.u64("epoch")), (Some(4), Some(1)), "{f}");
        assert!(f.u64("iters").unwrap() >= 5, "{f}");
        assert_eq!(f.bool("peers_alive"), Some(true), "{f}");
    }
    job.send_all(&all, "destroy");
    for s in all {
        assert_eq!(job.wait_for(s, "destroyed", WAIT).bool("ok"), Some(true));
        assert!(job.wait_exit(s, WAIT).success());
    }
    assert_eq!(job.close(), vec![]);
}
