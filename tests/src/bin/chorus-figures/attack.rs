//! `chorus-figures attack --duration 10m`: the attack test's scenario for longer — 4 ranks
//! all-reducing at the default heartbeat and deadline while mutated first frames stream at
//! every rank's TCP data and QUIC control ports and the root's (`chorus_tests::attack`).
//! Prints what came back per port and mutation, every answer that differed from the spec,
//! each rank's RSS growth, and whether the job ran on (no failure, no false death).

use std::time::Duration;

use chorus_tests::attack;
use chorus_tests::{Job, JobSpec};

const WAIT: Duration = Duration::from_secs(60);

/// `chorus-figures attack`'s options.
#[derive(clap::Args)]
pub(super) struct Args {
    /// How long to attack (`10m`, `90s`).
    #[arg(long, default_value = "10m", value_parser = super::soak::span)]
    duration: Duration,
    /// Hostile connections open at a time.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// The mutation engine's seed.
    #[arg(long, default_value_t = 0x5eed_0018)]
    seed: u64,
    #[command(flatten)]
    rank: super::RankProgram,
}

pub(super) fn main(args: Args) {
    let (duration, concurrency, seed) = (args.duration, args.concurrency as usize, args.seed);
    let bin = args.rank.checked();
    let spec = JobSpec::new(4)
        .env("CT_START", "loop")
        .env("CT_ON_FAIL", "idle")
        .env("CT_LIFETIME_S", duration.as_secs() + 300);
    let mut job = Job::start(&bin, spec);
    for s in 0..4 {
        job.wait_for(s, "looping", WAIT);
    }
    std::thread::sleep(Duration::from_secs(1));
    let rss = |job: &Job| -> Vec<u64> {
        (0..4)
            .map(|s| attack::rss_kib(job.pid(s)).unwrap_or(0))
            .collect()
    };
    let before = rss(&job);
    super::progress(&format!(
        "attacking 9 ports for {:.0} s, {concurrency} connections at a time, seed {seed:#x}",
        duration.as_secs_f64()
    ));
    let listeners = attack::listeners(&job, 0);
    let secret = job.token().secret.clone();
    let report = attack::run(&listeners, &secret, seed, duration, concurrency);
    let after = rss(&job);
    let mut failures = Vec::new();
    for s in 0..4 {
        failures.extend(
            job.pending(s, "failed")
                .into_iter()
                .map(|f| format!("slot {s}: {f}")),
        );
    }
    job.send_all(&[0, 1, 2, 3], "finish");
    let mut ran_on = true;
    for s in 0..4 {
        match job.try_wait_any(s, &["finished"], WAIT) {
            Ok(f) if f.bool("peers_alive") == Some(true) && f.u64("world") == Some(4) => {}
            Ok(f) => {
                ran_on = false;
                failures.push(format!("slot {s} finished with a peer gone: {f}"));
            }
            Err(why) => {
                ran_on = false;
                failures.push(format!("slot {s}: {why}"));
            }
        }
    }
    let left = job.close();
    println!(
        "attack: 4 ranks all-reducing (default heartbeat and deadline), {:.0} s, {concurrency} \
         hostile connections at a time, seed {seed:#x}\n",
        duration.as_secs_f64()
    );
    println!("{report}");
    println!("| slot | RSS before (KiB) | after (KiB) | growth (KiB) |");
    println!("|---:|---:|---:|---:|");
    for s in 0..4 {
        println!(
            "| {s} | {} | {} | {} |",
            before[s],
            after[s],
            after[s] as i64 - before[s] as i64
        );
    }
    println!(
        "\njob ran on: {ran_on}; failed operations or false deaths: {}; processes left: {}",
        failures.len(),
        left.len()
    );
    for f in &failures {
        println!("- {f}");
    }
    if !ran_on || !failures.is_empty() || report.wrong_count > 0 || !left.is_empty() {
        std::process::exit(1);
    }
}
