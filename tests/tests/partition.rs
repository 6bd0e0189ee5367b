//! A rank cut off from every peer while it stays alive (its packets dropped both ways in a
//! network namespace of the test's own): under the default majority quorum its `shrink()`
//! fails with `no-quorum` within two heartbeat deadlines of the cut, without waiting out the
//! agreement timeout, and the others shrink and go on. Skips with one line where it cannot
//! make the namespace (not root, no `ip` or `nft`: `.ci/netns-deps` installs them).

#![allow(clippy::print_stderr)] // the skip line
#![allow(clippy::print_stdout)] // measurements, shown with --nocapture

use std::path::Path;
use std::time::Duration;

use chorus_tests::netns::Netns;

const DEADLINE: Duration = Duration::from_secs(1);

#[test]
fn a_cut_off_rank_fails_its_shrink_with_no_quorum_and_the_others_go_on() {
    let ns = match Netns::enter("cut") {
        Ok(ns) => ns,
        Err(why) => {
            // Straight to the stderr handle: the harness captures `eprintln!` and shows it
            // only for failing tests, and a skip must be seen.
            let line = format!("skipped: no network namespace for the cut ({why})\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return;
        }
    };
    let bin = Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"));
    let run = chorus_tests::cut::run(&ns, bin, 4, DEADLINE);
    println!("{run:?}");
    let bound_ms = 2.0 * DEADLINE.as_secs_f64() * 1e3;
    assert!(
        run.cut_to_no_quorum_ms <= bound_ms,
        "the cut-off rank's shrink returned {:.0} ms after the cut, bound {bound_ms} ms: {}",
        run.cut_to_no_quorum_ms,
        run.detail
    );
    assert!(
        run.shrink_ms <= bound_ms,
        "the cut-off rank spent {:.0} ms in shrink(), bound {bound_ms} ms",
        run.shrink_ms
    );
    assert!(
        run.detail.contains("majority needs 3 of 4"),
        "the error names the view and the rule: {}",
        run.detail
    );
    // The survivors' shrink is bounded by the agreement timeout (30 s); it takes
    // milliseconds, but only the bound is asserted.
    for ms in &run.majority_shrink_ms {
        assert!(*ms <= 30_000.0, "a survivor's shrink took {ms:.0} ms");
    }
}
