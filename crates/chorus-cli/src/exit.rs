//! What `chorus run` and `chorus bench` exit with: one code per way a job can end, so a
//! script (or CI) can tell "my program failed" from "I pressed Ctrl-C" from "the launcher
//! could not do its job".
//!
//! | code    | meaning |
//! |---------|---------|
//! | 0       | every rank exited 0 (bench: the sweep completed and every result was right) |
//! | 1       | a rank failed: exited non-zero or was killed by a signal (bench: a wrong result, or the sweep could not complete) |
//! | 2       | bad command line (from the argument parser) |
//! | 3       | launcher error: the root could not start, a rank could not be spawned, or a rank could not be reaped even after SIGKILL |
//! | 124     | `--timeout` passed; the ranks were stopped |
//! | 128 + N | the launcher was interrupted by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP), which it forwarded to the ranks |
//!
//! When several apply, the first row of this precedence wins: launcher error, interrupted,
//! timeout, rank failed, ok.

use std::process::ExitCode;

/// How a job ended, as an exit code.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    RankFailed,
    Usage,
    LauncherError,
    Timeout,
    Interrupted(i32),
}

impl Verdict {
    pub(crate) fn code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::RankFailed => 1,
            Verdict::Usage => 2,
            Verdict::LauncherError => 3,
            Verdict::Timeout => 124,
            Verdict::Interrupted(signal) => u8::try_from(128 + signal.clamp(1, 127)).unwrap_or(255),
        }
    }

    /// A few words for the summary line.
    pub(crate) fn meaning(self) -> String {
        match self {
            Verdict::Ok => "all ranks ok".into(),
            Verdict::RankFailed => "a rank failed".into(),
            Verdict::Usage => "bad command line".into(),
            Verdict::LauncherError => "launcher error".into(),
            Verdict::Timeout => "timed out".into(),
            Verdict::Interrupted(s) => {
                format!("interrupted by {}", crate::signal::signal_name(s))
            }
        }
    }
}

impl From<Verdict> for ExitCode {
    fn from(v: Verdict) -> ExitCode {
        ExitCode::from(v.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_documented_table() {
        assert_eq!(Verdict::Ok.code(), 0);
        assert_eq!(Verdict::RankFailed.code(), 1);
        assert_eq!(Verdict::Usage.code(), 2);
        assert_eq!(Verdict::LauncherError.code(), 3);
        assert_eq!(Verdict::Timeout.code(), 124);
        assert_eq!(Verdict::Interrupted(2).code(), 130);
        assert_eq!(Verdict::Interrupted(15).code(), 143);
    }
}
