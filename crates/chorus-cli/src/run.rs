//! `chorus run -n N -- PROGRAM ARGS…`: the local launcher as a command.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::LaunchArgs;
use crate::exit::Verdict;
use crate::launcher::{JobSpec, Launcher, note};

const LABEL: &str = "chorus run";

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Number of ranks (processes) to start.
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) ranks: u32,
    #[command(flatten)]
    pub(crate) launch: LaunchArgs,
    /// What to do when a rank fails: let the others carry on (they get a prompt error and
    /// may shrink), or stop them all (SIGTERM).
    #[arg(long, value_enum, default_value_t = OnFailure::Continue)]
    pub(crate) on_failure: OnFailure,
    /// Do not print the token, the per-rank status lines or the summary.
    #[arg(short, long)]
    pub(crate) quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub(crate) command: Vec<OsString>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnFailure {
    Continue,
    Stop,
}

pub(crate) fn run(args: RunArgs) -> Verdict {
    let config = match chorus::Config::from_env() {
        Ok(c) => c,
        Err(e) => return crate::fail(LABEL, &e.to_string(), Verdict::LauncherError),
    };
    let Some((program, program_args)) = crate::program(&args.command) else {
        return crate::fail(LABEL, "no program to run", Verdict::Usage);
    };
    let spec = JobSpec {
        label: LABEL,
        world: args.ranks,
        program,
        args: program_args,
        bind: args.launch.bind,
        config,
        reap_budget: args.launch.reap_budget,
        final_wait: Duration::from_secs(5),
        timeout: args.launch.timeout,
        stop_on_failure: args.on_failure == OnFailure::Stop,
        capture_stdout: false,
        env: Vec::new(),
        token_file: args.launch.token_file.clone(),
        verbose: !args.quiet,
    };
    let launcher = match Launcher::start(spec) {
        Ok(l) => l,
        Err(e) => return crate::fail(LABEL, &e.to_string(), Verdict::LauncherError),
    };
    if !args.quiet {
        note(
            LABEL,
            &format!(
                "{} rank(s) started (pids {:?}); job token (also CHORUS_UNIQUE_ID): {}",
                args.ranks,
                launcher.pids(),
                launcher.token()
            ),
        );
    }
    let report = launcher.run(|_, _| {});
    let verdict = report.verdict(|_| false);
    if !args.quiet {
        let ok = report.ends.iter().filter(|e| e.how.ok()).count();
        note(
            LABEL,
            &format!(
                "{} rank(s): {ok} exited 0, {} did not, in {:.2}s; exit code {} ({})",
                report.ends.len(),
                report.ends.len() - ok,
                report.elapsed.as_secs_f64(),
                verdict.code(),
                verdict.meaning()
            ),
        );
    }
    verdict
}
