//! The local launcher behind `chorus run` and `chorus bench`: it hosts the job's bootstrap
//! root, starts every rank in its own process group with the launch environment set,
//! witnesses every exit for the job, forwards SIGINT/SIGTERM/SIGHUP, and reaps with a
//! no-progress budget, leaving no process behind.
//!
//! Driving it is a loop over [`Launcher::next_event`]: rank exits and, when stdout is
//! captured, the lines the ranks print. Waiting for the ranks has no total deadline (a job
//! may run for days) unless `--timeout` gives one; once the job is stopping (a signal, the
//! timeout, a failure under `--on-failure stop`), the launcher keeps waiting as long as
//! ranks keep exiting, and only after a whole budget passes with no exit does it SIGKILL
//! the rest — a slow teardown under load is not a hang, a wedged one is (seed `004_…`).

mod cleanup;
mod ending;
mod layout;
mod root;
mod signals;
mod token;

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::Signal;

pub(crate) use ending::{Cause, How, RankEnd};
pub(crate) use layout::Layout;
use root::JobRoot;

use crate::exit::Verdict;
use crate::nodes::RootPlan;
use crate::signal::signal_name;

/// How often the loop looks at its children when nothing else wakes it.
const TICK: Duration = Duration::from_millis(10);
/// How long the launcher waits for the ranks' output to drain once they are gone.
const DRAIN: Duration = Duration::from_secs(2);

/// What to launch and how to look after it.
#[derive(Clone, Debug)]
pub(crate) struct JobSpec {
    /// The prefix of the launcher's own lines (`chorus run`, `chorus bench`).
    pub(crate) label: &'static str,
    /// This node's ranks and their place in the job.
    pub(crate) layout: Layout,
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    /// The bootstrap root: hosted here (port 0: any free port), or node 0's.
    pub(crate) root: RootPlan,
    /// The root's configuration (its bootstrap deadline is `init_timeout`; a joining
    /// node waits for its token and the master that long).
    pub(crate) config: chorus::Config,
    /// While stopping: how long without any rank exiting before the rest get SIGKILL.
    pub(crate) reap_budget: Duration,
    /// After that SIGKILL: how long to wait for the last exits before giving up.
    pub(crate) final_wait: Duration,
    /// A limit on the whole job; at it, the ranks get SIGTERM.
    pub(crate) timeout: Option<Duration>,
    /// Stop the other ranks (SIGTERM) when one fails.
    pub(crate) stop_on_failure: bool,
    /// Capture every rank's stdout line by line ([`LaunchEvent::Line`]) instead of sharing
    /// the launcher's.
    pub(crate) capture_stdout: bool,
    /// Extra environment for every rank.
    pub(crate) env: Vec<(OsString, OsString)>,
    /// Where to write the job's token (for `chorus status`).
    pub(crate) token_file: Option<PathBuf>,
    /// Print the per-rank status lines and the summary on stderr.
    pub(crate) verbose: bool,
}

/// Something that happened to the job.
#[derive(Clone, Debug)]
pub(crate) enum LaunchEvent {
    /// A line a rank printed on its stdout (captured jobs only).
    Line { rank: u32, line: String },
    /// A rank's process ended (already witnessed to the job and reported).
    Ended(RankEnd),
    /// Every rank has ended and every output has drained: [`Launcher::finish`] next.
    Done,
}

/// Why the job is stopping. Set once, never changed (a one-way flag: a later event cannot
/// overwrite the reason, seed `004_…`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Signal(i32),
    Timeout,
    RankFailed(u32),
    /// A joining node's master went silent past its budget.
    MasterLost,
}

/// The launcher failed at its own job.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
    #[error("a job needs at least one rank")]
    NoRanks,
    #[error("cannot start the bootstrap root on {addr}: {source}")]
    Root {
        addr: SocketAddr,
        source: chorus::Error,
    },
    #[error("cannot read the job token: {0}")]
    Token(#[from] token::TokenWaitError),
    #[error("cannot follow the master: {0}")]
    Link(chorus::Error),
    #[error("cannot reach the master at {master} within {waited:?} (CHORUS_INIT_TIMEOUT): {why}")]
    Unreachable {
        master: SocketAddr,
        waited: Duration,
        why: String,
    },
    #[error("cannot write the token to {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot catch signals: {0}")]
    Signals(std::io::Error),
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        rank: u32,
        program: String,
        source: std::io::Error,
    },
}

/// How the whole job went.
#[derive(Clone, Debug)]
pub(crate) struct JobReport {
    pub(crate) ends: Vec<RankEnd>,
    pub(crate) stop: Option<Stop>,
    /// Processes that could not be reaped at all.
    pub(crate) unreaped: usize,
    pub(crate) elapsed: Duration,
}

impl JobReport {
    /// The exit code for this job, by the table in [`crate::exit`]; `expected` says which
    /// ranks' deaths the caller caused on purpose and does not count as failures.
    pub(crate) fn verdict(&self, expected: impl Fn(u32) -> bool) -> Verdict {
        if self.unreaped > 0 || self.ends.iter().any(|e| e.how == How::NotReaped) {
            return Verdict::LauncherError;
        }
        match self.stop {
            Some(Stop::MasterLost) => return Verdict::LauncherError,
            Some(Stop::Signal(s)) => return Verdict::Interrupted(s),
            Some(Stop::Timeout) => return Verdict::Timeout,
            _ => {}
        }
        if self.ends.iter().any(|e| !e.how.ok() && !expected(e.rank)) {
            Verdict::RankFailed
        } else {
            Verdict::Ok
        }
    }
}

struct RankProc {
    rank: u32,
    pid: u32,
    end: Option<RankEnd>,
    cause: Option<Cause>,
}

enum Output {
    Line(u32, String),
    Eof,
}

/// A running job.
pub(crate) struct Launcher {
    spec: JobSpec,
    started: Instant,
    root: JobRoot,
    ranks: Vec<RankProc>,
    intake: signals::Intake,
    output: mpsc::Receiver<Output>,
    open_outputs: usize,
    stop: Option<Stop>,
    /// When stopping began, or the last rank exit since: the no-progress budget's origin.
    progress_at: Option<Instant>,
    killed_at: Option<Instant>,
    all_ended_at: Option<Instant>,
    queue: VecDeque<LaunchEvent>,
    done: bool,
}

impl Launcher {
    /// Starts the root and every rank. On failure nothing is left running.
    pub(crate) fn start(spec: JobSpec) -> Result<Launcher, LaunchError> {
        if spec.layout.per_node == 0 {
            return Err(LaunchError::NoRanks);
        }
        let intake = signals::Intake::install().map_err(LaunchError::Signals)?;
        cleanup::become_subreaper();
        let mut spec = spec;
        let root = JobRoot::start(&spec.root, spec.layout.world(), &spec.config)?;
        let token = root.unique_id().to_token();
        // Ranks bind loopback unless told: across hosts they must bind where the others
        // can reach them, the address this host reaches the root from.
        if std::env::var_os("CHORUS_BIND").is_none()
            && !spec.env.iter().any(|(k, _)| k == "CHORUS_BIND")
            && let Some(ip) = chorus::launch::local_ip_toward(root.unique_id().root)
        {
            spec.env.push(("CHORUS_BIND".into(), ip.to_string().into()));
        }
        // A joining node read its token from the file: it is node 0's to write.
        if let (Some(path), JobRoot::Hosted(_)) = (&spec.token_file, &root) {
            token::write(path, &token).map_err(|source| LaunchError::TokenFile {
                path: path.clone(),
                source,
            })?;
        }
        let (tx, output) = mpsc::channel();
        let mut launcher = Launcher {
            started: Instant::now(),
            root,
            ranks: Vec::new(),
            intake,
            output,
            open_outputs: 0,
            stop: None,
            progress_at: None,
            killed_at: None,
            all_ended_at: None,
            queue: VecDeque::new(),
            done: false,
            spec,
        };
        for local in 0..launcher.spec.layout.per_node {
            if let Err(e) = launcher.spawn(local, &token, &tx) {
                launcher.abandon();
                return Err(e);
            }
        }
        Ok(launcher)
    }

    /// The job's token (`CHORUS_UNIQUE_ID` of every rank).
    pub(crate) fn token(&self) -> String {
        self.root.unique_id().to_token()
    }

    /// Whether this launcher hosts the job's bootstrap root.
    pub(crate) fn hosts_root(&self) -> bool {
        matches!(self.root, JobRoot::Hosted(_))
    }

    /// Process ids of the ranks, in rank order.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.pid).collect()
    }

    /// Ranks still running.
    pub(crate) fn live(&self) -> Vec<u32> {
        self.ranks
            .iter()
            .filter(|r| r.end.is_none())
            .map(|r| r.rank)
            .collect()
    }

    /// Starts this node's `local`-th rank.
    fn spawn(
        &mut self,
        local: u32,
        token: &str,
        tx: &mpsc::Sender<Output>,
    ) -> Result<(), LaunchError> {
        let spec = &self.spec;
        let rank = spec.layout.global(local);
        let root = self.root.unique_id().root;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.layout.rank_env(local, token, root))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            // Its own group: a signal to the launcher's group (a terminal's Ctrl-C) is not
            // delivered twice, and the rank's whole tree can be signalled at once.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(if spec.capture_stdout {
                Stdio::piped()
            } else {
                Stdio::inherit()
            });
        let launcher = rustix::process::getpid();
        // SAFETY: the closure runs in the forked child before exec and calls only prctl and
        // getppid (async-signal-safe system calls), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // If the launcher dies (even by SIGKILL), its ranks go with it.
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                if rustix::process::getppid() != Some(launcher) {
                    return Err(std::io::Error::other("the launcher exited"));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            rank,
            program: spec.program.to_string_lossy().into_owned(),
            source,
        })?;
        if let Some(stdout) = child.stdout.take() {
            let tx = tx.clone();
            self.open_outputs += 1;
            let reader = std::thread::Builder::new()
                .name(format!("rank-{rank}-stdout"))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        match line {
                            Ok(line) => {
                                if tx.send(Output::Line(rank, line)).is_err() {
                                    return;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    let _ = tx.send(Output::Eof);
                });
            if reader.is_err() {
                self.open_outputs -= 1;
            }
        }
        // The child is reaped by `waitpid` in the loop (as the subreaper reaps everything),
        // never through this handle.
        self.ranks.push(RankProc {
            rank,
            pid: child.id(),
            end: None,
            cause: None,
        });
        Ok(())
    }

    /// Kills and reaps whatever was started when the launch itself failed.
    fn abandon(&mut self) {
        for r in &self.ranks {
            cleanup::kill_group(r.pid, Signal::KILL);
        }
        let deadline = Instant::now() + self.spec.final_wait;
        while self.ranks.iter().any(|r| r.end.is_none()) && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(TICK);
        }
        cleanup::sweep_children(self.spec.final_wait);
    }

    /// Sends SIGKILL to `rank`'s process group now (e.g. a rank the caller froze), noting
    /// `why` on its status line. It is reaped as usual.
    pub(crate) fn kill(&mut self, rank: u32, why: &str) {
        if let Some(r) = self
            .ranks
            .iter_mut()
            .find(|r| r.rank == rank && r.end.is_none())
        {
            r.cause = Some(Cause::Requested(why.to_owned()));
            cleanup::kill_group(r.pid, Signal::KILL);
        }
    }

    /// Stops the job because `rank` failed, as `--on-failure stop` does: SIGTERM to the
    /// others, then the no-progress budget.
    pub(crate) fn stop_after_failure(&mut self, rank: u32) {
        self.begin_stop(Stop::RankFailed(rank), Signal::TERM, Cause::StopOnFailure);
    }

    /// Starts stopping the job (once; later calls keep the first reason): `signal` to every
    /// live rank's process group, and the no-progress budget starts.
    fn begin_stop(&mut self, stop: Stop, signal: Signal, cause: Cause) {
        if self.stop.is_some() {
            return;
        }
        self.stop = Some(stop);
        self.progress_at = Some(Instant::now());
        for r in self.ranks.iter_mut().filter(|r| r.end.is_none()) {
            r.cause = Some(cause.clone());
            cleanup::kill_group(r.pid, signal);
        }
    }

    /// The next thing that happens, waiting at most `wait` ([`None`] if nothing did).
    pub(crate) fn next_event(&mut self, wait: Duration) -> Option<LaunchEvent> {
        let until = Instant::now() + wait;
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(e);
            }
            if self.done {
                return Some(LaunchEvent::Done);
            }
            self.step();
            if !self.queue.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            match self.output.recv_timeout(TICK.min(until - now)) {
                Ok(Output::Line(rank, line)) => {
                    self.queue.push_back(LaunchEvent::Line { rank, line })
                }
                Ok(Output::Eof) => self.open_outputs = self.open_outputs.saturating_sub(1),
                Err(_) => {}
            }
        }
    }

    /// One look at everything: signals, the timeout, exits, the budgets, the end.
    fn step(&mut self) {
        for signal in self.intake.pending() {
            self.on_signal(signal);
        }
        if let (Some(limit), None) = (self.spec.timeout, self.stop)
            && self.started.elapsed() >= limit
        {
            self.begin_stop(Stop::Timeout, Signal::TERM, Cause::Timeout);
        }
        if self.stop.is_none()
            && let Some(why) = self.root.lost(Instant::now())
        {
            note(self.spec.label, &why);
            self.begin_stop(Stop::MasterLost, Signal::TERM, Cause::MasterLost);
        }
        self.reap();
        let now = Instant::now();
        let live: Vec<usize> = (0..self.ranks.len())
            .filter(|&i| self.ranks[i].end.is_none())
            .collect();
        if !live.is_empty() {
            if let (Some(since), None) = (self.progress_at, self.killed_at)
                && now.duration_since(since) >= self.spec.reap_budget
            {
                // A whole budget with no rank exiting: whoever is left is stuck.
                self.killed_at = Some(now);
                let cause = Cause::NoProgress(self.spec.reap_budget);
                for &i in &live {
                    self.ranks[i].cause = Some(cause.clone());
                    cleanup::kill_group(self.ranks[i].pid, Signal::KILL);
                }
            }
            if let Some(killed) = self.killed_at
                && now.duration_since(killed) >= self.spec.final_wait
            {
                for i in live {
                    self.end(i, How::NotReaped);
                }
            }
            return;
        }
        // Every rank has ended: clean up what they left, drain their output, finish.
        if self.all_ended_at.is_none() {
            self.all_ended_at = Some(now);
        }
        let drained = self.open_outputs == 0;
        let waited = self
            .all_ended_at
            .is_some_and(|t| now.duration_since(t) >= DRAIN);
        if drained || waited {
            self.done = true;
        }
    }

    fn on_signal(&mut self, signal: i32) {
        if self.stop.is_none() {
            let sig = match signal {
                2 => Signal::INT,
                1 => Signal::HUP,
                _ => Signal::TERM,
            };
            self.begin_stop(Stop::Signal(signal), sig, Cause::Forwarded(signal));
            return;
        }
        // A second signal: the user is not waiting for the budget.
        if self.killed_at.is_none() {
            self.killed_at = Some(Instant::now());
            for r in self.ranks.iter_mut().filter(|r| r.end.is_none()) {
                r.cause = Some(Cause::Requested(format!(
                    "a second {} reached the launcher",
                    signal_name(signal)
                )));
                cleanup::kill_group(r.pid, Signal::KILL);
            }
        }
    }

    /// Reaps every child that ended: ranks are recorded, witnessed and reported; anything
    /// else is a leftover descendant re-parented here, reaped and forgotten.
    fn reap(&mut self) {
        for (pid, status) in cleanup::reap_any() {
            let Some(i) = self
                .ranks
                .iter()
                .position(|r| r.pid == pid && r.end.is_none())
            else {
                continue;
            };
            let how = match (status.exit_status(), status.terminating_signal()) {
                (Some(code), _) => How::Exited(code),
                (None, Some(signal)) => How::Signaled(signal),
                // waitpid without WUNTRACED reports only terminations.
                (None, None) => continue,
            };
            self.end(i, how);
        }
    }

    fn end(&mut self, i: usize, how: How) {
        let r = &mut self.ranks[i];
        // Processes still in the rank's group outlive it otherwise.
        cleanup::kill_group(r.pid, Signal::KILL);
        let end = RankEnd {
            rank: r.rank,
            pid: r.pid,
            how,
            at: self.started.elapsed(),
            cause: r.cause.clone(),
        };
        r.end = Some(end.clone());
        if let Some(status) = how.witness_status() {
            // The job learns at once; survivors need not wait for a heartbeat deadline.
            self.root.witness_exit(end.rank, status);
        }
        if self.stop.is_some() {
            self.progress_at = Some(Instant::now());
        }
        if self.spec.verbose {
            note(self.spec.label, &end.to_string());
        }
        if !how.ok() && self.spec.stop_on_failure && self.stop.is_none() {
            self.begin_stop(
                Stop::RankFailed(end.rank),
                Signal::TERM,
                Cause::StopOnFailure,
            );
        }
        self.queue.push_back(LaunchEvent::Ended(end));
    }

    /// After [`LaunchEvent::Done`]: kills and reaps anything the ranks left behind, and
    /// reports the job.
    pub(crate) fn finish(self) -> JobReport {
        // The job is over; nothing may outlive it (a rank's daemon, a double-forked child).
        for r in &self.ranks {
            cleanup::kill_group(r.pid, Signal::KILL);
        }
        let (leftovers, unreaped) = cleanup::sweep_children(self.spec.final_wait);
        let report = JobReport {
            ends: self.ranks.iter().filter_map(|r| r.end.clone()).collect(),
            stop: self.stop,
            unreaped,
            elapsed: self.started.elapsed(),
        };
        if leftovers > 0 {
            note(
                self.spec.label,
                &format!("killed {leftovers} process(es) the ranks left behind"),
            );
        }
        if unreaped > 0 {
            note(
                self.spec.label,
                &format!("{unreaped} process(es) could not be reaped even after SIGKILL"),
            );
        }
        report
    }

    /// Runs the job to its end, handing every event to `on_event`.
    pub(crate) fn run(
        mut self,
        mut on_event: impl FnMut(&mut Launcher, &LaunchEvent),
    ) -> JobReport {
        loop {
            match self.next_event(Duration::from_millis(200)) {
                Some(LaunchEvent::Done) => break,
                Some(event) => on_event(&mut self, &event),
                None => {}
            }
        }
        self.finish()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // A launcher dropped before its job ended (a panic upstream) still leaves nothing.
        if self.ranks.iter().any(|r| r.end.is_none()) {
            for r in self.ranks.iter().filter(|r| r.end.is_none()) {
                cleanup::kill_group(r.pid, Signal::KILL);
            }
            cleanup::sweep_children(Duration::from_secs(2));
        }
    }
}

/// One line of the launcher's own on stderr.
pub(crate) fn note(label: &str, text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{label}: {text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(rank: u32, how: How) -> RankEnd {
        RankEnd {
            rank,
            pid: 100 + rank,
            how,
            at: Duration::ZERO,
            cause: None,
        }
    }

    fn report(ends: Vec<RankEnd>, stop: Option<Stop>, unreaped: usize) -> JobReport {
        JobReport {
            ends,
            stop,
            unreaped,
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn verdicts_follow_the_documented_precedence() {
        let ok = || vec![end(0, How::Exited(0)), end(1, How::Exited(0))];
        let failed = || vec![end(0, How::Exited(0)), end(1, How::Signaled(9))];
        assert_eq!(report(ok(), None, 0).verdict(|_| false), Verdict::Ok);
        assert_eq!(
            report(failed(), None, 0).verdict(|_| false),
            Verdict::RankFailed
        );
        // A death the caller caused on purpose (bench --inject) is not a failure.
        assert_eq!(report(failed(), None, 0).verdict(|r| r == 1), Verdict::Ok);
        assert_eq!(
            report(failed(), Some(Stop::RankFailed(1)), 0).verdict(|_| false),
            Verdict::RankFailed
        );
        assert_eq!(
            report(failed(), Some(Stop::Timeout), 0).verdict(|_| false),
            Verdict::Timeout
        );
        assert_eq!(
            report(ok(), Some(Stop::Signal(15)), 0).verdict(|_| false),
            Verdict::Interrupted(15)
        );
        // Launcher error over everything.
        assert_eq!(
            report(ok(), Some(Stop::Signal(2)), 1).verdict(|_| false),
            Verdict::LauncherError
        );
        let stuck = vec![end(0, How::Exited(0)), end(1, How::NotReaped)];
        assert_eq!(
            report(stuck, None, 0).verdict(|_| true),
            Verdict::LauncherError
        );
    }
}
