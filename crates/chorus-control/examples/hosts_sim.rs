//! The cross-host scenarios of `chorus-figures hosts` (3 hosts × 2 ranks; the lost host is
//! ranks 4 and 5) in the simulator, on the bed's network, for the note that sets simulated
//! detection beside measured detection.
//!
//! ```text
//! cargo run -p chorus-control --example hosts_sim -- [--runs 20] [--heartbeat-ms 100] [--deadline-ms 2000]
//! ```
//!
//! Networks: the bed's veth and bridge (about 50 µs one way), and the bad network of scenario
//! 5 (20 ms ± 5 ms, 1 % loss: 15 ms fixed plus an exponential extra of mean 5 ms capped at
//! 10 ms). A vanished host is a silent crash of both its processes at once; a frozen host a
//! freeze of both for longer than the run. Partitions and one-way loss have no detection
//! figure in the simulator's report, so they are left to the bed.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::Duration;

use chorus_control::Config;
use chorus_control::sim::{self, Fault, FaultKind, Net, Scenario};

fn main() -> ExitCode {
    let (mut runs, mut hb, mut deadline) = (20u64, 100u64, 2000u64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--runs", Some(v)) => runs = v,
            ("--heartbeat-ms", Some(v)) => hb = v,
            ("--deadline-ms", Some(v)) => deadline = v,
            _ => {
                eprintln!("usage: hosts_sim [--runs N] [--heartbeat-ms MS] [--deadline-ms MS]");
                return ExitCode::from(2);
            }
        }
    }
    let config = Config::from_timing(Duration::from_millis(hb), Duration::from_millis(deadline));
    let nets = [
        ("bed (50 us)", net(50, 20, 100, 0.0)),
        (
            "bad network (20 ms +- 5 ms, 1 % loss)",
            net(15_000, 5_000, 10_000, 0.01),
        ),
    ];
    let kinds = [
        ("vanished host", FaultKind::Crash),
        ("frozen host", FaultKind::Freeze(Duration::from_secs(60))),
    ];
    println!("heartbeat {hb} ms / deadline {deadline} ms, 6 ranks, {runs} runs each\n");
    println!("| scenario | network | n | p50 of runs' p50 | max p99 | max | violations |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut failed = false;
    for (net_name, net) in &nets {
        for (kind_name, kind) in &kinds {
            let (mut p50s, mut p99, mut max, mut n, mut violations) =
                (Vec::new(), 0f64, 0f64, 0, 0);
            for seed in 0..runs {
                let mut s = Scenario::quiet(seed, 6);
                s.config = config.clone();
                s.net = net.clone();
                // Mid-run, at a seeded point within a heartbeat interval.
                let at = sim::secs(3.0) + Duration::from_micros(seed * 7919 % (hb * 1000));
                for proc in [4, 5] {
                    s.faults.push(Fault {
                        at,
                        proc,
                        kind: kind.clone(),
                    });
                }
                s.end = at + config.deadline * 4;
                let report = sim::run(s);
                let d = &report.detection_ms;
                n += d.count;
                p50s.push(d.p50);
                p99 = p99.max(d.p99);
                max = max.max(d.max);
                violations += report.violations.len();
            }
            p50s.sort_by(f64::total_cmp);
            let median = p50s.get(p50s.len() / 2).copied().unwrap_or(f64::NAN);
            println!(
                "| {kind_name} | {net_name} | {n} | {median:.1} | {p99:.1} | {max:.1} | {violations} |"
            );
            failed |= violations > 0;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn net(latency_us: u64, jitter_us: u64, cap_us: u64, loss: f64) -> Net {
    let mut n = Net::fixed(Duration::from_micros(latency_us));
    n.jitter = Duration::from_micros(jitter_us);
    n.jitter_cap = Duration::from_micros(cap_us);
    n.loss = loss;
    n
}
