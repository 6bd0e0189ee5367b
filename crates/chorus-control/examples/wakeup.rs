//! Measures how late a sleeping control thread is woken on this machine: the number the
//! heartbeat deadline must absorb (see `chorus_control::config`).
//!
//! ```text
//! cargo run --release -p chorus-control --example wakeup -- --seconds 120 --interval-ms 200
//! ```
//!
//! A thread sleeps one heartbeat interval at a time, as the runtime's control thread does
//! between timers, and records how much later than asked it woke. Run it while the machine
//! is as loaded as it will be in tests (compilers, other test suites); add `--burn N` to
//! start N spinning threads of its own.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let mut seconds = 60u64;
    let mut interval_ms = 200u64;
    let mut burn = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--seconds", Some(v)) => seconds = v,
            ("--interval-ms", Some(v)) => interval_ms = v.max(1),
            ("--burn", Some(v)) => burn = v as usize,
            _ => {
                eprintln!("usage: wakeup [--seconds S] [--interval-ms MS] [--burn THREADS]");
                return ExitCode::from(2);
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..burn)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            })
        })
        .collect();
    let interval = Duration::from_millis(interval_ms);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut late_ms = Vec::new();
    while Instant::now() < end {
        let asked = Instant::now() + interval;
        std::thread::sleep(interval);
        late_ms.push(
            Instant::now()
                .saturating_duration_since(asked)
                .as_secs_f64()
                * 1e3,
        );
    }
    stop.store(true, Ordering::Relaxed);
    for b in burners {
        let _ = b.join();
    }
    late_ms.sort_by(f64::total_cmp);
    let at = |q: f64| late_ms[((late_ms.len() - 1) as f64 * q).round() as usize];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} wake-ups of {interval_ms} ms over {seconds} s (load average {}; {burn} burner threads)",
        late_ms.len(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "lateness ms: p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}",
        at(0.5),
        at(0.99),
        at(0.999),
        late_ms.last().copied().unwrap_or(0.0)
    );
    ExitCode::SUCCESS
}
