//! The data plane's measuring stick: chorus's engine over real TCP links (io_uring and
//! epoll), ranks as separate processes fully meshed over loopback with the transport's
//! handshake, against Open MPI over TCP (`benches/peer/mpi_allreduce.c`, launched the way the
//! peer comparison launches it) in the same run, rounds interleaved.
//!
//! ```sh
//! cargo bench -p chorus-benches --bench dataplane                  # 3 rounds, 8 B … 128 MiB ×4
//! cargo bench -p chorus-benches --bench dataplane -- --quick       # 8 B … 16 MiB ×8, fewer calls
//! cargo bench -p chorus-benches --bench dataplane -- --ranks 2 --systems uring,openmpi-tcp -e 64K
//! ```
//!
//! Every system prints the peer harness's `chorus_bench` document and is timed the same way
//! (nccl-tests': per size and mode, barrier, warm-up calls, barrier, timed calls, the ranks'
//! mean time per call; one checked call after). The table shows the in-place median over
//! rounds, bus bandwidth (`size / time × 2(n−1)/n`) and chorus ÷ Open MPI ratios; all
//! documents go to `bench-out/dataplane/dataplane.json`.
//!
//! Each chorus rank is an `Engine<HostDevice, TcpLink>` (or `dyn Link<Bytes>` with
//! `chorus-uring-dyn`) driven by `futures::executor::block_on` on the rank's main thread, as
//! an application thread calling a blocking collective would.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark program: its report and progress are its output"
)]

mod launch;
mod rank;
mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use chorus_benches::peer::bench_doc::BenchDoc;
use chorus_benches::peer::session::{self, Ending};
use chorus_benches::peer::stop;
use chorus_benches::peer::sweep::{Bytes, Sweep};
use chorus_benches::peer::system::{OpenMpi, System as PeerSystem, Tools};
use chorus_engine::{Algorithm, EngineConfig};
use chorus_transport::Backend;
use clap::{Parser, Subcommand, ValueEnum};

/// The job secret reaches the ranks through the environment, not their command lines.
const SECRET_ENV: &str = "CHORUS_DATAPLANE_SECRET";

#[derive(Parser)]
#[command(about = "chorus over TCP vs Open MPI over TCP: all-reduce, side by side")]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// One system's sweep at one rank count: starts the ranks, prints rank 0's document.
    Case(CaseArgs),
    /// One rank (started by `case`).
    #[command(hide = true)]
    Rank(RankArgs),
}

#[derive(clap::Args, Clone)]
struct SweepArgs {
    /// Smallest size in bytes (8, 64K, 1M).
    #[arg(short = 'b', long = "min")]
    min: Option<Bytes>,
    /// Largest size.
    #[arg(short = 'e', long = "max")]
    max: Option<Bytes>,
    /// Each size is this many times the last.
    #[arg(short = 'f', long)]
    factor: Option<u32>,
    /// Untimed calls per size and mode.
    #[arg(short = 'w', long)]
    warmup: Option<u32>,
    /// Timed calls per size and mode.
    #[arg(short = 'i', long)]
    iters: Option<u32>,
    /// The short sweep (8 B … 16 MiB ×8, 2 warm-up, 5 timed) as the base.
    #[arg(long)]
    quick: bool,
}

impl SweepArgs {
    fn sweep(&self) -> Result<Sweep, String> {
        let base = if self.quick {
            Sweep::QUICK
        } else {
            Sweep::FULL
        };
        Sweep::new(
            self.min.unwrap_or(base.min()),
            self.max.unwrap_or(base.max()),
            self.factor.unwrap_or(base.factor()),
            self.warmup.unwrap_or(base.warmup()),
            self.iters.unwrap_or(base.iters()),
        )
        .map_err(|e| e.to_string())
    }

    fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut push = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                v.extend([flag.to_owned(), value]);
            }
        };
        push("-b", self.min.map(|b| b.arg()));
        push("-e", self.max.map(|b| b.arg()));
        push("-f", self.factor.map(|f| f.to_string()));
        push("-w", self.warmup.map(|f| f.to_string()));
        push("-i", self.iters.map(|f| f.to_string()));
        if self.quick {
            v.push("--quick".into());
        }
        v
    }
}

/// Engine knobs (defaults: `EngineConfig::default()`), for tuning runs.
#[derive(clap::Args, Clone)]
struct EngineArgs {
    /// Chunk size in bytes.
    #[arg(long)]
    chunk: Option<Bytes>,
    /// Pipeline depth (chunks in flight per peer).
    #[arg(long)]
    depth: Option<usize>,
    /// Force an all-reduce algorithm (ring, recursive-doubling, halving-doubling).
    #[arg(long, value_parser = parse_algorithm)]
    algo: Option<Algorithm>,
}

fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    Algorithm::from_name(name)
        .filter(|a| Algorithm::for_collective(chorus_protocol::Collective::AllReduce).contains(a))
        .ok_or_else(|| format!("{name:?} is not an all-reduce algorithm"))
}

impl EngineArgs {
    fn config(&self) -> EngineConfig {
        let mut c = EngineConfig::default();
        if let Some(chunk) = self.chunk {
            c.chunk_bytes = chunk.0 as usize;
        }
        if let Some(depth) = self.depth {
            c.pipeline_depth = depth;
        }
        c.overrides.all_reduce = self.algo;
        c
    }

    fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(c) = self.chunk {
            v.extend(["--chunk".to_owned(), c.arg()]);
        }
        if let Some(d) = self.depth {
            v.extend(["--depth".to_owned(), d.to_string()]);
        }
        if let Some(a) = self.algo {
            v.extend(["--algo".to_owned(), a.name().to_owned()]);
        }
        v
    }
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Uring,
    Epoll,
}

impl BackendArg {
    fn backend(self) -> Backend {
        match self {
            BackendArg::Uring => Backend::Uring,
            BackendArg::Epoll => Backend::Epoll,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BackendArg::Uring => "uring",
            BackendArg::Epoll => "epoll",
        }
    }
}

/// How the engine holds its links.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum LinkKind {
    /// `Engine<HostDevice, TcpLink>`.
    Concrete,
    /// `Engine<HostDevice, dyn Link<Bytes>>`.
    Dyn,
}

impl LinkKind {
    fn name(self) -> &'static str {
        match self {
            LinkKind::Concrete => "TcpLink",
            LinkKind::Dyn => "dyn Link",
        }
    }
}

#[derive(clap::Args, Clone)]
struct CaseArgs {
    /// Ranks.
    #[arg(short = 'n', long)]
    ranks: u32,
    #[arg(long, value_enum, default_value = "uring")]
    backend: BackendArg,
    #[arg(long, value_enum, default_value = "concrete")]
    link: LinkKind,
    /// Kill the ranks after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(clap::Args)]
struct RankArgs {
    #[arg(long)]
    rank: u32,
    #[arg(long)]
    world: u32,
    #[arg(long, value_enum)]
    backend: BackendArg,
    #[arg(long, value_enum)]
    link: LinkKind,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// What the driver compares.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
enum System {
    /// chorus, TcpLink over io_uring.
    #[value(name = "uring")]
    Uring,
    /// chorus, TcpLink over epoll.
    #[value(name = "epoll")]
    Epoll,
    /// chorus, io_uring links behind `dyn Link<Bytes>`.
    #[value(name = "uring-dyn")]
    UringDyn,
    /// Open MPI, `--mca btl tcp,self` on `lo`.
    #[value(name = "openmpi-tcp")]
    OpenMpiTcp,
    /// Open MPI, shared memory.
    #[value(name = "openmpi-shm")]
    OpenMpiShm,
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Uring => "chorus uring",
            System::Epoll => "chorus epoll",
            System::UringDyn => "chorus uring dyn",
            System::OpenMpiTcp => "Open MPI tcp",
            System::OpenMpiShm => "Open MPI shm",
        }
    }

    fn is_chorus(self) -> bool {
        matches!(self, System::Uring | System::Epoll | System::UringDyn)
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// Rounds; the table shows the median over rounds.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Rank counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    ranks: Vec<u32>,
    /// Systems, in table order.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "uring,epoll,openmpi-tcp"
    )]
    systems: Vec<System>,
    /// Deadline of one system's sweep at one rank count, seconds.
    #[arg(long, default_value_t = 300)]
    case_timeout: u64,
    /// Where dataplane.json and the compiled MPI program go.
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value = "mpirun")]
    mpirun: PathBuf,
    #[arg(long, default_value = "mpicc")]
    mpicc: PathBuf,
    #[command(flatten)]
    sweep: SweepArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench` to harness-less benches.
    let args = Args::parse_from(std::env::args().filter(|a| a != "--bench"));
    let result = match args.cmd {
        Some(Cmd::Rank(a)) => run_rank(a),
        Some(Cmd::Case(a)) => run_case(&a),
        None => drive(&args.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dataplane: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_rank(a: RankArgs) -> Result<(), String> {
    let plan = rank::RankPlan {
        rank: a.rank,
        world: a.world,
        backend: a.backend.backend(),
        link: a.link,
        sweep: a.sweep.sweep()?,
        engine: a.engine.config(),
    };
    rank::run(&plan).map_err(|e| format!("rank {}: {e}", a.rank))
}

fn run_case(a: &CaseArgs) -> Result<(), String> {
    a.sweep.sweep()?;
    if !(2..=64).contains(&a.ranks) {
        return Err("ranks must be between 2 and 64".into());
    }
    launch::run(
        a.ranks,
        |r| {
            let mut v = vec![
                "rank".to_owned(),
                "--rank".into(),
                r.to_string(),
                "--world".into(),
                a.ranks.to_string(),
                "--backend".into(),
                a.backend.name().into(),
                "--link".into(),
                match a.link {
                    LinkKind::Concrete => "concrete".into(),
                    LinkKind::Dyn => "dyn".into(),
                },
            ];
            v.extend(a.sweep.to_args());
            v.extend(a.engine.to_args());
            v
        },
        Duration::from_secs(a.timeout),
    )
}

/// One measured (or failed) case.
pub(crate) struct Case {
    round: u32,
    system: System,
    ranks: u32,
    result: Result<BenchDoc, String>,
}

fn drive(a: &RunArgs) -> Result<(), String> {
    let sweep = a.sweep.sweep()?;
    session::become_subreaper().map_err(|e| e.to_string())?;
    stop::on_signals().map_err(|e| e.to_string())?;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| manifest.join("../bench-out/dataplane"));
    std::fs::create_dir_all(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let tools = mpi_tools(a, manifest, &out);
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let limit = Duration::from_secs(a.case_timeout);
    let mut cases = Vec::new();
    for round in 1..=a.rounds.max(1) {
        let mut ranks = a.ranks.clone();
        if round % 2 == 0 {
            ranks.reverse();
        }
        let mut systems = a.systems.clone();
        let shift = (round as usize - 1) % systems.len().max(1);
        systems.rotate_left(shift);
        for &n in &ranks {
            for &system in &systems {
                if stop::requested() {
                    break;
                }
                eprintln!(
                    "dataplane: round {round}/{}: {n} ranks, {} …",
                    a.rounds,
                    system.label()
                );
                let result = if system.is_chorus() {
                    let mut cmd = Command::new(&exe);
                    cmd.args(["case", "-n", &n.to_string(), "--timeout"])
                        .arg(a.case_timeout.saturating_sub(5).max(5).to_string())
                        .args(match system {
                            System::Epoll => ["--backend", "epoll", "--link", "concrete"],
                            System::UringDyn => ["--backend", "uring", "--link", "dyn"],
                            _ => ["--backend", "uring", "--link", "concrete"],
                        })
                        .args(a.sweep.to_args())
                        .args(a.engine.to_args());
                    supervise(&mut cmd, &out, system, n, limit)
                } else {
                    let peer = if system == System::OpenMpiTcp {
                        PeerSystem::OpenMpiTcp
                    } else {
                        PeerSystem::OpenMpiShm
                    };
                    tools
                        .command(peer, n, &sweep, a.case_timeout)
                        .and_then(|mut cmd| supervise(&mut cmd, &out, system, n, limit))
                };
                match &result {
                    Ok(doc) => eprintln!("    average bus bandwidth {:.3} GB/s", doc.avg_busbw_gbs),
                    Err(e) => eprintln!("    not measured: {e}"),
                }
                cases.push(Case {
                    round,
                    system,
                    ranks: n,
                    result,
                });
            }
        }
    }
    let json = report::json(&cases);
    let path = out.join("dataplane.json");
    std::fs::write(&path, json).map_err(|e| format!("write {}: {e}", path.display()))?;
    println!(
        "{}",
        report::markdown(&cases, &a.systems, &a.ranks, &sweep, a.rounds)
    );
    eprintln!("dataplane: wrote {}", path.display());
    Ok(())
}

/// Runs one case in a session of its own under `limit`; its document, or why there is none.
fn supervise(
    cmd: &mut Command,
    out: &Path,
    system: System,
    ranks: u32,
    limit: Duration,
) -> Result<BenchDoc, String> {
    let name = format!("{}-{ranks}", system.label().replace(' ', "-"));
    let (o, e) = (
        out.join(format!("{name}.out")),
        out.join(format!("{name}.err")),
    );
    let files = std::fs::File::create(&o).and_then(|f| Ok((f, std::fs::File::create(&e)?)));
    let (fo, fe) = files.map_err(|err| format!("create {}: {err}", o.display()))?;
    cmd.stdout(fo).stderr(fe);
    let outcome = session::run_in_session(cmd, limit).map_err(|e| e.to_string())?;
    let stdout = std::fs::read_to_string(&o).unwrap_or_default();
    let stderr = std::fs::read_to_string(&e).unwrap_or_default();
    let tail = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
    match outcome.ending {
        Ending::Exited(0) => {
            BenchDoc::from_stdout(&stdout, ranks).map_err(|err| format!("{err} (stderr: {tail})"))
        }
        ending => Err(format!("{ending:?} (stderr: {tail})")),
    }
}

/// Open MPI as the peer harness runs it, with `mpi_allreduce.c` compiled into `out`.
fn mpi_tools(a: &RunArgs, manifest: &Path, out: &Path) -> Tools {
    let wants_mpi = a.systems.iter().any(|s| !s.is_chorus());
    let open_mpi = if wants_mpi {
        Command::new(&a.mpirun)
            .arg("--version")
            .output()
            .map_err(|e| format!("{}: {e}", a.mpirun.display()))
            .and_then(|o| {
                OpenMpi::from_version_output(a.mpirun.clone(), &String::from_utf8_lossy(&o.stdout))
                    .ok_or_else(|| format!("{} is not Open MPI's", a.mpirun.display()))
            })
    } else {
        Err("not asked for".into())
    };
    let program = out.join("mpi_allreduce");
    let source = manifest.join("peer/mpi_allreduce.c");
    let mpi_program = if wants_mpi {
        Command::new(&a.mpicc)
            .args(["-O2", "-o"])
            .arg(&program)
            .arg(&source)
            .status()
            .map_err(|e| format!("{}: {e}", a.mpicc.display()))
            .and_then(|s| {
                s.success()
                    .then(|| program.clone())
                    .ok_or_else(|| format!("mpicc failed on {}: {s}", source.display()))
            })
    } else {
        Err("not asked for".into())
    };
    for why in [&open_mpi.as_ref().err(), &mpi_program.as_ref().err()]
        .into_iter()
        .flatten()
    {
        if wants_mpi {
            eprintln!("dataplane: Open MPI will not be measured: {why}");
        }
    }
    Tools {
        chorus: PathBuf::new(),
        python: Err("not measured here".into()),
        gloo_script: PathBuf::new(),
        chorus_python: Err("not measured here".into()),
        chorus_py_script: PathBuf::new(),
        open_mpi,
        mpi_program,
        as_root: rustix::process::geteuid().is_root(),
    }
}
