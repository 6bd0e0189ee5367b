//! `chorus-figures soak --duration 10m` (or `chorus-figures --soak 10m`): 4 ranks of
//! continuous all-reduces, 8 B to 4 MiB, at the default heartbeat and deadline, beside a
//! load of busy processes (2 per core by default). Reports the false deaths — any failed
//! operation, since nothing is injected (must be 0) — and the heartbeat lateness each rank
//! measured where it receives heartbeats (p50, p99, max). A job that fails is replaced by a
//! fresh one until the duration is spent, so the count covers the whole run.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chorus_tests::{Job, JobSpec};

/// Element counts (f64) the loop cycles through: 8 B, 1 KiB, 64 KiB, 1 MiB, 4 MiB.
const SIZES: &str = "1,128,8192,131072,524288";

const WAIT: Duration = Duration::from_secs(60);

/// A new job starts only while more than this is left of the soak.
const JOB_MARGIN: Duration = Duration::from_secs(5);

/// `chorus-figures soak`'s options.
#[derive(clap::Args)]
pub(super) struct Args {
    /// How long to soak (`10m`, `90s`).
    #[arg(long, default_value = "10m", value_parser = span)]
    duration: Duration,
    /// Ranks in the job.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    ranks: u32,
    /// Busy processes beside it (default: 2 per core).
    #[arg(long)]
    busy: Option<usize>,
    #[command(flatten)]
    rank: super::RankProgram,
}

impl Args {
    /// `chorus-figures --soak SPAN`: the defaults, for `duration`.
    pub(super) fn for_span(duration: Duration, rank: super::RankProgram) -> Args {
        Args {
            duration,
            ranks: 4,
            busy: None,
            rank,
        }
    }
}

struct Opts {
    duration: Duration,
    ranks: u32,
    busy: usize,
    bin: PathBuf,
}

pub(super) fn main(args: Args) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let opts = Opts {
        duration: args.duration,
        ranks: args.ranks,
        busy: args.busy.unwrap_or(2 * cores),
        bin: args.rank.checked(),
    };
    if opts.duration <= JOB_MARGIN {
        // A job starts only with more than this left, so a shorter soak would measure nothing.
        eprintln!(
            "chorus-figures soak: --duration {:?} is too short to start a job (more than {JOB_MARGIN:?})",
            opts.duration
        );
        std::process::exit(2);
    }
    let started = Instant::now();
    let _load = Load::start(opts.busy);
    let (mut false_deaths, mut jobs, mut iters) = (Vec::new(), 0, 0u64);
    let mut rows: Vec<(usize, u64, f64, f64, f64)> = Vec::new();
    while started.elapsed() + JOB_MARGIN < opts.duration {
        jobs += 1;
        let left = opts.duration.saturating_sub(started.elapsed());
        let spec = JobSpec::new(opts.ranks)
            .env("CT_START", "loop")
            .env("CT_ON_FAIL", "idle")
            .env("CT_SIZES", SIZES)
            .env("CT_LIFETIME_S", left.as_secs() + 300);
        let mut job = Job::start(&opts.bin, spec);
        let slots: Vec<usize> = (0..opts.ranks as usize).collect();
        for &s in &slots {
            job.wait_for(s, "looping", WAIT);
        }
        super::progress(&format!(
            "soak job {jobs}: {} ranks looping, {:.0} s left",
            opts.ranks,
            left.as_secs_f64()
        ));
        let until = Instant::now() + left;
        let mut failed = false;
        while Instant::now() < until && !failed {
            std::thread::sleep(Duration::from_secs(1));
            for &s in &slots {
                for f in job.pending(s, "failed") {
                    super::progress(&format!("false death seen by slot {s}: {f}"));
                    false_deaths.push(format!("job {jobs}, slot {s}: {f}"));
                    failed = true;
                }
            }
        }
        if failed {
            drop(job);
            continue;
        }
        job.send_all(&slots, "finish");
        for &s in &slots {
            match job.try_wait_any(s, &["finished"], WAIT) {
                Ok(f) => {
                    iters += f.u64("iters").unwrap_or(0);
                    if f.bool("peers_alive") != Some(true) {
                        false_deaths.push(format!("job {jobs}, slot {s}: {f}"));
                    }
                    rows.push((
                        s,
                        f.u64("hb_count").unwrap_or(0),
                        f.f64("hb_late_p50_ms").unwrap_or(f64::NAN),
                        f.f64("hb_late_p99_ms").unwrap_or(f64::NAN),
                        f.f64("hb_late_max_ms").unwrap_or(f64::NAN),
                    ));
                }
                Err(why) => false_deaths.push(format!("job {jobs}, slot {s}: no finish: {why}")),
            }
        }
        let left = job.close();
        assert!(left.is_empty(), "processes left behind: {left:?}");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "soak: {} ranks, all-reduce 8 B..4 MiB, default heartbeat and deadline \
         (CHORUS_HEARTBEAT_INTERVAL/DEADLINE unset), {} busy processes on {cores} cores, \
         {:.0} s, {jobs} job(s), {iters} all-reduces counted at finish\n",
        opts.ranks,
        opts.busy,
        started.elapsed().as_secs_f64()
    );
    // A false death is a live rank declared dead (its observers' `MissedDeadline`, or any
    // other death evidence); the failures it causes on every rank are listed below it.
    let mut dead: Vec<(u64, u64)> = false_deaths_of(&false_deaths);
    dead.dedup();
    println!(
        "false deaths: {} (ranks declared dead); failed operations: {}",
        dead.len(),
        false_deaths.len()
    );
    for f in &false_deaths {
        println!("- {f}");
    }
    println!("\n| slot | heartbeats | lateness p50 (ms) | p99 (ms) | max (ms) |");
    println!("|---:|---:|---:|---:|---:|");
    for (s, n, p50, p99, max) in &rows {
        println!("| {s} | {n} | {p50:.1} | {p99:.1} | {max:.1} |");
    }
    if !false_deaths.is_empty() {
        std::process::exit(1);
    }
}

/// The (job, rank) of each rank declared dead, from the failure lines (`job J, slot S:
/// {...}` with `peer-failed` and the peer's rank).
fn false_deaths_of(lines: &[String]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|l| {
            let job = l.strip_prefix("job ")?.split(',').next()?.parse().ok()?;
            let json = &l[l.find('{')?..];
            let v: serde_json::Value = serde_json::from_str(json).ok()?;
            (v.get("kind")?.as_str()? == "peer-failed").then_some(())?;
            Some((job, v.get("peer")?.as_u64()?))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Busy processes beside the job: each spins on a core until dropped.
struct Load(Vec<Child>);

impl Load {
    fn start(n: usize) -> Load {
        let children = (0..n)
            .filter_map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .ok()
            })
            .collect::<Vec<_>>();
        if children.len() < n {
            super::progress(&format!(
                "only {} of {n} busy processes started",
                children.len()
            ));
        }
        Load(children)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `10m`, `90s`, `1.5s` or `800ms`: more than zero, under a day.
pub(super) fn span(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a span such as 10m, 90s, 1.5s or 800ms (under a day)");
    let (n, unit) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 0.001)
    } else if let Some(m) = s.strip_suffix('m') {
        (m, 60.0)
    } else {
        (s.strip_suffix('s').ok_or_else(bad)?, 1.0)
    };
    let v: f64 = n.parse().map_err(|_| bad())?;
    let secs = v * unit;
    if secs.is_finite() && secs > 0.0 && secs < 86_400.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(bad())
    }
}
