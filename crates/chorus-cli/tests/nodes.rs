//! `chorus run` and `chorus bench` across nodes, the nodes being launchers on one loopback:
//! torchrun's numbering, the token handed over a file, a real two-node sweep, and a node
//! that cannot reach (or loses) its master giving up in time. Hosts that vanish or get cut
//! off are `tests/tests/hosts.rs`, on network-namespace hosts.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Proc, chorus, run, scratch};
use rustix::process::Signal;

const LIMIT: Duration = Duration::from_secs(90);

/// A loopback address whose UDP port was free a moment ago (the root listens on QUIC).
fn master() -> String {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.local_addr().unwrap().to_string()
}

fn node(i: u32, master: &str, token: &str, rest: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["--nnodes", "2", "--node-rank", &i.to_string(), "--master"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend([master.to_owned(), "--token-file".into(), token.to_owned()]);
    args.extend(rest.iter().map(|s| s.to_string()));
    args
}

fn start(cmd: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
    let mut all = vec![cmd];
    all.extend(args.iter().map(String::as_str));
    let mut c = chorus(&all);
    c.envs(env.iter().copied());
    Proc::start(c)
}

#[test]
fn two_nodes_number_their_ranks_as_torchrun_does() {
    let dir = scratch("nodes-env");
    let token = dir.join("token").display().to_string();
    let m = master();
    // Node 0's ranks stay until both of node 1's have printed, so node 1 finds its master.
    let script = format!(
        "echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK \
         $CHORUS_RANK $CHORUS_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT $CHORUS_UNIQUE_ID\"; \
         touch {0}/ran-$RANK; i=0; while [ $i -lt 600 ] && ! [ -e {0}/ran-2 -a -e {0}/ran-3 ]; \
         do sleep 0.05; i=$((i+1)); done",
        dir.display()
    );
    let tail = ["-n", "2", "--", "sh", "-c", &script];
    // Node 1 first: it waits for the token node 0 has not written yet.
    let one = start("run", &node(1, &m, &token, &tail), &[]);
    std::thread::sleep(Duration::from_millis(300));
    let zero = start("run", &node(0, &m, &token, &tail), &[]);
    let (zero, one) = (zero.finish(LIMIT), one.finish(LIMIT));
    assert_eq!(zero.code(), 0, "{}", zero.stderr);
    assert_eq!(one.code(), 0, "{}", one.stderr);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&token).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the token file holds the secret");
    let written = std::fs::read_to_string(&token).unwrap();
    let mut seen = BTreeMap::new();
    for (node, done) in [(0, &zero), (1, &one)] {
        for line in done.stdout.lines().filter(|l| l.starts_with("env ")) {
            let f: Vec<&str> = line.split(' ').collect();
            seen.insert(f[1].parse::<u32>().unwrap(), (node, f[1..].join(" ")));
            assert_eq!(f[9], written.trim(), "every rank has node 0's token");
        }
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    for (rank, (node, fields)) in seen {
        let local = rank % 2;
        let want = format!("{rank} 4 {local} 2 {node} {rank} 4 {m}");
        assert!(fields.starts_with(&want), "{fields} / {want}");
    }
    assert!(
        zero.stderr.contains("node 0 of 2: ranks 0..=1 of 4"),
        "{}",
        zero.stderr
    );
    assert!(
        one.stderr.contains("node 1 of 2: ranks 2..=3 of 4"),
        "{}",
        one.stderr
    );
}

#[test]
fn a_two_node_bench_sweeps_four_ranks_with_every_row_right() {
    let dir = scratch("nodes-bench");
    let token = dir.join("token").display().to_string();
    let m = master();
    let tail = [
        "-n", "2", "-b", "8", "-e", "64K", "-f", "8", "-i", "3", "-w", "1",
    ];
    let mut zero_args = node(0, &m, &token, &tail);
    zero_args.push("--json".into());
    let zero = start("bench", &zero_args, &[]);
    let one = start("bench", &node(1, &m, &token, &tail), &[]);
    let (zero, one) = (zero.finish(LIMIT), one.finish(LIMIT));
    assert_eq!(zero.code(), 0, "{}", zero.stderr);
    assert_eq!(one.code(), 0, "{}", one.stderr);
    let doc: serde_json::Value = serde_json::from_str(&zero.stdout).unwrap();
    assert_eq!(doc["ranks"], 4, "{doc}");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "8 B, 64 B, 512 B, 4 KiB, 32 KiB: {doc}");
    for row in rows {
        assert_eq!(row["in_place"]["wrong"], 0, "{row}");
        assert_eq!(row["out_of_place"]["wrong"], 0, "{row}");
    }
    assert!(
        one.stderr.contains("node 0 prints the table"),
        "{}",
        one.stderr
    );
    assert!(one.stdout.trim().is_empty(), "{}", one.stdout);
}

#[test]
fn a_node_that_loses_its_master_stops_its_ranks_and_exits_3_within_the_init_timeout() {
    let dir = scratch("nodes-lost");
    let token = dir.join("token").display().to_string();
    let m = master();
    let init = Duration::from_secs(4);
    let env = [("CHORUS_INIT_TIMEOUT", "4s")];
    let tail = ["-n", "1", "--", "sleep", "60"];
    let zero = start("run", &node(0, &m, &token, &tail), &env);
    let one = start("run", &node(1, &m, &token, &tail), &env);
    one.wait_for("rank(s) started", LIMIT);
    // Node 0 goes away at once (its rank with it, by the parent-death signal).
    zero.signal(Signal::KILL);
    let lost = Instant::now();
    let done = one.finish(LIMIT);
    let took = lost.elapsed();
    assert_eq!(done.code(), 3, "{}", done.stderr);
    assert!(
        done.stderr.contains(&format!("lost the master at {m}")),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains("SIGTERM from the launcher: it lost the master"),
        "{}",
        done.stderr
    );
    assert!(
        took <= init + init / 5,
        "{took:?} past the init timeout {init:?} + 20 %"
    );
    drop(zero);
}

#[test]
fn a_node_whose_token_never_comes_exits_3_within_the_init_timeout() {
    let dir = scratch("nodes-notoken");
    let token = dir.join("token").display().to_string();
    let started = Instant::now();
    let mut args = vec!["run".to_owned()];
    args.extend(node(1, "127.0.0.1:9", &token, &["-n", "1", "--", "true"]));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = chorus(&argv);
    c.env("CHORUS_INIT_TIMEOUT", "1s");
    let done = Proc::start(c).finish(LIMIT);
    assert_eq!(done.code(), 3, "{}", done.stderr);
    assert!(done.stderr.contains("no token in"), "{}", done.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn bad_node_options_exit_2_naming_the_problem() {
    for (args, says) in [
        (
            vec!["run", "--nnodes", "2", "-n", "1", "--", "true"],
            "needs --node-rank",
        ),
        (
            vec![
                "run",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "-n",
                "1",
                "--",
                "true",
            ],
            "needs --master",
        ),
        (
            vec![
                "run",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master",
                "127.0.0.1:9",
                "-n",
                "1",
                "--",
                "true",
            ],
            "needs the job token",
        ),
        (
            vec![
                "bench",
                "--nnodes",
                "2",
                "--node-rank",
                "3",
                "--master",
                "127.0.0.1:9",
            ],
            "not below --nnodes 2",
        ),
    ] {
        let done = run(&args, LIMIT);
        assert_eq!(done.code(), 2, "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains(says), "{args:?}: {}", done.stderr);
    }
}
