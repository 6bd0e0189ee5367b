//! How one rank's process ended, and the status line the launcher prints for it.

use std::fmt;
use std::time::Duration;

use crate::signal::signal_name;

/// How a rank's process ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
    /// Still there after SIGKILL and the final wait (uninterruptible sleep, a kernel bug):
    /// the launcher gave up on it.
    NotReaped,
}

impl How {
    /// The status the job is told (`RootHost::witness_exit`): the exit code, or minus the
    /// signal.
    pub(crate) fn witness_status(self) -> Option<i32> {
        match self {
            How::Exited(code) => Some(code),
            How::Signaled(signal) => Some(-signal),
            How::NotReaped => None,
        }
    }

    pub(crate) fn ok(self) -> bool {
        self == How::Exited(0)
    }
}

/// Why the launcher itself signalled a rank, when it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The launcher forwarded a signal it received.
    Forwarded(i32),
    /// `--timeout` passed and the launcher sent SIGTERM.
    Timeout,
    /// Another rank failed and `--on-failure stop` asked for the rest to stop.
    StopOnFailure,
    /// No rank exited for a whole no-progress budget while stopping: SIGKILL.
    NoProgress(Duration),
    /// The caller asked (e.g. `chorus bench` cleaning up a rank it froze).
    Requested(String),
    /// This node lost the job's master (a joining node of a multi-node job).
    MasterLost,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Forwarded(s) => write!(f, "{} forwarded by the launcher", signal_name(*s)),
            Cause::Timeout => f.write_str("SIGTERM from the launcher at --timeout"),
            Cause::StopOnFailure => f.write_str("SIGTERM from the launcher: another rank failed"),
            Cause::NoProgress(budget) => write!(
                f,
                "SIGKILL from the launcher: no rank exited for {}",
                humantime::format_duration(*budget)
            ),
            Cause::Requested(why) => write!(f, "SIGKILL from the launcher: {why}"),
            Cause::MasterLost => f.write_str("SIGTERM from the launcher: it lost the master"),
        }
    }
}

/// The end of one rank, as the status line says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankEnd {
    pub(crate) rank: u32,
    pub(crate) pid: u32,
    pub(crate) how: How,
    /// Time since the launch.
    pub(crate) at: Duration,
    /// The last thing the launcher did to this rank, if anything.
    pub(crate) cause: Option<Cause>,
}

impl fmt::Display for RankEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} (pid {}) ", self.rank, self.pid)?;
        match self.how {
            How::Exited(0) => f.write_str("exited 0")?,
            How::Exited(code) => write!(f, "exited with code {code}")?,
            How::Signaled(s) => write!(f, "was killed by {}", signal_name(s))?,
            How::NotReaped => f.write_str("could not be reaped (still there after SIGKILL)")?,
        }
        write!(f, " at +{:.2}s", self.at.as_secs_f64())?;
        if let Some(cause) = &self.cause {
            write!(f, " [{cause}]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_say_rank_pid_how_and_when() {
        let end = RankEnd {
            rank: 2,
            pid: 4242,
            how: How::Signaled(9),
            at: Duration::from_millis(1250),
            cause: Some(Cause::NoProgress(Duration::from_secs(10))),
        };
        assert_eq!(
            end.to_string(),
            "rank 2 (pid 4242) was killed by SIGKILL at +1.25s \
             [SIGKILL from the launcher: no rank exited for 10s]"
        );
        assert_eq!(end.how.witness_status(), Some(-9));
        assert_eq!(How::Exited(3).witness_status(), Some(3));
        assert!(How::Exited(0).ok() && !How::Exited(1).ok());
    }
}
