//! chorus-tests (floor 5): multi-process and fault-injection tests of the real binaries on
//! loopback. Nothing imports it.
//!
//! - [`job`]: starts a job of `chorus-test-rank` processes around a bootstrap root hosted in
//!   the calling process, reads their JSON-line reports with deadlines, injects faults
//!   (signals), and always reaps every process it started, forked grandchildren included.
//! - [`reap`]: the process-group bookkeeping behind that promise (test 9), and [`busy`]:
//!   the busy job its tests (and the `chorus-test-harness` process they kill) start.
//! - [`probe`]: clients that send bad input to a job's listening ports; [`mutate`]: the
//!   seeded mutation engine of hostile first frames and the spec's answer to each, and
//!   [`attack`]: the stream of them at a running job (test and figures).
//! - [`netns`]: a network namespace of the caller's own with an nftables cut, and [`cut`]:
//!   the run that silences one rank inside it (the partitioned-minority test and figures).
//! - [`bed`]: hosts as network namespaces on a bridge, one node launcher each, and the
//!   faults a cluster has (cut, vanish, freeze, netem, one-way drop); [`wire`]: the
//!   userspace router it stands on instead where the kernel has no `sch_netem`.
//! - [`clock`]: the host-wide monotonic clock the ranks report in.
//! - [`stats`]: percentiles for the figures.

pub mod attack;
pub mod bed;
pub mod busy;
pub mod clock;
pub mod cut;
pub mod event;
pub mod job;
pub mod mutate;
pub mod netns;
pub mod probe;
pub mod reap;
pub mod stats;
pub mod wire;

pub use event::Event;
pub use job::{Job, JobSpec, Slot};

/// Says on stderr, in one line, that a test skips and why. Straight to the handle: the
/// harness shows `eprintln!` only for failing tests, and a skip must be seen.
pub fn skip(why: &str) {
    let line = format!("skipped: {why}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// How much a sub-second latency bound may stretch on a loaded 2-core CI machine before a
/// test calls it a failure. The bounds themselves are the features' (100 ms same-host
/// detection, 50 ms departure, ...); typical measurements are a tenth of them (see
/// `tests/README.md`), and a scheduler that keeps a process off both cores for a few tens of
/// milliseconds is not a chorus bug. Bounds of seconds (heartbeat deadline + 20 %) need no
/// stretch: their own margin dwarfs such delays.
pub const LOAD_MARGIN: f64 = 2.0;
