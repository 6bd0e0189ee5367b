//! `chorus bench [COLLECTIVE]`: nccl-tests' sweep and table for chorus, its ranks separate
//! processes on loopback, started and reaped by the same launcher as `chorus run` (each rank
//! is this binary again, as `chorus bench-rank`, reporting on its captured stdout).
//!
//! `--inject kill:R@I` / `stop:R@I` makes rank R kill or freeze itself before its I-th timed
//! call; the survivors' error, their shrink and the sweep going on on the smaller world are
//! shown live on stderr (and as `#` lines in the table when stdout is not a terminal), and
//! a frozen rank is killed and reaped by the launcher once the survivors are done.

mod options;
mod pattern;
pub(crate) mod rank;
mod report;
mod shape;
mod table;
mod wire;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use chorus::TransportChoice;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) use options::{Coll, SweepArgs};
pub(crate) use rank::RankArgs;

use crate::LaunchArgs;
use crate::exit::Verdict;
use crate::launcher::{JobSpec, LaunchEvent, Launcher, Layout, note};
use crate::size::ByteSize;
use report::{Doc, Incident, Measure, RankMs, Row};
use wire::{RankEvent, Timing};

const LABEL: &str = "chorus bench";

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// The collective to measure.
    #[arg(value_enum, default_value_t = Coll::AllReduce)]
    pub(crate) collective: Coll,
    /// Number of ranks (processes) on this node.
    #[arg(short = 'n', long = "ranks", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) ranks: u32,
    #[command(flatten)]
    pub(crate) sweep: SweepArgs,
    /// Data-plane transport between the ranks: auto (shm on one host), tcp, tcp-uring,
    /// tcp-epoll, quic, shm.
    #[arg(long, value_name = "T", default_value = "auto", value_parser = transport)]
    pub(crate) transport: TransportChoice,
    /// Print one JSON document (the `chorus_bench` schema) on stdout instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) launch: LaunchArgs,
}

fn transport(s: &str) -> Result<TransportChoice, String> {
    s.parse()
}

pub(crate) fn run(args: BenchArgs) -> Verdict {
    let plan = match crate::nodes::plan(&args.launch, args.ranks, crate::nodes::resolve) {
        Ok(p) => p,
        Err(e) => return crate::fail(LABEL, &e, Verdict::Usage),
    };
    let world = plan.layout.world();
    // Rank 0 reports the rows: the table is node 0's; the other nodes only run their ranks.
    let reports = plan.layout.hosts_root();
    let sizes = match args.sweep.sizes(world) {
        Ok(s) => s,
        Err(e) => return crate::fail(LABEL, &e, Verdict::Usage),
    };
    let config = match chorus::Config::from_env() {
        Ok(c) => c,
        Err(e) => return crate::fail(LABEL, &e.to_string(), Verdict::LauncherError),
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return crate::fail(
                LABEL,
                &format!("cannot find this program: {e}"),
                Verdict::LauncherError,
            );
        }
    };
    let mut rank_args: Vec<OsString> = vec!["bench-rank".into(), args.collective.name().into()];
    rank_args.extend(args.sweep.to_args());
    let mut env: Vec<(OsString, OsString)> =
        vec![("CHORUS_TRANSPORT".into(), args.transport.name().into())];
    // On one host no partition can split the job, so survivors may shrink however many
    // remain (with the default majority quorum, 2 ranks could not survive losing 1).
    if !args.sweep.inject.is_empty() && std::env::var_os("CHORUS_QUORUM").is_none() {
        env.push(("CHORUS_QUORUM".into(), "survivors".into()));
    }
    let spec = JobSpec {
        label: LABEL,
        layout: plan.layout,
        program: exe.into_os_string(),
        args: rank_args,
        root: plan.root,
        config,
        reap_budget: args.launch.reap_budget,
        final_wait: Duration::from_secs(5),
        timeout: args.launch.timeout,
        stop_on_failure: false,
        capture_stdout: true,
        env,
        token_file: args.launch.token_file.clone(),
        verbose: false,
    };
    let mut sweep = Sweep::new(&args, world, sizes.len());
    if reports {
        sweep.out.table(&sweep.banner(&args, &plan.layout, &sizes));
    } else {
        note(
            LABEL,
            &format!(
                "node {} of {}: ranks {}..={}; node 0 prints the table",
                plan.layout.node,
                plan.layout.nnodes,
                plan.layout.global(0),
                plan.layout.global(plan.layout.per_node - 1)
            ),
        );
    }
    let launcher = match Launcher::start(spec) {
        Ok(l) => l,
        Err(e) => return crate::fail(LABEL, &e.to_string(), Verdict::LauncherError),
    };
    let report = launcher.run(|l, event| sweep.on_event(l, event));
    sweep.out.pb.finish_and_clear();
    sweep.flush_incidents();
    let injected: BTreeSet<u32> = args.sweep.inject.iter().map(|j| j.rank).collect();
    let mut verdict = report.verdict(|rank| injected.contains(&rank));
    let wrong = Doc::wrong(&sweep.rows);
    let complete = !reports || sweep.rows.len() == sizes.len();
    if verdict == Verdict::Ok && (wrong > 0 || !complete || !sweep.fatal.is_empty()) {
        verdict = Verdict::RankFailed;
    }
    if complete && !sweep.fatal.is_empty() {
        let lost: Vec<String> = sweep.fatal.iter().map(|(r, _)| r.to_string()).collect();
        note(
            LABEL,
            &format!(
                "the sweep completed without rank(s) {}, which stopped on an error (exit \
                 status 1: a rank failed)",
                lost.join(", ")
            ),
        );
    }
    if !complete && verdict != Verdict::Ok {
        note(
            LABEL,
            &format!(
                "the sweep stopped after {} of {} sizes",
                sweep.rows.len(),
                sizes.len()
            ),
        );
    }
    let avg = Doc::average_busbw(&sweep.rows);
    if !reports {
        return verdict;
    }
    if args.json {
        let doc = Doc {
            chorus_bench: report::SCHEMA,
            collective: args.collective.name().into(),
            ranks: world,
            transport: args.transport.name().into(),
            dtype: args.sweep.dtype.name().into(),
            op: sweep.redop.clone(),
            warmup: args.sweep.warmup,
            iters: args.sweep.iters,
            library: format!("chorus {}", env!("CARGO_PKG_VERSION")),
            rows: sweep.rows.clone(),
            avg_busbw_gbs: avg,
            incidents: sweep.incidents.iter().map(|o| o.incident.clone()).collect(),
        };
        match serde_json::to_string_pretty(&doc) {
            Ok(text) => sweep.out.stdout(&text),
            Err(e) => note(LABEL, &format!("cannot write the JSON document: {e}")),
        }
    } else {
        sweep.out.table(&table::footer(wrong, avg));
    }
    verdict
}

/// Where the bench's output goes: the table (or JSON) on stdout, live news on stderr, a
/// progress bar on stderr when it is a terminal.
struct Out {
    json: bool,
    stdout_tty: bool,
    pb: ProgressBar,
}

impl Out {
    fn stdout(&self, text: &str) {
        self.pb.suspend(|| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        });
    }

    /// A line of the table (nothing with `--json`).
    fn table(&self, text: &str) {
        if !self.json {
            self.stdout(text);
        }
    }

    /// News as it happens: on stderr, and in the table as a comment when the table goes to a
    /// file (on a terminal, stderr is already beside it).
    fn live(&self, text: &str) {
        self.pb.suspend(|| note(LABEL, text));
        if !self.stdout_tty {
            self.table(&format!("# {text}"));
        }
    }
}

/// The state of one sweep as the launcher sees it.
struct Sweep {
    out: Out,
    coll: Coll,
    dtype: String,
    redop: String,
    /// The world the sweep started with, and the world now.
    initial: u32,
    world: u32,
    rows: Vec<Row>,
    incidents: Vec<Open>,
    /// Ranks that froze themselves; killed once everyone else is gone.
    frozen: BTreeSet<u32>,
    /// Ranks whose communicator is up (init done).
    ready: BTreeSet<u32>,
    fatal: Vec<(u32, String)>,
    total: usize,
}

/// An incident and what has been printed of it.
struct Open {
    incident: Incident,
    injected_ns: Option<u64>,
    detect_shown: bool,
    shrink_shown: bool,
}

impl Sweep {
    fn new(args: &BenchArgs, world: u32, total: usize) -> Sweep {
        let pb = if std::io::stderr().is_terminal() {
            ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) =
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} sizes, {msg} ({elapsed})")
        {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_prefix(format!("{} on {world} ranks", args.collective));
        pb.set_message("starting ranks");
        let stdout_tty = std::io::stdout().is_terminal();
        Sweep {
            out: Out {
                json: args.json,
                stdout_tty,
                pb,
            },
            coll: args.collective,
            dtype: args.sweep.dtype.name().into(),
            redop: if args.collective.reduces() {
                args.sweep.op.name().into()
            } else {
                "none".into()
            },
            initial: world,
            world,
            rows: Vec::new(),
            incidents: Vec::new(),
            frozen: BTreeSet::new(),
            ready: BTreeSet::new(),
            fatal: Vec::new(),
            total,
        }
    }

    fn banner(&self, args: &BenchArgs, layout: &Layout, sizes: &[u64]) -> String {
        let s = &args.sweep;
        let first = sizes.first().copied().unwrap_or(0);
        let last = sizes.last().copied().unwrap_or(0);
        let mut text = format!(
            "# chorus bench {}: {} ranks ({}), transport {}\n\
             # {} to {} (x{}), type {}, op {}, warm-up {}, iterations {}, check {}",
            self.coll,
            layout.world(),
            where_ranks(args, layout),
            args.transport,
            ByteSize(first),
            ByteSize(last),
            s.factor,
            self.dtype,
            self.redop,
            s.warmup,
            s.iters,
            s.check
        );
        for j in &s.inject {
            text.push_str(&format!("\n# inject: {j}"));
        }
        text.push('\n');
        text.push_str(&table::header());
        text
    }

    fn on_event(&mut self, launcher: &mut Launcher, event: &LaunchEvent) {
        match event {
            LaunchEvent::Line { rank, line } => match RankEvent::parse(line) {
                Some(RankEvent::Fatal { rank, error }) => {
                    if chorus::ErrorKind::from_text(&error) == Some(chorus::ErrorKind::NoQuorum) {
                        self.out.live(&format!(
                            "rank {rank} is cut off from a quorum and stops; the others go on \
                             without it: {error}"
                        ));
                    } else {
                        self.out.live(&format!("rank {rank} cannot go on: {error}"));
                    }
                    self.fatal.push((rank, error));
                    // A rank that failed its init: the others would only wait for it until
                    // their init deadline, so stop them now. Once it was up, the others
                    // shrink and go on (see README, "When a rank fails").
                    if !self.ready.contains(&rank) {
                        launcher.stop_after_failure(rank);
                    }
                }
                Some(RankEvent::Ready { rank }) => {
                    self.ready.insert(rank);
                }
                Some(ev) => self.on_rank_event(ev),
                // Whatever else a rank prints is passed on, named.
                None => self
                    .out
                    .pb
                    .suspend(|| note(LABEL, &format!("rank {rank}: {line}"))),
            },
            LaunchEvent::Ended(end) => {
                if !end.how.ok() {
                    self.out.live(&end.to_string());
                    let injected = self
                        .incidents
                        .iter()
                        .any(|o| o.incident.rank == Some(end.rank));
                    if !self.ready.contains(&end.rank) && !injected {
                        launcher.stop_after_failure(end.rank);
                    }
                }
            }
            LaunchEvent::Done => {}
        }
        let live = launcher.live();
        if !live.is_empty() && live.iter().all(|r| self.frozen.contains(r)) {
            for rank in live {
                launcher.kill(
                    rank,
                    "frozen by --inject and left behind; the sweep is over",
                );
            }
        }
    }

    fn on_rank_event(&mut self, ev: RankEvent) {
        match ev {
            RankEvent::Row {
                size,
                count,
                world,
                root,
                out_of_place,
                in_place,
            } => {
                let measure = |t: Option<Timing>| {
                    t.map(|t| {
                        let (algbw, busbw) = shape::bandwidth(self.coll, size, t.time_us, world);
                        Measure {
                            time_us: t.time_us,
                            algbw_gbs: algbw,
                            busbw_gbs: busbw,
                            wrong: t.wrong,
                        }
                    })
                };
                let row = Row {
                    size,
                    count,
                    dtype: self.dtype.clone(),
                    redop: self.redop.clone(),
                    root,
                    out_of_place: measure(out_of_place),
                    in_place: measure(in_place),
                    ranks: world,
                };
                let note = if world != self.initial {
                    format!("[{world} ranks]")
                } else {
                    String::new()
                };
                self.out.table(&table::row(
                    size,
                    count,
                    &self.dtype,
                    &self.redop,
                    root,
                    row.out_of_place.as_ref(),
                    row.in_place.as_ref(),
                    &note,
                ));
                self.rows.push(row);
                self.out.pb.inc(1);
                let left = self.total.saturating_sub(self.rows.len());
                self.out
                    .pb
                    .set_message(format!("{left} to go on {world} ranks"));
            }
            RankEvent::Inject {
                rank,
                kind,
                iter,
                size,
                mode,
                t_ns,
            } => {
                if kind == "stop" {
                    self.frozen.insert(rank);
                }
                let how = if kind == "stop" {
                    "frozen (SIGSTOP)"
                } else {
                    "killed (SIGKILL)"
                };
                self.out.live(&format!(
                    "rank {rank} {how} before timed call {iter}: {} {mode}, {} ranks",
                    ByteSize(size),
                    self.world
                ));
                self.incidents.push(Open {
                    incident: Incident {
                        kind,
                        rank: Some(rank),
                        iter: Some(iter),
                        size,
                        mode: Some(mode),
                        world_before: self.world,
                        detect_ms: Vec::new(),
                        shrink_ms: Vec::new(),
                        world_after: None,
                        epoch_after: None,
                        error: None,
                    },
                    injected_ns: Some(t_ns),
                    detect_shown: false,
                    shrink_shown: false,
                });
            }
            RankEvent::Failed {
                rank,
                world,
                size,
                t_ns,
                error,
            } => {
                let open = self.open_incident(world, size);
                let i = &mut open.incident;
                if i.detect_ms.iter().all(|d| d.rank != rank) {
                    let ms = open
                        .injected_ns
                        .map_or(0.0, |t0| t_ns.saturating_sub(t0) as f64 / 1e6);
                    i.detect_ms.push(RankMs { rank, ms });
                }
                if i.error.is_none() {
                    i.error = Some(error);
                }
                self.show_progress();
            }
            RankEvent::Shrunk {
                rank,
                world,
                epoch,
                shrink_ms,
                ..
            } => {
                self.world = world;
                let open = self.open_incident(world, 0);
                let i = &mut open.incident;
                i.shrink_ms.push(RankMs {
                    rank,
                    ms: shrink_ms,
                });
                i.world_after = Some(world);
                i.epoch_after = Some(epoch);
                self.show_progress();
            }
            // Handled with the launcher at hand, in `on_event`.
            RankEvent::Fatal { .. } | RankEvent::Ready { .. } => {}
        }
    }

    /// The incident a failure or shrink belongs to: the latest one not yet shrunk from, or
    /// a new one for a failure nobody injected.
    fn open_incident(&mut self, world: u32, size: u64) -> &mut Open {
        let reuse = self.incidents.last().is_some_and(|o| {
            o.incident.world_after.is_none() || o.incident.shrink_ms.len() < expected(o)
        });
        if !reuse {
            self.incidents.push(Open {
                incident: Incident {
                    kind: "failure".into(),
                    rank: None,
                    iter: None,
                    size,
                    mode: None,
                    world_before: world,
                    detect_ms: Vec::new(),
                    shrink_ms: Vec::new(),
                    world_after: None,
                    epoch_after: None,
                    error: None,
                },
                injected_ns: None,
                detect_shown: false,
                shrink_shown: false,
            });
        }
        let last = self.incidents.len() - 1;
        &mut self.incidents[last]
    }

    /// Prints what is complete of the latest incident: the detection once every survivor
    /// has failed (or one has shrunk), the shrink once every survivor has shrunk.
    fn show_progress(&mut self) {
        let Some(open) = self.incidents.last_mut() else {
            return;
        };
        let survivors = expected(open);
        let mut lines = Vec::new();
        if !open.detect_shown
            && (open.incident.detect_ms.len() >= survivors || !open.incident.shrink_ms.is_empty())
        {
            open.detect_shown = true;
            lines.push(detect_line(open));
        }
        if !open.shrink_shown && open.incident.shrink_ms.len() >= survivors {
            open.shrink_shown = true;
            lines.push(shrink_line(open));
        }
        for line in lines {
            self.out.live(&line);
        }
    }

    /// Prints whatever of the incidents was not printed yet (the sweep ended first).
    fn flush_incidents(&mut self) {
        let mut lines = Vec::new();
        for open in &mut self.incidents {
            if !open.detect_shown && !open.incident.detect_ms.is_empty() {
                open.detect_shown = true;
                lines.push(detect_line(open));
            }
            if !open.shrink_shown && !open.incident.shrink_ms.is_empty() {
                open.shrink_shown = true;
                lines.push(shrink_line(open));
            }
        }
        for line in lines {
            self.out.live(&line);
        }
    }
}

/// How many survivors an incident expects to hear from.
fn expected(open: &Open) -> usize {
    let gone = usize::from(open.incident.rank.is_some());
    (open.incident.world_before as usize)
        .saturating_sub(gone)
        .max(1)
}

fn detect_line(open: &Open) -> String {
    let i = &open.incident;
    let error = i.error.as_deref().unwrap_or("");
    match (report::range(&i.detect_ms), open.injected_ns) {
        (Some((lo, hi)), Some(_)) => format!(
            "detected by {}/{} survivors {} after the injection: {error}",
            i.detect_ms.len(),
            expected(open),
            span(lo, hi)
        ),
        _ => format!("{} rank(s) saw a failure: {error}", i.detect_ms.len()),
    }
}

fn shrink_line(open: &Open) -> String {
    let i = &open.incident;
    let (lo, hi) = report::range(&i.shrink_ms).unwrap_or((0.0, 0.0));
    format!(
        "shrunk to {} ranks (epoch {}) in {}; the sweep goes on from {}",
        i.world_after.unwrap_or(0),
        i.epoch_after.unwrap_or(0),
        span(lo, hi),
        ByteSize(i.size)
    )
}

/// `12.3 ms` or `12.3-15.0 ms`.
/// Where the ranks run, for the banner.
fn where_ranks(args: &BenchArgs, layout: &Layout) -> String {
    if layout.multi() {
        format!("{} nodes of {}", layout.nnodes, layout.per_node)
    } else {
        let at = match (&args.launch.master, args.launch.bind) {
            (Some(master), _) => master.clone(),
            (None, Some(bind)) => bind.ip().to_string(),
            (None, None) => "127.0.0.1".to_owned(),
        };
        format!("processes on {at}")
    }
}

fn span(lo: f64, hi: f64) -> String {
    if (hi - lo).abs() < 0.05 {
        format!("{lo:.1} ms")
    } else {
        format!("{lo:.1}-{hi:.1} ms")
    }
}
