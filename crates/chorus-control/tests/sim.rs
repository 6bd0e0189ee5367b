//! Seeded scenarios through the simulator: every property is checked on every run, and a
//! failure names its seed. Replay one with
//! `CHORUS_SIM_SEED=<seed> cargo test -p chorus-control --test sim replay -- --nocapture`
//! (or `cargo run --release -p chorus-control --example sim -- --replay <seed>`).

use std::time::Duration;

use chorus_control::Quorum;
use chorus_control::sim::{self, Fault, FaultKind, Report, Scenario, secs};
use chorus_protocol::message::Kind;

/// Random scenarios per batch. Debug builds run fewer per batch (same coverage per seed;
/// `--release` or `CHORUS_SIM_SCENARIOS` runs more).
fn per_batch() -> u64 {
    if let Some(n) = std::env::var("CHORUS_SIM_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if cfg!(debug_assertions) { 125 } else { 250 }
}

fn assert_passed(scenario: Scenario, report: &Report) {
    assert!(
        report.passed(),
        "scenario failed; replay with CHORUS_SIM_SEED={} (or --example sim -- --replay {})\n{}\n{}",
        scenario.seed,
        scenario.seed,
        scenario.summary(),
        report
    );
}

fn batch(first: u64) {
    let mut failures = Vec::new();
    for seed in first..first + per_batch() {
        let scenario = Scenario::random(seed);
        let report = sim::run(scenario.clone());
        if !report.passed() {
            failures.push(format!(
                "seed {seed}: {}\n    {}",
                scenario.summary(),
                report
                    .violations
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenarios failed (replay: CHORUS_SIM_SEED=<seed> cargo test -p chorus-control --test sim replay -- --nocapture):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// Four batches so the test harness spreads them over the cores.
#[test]
fn random_scenarios_batch_0() {
    batch(0);
}

#[test]
fn random_scenarios_batch_1() {
    batch(10_000);
}

#[test]
fn random_scenarios_batch_2() {
    batch(20_000);
}

#[test]
fn random_scenarios_batch_3() {
    batch(30_000);
}

#[test]
fn replay() {
    let Some(seed) = std::env::var("CHORUS_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    else {
        println!("replay: skipped (set CHORUS_SIM_SEED=<seed> to replay one scenario)");
        return;
    };
    let scenario = Scenario::random(seed);
    println!("{}", scenario.summary());
    let report = sim::run(scenario.clone());
    println!("{report}");
    assert_passed(scenario, &report);
}

#[test]
fn same_seed_same_run() {
    for seed in [3, 77, 1234] {
        let a = sim::run(Scenario::random(seed));
        let b = sim::run(Scenario::random(seed));
        assert_eq!(a.events, b.events, "seed {seed}");
        assert_eq!(a.frames, b.frames, "seed {seed}");
        assert_eq!(a.detection_ms, b.detection_ms, "seed {seed}");
        assert_eq!(a.violations, b.violations, "seed {seed}");
    }
}

#[test]
fn fault_free_runs_declare_nobody_and_cost_k_over_interval() {
    for (seed, ranks) in [(1, 8), (2, 64), (3, 256)] {
        let scenario = Scenario::quiet(seed, ranks);
        let expected =
            f64::from(scenario.config.observers) / scenario.config.heartbeat_interval.as_secs_f64();
        let report = sim::run(scenario.clone());
        assert_passed(scenario, &report);
        assert_eq!(
            report.hops.count, 0,
            "nobody may be declared in a fault-free run"
        );
        assert!(
            (report.steady_msgs_per_rank_per_s - expected).abs() < 0.5,
            "{report}"
        );
    }
}

#[test]
fn stalls_inside_the_slack_are_tolerated() {
    let mut scenario = Scenario::quiet(11, 32);
    let stall = scenario.tolerated_freeze();
    for proc in [0, 5, 6, 31] {
        scenario.faults.push(Fault {
            at: secs(2.0),
            proc,
            kind: FaultKind::Freeze(stall),
        });
    }
    scenario.end = secs(8.0);
    let report = sim::run(scenario.clone());
    assert_passed(scenario, &report);
    assert_eq!(
        report.hops.count, 0,
        "a stall inside the slack is not a death: {report}"
    );
}

#[test]
fn a_crash_is_detected_within_the_deadline_and_survivors_shrink() {
    let mut scenario = Scenario::quiet(5, 16);
    scenario.shrink = Some(Duration::from_millis(10));
    scenario.faults.push(Fault {
        at: secs(2.0),
        proc: 7,
        kind: FaultKind::Crash,
    });
    scenario.end = secs(12.0);
    let report = sim::run(scenario.clone());
    assert_passed(scenario.clone(), &report);
    let bound = scenario.config.deadline.as_secs_f64() * 1e3 * 1.2;
    assert!(
        report.detection_ms.max <= bound,
        "detection {} ms > deadline + 20 %",
        report.detection_ms.max
    );
    assert_eq!(report.final_epoch, 1);
}

#[test]
fn coordinator_crash_in_each_phase_still_agrees() {
    for (seed, kind) in [(21, Kind::Prepare), (22, Kind::Propose), (23, Kind::Commit)] {
        for quorum in [Quorum::Majority, Quorum::Survivors] {
            let mut scenario = Scenario::quiet(seed, 12);
            scenario.config.quorum = quorum;
            scenario.shrink = Some(Duration::from_millis(5));
            scenario.faults.push(Fault {
                at: secs(1.5),
                proc: 0,
                kind: FaultKind::CrashCoordinator(kind),
            });
            scenario.faults.push(Fault {
                at: secs(2.0),
                proc: 9,
                kind: FaultKind::Crash,
            });
            scenario.end = secs(25.0);
            let report = sim::run(scenario.clone());
            assert_passed(scenario, &report);
            assert!(
                report.final_epoch >= 1,
                "{kind:?} {quorum:?}: no agreement\n{report}"
            );
        }
    }
}

#[test]
fn a_frozen_rank_is_evicted_when_it_resumes() {
    let mut scenario = Scenario::quiet(8, 10);
    let freeze = scenario.config.deadline * 2;
    scenario.faults.push(Fault {
        at: secs(2.0),
        proc: 4,
        kind: FaultKind::Freeze(freeze),
    });
    scenario.end = secs(12.0);
    let report = sim::run(scenario.clone());
    assert_passed(scenario, &report);
    assert_eq!(report.evictions, 1, "{report}");
}

#[test]
fn departures_spread_in_log_hops() {
    let mut scenario = Scenario::quiet(9, 256);
    scenario.faults.push(Fault {
        at: secs(2.0),
        proc: 100,
        kind: FaultKind::Depart,
    });
    scenario.faults.push(Fault {
        at: secs(2.5),
        proc: 7,
        kind: FaultKind::Abort,
    });
    scenario.end = secs(4.0);
    let report = sim::run(scenario.clone());
    assert_passed(scenario, &report);
    assert!(report.hops.max <= 9.0, "{report}");
}

#[test]
fn grow_admits_joiners_at_an_epoch_boundary() {
    let mut scenario = Scenario::quiet(13, 8);
    scenario.shrink = Some(Duration::from_millis(5));
    scenario.faults.push(Fault {
        at: secs(2.0),
        proc: 3,
        kind: FaultKind::Admit(2),
    });
    scenario.faults.push(Fault {
        at: secs(4.0),
        proc: 5,
        kind: FaultKind::Crash,
    });
    scenario.end = secs(12.0);
    let report = sim::run(scenario.clone());
    assert_passed(scenario, &report);
    assert_eq!(report.final_epoch, 2, "grow then shrink: {report}");
}

#[test]
fn a_minority_cannot_agree_under_majority_quorum() {
    let mut scenario = Scenario::quiet(14, 8);
    scenario.shrink = Some(Duration::from_millis(5));
    for proc in 0..4 {
        scenario.faults.push(Fault {
            at: secs(2.0),
            proc,
            kind: FaultKind::Crash,
        });
    }
    scenario.end = secs(14.0);
    let report = sim::run(scenario.clone());
    assert_eq!(report.final_epoch, 0, "4 of 8 is not a majority: {report}");
    assert!(
        report.stalls > 0,
        "the coordinator reports the stalled round: {report}"
    );
    // With the survivors quorum the same failure is survivable.
    scenario.config.quorum = Quorum::Survivors;
    let report = sim::run(scenario.clone());
    assert_passed(scenario, &report);
    assert_eq!(report.final_epoch, 1, "{report}");
}

#[test]
fn ten_thousand_ranks() {
    // 3 silent crashes and 2 long freezes at random ranks; every survivor's application
    // shrinks when it learns of one, so agreement runs at 10 000 ranks too.
    let mut scenario = Scenario::scale(10, 10_000, 3, 2);
    scenario.shrink = Some(Duration::from_millis(20));
    scenario.end = scenario.end + scenario.config.agreement_timeout * 2;
    let report = sim::run(scenario.clone());
    println!("{report}");
    assert_passed(scenario.clone(), &report);
    assert!(
        report.detection_ms.count >= 5 * (10_000 - 5),
        "every healthy rank learned every fault: {report}"
    );
    let bound = scenario.config.deadline.as_secs_f64() * 1e3 * 1.2;
    assert!(report.detection_ms.max <= bound, "{report}");
    assert!(report.hops.max <= 16.0, "log2(10 000) ≈ 13.3: {report}");
    assert!(
        (report.steady_msgs_per_rank_per_s - 10.0).abs() < 0.5,
        "{report}"
    );
    assert!(
        report.final_epoch >= 1,
        "survivors agreed on a smaller world: {report}"
    );
    assert_eq!(
        report.evictions, 2,
        "both frozen ranks learned they were evicted: {report}"
    );
}
