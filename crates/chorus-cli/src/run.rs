//! `chorus run -n N -- PROGRAM ARGS…`: the launcher as a command, on one node or, with
//! `--nnodes N --node-rank I --master HOST:PORT`, on each node of many (torchrun's shape).

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::LaunchArgs;
use crate::exit::Verdict;
use crate::launcher::{JobSpec, Launcher, note};

const LABEL: &str = "chorus run";

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Number of ranks (processes) to start on this node.
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
    let plan = match crate::nodes::plan(&args.launch, args.ranks, crate::nodes::resolve) {
        Ok(p) => p,
        Err(e) => return crate::fail(LABEL, &e, Verdict::Usage),
    };
    let layout = plan.layout;
    let spec = JobSpec {
        label: LABEL,
        layout,
        program,
        args: program_args,
        root: plan.root,
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
        let place = if layout.multi() {
            format!(
                "node {} of {}: ranks {}..={} of {} ",
                layout.node,
                layout.nnodes,
                layout.global(0),
                layout.global(layout.per_node - 1),
                layout.world()
            )
        } else {
            String::new()
        };
        note(
            LABEL,
            &format!(
                "{place}{} rank(s) started (pids {:?}); job token (also CHORUS_UNIQUE_ID): {}",
                args.ranks,
                launcher.pids(),
                launcher.token()
            ),
        );
    } else if layout.multi() && launcher.hosts_root() && args.launch.token_file.is_none() {
        // The other nodes cannot start without it, quiet or not.
        note(
            LABEL,
            &format!("job token for the other nodes: {}", launcher.token()),
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
