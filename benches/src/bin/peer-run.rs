//! `peer-run [--quick] …`: the peer comparison's measuring step. Finds the installed peers,
//! runs the machine-limit programs and every system's all-reduce sweep at 2 and 4 ranks in
//! interleaved rounds (each under a deadline, nothing left running), records the raw results
//! under `OUT/raw/`, then writes `OUT/report.md`, `OUT/report.json` and `OUT/busbw.png` and
//! prints the markdown. `benches/peer/run.sh` installs the peers and calls this.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its report and progress are its output"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chorus_benches::peer::record::{Meta, RawDir};
use chorus_benches::peer::runner::{LimitTools, Plan, Runner};
use chorus_benches::peer::session::{self, Ending};
use chorus_benches::peer::sweep::{Bytes, SMALL_CALLS, SMALL_UP_TO, Sweep};
use chorus_benches::peer::system::{OpenMpi, System, Tools};
use chorus_benches::peer::{PeerError, markdown, report, stop};
use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Measure chorus, Gloo and Open MPI all-reduce side by side, with the machine's limits"
)]
struct Args {
    /// A short sweep (8 B … 16 MiB in ×8 steps, fewer calls) instead of the full one.
    #[arg(long)]
    quick: bool,
    /// Where raw/, report.md, report.json and busbw.png go.
    #[arg(long, default_value = "bench-out/peer")]
    out: PathBuf,
    /// Rounds; each runs every system once per rank count, and the report shows the median.
    #[arg(long)]
    rounds: Option<u32>,
    /// Rank counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    ranks: Vec<u32>,
    /// Systems to run (chorus-tcp, chorus-shm, chorus-py, chorus-torch, gloo-tcp, openmpi-tcp,
    /// openmpi-shm).
    #[arg(long, value_delimiter = ',', value_parser = parse_system)]
    systems: Option<Vec<System>>,
    /// Override the sweep's smallest size (e.g. 8).
    #[arg(short = 'b', long)]
    min: Option<Bytes>,
    /// Override the sweep's largest size (e.g. 128M).
    #[arg(short = 'e', long)]
    max: Option<Bytes>,
    /// Override the sweep's size factor.
    #[arg(short = 'f', long)]
    factor: Option<u32>,
    /// Override the warm-up calls per size.
    #[arg(short = 'w', long)]
    warmup: Option<u32>,
    /// Override the timed calls per size.
    #[arg(short = 'i', long)]
    iters: Option<u32>,
    /// The same calls at every size, nccl-tests' way. Without it the full sweep makes 25
    /// times as many (warm-up and timed) up to 1 MiB, where 20 calls last well under a
    /// millisecond and one scheduling hiccup moves a figure by several times.
    #[arg(long)]
    flat: bool,
    /// The chorus binary (`chorus bench all-reduce … --json`).
    #[arg(long, default_value = "target/release/chorus")]
    chorus: PathBuf,
    /// A python with torch (for Gloo).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Why there is no python with torch, when the install step failed.
    #[arg(long)]
    python_missing: Option<String>,
    /// The Gloo benchmark script.
    #[arg(long, default_value = "benches/peer/gloo_allreduce.py")]
    gloo_script: PathBuf,
    /// The chorus (python) benchmark script, run by `--python` (which needs the chorus
    /// package installed: `pip install ./python`).
    #[arg(long, default_value = "benches/peer/chorus_py_allreduce.py")]
    chorus_py_script: PathBuf,
    /// Open MPI's launcher.
    #[arg(long, default_value = "mpirun")]
    mpirun: PathBuf,
    /// The compiled benches/peer/mpi_allreduce.c.
    #[arg(long)]
    mpi_program: Option<PathBuf>,
    /// Why there is no compiled MPI program, when the build step failed.
    #[arg(long)]
    mpi_missing: Option<String>,
    /// Deadline of one system's sweep at one rank count, seconds (default: 300 full, 120 quick).
    #[arg(long)]
    case_timeout: Option<u64>,
    /// Stop starting new sweeps after this many seconds (default: 1500 full, 360 quick).
    #[arg(long)]
    budget: Option<u64>,
    /// Extra `NAME=VERSION` lines for the report (e.g. chorus=abc1234).
    #[arg(long = "version-note")]
    version_notes: Vec<String>,
}

fn parse_system(text: &str) -> Result<System, String> {
    System::ALL
        .into_iter()
        .find(|s| s.key() == text)
        .ok_or_else(|| {
            format!(
                "unknown system {text:?} (chorus-tcp, chorus-shm, chorus-py, chorus-torch, gloo-tcp, openmpi-tcp, openmpi-shm)"
            )
        })
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peer-run: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<ExitCode, PeerError> {
    // Orphaned ranks (a killed mpirun's) are re-parented here and reaped by the clean-up.
    session::become_subreaper()?;
    // Ctrl-C or a `timeout` must not orphan the running sweep, which sits in its own session.
    stop::on_signals()?;
    let base = if args.quick {
        Sweep::QUICK
    } else {
        Sweep::FULL
    };
    let sweep = Sweep::new(
        args.min.unwrap_or(base.min()),
        args.max.unwrap_or(base.max()),
        args.factor.unwrap_or(base.factor()),
        args.warmup.unwrap_or(base.warmup()),
        args.iters.unwrap_or(base.iters()),
    )?
    .scaled(base.is_scaled() && !args.flat);
    if args.ranks.is_empty() || args.ranks.iter().any(|&n| !(2..=64).contains(&n)) {
        return Err(PeerError::BadSweep(
            "rank counts must be between 2 and 64".to_owned(),
        ));
    }
    let plan = Plan {
        sweep,
        rounds: args.rounds.unwrap_or(3).max(1),
        ranks: args.ranks.clone(),
        systems: args.systems.clone().unwrap_or_else(|| System::ALL.to_vec()),
        case_limit: Duration::from_secs(args.case_timeout.unwrap_or(if args.quick {
            120
        } else {
            300
        })),
        budget: Duration::from_secs(args.budget.unwrap_or(if args.quick { 360 } else { 1500 })),
    };

    let mut versions = Vec::new();
    let tools = find_tools(&args, &mut versions);
    for note in &args.version_notes {
        if let Some((k, v)) = note.split_once('=') {
            versions.push((k.to_owned(), v.to_owned()));
        }
    }
    for (system, why) in [
        (System::GlooTcp, tools.python.as_ref().err()),
        (System::ChorusPy, tools.chorus_python.as_ref().err()),
        (System::ChorusTorch, tools.chorus_python.as_ref().err()),
        (
            System::OpenMpiTcp,
            tools
                .open_mpi
                .as_ref()
                .err()
                .or(tools.mpi_program.as_ref().err()),
        ),
    ] {
        if let Some(why) = why {
            eprintln!("peer-run: {} will not be measured: {why}", system.label());
        }
    }

    let here =
        std::env::current_exe().map_err(|e| PeerError::io("find this program's folder", e))?;
    let bin_dir = here.parent().unwrap_or(Path::new("."));
    let limits = LimitTools {
        memcpy: bin_dir.join("memcpy-bw"),
        tcp: bin_dir.join("tcp-stream"),
    };

    let raw = RawDir::new(args.out.join("raw"));
    raw.start(&Meta {
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        quick: args.quick,
        min: sweep.min(),
        max: sweep.max(),
        factor: sweep.factor(),
        warmup: sweep.warmup(),
        iters: sweep.iters(),
        scaled: sweep.is_scaled(),
        small_calls: SMALL_CALLS,
        small_up_to: SMALL_UP_TO,
        rounds: plan.rounds,
        ranks: plan.ranks.clone(),
        systems: plan.systems.clone(),
        cpu: cpu_model(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        versions,
    })?;

    let mut stderr = std::io::stderr();
    Runner {
        plan: &plan,
        tools: &tools,
        limits: &limits,
        raw: &raw,
        progress: &mut stderr,
    }
    .run()?;

    let written = report::write(&raw, &args.out)?;
    println!("{}", markdown::render(&written.summary));
    eprintln!(
        "peer-run: wrote {} and {}",
        written.markdown.display(),
        written.json.display()
    );
    match written.plot {
        Ok(png) => eprintln!("peer-run: wrote {}", png.display()),
        Err(e) => {
            eprintln!("peer-run: {e}");
            return Ok(ExitCode::FAILURE);
        }
    }
    if stop::requested() {
        eprintln!("peer-run: interrupted; the report holds what was measured before");
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::SUCCESS)
}

/// Finds each peer and says why when one cannot be used.
fn find_tools(args: &Args, versions: &mut Vec<(String, String)>) -> Tools {
    let python = match (&args.python, &args.python_missing) {
        (_, Some(why)) => Err(why.clone()),
        (None, None) => Err("no --python given".to_owned()),
        (Some(python), None) => check_torch(python).map(|version| {
            versions.push(("torch".to_owned(), version));
            python.clone()
        }),
    };
    let chorus_python = match (&args.python, &args.python_missing) {
        (_, Some(why)) => Err(why.clone()),
        (None, None) => Err("no --python given".to_owned()),
        (Some(python), None) => check_chorus(python).map(|version| {
            versions.push(("chorus (python)".to_owned(), version));
            python.clone()
        }),
    };
    let open_mpi = probe(&args.mpirun, &["--version"], Duration::from_secs(20))
        .and_then(|text| {
            OpenMpi::from_version_output(args.mpirun.clone(), &text).ok_or_else(|| {
                format!(
                    "{} is not Open MPI's (it said {:?})",
                    args.mpirun.display(),
                    first_line(&text)
                )
            })
        })
        .inspect(|mpi| {
            versions.push(("Open MPI".to_owned(), mpi.version.clone()));
        });
    let mpi_program = match (&args.mpi_program, &args.mpi_missing) {
        (_, Some(why)) => Err(why.clone()),
        (None, None) => Err("no --mpi-program given".to_owned()),
        (Some(p), None) if !p.is_file() => Err(format!(
            "{} not found (was mpi_allreduce.c compiled?)",
            p.display()
        )),
        (Some(p), None) => Ok(p.clone()),
    };
    Tools {
        chorus: args.chorus.clone(),
        python,
        gloo_script: args.gloo_script.clone(),
        chorus_python,
        chorus_py_script: args.chorus_py_script.clone(),
        open_mpi,
        mpi_program,
        as_root: rustix::process::geteuid().is_root(),
    }
}

/// Checks that `python` imports torch with a usable gloo backend; returns torch's version.
fn check_torch(python: &Path) -> Result<String, String> {
    let script = "import warnings; warnings.filterwarnings('ignore');\n\
                  import torch, torch.distributed as d\n\
                  assert d.is_available() and d.is_gloo_available(), 'torch.distributed has no gloo'\n\
                  print(torch.__version__)";
    // A first import after installing compiles bytecode for thousands of files: be patient.
    probe(python, &["-c", script], Duration::from_secs(180)).map(|out| out.trim().to_owned())
}

/// Checks that `python` imports the chorus package and numpy; returns chorus's version.
fn check_chorus(python: &Path) -> Result<String, String> {
    let script = "import numpy, chorus; print(chorus.__version__)";
    probe(python, &["-c", script], Duration::from_secs(60))
        .map(|out| out.trim().to_owned())
        .map_err(|e| format!("the chorus package is not usable there (pip install ./python): {e}"))
}

/// Runs a short probe under a deadline and returns its stdout, or why it failed.
fn probe(program: &Path, args: &[&str], limit: Duration) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("chorus-peer-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (out, err) = (dir.join("out"), dir.join("err"));
    let files = std::fs::File::create(&out).and_then(|o| Ok((o, std::fs::File::create(&err)?)));
    let (o, e) = files.map_err(|e| format!("cannot create probe files: {e}"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).stdout(Stdio::from(o)).stderr(Stdio::from(e));
    let outcome = session::run_in_session(&mut cmd, limit).map_err(|e| e.to_string());
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    match outcome?.ending {
        Ending::Exited(0) => Ok(stdout),
        ending => Err(format!(
            "{} {} failed ({ending:?}): {}",
            program.display(),
            args.first().copied().unwrap_or(""),
            stderr
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no message")
        )),
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}
