//! The busy job of test 9: a job in every state a test can leave it in, shared by the
//! reaping tests and by `chorus-test-harness`, the process they kill.

use std::path::Path;
use std::time::Duration;

use crate::{Job, JobSpec};

/// How long the busy job's ranks may take to report each step.
pub const WAIT: Duration = Duration::from_secs(20);

/// Three ranks of `rank_bin` looping, rank 1 stopped, every rank with a forked child holding
/// its descriptors.
pub fn busy_job(rank_bin: &Path) -> Job {
    let mut job = Job::start(
        rank_bin,
        JobSpec::new(3)
            .env("CT_FORK_HOLDER", "1")
            .env("CT_START", "loop"),
    );
    for s in 0..3 {
        job.wait_for(s, "forked", WAIT);
        job.wait_for(s, "looping", WAIT);
    }
    job.signal(1, libc::SIGSTOP);
    job
}
