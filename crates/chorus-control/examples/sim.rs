//! Scale runs of the control-plane simulator.
//!
//! ```text
//! cargo run --release -p chorus-control --example sim -- --ranks 100000 --seed 7 --crash 10 --freeze 5
//! cargo run --release -p chorus-control --example sim -- --random 0..1000      # sweep random scenarios
//! cargo run --release -p chorus-control --example sim -- --replay 1234         # one random scenario, verbose
//! ```
//!
//! Prints detection latency percentiles, notice hops, steady-state control frames per rank
//! per second, and the simulator's own wall time. Exits non-zero if any property failed.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chorus_control::sim::{self, Scenario};

struct Args {
    ranks: u32,
    seed: u64,
    crash: u32,
    freeze: u32,
    shrink: bool,
    random: Option<(u64, u64)>,
    replay: Option<u64>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        ranks: 1000,
        seed: 7,
        crash: 10,
        freeze: 5,
        shrink: false,
        random: None,
        replay: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--ranks" => a.ranks = value()?.parse().map_err(|e| format!("--ranks: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--crash" => a.crash = value()?.parse().map_err(|e| format!("--crash: {e}"))?,
            "--freeze" => a.freeze = value()?.parse().map_err(|e| format!("--freeze: {e}"))?,
            "--shrink" => a.shrink = true,
            "--replay" => a.replay = Some(value()?.parse().map_err(|e| format!("--replay: {e}"))?),
            "--random" => {
                let v = value()?;
                let (lo, hi) = v.split_once("..").ok_or("--random takes lo..hi")?;
                a.random = Some((
                    lo.parse().map_err(|e| format!("--random: {e}"))?,
                    hi.parse().map_err(|e| format!("--random: {e}"))?,
                ));
            }
            "-h" | "--help" => {
                return Err("usage: sim [--ranks N] [--seed S] [--crash C] [--freeze F] [--shrink] | --random LO..HI | --replay SEED".into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.ranks < 2 {
        return Err("--ranks must be at least 2".into());
    }
    if a.crash + a.freeze >= a.ranks {
        return Err("--crash + --freeze must be fewer than --ranks".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.replay {
        if std::env::var_os("RUST_LOG").is_some() {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .without_time()
                .init();
        }
        let scenario = Scenario::random(seed);
        println!("{}", scenario.summary());
        let started = Instant::now();
        let report = sim::run(scenario);
        println!("{report}");
        println!("wall time {:.3} s", started.elapsed().as_secs_f64());
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if let Some((lo, hi)) = args.random {
        let started = Instant::now();
        let mut failed = 0;
        for seed in lo..hi {
            let report = sim::run(Scenario::random(seed));
            if !report.passed() {
                failed += 1;
                println!("FAILED seed {seed}: {}", Scenario::random(seed).summary());
                for v in report.violations.iter().take(5) {
                    println!("    {v}");
                }
            }
        }
        println!(
            "{} scenarios, {failed} failed, wall time {:.1} s",
            hi - lo,
            started.elapsed().as_secs_f64()
        );
        return if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let mut scenario = Scenario::scale(args.seed, args.ranks, args.crash, args.freeze);
    if args.shrink {
        scenario.shrink = Some(Duration::from_millis(20));
        scenario.end = scenario.end + scenario.config.agreement_timeout * 2;
    }
    println!(
        "ranks {} seed {} crash {} freeze {} (interval {:?}, deadline {:?}, k {}, latency {:?}+exp({:?}) cap {:?})",
        args.ranks,
        args.seed,
        args.crash,
        args.freeze,
        scenario.config.heartbeat_interval,
        scenario.config.deadline,
        scenario.config.observers,
        scenario.net.latency,
        scenario.net.jitter,
        scenario.net.jitter_cap,
    );
    let started = Instant::now();
    let report = sim::run(scenario);
    let wall = started.elapsed();
    println!("{report}");
    println!(
        "simulator wall time {:.2} s ({:.0} events/s)",
        wall.as_secs_f64(),
        report.events as f64 / wall.as_secs_f64()
    );
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
