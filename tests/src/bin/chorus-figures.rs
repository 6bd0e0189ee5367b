//! `chorus-figures`: the runtime's figures over repeats, measured on real processes on
//! loopback with the `chorus-tests` harness, printed as a Markdown table.
//!
//! - detection latency per fault kind (SIGKILL with same-host evidence, SIGKILL without it,
//!   SIGSTOP): from the signal to each survivor's failed all-reduce;
//! - abort-to-release: seed 001, from the parent's `abort()` to the return of the operation
//!   blocked on its split child;
//! - shrink time (the `shrink()` call, every survivor) after a SIGKILL at 4 and 8 ranks;
//! - grow time (the members' `grow(1)` call, the newcomer already waiting) to 4 and 8 ranks;
//! - init time at 8 and 32 ranks: each rank's `Comm::from_env` call, and the whole job from
//!   the first process started to the last rank ready.
//!
//! `chorus-figures cut` measures one thing instead: a rank of 4 cut off from every peer
//! while alive (its packets dropped in a network namespace of its own, as
//! `tests/tests/partition.rs` does; needs root, `ip` and `nft`), the time it spends in the
//! `shrink()` that fails with `no-quorum`, from the cut to that return, and the others'
//! `shrink()`; heartbeats every tenth of the deadline (default `--deadline 1s`).
//!
//! `chorus-figures hosts` measures detection across network-namespace hosts instead
//! (`figures/hosts.rs`).
//! `chorus-figures soak --duration 10m` (also `--soak 10m`) and `chorus-figures attack
//! --duration 10m` run the loaded soak and the attack for longer (their own module files).
//!
//! Build everything first, then run (the rank program is found beside this binary):
//!
//! ```sh
//! cargo build --release -p chorus-tests --bins
//! target/release/chorus-figures [--repeats N] [--heartbeat 200ms --deadline 2s]
//! target/release/chorus-figures cut [--repeats 20] [--deadline 1s]
//! target/release/chorus-figures help            # every mode and option (clap)
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)] // a report on stdout, progress on stderr
#![allow(clippy::unwrap_used)] // a measuring tool: a failed run is a failed measurement

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chorus_tests::clock::{mono_ns, ms_between};
use chorus_tests::stats::percentile;
use chorus_tests::{Job, JobSpec};
use clap::{CommandFactory as _, Parser, Subcommand};
use rand::{Rng, SeedableRng};

const WAIT: Duration = Duration::from_secs(60);

#[path = "figures/hosts.rs"]
mod hosts;

/// The command line: the default figures, or one mode.
#[derive(Parser)]
#[command(
    name = "chorus-figures",
    about = "The runtime's figures over repeats, on real processes (a Markdown table)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    figures: Figures,
    /// Run the soak for this long (the same as `soak --duration SPAN`).
    #[arg(long, value_name = "SPAN", value_parser = soak::span)]
    soak: Option<Duration>,
}

#[derive(Subcommand)]
enum Mode {
    /// Only the cut-off minority of one of 4 (root, `ip` and `nft`).
    Cut(CutArgs),
    /// Detection across network-namespace hosts (root, `ip`, `nft`, `unshare`).
    Hosts(hosts::Args),
    /// The loaded soak: continuous all-reduces beside busy processes.
    Soak(soak::Args),
    /// The attack test's scenario for longer.
    Attack(attack::Args),
}

/// The default figures' options.
#[derive(clap::Args)]
struct Figures {
    /// Runs per figure.
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// `CHORUS_HEARTBEAT_INTERVAL` of the ranks.
    #[arg(long, default_value = "200ms")]
    heartbeat: String,
    /// `CHORUS_HEARTBEAT_DEADLINE` of the ranks.
    #[arg(long, default_value = "2s")]
    deadline: String,
    #[command(flatten)]
    rank: RankProgram,
}

#[derive(clap::Args)]
struct CutArgs {
    /// Runs measured.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// The heartbeat deadline (heartbeats every tenth of it).
    #[arg(long, default_value = "1s", value_parser = soak::span)]
    deadline: Duration,
    #[command(flatten)]
    rank: RankProgram,
}

/// Where `chorus-test-rank` is; every mode takes it.
#[derive(clap::Args, Clone)]
pub(crate) struct RankProgram {
    /// The rank program, `chorus-test-rank` (by default the one beside this executable).
    #[arg(long = "rank-program", value_name = "PATH", default_value_os_t = rank_program())]
    path: PathBuf,
}

impl RankProgram {
    /// The path, or a usage error if nothing is there.
    pub(crate) fn checked(self) -> PathBuf {
        if !self.path.is_file() {
            Cli::command()
                .error(
                    clap::error::ErrorKind::InvalidValue,
                    format!(
                        "no rank program at {} (cargo build -p chorus-tests --bins)",
                        self.path.display()
                    ),
                )
                .exit();
        }
        self.path
    }
}

/// What the default figures' runs need.
struct Opts {
    repeats: usize,
    heartbeat: String,
    deadline: String,
    bin: PathBuf,
}

#[path = "chorus-figures/attack.rs"]
mod attack;
#[path = "chorus-figures/soak.rs"]
mod soak;

fn main() {
    let cli = Cli::parse();
    match cli.mode {
        Some(Mode::Hosts(args)) => return hosts::main(args),
        Some(Mode::Soak(args)) => return soak::main(args),
        Some(Mode::Attack(args)) => return attack::main(args),
        Some(Mode::Cut(args)) => return cut_figures(args),
        None => {}
    }
    if let Some(duration) = cli.soak {
        return soak::main(soak::Args::for_span(duration, cli.figures.rank));
    }
    let f = cli.figures;
    let opts = Opts {
        repeats: f.repeats,
        heartbeat: f.heartbeat,
        deadline: f.deadline,
        bin: f.rank.checked(),
    };
    let started = Instant::now();
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let r = opts.repeats;

    let mut kill_same = Vec::new();
    let mut kill_remote = Vec::new();
    let mut stop = Vec::new();
    let mut shrink4 = Vec::new();
    let mut shrink8 = Vec::new();
    for i in 0..r {
        progress(&format!("SIGKILL (same-host evidence) {}/{r}", i + 1));
        let (d, s) = fault_run(&opts, 4, libc::SIGKILL, true, i as u64);
        kill_same.extend(d);
        shrink4.extend(s);
        progress(&format!("SIGKILL (same-host evidence off) {}/{r}", i + 1));
        let (d, s) = fault_run(&opts, 4, libc::SIGKILL, false, 1000 + i as u64);
        kill_remote.extend(d);
        shrink4.extend(s);
        progress(&format!("SIGKILL at 8 ranks {}/{r}", i + 1));
        let (_, s) = fault_run(&opts, 8, libc::SIGKILL, true, 2000 + i as u64);
        shrink8.extend(s);
    }
    let stops = r.div_ceil(2).max(3);
    for i in 0..stops {
        progress(&format!("SIGSTOP {}/{stops}", i + 1));
        let (d, s) = fault_run(&opts, 4, libc::SIGSTOP, true, 3000 + i as u64);
        stop.extend(d);
        shrink4.extend(s);
    }
    rows.push((
        "detection: SIGKILL, same-host evidence (ms)".into(),
        kill_same,
    ));
    rows.push((
        "detection: SIGKILL, same-host evidence off (ms)".into(),
        kill_remote,
    ));
    rows.push((
        format!("detection: SIGSTOP, deadline {} (ms)", opts.deadline),
        stop,
    ));

    let mut release = Vec::new();
    for i in 0..r {
        progress(&format!("abort-to-release {}/{r}", i + 1));
        release.push(abort_to_release(&opts));
    }
    rows.push(("abort-to-release, seed 001 (ms)".into(), release));
    rows.push(("shrink after SIGKILL, 4 ranks (ms)".into(), shrink4));
    rows.push(("shrink after SIGKILL, 8 ranks (ms)".into(), shrink8));

    let mut grow4 = Vec::new();
    let mut grow8 = Vec::new();
    for i in 0..r {
        progress(&format!("grow {}/{r}", i + 1));
        grow4.extend(grow_run(&opts, 4));
        grow8.extend(grow_run(&opts, 8));
    }
    rows.push(("grow 3 -> 4 ranks (ms)".into(), grow4));
    rows.push(("grow 7 -> 8 ranks (ms)".into(), grow8));

    let inits = r.div_ceil(2).max(3);
    let (mut init8, mut job8, mut init32, mut job32) = (vec![], vec![], vec![], vec![]);
    for i in 0..inits {
        progress(&format!("init {}/{inits}", i + 1));
        let (each, all) = init_run(&opts, 8);
        init8.extend(each);
        job8.push(all);
        let (each, all) = init_run(&opts, 32);
        init32.extend(each);
        job32.push(all);
    }
    rows.push(("init, 8 ranks: each rank's call (ms)".into(), init8));
    rows.push(("init, 8 ranks: first start to all ready (ms)".into(), job8));
    rows.push(("init, 32 ranks: each rank's call (ms)".into(), init32));
    rows.push((
        "init, 32 ranks: first start to all ready (ms)".into(),
        job32,
    ));

    println!(
        "heartbeat {} / deadline {}, loopback, {} repeats, {:.0} s\n",
        opts.heartbeat,
        opts.deadline,
        r,
        started.elapsed().as_secs_f64()
    );
    table(&rows);
}

/// `chorus-figures cut`: the cut-off minority of one of 4, `--repeats` times.
fn cut_figures(args: CutArgs) {
    let started = Instant::now();
    let deadline = args.deadline;
    let (repeats, bin) = (args.repeats, args.rank.checked());
    let ns = chorus_tests::netns::Netns::enter("figures").unwrap_or_else(|why| {
        eprintln!("chorus-figures: cannot cut a rank off here: {why}");
        std::process::exit(1);
    });
    let (mut shrink, mut after_cut, mut majority) = (Vec::new(), Vec::new(), Vec::new());
    // A run in which a rank does something else than the scenario says panics with every
    // rank's reports (on stderr); it is counted, not measured, and another run takes its
    // place, up to as many again.
    let mut failed = 0;
    while shrink.len() < repeats && failed < repeats {
        progress(&format!(
            "cut-off rank of 4 {}/{repeats} ({failed} failed)",
            shrink.len() + 1,
        ));
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            chorus_tests::cut::run(&ns, &bin, 4, deadline)
        }));
        match attempt {
            Ok(run) => {
                shrink.push(run.shrink_ms);
                after_cut.push(run.cut_to_no_quorum_ms);
                majority.extend(run.majority_shrink_ms);
            }
            Err(_) => failed += 1,
        }
    }
    drop(ns);
    println!(
        "heartbeat {:?} / deadline {:?}, loopback in a network namespace, rank 3 of 4 cut \
         off by nftables, {} runs measured, {failed} failed, {:.0} s\n",
        deadline / 10,
        deadline,
        shrink.len(),
        started.elapsed().as_secs_f64()
    );
    table(&[
        ("minority shrink() until no-quorum (ms)".into(), shrink),
        ("cut to the minority's no-quorum (ms)".into(), after_cut),
        ("majority shrink(), 4 -> 3 ranks (ms)".into(), majority),
    ]);
}

fn table(rows: &[(String, Vec<f64>)]) {
    println!("| figure | n | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, samples) in rows {
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} |",
            samples.len(),
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            percentile(samples, 100.0)
        );
    }
}

fn spec(opts: &Opts, world: u32) -> JobSpec {
    JobSpec::new(world)
        .env("CHORUS_HEARTBEAT_INTERVAL", &opts.heartbeat)
        .env("CHORUS_HEARTBEAT_DEADLINE", &opts.deadline)
}

/// One job of `world` ranks in the all-reduce loop; the last rank gets `signal` at a seeded
/// random point. Returns each survivor's detection latency and shrink time.
fn fault_run(
    opts: &Opts,
    world: u32,
    signal: i32,
    same_host: bool,
    seed: u64,
) -> (Vec<f64>, Vec<f64>) {
    let spec = spec(opts, world)
        .env(
            "CHORUS_SAME_HOST_EVIDENCE",
            if same_host { "1" } else { "0" },
        )
        .env("CT_START", "loop")
        .env("CT_ON_FAIL", "shrink");
    let mut job = Job::start(&opts.bin, spec);
    let victim = world as usize - 1;
    for s in 0..world as usize {
        job.wait_for(s, "looping", WAIT);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    std::thread::sleep(Duration::from_millis(rng.random_range(50..350)));
    let at = job.signal(victim, signal);
    let mut detect = Vec::new();
    for s in 0..victim {
        let f = job.wait_for(s, "failed", WAIT);
        detect.push(ms_between(at, f.t()));
    }
    let mut shrink = Vec::new();
    for s in 0..victim {
        shrink.push(job.wait_for(s, "shrunk", WAIT).f64("ms").unwrap());
    }
    let survivors: Vec<usize> = (0..victim).collect();
    job.send_all(&survivors, "finish");
    for &s in &survivors {
        job.wait_for(s, "finished", WAIT);
    }
    let left = job.close();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    (detect, shrink)
}

/// Seed 001 once: the parent's abort releases an operation blocked on its split child.
fn abort_to_release(opts: &Opts) -> f64 {
    let mut job = Job::start(&opts.bin, spec(opts, 4));
    job.send_all(&[0, 1, 2, 3], "split-abort 50");
    let r = job.wait_for(0, "released", WAIT);
    let ms = ms_between(r.u64("t_abort").unwrap(), r.t());
    let left = job.close();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    ms
}

/// `world - 1` members grow by one newcomer that is already asking to join.
fn grow_run(opts: &Opts, world: u32) -> Vec<f64> {
    let members: Vec<usize> = (0..world as usize - 1).collect();
    let mut job = Job::start(&opts.bin, spec(opts, world - 1));
    let token = job.ready(0).str("grow_token").unwrap().to_owned();
    let newcomer = job.spawn_joiner(&token);
    // Let the newcomer start and reach the coordinator before the members grow.
    std::thread::sleep(Duration::from_millis(300));
    job.send_all(&members, "grow 1");
    let mut ms = Vec::new();
    for &s in &members {
        ms.push(job.wait_for(s, "grown", WAIT).f64("ms").unwrap());
    }
    job.wait_for(newcomer, "joined", WAIT);
    let left = job.close();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    ms
}

/// A job of `world` ranks: each rank's init call, and first process start to last ready.
fn init_run(opts: &Opts, world: u32) -> (Vec<f64>, f64) {
    let t0 = mono_ns();
    let job = Job::start(&opts.bin, spec(opts, world));
    let each: Vec<f64> = (0..world as usize)
        .map(|s| job.ready(s).f64("ms").unwrap())
        .collect();
    let last = (0..world as usize).map(|s| job.ready(s).t()).max().unwrap();
    let all = ms_between(t0, last);
    let left = job.close();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    (each, all)
}

fn progress(what: &str) {
    eprintln!("chorus-figures: {what}");
}

/// `chorus-test-rank` beside this executable.
fn rank_program() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default()
        .join("chorus-test-rank")
}
