//! Faults across hosts (issue 17, section 3): 3 network-namespace hosts × 2 ranks, one node
//! launcher per host, heartbeat 100 ms and deadline 2 s. Across hosts nothing tells a
//! survivor that a peer is gone (no pidfd, no FIN, no launcher on its host): only silence
//! and the deadline do. Skips with one line where the bed cannot be built (not root, no
//! `ip`/`nft`/`unshare`, or no `chorus` binary: `cargo build -p chorus-cli`).
//!
//! Why 2 s and not 1 s: six ranks all-reducing flat out on a loaded 2-core machine (load
//! average 20 while this was written) miss a 1 s deadline in their first second of looping,
//! on loopback as much as across hosts (`chorus run -n 6` of `chorus-test-rank` with
//! `CHORUS_HEARTBEAT_DEADLINE=1s` shows it without any fault); at 2 s they do not.

#![allow(clippy::print_stdout)] // measurements, shown with --nocapture
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chorus_tests::Event;
use chorus_tests::bed::{Bed, BedJob};
use chorus_tests::clock::ms_between;

const DEADLINE_MS: f64 = 2000.0;
/// The teardown budget (`CHORUS_TEARDOWN_BUDGET`'s default).
const TEARDOWN_MS: f64 = 2000.0;
const WAIT: Duration = Duration::from_secs(20);
/// The host every scenario takes away: ranks 4 and 5.
const LOST: usize = 2;
const SURVIVORS: [usize; 4] = [0, 1, 2, 3];

/// A bed of 3 hosts with the job looping, or `None` (skip line printed).
fn start(what: &str, host_env: &[(usize, &str, &str)]) -> Option<Bed> {
    let mut bed = Bed::new_or_skip(3, what)?;
    let job = bed_job(host_env);
    if let Err(e) = bed.launch(&job) {
        panic!("{what}: the job did not start: {e}");
    }
    for s in 0..6 {
        expect(&mut bed, s, &["looping"]);
    }
    // Let the all-reduces run for a while: the fault lands mid-operation.
    std::thread::sleep(Duration::from_millis(400));
    no_failure_yet(&mut bed, what);
    Some(bed)
}

/// The job every scenario runs: 2 ranks per host, looping, shrinking on a failure.
fn bed_job(host_env: &[(usize, &str, &str)]) -> BedJob {
    let env = [
        ("CHORUS_HEARTBEAT_INTERVAL", "100ms"),
        ("CHORUS_HEARTBEAT_DEADLINE", "2s"),
        ("CHORUS_INIT_TIMEOUT", "30s"),
        ("CT_START", "loop"),
        ("CT_ON_FAIL", "shrink"),
        ("CT_SIZES", "1,256,4096"),
        ("CT_LIFETIME_S", "120"),
    ];
    BedJob {
        per_node: 2,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        host_env: host_env
            .iter()
            .map(|(h, k, v)| (*h, k.to_string(), v.to_string()))
            .collect(),
        start_timeout: Duration::from_secs(60),
        rank: PathBuf::from(env!("CARGO_BIN_EXE_chorus-test-rank")),
    }
}

/// Nothing failed before the fault: a failure now is a false death (heartbeats starved by
/// load, or a liveness bug), and every bound after it would measure the wrong thing.
fn no_failure_yet(bed: &mut Bed, what: &str) {
    for s in 0..6 {
        if let Some(f) = bed.log(s).into_iter().find(|e| e.ev() == "failed") {
            panic!(
                "{what}: slot {s} failed before any fault (a false death): {f}{}",
                bed.diagnose()
            );
        }
    }
}

fn expect(bed: &mut Bed, slot: usize, evs: &[&str]) -> Event {
    match bed.wait_any(slot, evs, WAIT) {
        Some(e) => e,
        None => panic!("slot {slot}: no {evs:?} within {WAIT:?}:{}", bed.diagnose()),
    }
}

/// Every survivor fails naming a rank of the lost host within `bound_ms` of `at`.
fn survivors_fail(bed: &mut Bed, at: u64, bound_ms: f64, what: &str) {
    let lost: BTreeSet<u64> = [4, 5].into();
    for s in SURVIVORS {
        let f = expect(bed, s, &["failed"]);
        let latency = ms_between(at, f.t());
        println!(
            "{what}: slot {s} failed {latency:.0} ms after the fault: {}",
            f.str("detail").unwrap_or("")
        );
        assert!(
            f.kind() == "peer-failed" && f.peer().is_some_and(|p| lost.contains(&p)),
            "{what}: slot {s} should fail naming rank 4 or 5: {f}{}",
            bed.diagnose()
        );
        assert!(
            latency <= bound_ms,
            "{what}: slot {s} failed {latency:.0} ms after, bound {bound_ms} ms"
        );
    }
}

/// The survivors shrink to the same 4-rank membership (no split brain), in order.
fn survivors_agree(bed: &mut Bed, what: &str) {
    let mut agreed = BTreeSet::new();
    for (s, want) in SURVIVORS.iter().zip(0u64..) {
        let e = expect(bed, *s, &["shrunk", "shrink-failed"]);
        assert_eq!(e.ev(), "shrunk", "{what}: slot {s}: {e}{}", bed.diagnose());
        assert_eq!(
            (e.u64("world"), e.u64("rank")),
            (Some(4), Some(want)),
            "{what}: {e}"
        );
        agreed.insert((e.u64("epoch"), e.u64("comm")));
    }
    assert_eq!(
        agreed.len(),
        1,
        "{what}: one membership, one epoch: {agreed:?}"
    );
}

/// The survivors finish together on 4 ranks, every result checked by the ranks.
fn survivors_finish(bed: &mut Bed, what: &str) {
    bed.send_all(&SURVIVORS, "finish");
    for s in SURVIVORS {
        let e = expect(bed, s, &["finished", "error"]);
        assert_eq!(
            (e.ev(), e.u64("world")),
            ("finished", Some(4)),
            "{what}: slot {s}: {e}"
        );
    }
}

/// Scenario 1: The host vanishes: link silenced, every process SIGKILLed, link deleted.
#[test]
fn a_vanished_host_fails_every_survivor_by_the_deadline_and_they_go_on_as_four() {
    let Some(mut bed) = start("vanished host", &[]) else {
        return;
    };
    let at = bed.vanish(LOST).unwrap();
    survivors_fail(&mut bed, at, DEADLINE_MS * 1.2, "vanish");
    survivors_agree(&mut bed, "vanish");
    survivors_finish(&mut bed, "vanish");
}

/// Scenario 2: Partition: host 2 cut off mid all-reduce. The majority shrinks; the minority fails
/// with a named error by the deadline and cannot shrink under the majority quorum; no
/// minority rank ever runs in the new epoch. Once the cut heals, the minority learns it was
/// removed within the deadline + 20 % (it knocks on the members it holds dead, one per
/// heartbeat interval, and a member of the new epoch refuses it with `evicted`): its next
/// shrink fails `evicted`. Then its processes exit, a new one started on the healed host
/// joins with the grow token while the majority grows by one, and the five all-reduce
/// correctly. The minority stays idle after its failure to ask again.
#[test]
fn a_partitioned_host_cannot_shrink_and_the_majority_goes_on_alone() {
    let Some(mut bed) = start("partition", &[(LOST, "CT_ON_FAIL", "idle")]) else {
        return;
    };
    bed.cut(LOST).unwrap();
    let at = chorus_tests::clock::mono_ns();
    for s in bed.slots_of(LOST) {
        let f = expect(&mut bed, s, &["failed"]);
        let latency = ms_between(at, f.t());
        println!("partition: minority slot {s} failed {latency:.0} ms after the cut: {f}");
        assert!(!f.kind().is_empty(), "a named error: {f}");
        assert!(
            latency <= DEADLINE_MS * 1.2,
            "minority slot {s}: {latency:.0} ms"
        );
        bed.send(s, "shrink");
        let shrink = expect(&mut bed, s, &["shrunk", "shrink-failed"]);
        assert_eq!(
            (shrink.ev(), shrink.kind()),
            ("shrink-failed", "no-quorum"),
            "{shrink}"
        );
    }
    survivors_fail(&mut bed, at, DEADLINE_MS * 1.2, "partition");
    survivors_agree(&mut bed, "partition");
    bed.heal(LOST).unwrap();
    let healed = chorus_tests::clock::mono_ns();
    for s in bed.slots_of(LOST) {
        let evicted = evicted_after_heal(&mut bed, s, healed);
        let latency = ms_between(healed, evicted.t());
        println!(
            "partition: healed minority slot {s} evicted {latency:.0} ms after the heal: {evicted}"
        );
        assert!(
            latency <= DEADLINE_MS * 1.2,
            "minority slot {s} learned it was evicted {latency:.0} ms after the heal"
        );
    }
    for s in bed.slots_of(LOST) {
        let log = bed.log(s);
        assert!(
            !log.iter()
                .any(|e| matches!(e.ev(), "shrunk" | "finished" | "grown")),
            "minority slot {s} ran in a new epoch: {log:?}"
        );
    }
    survivors_finish(&mut bed, "partition");
    rejoin_through_grow(&mut bed);
}

/// Asks a healed minority rank to shrink until its answer is `evicted` (until then it is
/// `no-quorum`, at once); that answer. Panics past the deadline + 20 % and some asking.
fn evicted_after_heal(bed: &mut Bed, slot: usize, healed: u64) -> Event {
    loop {
        bed.send(slot, "shrink");
        let again = expect(bed, slot, &["shrunk", "shrink-failed"]);
        assert_eq!(
            again.ev(),
            "shrink-failed",
            "a healed minority rank got in: {again}"
        );
        if again.kind() == "evicted" {
            return again;
        }
        assert_eq!(again.kind(), "no-quorum", "{again}");
        let waited = ms_between(healed, chorus_tests::clock::mono_ns());
        assert!(
            waited <= DEADLINE_MS * 2.0,
            "slot {slot}: still not evicted {waited:.0} ms after the heal: {again}{}",
            bed.diagnose()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The evicted minority's processes exit; a restarted process on the healed host joins
/// with the grow token (rank 0's control endpoint) while the four grow by one; the five
/// run checked all-reduces.
fn rejoin_through_grow(bed: &mut Bed) {
    for s in bed.slots_of(LOST) {
        bed.send(s, "exit");
        expect(bed, s, &["exit"]);
    }
    let ready = bed.log(0).into_iter().find(|e| e.ev() == "ready").unwrap();
    let token = ready.str("grow_token").unwrap().to_owned();
    let env: Vec<(String, String)> = [
        ("CHORUS_HEARTBEAT_INTERVAL", "100ms"),
        ("CHORUS_HEARTBEAT_DEADLINE", "2s"),
        ("CT_LIFETIME_S", "60"),
        ("CT_SIZES", "1,256,4096"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("CT_JOIN".to_string(), token)])
    .collect();
    let rank = PathBuf::from(env!("CARGO_BIN_EXE_chorus-test-rank"));
    let newcomer = bed.spawn_rank(LOST, &rank, &env).unwrap();
    bed.send_all(&SURVIVORS, "grow 1");
    let joined = expect(bed, newcomer, &["joined", "init-failed"]);
    println!("partition: restarted process on the healed host: {joined}");
    assert_eq!(
        (joined.ev(), joined.u64("rank"), joined.u64("world")),
        ("joined", Some(4), Some(5)),
        "{joined}{}",
        bed.diagnose()
    );
    let epoch = joined.u64("epoch");
    for s in SURVIVORS {
        let g = expect(bed, s, &["grown", "grow-failed"]);
        assert_eq!(
            (g.ev(), g.u64("world"), g.u64("rank"), g.u64("epoch")),
            ("grown", Some(5), Some(s as u64), epoch),
            "{g}"
        );
    }
    let all = [0, 1, 2, 3, newcomer];
    bed.send_all(&all, "loop");
    std::thread::sleep(Duration::from_millis(500));
    bed.send_all(&all, "finish");
    for s in all {
        let f = expect(bed, s, &["finished", "error"]);
        assert_eq!(
            (f.ev(), f.u64("world"), f.u64("epoch")),
            ("finished", Some(5), epoch),
            "slot {s}: {f}"
        );
        assert!(f.u64("iters").unwrap_or(0) >= 5, "{f}");
    }
}

/// A rank on node 1 dies before it joins (issue 17, 1: each node's launcher witnesses its
/// own ranks and tells the job promptly). Its launcher is the only witness and the root is
/// on node 0: it tells the root, which refuses every joiner with `aborted` naming the rank
/// at once (`bootstrap` errors upstairs; a rank that asks after node 0's launcher ended
/// finds no root, as promptly), so every other rank's init fails within 5 s of the death
/// (the init deadline is 30 s; the bound leaves room for the others' own start on a loaded
/// machine).
#[test]
fn a_rank_on_another_node_that_dies_before_joining_fails_the_init_promptly() {
    let what = "death before joining";
    let Some(mut bed) = Bed::new_or_skip(3, what) else {
        return;
    };
    bed.start(&bed_job(&[(1, "CT_DIE_BEFORE_INIT", "3")]))
        .unwrap();
    expect(&mut bed, 3, &["doomed"]);
    // Every host's launcher and both of its ranks are up (the others joining the root), so
    // the death lands while the job waits for it; then rank 3 dies.
    let until = std::time::Instant::now() + WAIT;
    while (0..3).any(|h| bed.pids(h).len() < 3) {
        assert!(
            std::time::Instant::now() < until,
            "{what}: the hosts did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    bed.send(3, "die");
    let died = expect(&mut bed, 3, &["died"]);
    for s in [0, 1, 2, 4, 5] {
        let f = expect(&mut bed, s, &["init-failed", "ready"]);
        let latency = ms_between(died.t(), f.t()).max(0.0);
        println!(
            "{what}: slot {s} {} {latency:.0} ms after rank 3 died: {f}",
            f.ev()
        );
        assert_eq!(
            (f.ev(), f.kind()),
            ("init-failed", "bootstrap"),
            "slot {s}: {f}{}",
            bed.diagnose()
        );
        assert!(
            latency <= 5000.0,
            "slot {s}: {latency:.0} ms after the death"
        );
    }
}

/// Scenario 4: A frozen host: SIGSTOP of every process; detection by the deadline; on SIGCONT its
/// ranks learn they were evicted.
#[test]
fn a_frozen_host_is_detected_by_the_deadline_and_evicted_on_resume() {
    let Some(mut bed) = start("frozen host", &[]) else {
        return;
    };
    let at = bed.signal_host(LOST, libc::SIGSTOP);
    survivors_fail(&mut bed, at, DEADLINE_MS * 1.2, "freeze");
    survivors_agree(&mut bed, "freeze");
    std::thread::sleep(Duration::from_millis(300));
    bed.signal_host(LOST, libc::SIGCONT);
    for s in bed.slots_of(LOST) {
        // Its operation fails (on the eviction, or first on a survivor's departure from
        // the old epoch); its shrink then says what it is.
        let f = expect(&mut bed, s, &["failed"]);
        let shrink = expect(&mut bed, s, &["shrunk", "shrink-failed"]);
        println!(
            "freeze: resumed slot {s}: {} then {}",
            f.kind(),
            shrink.kind()
        );
        assert_eq!(
            (shrink.ev(), shrink.kind()),
            ("shrink-failed", "evicted"),
            "slot {s}: {f} {shrink}"
        );
    }
    survivors_finish(&mut bed, "freeze");
}

/// Scenario 6: Teardown across hosts: `destroy` while a remote host is frozen, and while one is cut
/// off, stays within the teardown budget. The ranks finish first, so `destroy` is called
/// while idle, before anyone's deadline could notice the fault.
#[test]
fn destroy_stays_within_the_teardown_budget_with_a_remote_host_frozen_or_cut_off() {
    for fault in ["frozen", "cut off"] {
        let Some(mut bed) = start("teardown", &[]) else {
            return;
        };
        let all: Vec<usize> = (0..6).collect();
        bed.send_all(&all, "finish");
        for s in all {
            expect(&mut bed, s, &["finished"]);
        }
        if fault == "frozen" {
            bed.signal_host(LOST, libc::SIGSTOP);
        } else {
            bed.cut(LOST).unwrap();
        }
        bed.send_all(&SURVIVORS, "destroy");
        for s in SURVIVORS {
            let d = expect(&mut bed, s, &["destroyed"]);
            let ms = d.f64("ms").unwrap_or(f64::MAX);
            println!("teardown, remote host {fault}: slot {s} destroyed in {ms:.0} ms");
            assert!(
                ms <= TEARDOWN_MS * 1.2,
                "{fault}: slot {s} took {ms:.0} ms: {d}"
            );
        }
    }
}

/// Scenario 3: Asymmetric loss: host 1 → host 2 dropped while host 2 → host 1 still flows. Detection
/// and agreement still end in one membership within 2 × the deadline (+ 20 %, the margin of
/// bounds of seconds) on every rank: every member of it fails and shrinks into the same
/// membership by then, and every other rank's last shrink has told it it is out (evicted
/// or without a quorum) by then too, and it stops.
#[test]
fn one_way_loss_ends_in_one_membership_within_two_deadlines() {
    let Some(mut bed) = start("asymmetric loss", &[]) else {
        return;
    };
    let (from, to) = (1, 2);
    no_failure_yet(&mut bed, "asymmetric loss");
    bed.drop_one_way(from, to).unwrap();
    let at = chorus_tests::clock::mono_ns();
    let bound_ms = 2.0 * DEADLINE_MS * 1.2;
    for s in 0..6 {
        let f = expect(&mut bed, s, &["failed"]);
        let failed_ms = ms_between(at, f.t());
        println!(
            "one-way {from}->{to}: slot {s} failed ({}) {failed_ms:.0} ms after the drop",
            f.kind()
        );
        assert!(
            failed_ms <= bound_ms,
            "slot {s} failed {failed_ms:.0} ms after the drop"
        );
    }
    // The agreement may take more than one epoch: a first shrink that keeps one rank of the
    // lossy host, then a second that removes it, which the first epoch's members follow by
    // failing and shrinking again. What must be one is where it ends, by the bound; so the
    // reports are read once the bound has passed (plus time for a late one to show).
    let settle = Duration::from_secs_f64((bound_ms + 500.0) / 1000.0);
    std::thread::sleep(settle.saturating_sub(Duration::from_nanos(
        chorus_tests::clock::mono_ns().saturating_sub(at),
    )));
    let mut agreed = BTreeSet::new();
    let mut members = 0;
    for s in 0..6 {
        let log = bed.log(s);
        let ends: Vec<&Event> = log
            .iter()
            .filter(|e| e.t() >= at && matches!(e.ev(), "shrunk" | "destroyed"))
            .collect();
        let tries: Vec<String> = log
            .iter()
            .filter(|e| e.t() >= at && e.ev() == "shrink-failed")
            .map(|e| e.kind().to_owned())
            .collect();
        let epochs: Vec<String> = ends
            .iter()
            .map(|e| format!("{}@e{}", e.ev(), e.u64("epoch").unwrap_or(0)))
            .collect();
        let Some(last) = ends.last() else {
            panic!("slot {s}: neither shrunk nor stopped{}", bed.diagnose());
        };
        // Where the agreement ended for this rank: its last shrink, or the refusal that put
        // it out.
        let end = match (
            last.ev(),
            log.iter().rev().find(|e| e.ev() == "shrink-failed"),
        ) {
            ("destroyed", Some(refusal)) => refusal.t(),
            _ => last.t(),
        };
        let ended_ms = ms_between(at, end);
        println!(
            "one-way {from}->{to}: slot {s}: {epochs:?}, agreement ended at {ended_ms:.0} ms, \
             failed shrinks {tries:?}"
        );
        assert!(
            ended_ms <= bound_ms,
            "slot {s}: the agreement ended for it {ended_ms:.0} ms after the drop{}",
            bed.diagnose()
        );
        if last.ev() == "shrunk" {
            members += 1;
            agreed.insert((last.u64("epoch"), last.u64("comm"), last.u64("world")));
        } else {
            assert!(
                tries.iter().any(|k| k == "evicted" || k == "no-quorum"),
                "slot {s} left out without learning why: {tries:?}"
            );
        }
    }
    assert_eq!(
        agreed.len(),
        1,
        "one membership: {agreed:?}{}",
        bed.diagnose()
    );
    let world = agreed.iter().next().and_then(|m| m.2);
    assert_eq!(world, Some(members), "every member of it shrank into it");
    assert!(members >= 4, "a majority goes on: {members}");
    bed.allow(to).unwrap();
}

/// The userspace router that stands in for netem (kernels without `sch_netem`): a UDP echo
/// between two hosts takes at least the four link crossings' delay, a cut host hears
/// nothing until it is healed, and the namespaces are gone once the bed is dropped.
#[test]
fn the_router_bed_delays_cuts_and_heals() {
    let bed = match Bed::on_router(2, &["delay", "10ms"]) {
        Ok(b) => b,
        Err(why) => {
            let line = format!("skipped: router bed: {why}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return;
        }
    };
    let server =
        chorus_tests::wire::in_namespace(&bed.ns_path(1), || UdpSocket::bind((bed.addr(1), 7007)))
            .unwrap();
    let client =
        chorus_tests::wire::in_namespace(&bed.ns_path(0), || UdpSocket::bind((bed.addr(0), 0)))
            .unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    let stop = AtomicBool::new(false);
    /// Stops the echo server however the scope ends: a failed assertion inside it would
    /// otherwise leave the scope waiting on the server for ever.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = Stop(&stop);
        s.spawn(|| {
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = server.recv_from(&mut buf) {
                    let _ = server.send_to(&buf[..n], from);
                }
            }
        });
        let echo = |k: u8| -> Option<Duration> {
            let t = Instant::now();
            client.send_to(&[k], (bed.addr(1), 7007)).unwrap();
            let mut buf = [0u8; 64];
            // A late echo of an earlier probe is not this one's.
            while let Ok(n) = client.recv(&mut buf) {
                if n == 1 && buf[0] == k {
                    return Some(t.elapsed());
                }
            }
            None
        };
        // There and back, each way across host 0's link and host 1's: 4 × 10 ms.
        for k in 0..5 {
            let rtt = echo(k).expect("an echo through the router");
            assert!(
                rtt >= Duration::from_millis(40),
                "faster than the links: {rtt:?}"
            );
            assert!(rtt < Duration::from_millis(400), "{rtt:?}");
        }
        bed.cut(1).unwrap();
        assert_eq!(echo(100), None, "a cut host answers nothing");
        bed.heal(1).unwrap();
        assert!(echo(101).is_some(), "healed");
    });
    let names: Vec<PathBuf> = (0..2).map(|i| bed.ns_path(i)).collect();
    drop(bed);
    for ns in names {
        assert!(!ns.exists(), "{} left behind", ns.display());
    }
}

/// Scenario 5, short: 20 ms ± 5 ms delay and 1 % loss on every link; every collective of
/// the bench's matrix is correct across the hosts and its bus bandwidth is reported (the
/// 5-minute zero-false-death loop is `chorus-figures hosts`). Without netem in the kernel
/// the hosts stand on the bed's userspace router, which impairs every link the same way.
#[test]
fn every_collective_is_correct_across_hosts_on_a_bad_network() {
    let spec = ["delay", "20ms", "5ms", "loss", "1%"];
    let (bed, network) = match Bed::bad_network(3, &spec) {
        Ok(b) => b,
        Err(why) => return chorus_tests::skip(&format!("bad network: no host bed ({why})")),
    };
    println!("bad network: {network}");
    let chorus = chorus_tests::bed::chorus_bin().unwrap();
    for coll in [
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "broadcast",
        "reduce",
        "all-to-all",
        "send-recv",
    ] {
        let token = bed.dir().join(format!("token-{coll}"));
        let mut nodes = Vec::new();
        for i in 0..3 {
            let mut cmd = bed.command(i, &chorus);
            cmd.args([
                "bench",
                coll,
                "--nnodes",
                "3",
                "--node-rank",
                &i.to_string(),
            ])
            .args(["--master", &bed.master(), "--token-file"])
            .arg(&token)
            .args([
                "-n", "2", "-b", "8", "-e", "64K", "-f", "32", "-i", "3", "-w", "1",
            ])
            .arg("--json")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
            nodes.push(cmd.spawn().unwrap());
        }
        let outs: Vec<std::process::Output> = nodes
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        for (i, out) in outs.iter().enumerate() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{coll}: node {i}: {:?}\n{err}",
                out.status
            );
        }
        let doc: serde_json::Value = serde_json::from_slice(&outs[0].stdout).unwrap();
        assert_eq!(doc["ranks"], 6, "{doc}");
        let rows = doc["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "8 B, 256 B, 8 KiB: {doc}");
        for row in rows {
            for place in ["in_place", "out_of_place"] {
                if row[place].is_null() {
                    continue;
                }
                assert_eq!(row[place]["wrong"], 0, "{coll}: {row}");
                assert!(row[place]["busbw_gbs"].as_f64().is_some(), "{coll}: {row}");
            }
        }
        println!(
            "{coll} across 3 hosts: avg busbw {} GB/s",
            doc["avg_busbw_gbs"]
        );
    }
    // On the router, the loss was real: thousands of packets, about 2 % of them dropped.
    if let Some(c) = bed.router_counts() {
        println!("router: {c:?}");
        assert!(c.delivered > 1000 && c.dropped > 0, "{c:?}");
    }
}
