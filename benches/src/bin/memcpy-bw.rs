//! `memcpy-bw SIZE…`: single-thread memcpy bandwidth at each size (`8`, `64K`, `128M`),
//! printed as a JSON list of `{"size": BYTES, "gbs": RATE}` on stdout. `peer-run` runs it
//! in every round as one of the machine's limits.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its result and errors are its output"
)]

use std::process::ExitCode;
use std::time::Duration;

use chorus_benches::peer::memcpy::measure_memcpy;
use chorus_benches::peer::sweep::Bytes;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Single-thread memcpy bandwidth per size, as JSON")]
struct Args {
    /// Sizes to copy, e.g. 8 64K 128M.
    #[arg(required = true)]
    sizes: Vec<Bytes>,
    /// Time spent copying at each size, in milliseconds.
    #[arg(long, default_value_t = 25)]
    budget_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.sizes.iter().any(|s| s.0 == 0 || s.0 > 1 << 30) {
        eprintln!("memcpy-bw: sizes must be between 1 byte and 1 GiB");
        return ExitCode::from(2);
    }
    let points = measure_memcpy(&args.sizes, Duration::from_millis(args.budget_ms));
    match serde_json::to_string(&points) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("memcpy-bw: cannot write the result: {e}");
            ExitCode::FAILURE
        }
    }
}
