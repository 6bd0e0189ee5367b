//! `peer-report [--raw DIR] [--out DIR]`: turns a peer run's raw results into `report.md`,
//! `report.json` and `busbw.png`, and prints the markdown. `peer-run` does this itself at
//! its end; this redoes it, e.g. after the report's format changed.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its report and errors are its output"
)]

use std::path::PathBuf;
use std::process::ExitCode;

use chorus_benches::peer::record::RawDir;
use chorus_benches::peer::{markdown, report};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Write the peer comparison's table, JSON and plot from a run's raw results")]
struct Args {
    /// The run's raw folder (meta.json, records.jsonl).
    #[arg(long, default_value = "bench-out/peer/raw")]
    raw: PathBuf,
    /// Where report.md, report.json and busbw.png go.
    #[arg(long, default_value = "bench-out/peer")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match report::write(&RawDir::new(&args.raw), &args.out) {
        Ok(written) => {
            println!("{}", markdown::render(&written.summary));
            eprintln!(
                "peer-report: wrote {} and {}",
                written.markdown.display(),
                written.json.display()
            );
            match written.plot {
                Ok(png) => {
                    eprintln!("peer-report: wrote {}", png.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("peer-report: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("peer-report: {e}");
            ExitCode::FAILURE
        }
    }
}
