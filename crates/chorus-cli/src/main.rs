//! The `chorus` command (floor 5): `run` (a local launcher), `bench` (nccl-tests' table for
//! chorus, with failure injection), `status` (what a running job is doing, and which rank it
//! waits on). Nothing imports it. Exit codes: [`exit`].

// `chorus::Error` carries its structured fields inline (136 bytes); it travels only on the
// failure path, where the move costs nothing next to what failed.
#![allow(clippy::result_large_err)]

mod bench;
mod exit;
mod launcher;
mod nodes;
mod run;
mod signal;
mod size;
mod status;

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit::Verdict;

/// chorus: collective communication where no rank ever hangs.
#[derive(Parser, Debug)]
#[command(name = "chorus", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Launch N ranks of PROGRAM on this machine (CHORUS_* and torchrun variables set).
    ///
    /// On many hosts, run it on each with --nnodes, --node-rank and --master HOST:PORT (node
    /// 0 first: it hosts the bootstrap root there and writes --token-file for the others).
    ///
    /// Exit codes: 0 every rank exited 0; 1 a rank failed (non-zero exit or a signal);
    /// 2 bad command line; 3 launcher error; 124 --timeout passed; 128+N interrupted by
    /// signal N (forwarded to the ranks).
    Run(run::RunArgs),
    /// Measure a collective the way nccl-tests does, ranks as processes on 127.0.0.1 (or on
    /// many hosts with --nnodes, --node-rank and --master, as `chorus run`).
    ///
    /// Without arguments: all-reduce of float sum on 4 ranks, 8 B to 64 MiB.
    /// Exit codes as `chorus run`, and 1 when a result was wrong or the sweep could not
    /// finish.
    Bench(bench::BenchArgs),
    /// Ask a running job what each rank is doing and which rank the others wait on.
    Status(status::StatusArgs),
    /// One rank of `chorus bench` (started by it, under its launcher).
    #[command(hide = true)]
    BenchRank(bench::RankArgs),
}

/// The launcher's options, shared by `run` and `bench`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LaunchArgs {
    /// Address of the job's bootstrap root (the launcher hosts it): IP or IP:PORT
    /// [default: 127.0.0.1]. One node only; with --nnodes, --master says where it is.
    #[arg(long, value_name = "ADDR", value_parser = bind_addr, conflicts_with = "master")]
    pub(crate) bind: Option<SocketAddr>,
    /// Nodes in the job, each running this command with -n ranks (torchrun's --nnodes).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) nnodes: u32,
    /// This node's index, 0 to N-1; node 0 hosts the bootstrap root at --master.
    #[arg(long, value_name = "I")]
    pub(crate) node_rank: Option<u32>,
    /// The bootstrap root's address, HOST:PORT, on node 0 (torchrun's master): node 0 binds
    /// it, the other nodes join it.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) master: Option<String>,
    /// Write the job's token here (for `chorus status`, and on node 0 for the other nodes);
    /// it holds the job secret (mode 0600). On the other nodes: read it from here, waiting
    /// for node 0 to write it within the init timeout (a shared filesystem).
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
    /// On nodes other than 0: the job token node 0 printed (instead of --token-file; it
    /// holds the secret, so other users may see it in the process list).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub(crate) token: Option<String>,
    /// While stopping: SIGKILL the remaining ranks once this long passes with no rank exiting.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "10s")]
    pub(crate) reap_budget: Duration,
    /// Stop the job (SIGTERM to every rank) after this long; exit code 124.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) timeout: Option<Duration>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rank = matches!(cli.command, Command::BenchRank(_));
    init_logging(if rank { "error" } else { "warn" });
    let verdict = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Status(args) => status::run(args),
        Command::BenchRank(args) => bench::rank::run(args),
    };
    verdict.into()
}

/// Logs on stderr, filtered by `CHORUS_LOG` (tracing's env-filter syntax).
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHORUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

/// The longest duration an option takes: a year. Every option is a wait or a budget that
/// the launcher adds to the clock, which a larger value could overflow.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// `10s`, `500ms`, `2m`; at most [`MAX_DURATION`].
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let d =
        humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e})"))?;
    if d > MAX_DURATION {
        return Err(format!("{text:?} is longer than a year"));
    }
    Ok(d)
}

/// `127.0.0.1` (any free port) or `127.0.0.1:29500`.
fn bind_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 0))
        .map_err(|_| format!("{text:?} is not an IP address or IP:PORT"))
}

/// A program and its arguments, as given after `--`.
pub(crate) fn program(command: &[OsString]) -> Option<(OsString, Vec<OsString>)> {
    let (first, rest) = command.split_first()?;
    Some((first.clone(), rest.to_vec()))
}

/// The exit code for a command that could not start.
fn fail(label: &str, text: &str, verdict: Verdict) -> Verdict {
    launcher::note(label, text);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn bind_takes_an_ip_or_an_address() {
        assert_eq!(bind_addr("127.0.0.1").unwrap().port(), 0);
        assert_eq!(bind_addr("127.0.0.1:29500").unwrap().port(), 29500);
        assert!(bind_addr("localhost:1").is_err());
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(duration("soon").is_err());
        assert!(duration("200000000000y").is_err());
        assert_eq!(duration("366days").unwrap(), MAX_DURATION);
    }
}
