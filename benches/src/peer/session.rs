//! A command run in a session of its own, under a deadline, with nothing of it left behind.
//!
//! `mpirun` puts each rank in a process group of its own and the Gloo launcher starts one
//! Python process per rank, so killing the direct child, or its process group, can leave
//! ranks running. Every process a supervised command starts stays in the session it was
//! started in (none of the peers calls `setsid`), so at the end, whether the command finished,
//! failed or ran out of time, every process still in that session is terminated, then killed.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

use crate::peer::{PeerError, stop};

/// How often a running command is polled for its exit.
const POLL: Duration = Duration::from_millis(10);
/// How long SIGTERM gets before SIGKILL follows (mpirun uses it to stop its ranks).
const GRACE: Duration = Duration::from_secs(2);
/// How long processes get to vanish after SIGKILL before they are reported as unkillable.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How a supervised command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It exited by itself with this status code.
    Exited(i32),
    /// It was ended by this signal, not one the supervisor sent.
    Signaled(i32),
    /// It was still running at the deadline and was killed.
    TimedOut,
    /// The run was asked to stop (see [`stop`]) and it was killed.
    Interrupted,
}

/// What happened to a supervised command and the processes it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub ending: Ending,
    /// From start to the end of the command (not of the clean-up).
    pub elapsed: Duration,
    /// Processes still in the session after the command ended, which the clean-up killed.
    pub stragglers: usize,
    /// Processes that survived SIGKILL for [`KILL_WAIT`] (stuck in the kernel): their pids.
    pub unkillable: Vec<i32>,
}

/// Lets this process reap the orphans of the commands it supervises: a rank whose `mpirun`
/// died is re-parented here, not to init, so the clean-up can collect its exit.
pub fn become_subreaper() -> Result<(), PeerError> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| PeerError::io("become a child subreaper", e.into()))
}

/// Runs `cmd` (stdin from /dev/null; stdout and stderr as the caller set them) in a new
/// session, waits at most `limit` for it (less if the run is asked to [`stop`]), then ends
/// every process left in the session.
pub fn run_in_session(cmd: &mut Command, limit: Duration) -> Result<Outcome, PeerError> {
    cmd.stdin(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe and touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| rustix::process::setsid().map(drop).map_err(io::Error::from));
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| PeerError::io(format!("start {}", describe(cmd)), e))?;
    let session = Pid::from_child(&child);
    let deadline = started + limit;
    let ending = loop {
        if let Some(status) = try_wait(&mut child)? {
            break ending_of(status);
        }
        if Instant::now() >= deadline {
            break Ending::TimedOut;
        }
        if stop::requested() {
            break Ending::Interrupted;
        }
        sleep(POLL);
    };
    let elapsed = started.elapsed();
    if matches!(ending, Ending::TimedOut | Ending::Interrupted) {
        stop_leader(&mut child, session)?;
    }
    let (stragglers, unkillable) = clear_session(session);
    Ok(Outcome {
        ending,
        elapsed,
        stragglers,
        unkillable,
    })
}

/// Ends a leader that ran past its deadline or was interrupted: SIGTERM to the whole session (mpirun forwards
/// it to its ranks), SIGKILL to whatever is left after [`GRACE`], then reaps the leader.
fn stop_leader(child: &mut Child, session: Pid) -> Result<(), PeerError> {
    signal_all(&members(session), Signal::TERM);
    let grace_end = Instant::now() + GRACE;
    while Instant::now() < grace_end {
        if try_wait(child)?.is_some() {
            return Ok(());
        }
        sleep(POLL);
    }
    signal_all(&members(session), Signal::KILL);
    let kill_end = Instant::now() + KILL_WAIT;
    while Instant::now() < kill_end {
        if try_wait(child)?.is_some() {
            return Ok(());
        }
        sleep(POLL);
    }
    Err(PeerError::io(
        format!("reap pid {} after SIGKILL", session.as_raw_nonzero()),
        io::Error::new(io::ErrorKind::TimedOut, "still running"),
    ))
}

/// Terminates, then kills, every process still in `session`; returns how many there were
/// and the pids that outlived [`KILL_WAIT`] after SIGKILL.
fn clear_session(session: Pid) -> (usize, Vec<i32>) {
    let left = members(session);
    if left.is_empty() {
        return (0, Vec::new());
    }
    signal_all(&left, Signal::TERM);
    let mut alive = wait_until_gone(session, &left, GRACE);
    if !alive.is_empty() {
        signal_all(&alive, Signal::KILL);
        alive = wait_until_gone(session, &left, KILL_WAIT);
    }
    (
        left.len(),
        alive
            .into_iter()
            .map(|p| p.as_raw_nonzero().get())
            .collect(),
    )
}

/// Polls until no live process remains in `session`, reaping those that were re-parented to
/// this process (see [`become_subreaper`]); returns the survivors at `wait`'s end.
fn wait_until_gone(session: Pid, seen: &[Pid], wait: Duration) -> Vec<Pid> {
    let end = Instant::now() + wait;
    loop {
        for &pid in seen {
            // Only succeeds for our own (re-parented) children; for others it is ECHILD.
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
        }
        let alive = members(session);
        if alive.is_empty() || Instant::now() >= end {
            return alive;
        }
        sleep(POLL);
    }
}

fn signal_all(pids: &[Pid], signal: Signal) {
    for &pid in pids {
        // A process that exited between the scan and the signal is what we wanted anyway.
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// The live (not zombie) processes whose session id is `session`, read from /proc.
pub fn members(session: Pid) -> Vec<Pid> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            let (state, sid) = parse_stat(&stat)?;
            (sid == session.as_raw_nonzero().get() && state != 'Z' && state != 'X')
                .then(|| Pid::from_raw(pid))
                .flatten()
        })
        .collect()
}

/// State and session id from a `/proc/PID/stat` line. The command name sits in parentheses
/// and may itself hold spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let _pgrp = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    Some((state, session))
}

fn try_wait(child: &mut Child) -> Result<Option<ExitStatus>, PeerError> {
    child
        .try_wait()
        .map_err(|e| PeerError::io(format!("wait for pid {}", child.id()), e))
}

fn ending_of(status: ExitStatus) -> Ending {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Exited(code),
        (None, Some(signal)) => Ending::Signaled(signal),
        // Neither a code nor a signal is only reported for stopped children, which
        // try_wait does not return; treat it as a failure rather than a success.
        (None, None) => Ending::Exited(-1),
    }
}

fn describe(cmd: &Command) -> String {
    cmd.get_program().to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// Runs `script` in a supervised session, then checks that no live process is left in
    /// it. The script's first act is to write its pid (= the session id) to a marker file.
    fn run_and_check_empty(script: &str, limit: Duration) -> Outcome {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker =
            std::env::temp_dir().join(format!("chorus-session-test-{}-{n}", std::process::id()));
        let _ = fs::remove_file(&marker);
        let full = format!("echo $$ > {}; {script}", marker.display());
        let outcome = run_in_session(&mut sh(&full), limit).unwrap();
        let sid: i32 = fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        let _ = fs::remove_file(&marker);
        let sid = Pid::from_raw(sid).unwrap();
        assert!(
            members(sid).is_empty(),
            "session {sid:?} still has {:?}",
            members(sid)
        );
        outcome
    }

    #[test]
    fn a_command_that_finishes_reports_its_exit_code() {
        let outcome = run_and_check_empty("exit 3", Duration::from_secs(30));
        assert_eq!(outcome.ending, Ending::Exited(3));
        assert_eq!(outcome.stragglers, 0);
        assert!(outcome.unkillable.is_empty());
    }

    #[test]
    fn a_hung_command_is_killed_at_its_deadline_with_its_whole_tree() {
        // The grandchild sits in a process group of its own, as mpirun's ranks do.
        let started = Instant::now();
        let outcome =
            run_and_check_empty("set -m; sleep 600 & sleep 600", Duration::from_millis(300));
        assert_eq!(outcome.ending, Ending::TimedOut);
        assert!(outcome.elapsed >= Duration::from_millis(300));
        // Deadline + SIGTERM grace, with room for a loaded machine; far below `sleep 600`.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert!(outcome.unkillable.is_empty());
    }

    #[test]
    fn a_command_that_ignores_sigterm_is_killed() {
        let started = Instant::now();
        let outcome = run_and_check_empty(
            "trap '' TERM; sleep 600 & trap '' TERM; while :; do sleep 1; done",
            Duration::from_millis(200),
        );
        assert_eq!(outcome.ending, Ending::TimedOut);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn processes_left_behind_by_a_finished_command_are_killed_and_counted() {
        let outcome =
            run_and_check_empty("sleep 600 & sleep 600 & exit 0", Duration::from_secs(30));
        assert_eq!(outcome.ending, Ending::Exited(0));
        assert_eq!(outcome.stragglers, 2);
    }

    #[test]
    fn a_missing_program_is_an_error_naming_it() {
        let err = run_in_session(
            &mut Command::new("/nonexistent/peer-program"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/peer-program"),
            "{err}"
        );
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        assert_eq!(parse_stat("42 (sleep) S 1 42 42 0 -1"), Some(('S', 42)));
        assert_eq!(parse_stat("42 (a) b) (c) Z 1 7 9 0"), Some(('Z', 9)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R 0 1 notanumber"), None);
    }
}
