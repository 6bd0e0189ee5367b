//! `chorus-test-harness RANK_BIN`: a test harness process for test 9, which kills it.
//!
//! It starts the busy job (three ranks of `RANK_BIN`, one stopped, each with a forked
//! descriptor holder), prints `PGIDS g1,g2,g3` on stdout, and then waits to be killed. If
//! nobody kills it within a minute it closes the job itself and exits with code 2, so a
//! broken parent cannot leave it running. stdout is its protocol with the parent test.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chorus_tests::busy;

/// How long the harness waits to be killed before it gives up.
const LIFETIME: Duration = Duration::from_secs(60);

#[allow(clippy::print_stderr)] // a usage error and the give-up line are for a person
fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(rank_bin), None) = (args.next(), args.next()) else {
        eprintln!("usage: chorus-test-harness RANK_BIN (the path of chorus-test-rank)");
        return ExitCode::from(64);
    };
    let rank_bin = PathBuf::from(rank_bin);
    if !rank_bin.is_file() {
        eprintln!("chorus-test-harness: {} is not a file", rank_bin.display());
        return ExitCode::from(64);
    }
    let job = busy::busy_job(&rank_bin);
    let pgids: Vec<String> = job.pgids().iter().map(|p| p.to_string()).collect();
    #[allow(clippy::print_stdout)] // stdout is the protocol with the parent test
    {
        println!("PGIDS {}", pgids.join(","));
    }
    std::thread::sleep(LIFETIME);
    eprintln!("chorus-test-harness: not killed within {LIFETIME:?}; closing the job");
    drop(job);
    ExitCode::from(2)
}
