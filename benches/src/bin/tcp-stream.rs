//! `tcp-stream`: one loopback TCP connection's streaming rate and 8-byte ping-pong time,
//! printed as `{"stream_gbs": RATE, "pingpong_8b_us": TIME}` on stdout. `peer-run` runs it
//! in every round as one of the machine's limits.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its result and errors are its output"
)]

use std::process::ExitCode;
use std::time::Duration;

use chorus_benches::peer::loopback::measure_tcp;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Loopback TCP stream rate and ping-pong latency, as JSON")]
struct Args {
    /// How long to stream, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    stream_ms: u64,
    /// How long to ping-pong, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pingpong_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let limit = match measure_tcp(
        Duration::from_millis(args.stream_ms),
        Duration::from_millis(args.pingpong_ms),
    ) {
        Ok(limit) => limit,
        Err(e) => {
            eprintln!("tcp-stream: {e}");
            return ExitCode::FAILURE;
        }
    };
    match serde_json::to_string(&limit) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tcp-stream: cannot write the result: {e}");
            ExitCode::FAILURE
        }
    }
}
