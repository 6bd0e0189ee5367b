//! `chorus-figures hosts`: detection across network-namespace hosts (3 hosts × 2 ranks, one
//! node launcher per host, `chorus_tests::bed`), each figure over `--repeats` runs (default
//! 20): from the fault to each rank's failed all-reduce, for a host that vanishes (link
//! silenced, every process SIGKILLed), a frozen host (SIGSTOP), a partitioned host (both
//! sides), and one-way loss (every rank, and the end of the agreement); and, for a healed
//! partition, from the heal to each minority rank's shrink failing `evicted`. Then the bad
//! network: 20 ms ± 5 ms delay and 1 % loss on every link (`tc netem`; without it, the
//! bed's userspace router, `chorus_tests::wire`) and an all-reduce loop of `--loop-minutes` (default 5) at the
//! default heartbeat and deadline, counting false deaths. Needs root, `ip`, `nft`,
//! `unshare` and the `chorus` binary beside this one (`cargo build -p chorus-cli`).
//!
//! ```sh
//! cargo build -p chorus-cli -p chorus-tests --bins
//! target/debug/chorus-figures hosts [--repeats 20] [--heartbeat 100ms] [--deadline 2s]
//!                                   [--loop-minutes 5] [--only heal] [--pin-neighbours]
//!                                   [--bad-network]
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chorus_tests::bed::{Bed, BedJob};
use chorus_tests::clock::{mono_ns, ms_between};

use super::{progress, rank_program, table};

const WAIT: Duration = Duration::from_secs(30);

/// `chorus-figures hosts`' options.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Runs per scenario.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// `CHORUS_HEARTBEAT_INTERVAL` of the ranks.
    #[arg(long, default_value = "100ms")]
    heartbeat: String,
    /// `CHORUS_HEARTBEAT_DEADLINE` of the ranks.
    #[arg(long, default_value = "2s")]
    deadline: String,
    /// Minutes of the bad-network all-reduce loop (0: none).
    #[arg(long, default_value_t = 5.0, value_parser = minutes)]
    loop_minutes: f64,
    /// The rank program, `chorus-test-rank` (by default the one beside this executable).
    #[arg(long = "rank-program", value_name = "PATH", default_value_os_t = rank_program())]
    bin: PathBuf,
    /// Run only the scenarios whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Pin the hosts' neighbour entries (static ARP; `Bed::pin_neighbours`), so a healed
    /// cut carries packets at once instead of after the next ARP request (0 to 1 s).
    #[arg(long)]
    pin_neighbours: bool,
    /// Run the detection scenarios on the bad network too (`BAD_NETWORK` on every link),
    /// to set beside the simulator's bad-network column.
    #[arg(long)]
    bad_network: bool,
}

/// Scenario 5's impairment, netem's words: on every host's link.
const BAD_NETWORK: [&str; 5] = ["delay", "20ms", "5ms", "loss", "1%"];

/// `--loop-minutes`: zero or more, under a day.
fn minutes(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(m) if m.is_finite() && (0.0..1440.0).contains(&m) => Ok(m),
        _ => Err(format!("{s:?} is not a number of minutes from 0 to 1440")),
    }
}

/// The mode's entry.
pub(crate) fn main(args: Args) {
    let started = Instant::now();
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let mut failed_runs = 0;
    for (name, scenario) in [
        ("vanished host: survivors", Scenario::Vanish),
        ("frozen host: survivors", Scenario::Freeze),
        ("partition: majority", Scenario::Partition),
        ("one-way loss: every rank", Scenario::OneWay),
        ("healed partition: minority", Scenario::Heal),
    ] {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let mut samples = Vec::new();
        let mut extra = Vec::new();
        let mut runs = 0;
        let mut failed = 0;
        while runs < args.repeats && failed < args.repeats {
            progress(&format!(
                "{name} {}/{} ({failed} failed)",
                runs + 1,
                args.repeats
            ));
            let run = std::panic::catch_unwind(|| scenario.run(&args));
            match run {
                Ok(Some((s, e))) => {
                    samples.extend(s);
                    extra.extend(e);
                    runs += 1;
                }
                Ok(None) => return,
                Err(_) => failed += 1,
            }
        }
        failed_runs += failed;
        let mut these = vec![(format!("{name}: {} (ms)", scenario.measured()), samples)];
        if let Some(label) = scenario.extra() {
            these.push((format!("{label} (ms)"), extra));
        }
        // Each scenario's rows as soon as they are measured: a long run cut short keeps them.
        eprintln!("chorus-figures: {name}: {failed} run(s) failed");
        for (label, samples) in &these {
            eprintln!(
                "chorus-figures: {label}: n {} p50 {:.1} p99 {:.1} max {:.1}",
                samples.len(),
                chorus_tests::stats::percentile(samples, 50.0),
                chorus_tests::stats::percentile(samples, 99.0),
                chorus_tests::stats::percentile(samples, 100.0)
            );
        }
        rows.extend(these);
    }
    println!(
        "3 namespace hosts x 2 ranks{}, heartbeat {} / deadline {}, neighbours {}, {} runs per \
         scenario, {} runs failed (a false death before the fault, or a rank off script), \
         {:.0} s\n",
        if args.bad_network {
            format!(" on a bad network ({})", BAD_NETWORK.join(" "))
        } else {
            String::new()
        },
        args.heartbeat,
        args.deadline,
        if args.pin_neighbours {
            "pinned"
        } else {
            "resolved by ARP"
        },
        args.repeats,
        failed_runs,
        started.elapsed().as_secs_f64()
    );
    table(&rows);
    if args.loop_minutes > 0.0 {
        bad_network_loop(&args);
    }
}

#[derive(Copy, Clone)]
enum Scenario {
    Vanish,
    Freeze,
    Partition,
    OneWay,
    Heal,
}

impl Scenario {
    /// What the first figure of a run measures.
    fn measured(self) -> &'static str {
        match self {
            Scenario::Heal => "heal to evicted",
            _ => "fault to failed op",
        }
    }

    /// The second figure a run yields, if any.
    fn extra(self) -> Option<&'static str> {
        match self {
            Scenario::Partition => Some("partition: minority, cut to failed op"),
            Scenario::OneWay => Some("one-way loss: drop to the last member's shrink"),
            _ => None,
        }
    }

    /// One run: `None` if the bed cannot be built (said on stderr).
    fn run(self, args: &Args) -> Option<(Vec<f64>, Vec<f64>)> {
        let minority = match self {
            Scenario::Heal => vec![(2, "CT_ON_FAIL".to_owned(), "idle".to_owned())],
            _ => Vec::new(),
        };
        let mut bed = start(
            args,
            &[("CT_START", "loop"), ("CT_ON_FAIL", "shrink")],
            minority,
        )?;
        let survivors = [0, 1, 2, 3];
        let (mut first, mut second) = (Vec::new(), Vec::new());
        match self {
            Scenario::Vanish | Scenario::Freeze => {
                let at = match self {
                    Scenario::Vanish => bed.vanish(2).unwrap(),
                    _ => bed.signal_host(2, libc::SIGSTOP),
                };
                for s in survivors {
                    first.push(failed_after(&mut bed, s, at, &[4, 5]));
                }
            }
            Scenario::Partition => {
                bed.cut(2).unwrap();
                let at = mono_ns();
                for s in survivors {
                    first.push(failed_after(&mut bed, s, at, &[4, 5]));
                }
                for s in [4, 5] {
                    second.push(failed_after(&mut bed, s, at, &[0, 1, 2, 3]));
                }
            }
            Scenario::OneWay => {
                bed.drop_one_way(1, 2).unwrap();
                let at = mono_ns();
                let mut agreed = BTreeSet::new();
                let mut last = 0.0_f64;
                for s in 0..6 {
                    let f = expect(&mut bed, s, &["failed"]);
                    first.push(ms_between(at, f.t()));
                    let e = expect(&mut bed, s, &["shrunk", "destroyed"]);
                    if e.ev() == "shrunk" {
                        agreed.insert((e.u64("epoch"), e.u64("comm")));
                        last = last.max(ms_between(at, e.t()));
                    }
                }
                assert_eq!(agreed.len(), 1, "one membership: {agreed:?}");
                second.push(last);
            }
            Scenario::Heal => {
                bed.cut(2).unwrap();
                for s in survivors {
                    expect(&mut bed, s, &["shrunk"]);
                }
                bed.heal(2).unwrap();
                let at = mono_ns();
                for s in [4, 5] {
                    first.push(evicted_after(&mut bed, s, at));
                }
            }
        }
        Some((first, second))
    }
}

/// A looping bed of 3 hosts × 2 ranks with `env` (and `host_env` on one host), or `None`
/// when it cannot be built.
fn start(args: &Args, env: &[(&str, &str)], host_env: Vec<(usize, String, String)>) -> Option<Bed> {
    let bed = if args.bad_network {
        Bed::bad_network(3, &BAD_NETWORK).map(|(bed, _)| bed)
    } else {
        Bed::new(3)
    };
    let mut bed = match bed {
        Ok(b) => b,
        Err(why) => {
            eprintln!("chorus-figures: no host bed here: {why}");
            return None;
        }
    };
    if args.pin_neighbours
        && let Err(why) = bed.pin_neighbours()
    {
        eprintln!("chorus-figures: cannot pin the bed's neighbours: {why}");
        return None;
    }
    let mut all: Vec<(String, String)> = vec![
        ("CHORUS_HEARTBEAT_INTERVAL".into(), args.heartbeat.clone()),
        ("CHORUS_HEARTBEAT_DEADLINE".into(), args.deadline.clone()),
        ("CT_SIZES".into(), "1,256,4096".into()),
        ("CT_LIFETIME_S".into(), "900".into()),
    ];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let job = BedJob {
        per_node: 2,
        env: all,
        host_env,
        start_timeout: Duration::from_secs(60),
        rank: args.bin.clone(),
    };
    bed.launch(&job).unwrap();
    for s in 0..6 {
        expect(&mut bed, s, &["looping"]);
    }
    std::thread::sleep(Duration::from_millis(400));
    for s in 0..6 {
        let early = bed.log(s).into_iter().find(|e| e.ev() == "failed");
        assert!(early.is_none(), "false death before the fault: {early:?}");
    }
    Some(bed)
}

fn expect(bed: &mut Bed, slot: usize, evs: &[&str]) -> chorus_tests::Event {
    match bed.wait_any(slot, evs, WAIT) {
        Some(e) => e,
        None => panic!("slot {slot}: no {evs:?}:{}", bed.diagnose()),
    }
}

/// Asks healed minority rank `slot` to shrink until it answers `evicted` (until then
/// `no-quorum`, at once); when that came, in ms after `at`.
fn evicted_after(bed: &mut Bed, slot: usize, at: u64) -> f64 {
    let until = Instant::now() + WAIT;
    loop {
        bed.send(slot, "shrink");
        let e = expect(bed, slot, &["shrink-failed", "shrunk"]);
        assert_eq!(
            e.ev(),
            "shrink-failed",
            "a healed minority rank got in: {e}"
        );
        if e.kind() == "evicted" {
            return ms_between(at, e.t());
        }
        assert!(Instant::now() < until, "slot {slot} never evicted: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `slot`'s failure naming one of `peers`, in ms after `at`.
fn failed_after(bed: &mut Bed, slot: usize, at: u64, peers: &[u64]) -> f64 {
    let f = expect(bed, slot, &["failed"]);
    assert!(
        f.peer().is_some_and(|p| peers.contains(&p)) || f.kind() == "evicted",
        "slot {slot} failed naming another peer: {f}"
    );
    ms_between(at, f.t())
}

/// Scenario 5's long run: netem on every link, the default liveness settings, and an
/// all-reduce loop that must see no failure at all.
fn bad_network_loop(args: &Args) {
    let (mut bed, network) = match Bed::bad_network(3, &BAD_NETWORK) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("chorus-figures: no host bed for the bad-network loop: {why}");
            return;
        }
    };
    let job = BedJob {
        per_node: 2,
        env: [
            ("CT_START", "loop"),
            ("CT_ON_FAIL", "shrink"),
            ("CT_LIFETIME_S", "3600"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        host_env: Vec::new(),
        start_timeout: Duration::from_secs(120),
        rank: args.bin.clone(),
    };
    bed.launch(&job).unwrap();
    let minutes = args.loop_minutes;
    progress(&format!("all-reduce loop for {minutes} min on {network}"));
    std::thread::sleep(Duration::from_secs_f64(minutes * 60.0));
    let all: Vec<usize> = (0..6).collect();
    bed.send_all(&all, "finish");
    let mut iters = 0;
    for s in all.clone() {
        // A rank that failed meanwhile has shrunk or left: it says `exit`, not `finished`.
        if let Some(e) = bed.wait_any(s, &["finished", "exit"], Duration::from_secs(30))
            && e.ev() == "finished"
        {
            iters = iters.max(e.u64("iters").unwrap_or(0));
        }
    }
    let failures: Vec<String> = all
        .iter()
        .flat_map(|&s| bed.log(s))
        .filter(|e| e.ev() == "failed")
        .map(|e| e.str("detail").unwrap_or("").to_owned())
        .collect();
    let false_deaths = failures.len();
    if let Some(c) = bed.router_counts() {
        let seen = (c.delivered + c.dropped).max(1);
        println!(
            "router: {} packets delivered, {} dropped ({:.2} %), {} refused (not IPv4 between hosts)",
            c.delivered,
            c.dropped,
            100.0 * c.dropped as f64 / seen as f64,
            c.refused
        );
    }
    for f in &failures {
        eprintln!("chorus-figures: false death: {f}");
    }
    println!(
        "\nbad network: {minutes} min all-reduce loop on {network}, default heartbeat and \
         deadline: {false_deaths} false death(s), {iters} iterations\n"
    );
}
