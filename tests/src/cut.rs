//! A rank cut off from every peer while it stays alive: a job of `world` ranks all-reducing
//! in a loop inside the caller's [`Netns`], then every packet from or to the last rank's
//! ports dropped. The cut-off rank is a minority of one; under the default majority quorum
//! its `shrink()` must fail at once with `no-quorum`, while the others shrink and go on.
//! Shared by the test (`tests/tests/partition.rs`) and the figures (`chorus-figures cut`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::clock::{mono_ns, ms_between};
use crate::netns::Netns;
use crate::{Job, JobSpec};

/// How long any single report may take to arrive (far past every bound asserted).
const WAIT: Duration = Duration::from_secs(30);

/// What one run measured.
#[derive(Clone, Debug)]
pub struct CutRun {
    /// From the cut to the cut-off rank's `shrink()` returning, in ms.
    pub cut_to_no_quorum_ms: f64,
    /// Time the cut-off rank spent inside `shrink()`, in ms.
    pub shrink_ms: f64,
    /// Its error, as displayed.
    pub detail: String,
    /// Time each other rank spent inside its successful `shrink()`, in ms.
    pub majority_shrink_ms: Vec<f64>,
}

/// Runs it once with heartbeats every `deadline / 10` and the given deadline. Panics (with
/// every rank's reports) if any rank does something other than the above.
pub fn run(ns: &Netns, bin: &Path, world: u32, deadline: Duration) -> CutRun {
    let interval = deadline / 10;
    let spec = JobSpec::new(world)
        .env(
            "CHORUS_HEARTBEAT_INTERVAL",
            format!("{}ms", interval.as_millis()),
        )
        .env(
            "CHORUS_HEARTBEAT_DEADLINE",
            format!("{}ms", deadline.as_millis()),
        )
        .env("CT_ON_FAIL", "shrink")
        .env("CT_START", "loop")
        .env("CT_SIZES", "1,1024")
        // The cut drops packets: it partitions sockets, not shared memory, so the ranks'
        // data links must be sockets too (under `auto` same-host peers share segments,
        // and the cut-off rank would hear its eviction through one).
        .env("CHORUS_TRANSPORT", "tcp");
    let mut job = Job::start(bin, spec);
    let slots: Vec<usize> = (0..world as usize).collect();
    for &s in &slots {
        job.wait_for(s, "looping", WAIT);
    }
    std::thread::sleep(Duration::from_millis(200));
    let cut = world as usize - 1;
    let port = |key: &str| -> u16 {
        job.ready(cut)
            .str(key)
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map_or(0, |a| a.port())
    };
    let (control, data) = (port("control"), port("data"));
    if control == 0 || data == 0 {
        job.fail("the cut-off rank reported no control or data port");
    }
    if let Err(e) = ns.silence(&[control], &[data]) {
        job.fail(&format!("cannot install the cut: {e}"));
    }
    let cut_at = mono_ns();
    let failed = job.wait_any(cut, &["shrink-failed", "shrunk"], WAIT);
    if failed.ev() != "shrink-failed" || failed.kind() != "no-quorum" {
        job.fail(&format!(
            "the cut-off rank should fail its shrink with no-quorum: {failed}"
        ));
    }
    let run = CutRun {
        cut_to_no_quorum_ms: ms_between(cut_at, failed.t()),
        shrink_ms: failed.f64("ms").unwrap_or(f64::MAX),
        detail: failed.str("detail").unwrap_or("").to_owned(),
        majority_shrink_ms: slots[..cut]
            .iter()
            .map(|&s| {
                let shrunk = job.wait_for(s, "shrunk", WAIT);
                if shrunk.u64("world") != Some(u64::from(world - 1)) {
                    job.fail(&format!("slot {s} shrank to the wrong world: {shrunk}"));
                }
                shrunk.f64("ms").unwrap_or(f64::MAX)
            })
            .collect(),
    };
    // The majority goes on: one more agreed finish on the smaller world.
    job.send_all(&slots[..cut], "finish");
    for &s in &slots[..cut] {
        let done = job.wait_for(s, "finished", WAIT);
        if done.u64("world") != Some(u64::from(world - 1)) {
            job.fail(&format!("slot {s} finished on the wrong world: {done}"));
        }
    }
    // The cut-off rank destroys its communicator and exits, bounded although nobody hears it.
    job.wait_exit(cut, WAIT);
    let left = job.close();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    run
}
