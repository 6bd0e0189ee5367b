//! `sim`: a deterministic simulator of many control-plane nodes on a faulty network.
//!
//! A [`Scenario`] fixes everything: world size, configuration, network (latency, jitter,
//! loss, reordering, partitions), faults (crash, kill, freeze then resume, graceful
//! departure, abort, revoke, a coordinator crashing part-way through an agreement phase,
//! grow), and whether the application shrinks after a failure. [`run`] plays it in
//! simulated time with one seeded generator and returns a [`Report`]: the property
//! violations (empty when the run is correct) and the figures (detection latency, notice
//! hops, steady-state traffic). The same scenario always produces the same report, so a
//! failing seed is a reproducible bug: `Scenario::random(seed)` rebuilds it.
//!
//! Properties checked on every run (see `check` for the bounds):
//! no false death (nobody is declared absent who was not crashed, killed, frozen past the
//! tolerated stall, departed or cut off by a long partition); every healthy member learns
//! of each crash within the detection bound and of each departure within the spread bound;
//! every member that installs an epoch installs the same membership; epochs only grow, one
//! at a time; no frame from an older epoch is accepted; no member sends for an epoch it is
//! not in; revocations reach everyone at the epoch; survivors converge on one epoch holding
//! exactly them; a member frozen past its deadline is evicted when it resumes.

mod check;
mod cluster;
mod network;
mod queue;
mod record;
mod report;
mod rng;
mod scenario;

pub use network::{Net, Partition, Slow};
pub use report::{GaveUp, Report, Summary};
pub use rng::Rng;
pub use scenario::{Fault, FaultKind, Scenario, secs};

/// Plays `scenario` to its end and checks every property.
pub fn run(scenario: Scenario) -> Report {
    let mut cluster = cluster::Cluster::new(scenario);
    cluster.run();
    check::finish(&cluster)
}
