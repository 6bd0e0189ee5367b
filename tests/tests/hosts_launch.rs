//! `Comm::from_env` across two network-namespace hosts under the launchers people already
//! use: Slurm's variables (as `srun` sets them, the node list naming node 0 first) and
//! torchrun with `--nnodes 2` (torch's own `torch.distributed.run`, driving a non-torch
//! rank program with `--no-python`). Each rank finds its root, its rank and its world from
//! the environment alone, binds the address its host reaches the root from, and the four
//! ranks all-reduce with checked results. Skips with one line without the bed (root, `ip`,
//! `nft`, `unshare`, the `chorus` binary) or, for torchrun, without a Python that has torch
//! (`CHORUS_TEST_PYTHON`, else `python3`).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chorus_tests::bed::Bed;

const WAIT: Duration = Duration::from_secs(120);
/// A secret both hosts are given (as a job script would export it).
const SECRET: &str = "5eb63bbbe01eeed093cb22bb8f5acdc35eb63bbbe01eeed093cb22bb8f5acdc3";

fn rank_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

/// The environment every rank gets besides its launcher's.
fn common(cmd: &mut Command, bed: &Bed) {
    cmd.env("CHORUS_SECRET", SECRET)
        .env("CT_EVENTS", bed.dir().join("ev-%r"))
        .env("CT_COMMANDS", bed.dir().join("cmd-%r"))
        .env("CT_START", "loop")
        .env("CT_LIFETIME_S", "120")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
}

/// Every rank of 4 ready on the world of 4, looping, then finishing together with checked
/// results, then destroying.
fn four_ranks_work(bed: &mut Bed, what: &str) {
    bed.watch(4);
    for s in 0..4 {
        let ready = bed.wait_any(s, &["ready", "init-failed"], WAIT);
        let ready = ready.unwrap_or_else(|| panic!("{what}: slot {s} silent:{}", bed.diagnose()));
        assert_eq!(ready.ev(), "ready", "{what}: slot {s}: {ready}");
        assert_eq!(
            (ready.u64("rank"), ready.u64("world")),
            (Some(s as u64), Some(4))
        );
        let host = if s < 2 { "10.77.0.1" } else { "10.77.0.2" };
        let control = ready.str("control").unwrap_or("");
        assert!(
            control.starts_with(host),
            "{what}: slot {s} binds its host: {control}"
        );
    }
    let all = [0, 1, 2, 3];
    bed.send_all(&all, "finish");
    for s in all {
        let e = bed
            .wait_any(s, &["finished", "error", "failed"], WAIT)
            .unwrap();
        assert_eq!(
            (e.ev(), e.u64("world")),
            ("finished", Some(4)),
            "{what}: slot {s}: {e}"
        );
    }
    bed.send_all(&all, "destroy");
    for s in all {
        let e = bed.wait_any(s, &["destroyed"], WAIT).unwrap();
        assert_eq!(e.bool("ok"), Some(true), "{what}: slot {s}: {e}");
    }
}

fn wait_all(children: Vec<Child>, what: &str) {
    let until = Instant::now() + WAIT;
    for mut c in children {
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "{what}: a launcher or rank ended with {status}"
                );
                break;
            }
            if Instant::now() >= until {
                let _ = c.kill();
                let _ = c.wait();
                panic!("{what}: a process did not exit within {WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn from_env_under_slurm_variables_across_two_hosts() {
    let Some(mut bed) = Bed::new_or_skip(2, "Slurm across hosts") else {
        return;
    };
    let mut ranks = Vec::new();
    for host in 0..2 {
        for local in 0..2 {
            let mut cmd = bed.command(host, &rank_bin());
            common(&mut cmd, &bed);
            cmd.env("SLURM_PROCID", (host * 2 + local).to_string())
                .env("SLURM_NTASKS", "4")
                .env("SLURM_LOCALID", local.to_string())
                .env("SLURM_NTASKS_PER_NODE", "2")
                .env("SLURM_JOB_NODELIST", "10.77.0.1,10.77.0.2")
                .env("SLURM_JOB_ID", "4242");
            ranks.push(cmd.spawn().unwrap());
        }
    }
    four_ranks_work(&mut bed, "slurm");
    wait_all(ranks, "slurm");
}

/// A Python that can run `torch.distributed.run`, if there is one.
fn torch_python() -> Option<PathBuf> {
    let python = std::env::var_os("CHORUS_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let ok = Command::new(&python)
        .args(["-c", "import torch.distributed.run"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(python)
}

#[test]
fn from_env_under_torchrun_with_two_nodes_across_two_hosts() {
    let Some(python) = torch_python() else {
        return chorus_tests::skip(
            "torchrun across hosts: no Python with torch (set CHORUS_TEST_PYTHON)",
        );
    };
    let Some(mut bed) = Bed::new_or_skip(2, "torchrun across hosts") else {
        return;
    };
    let mut nodes = Vec::new();
    for host in 0..2 {
        let mut cmd = bed.command(host, Path::new(&python));
        cmd.args(["-m", "torch.distributed.run", "--nnodes", "2"])
            .args(["--node-rank", &host.to_string()])
            .args(["--master-addr", "10.77.0.1", "--master-port", "29500"])
            .args(["--nproc-per-node", "2", "--no-python"])
            .arg(rank_bin());
        common(&mut cmd, &bed);
        nodes.push(cmd.spawn().unwrap());
    }
    four_ranks_work(&mut bed, "torchrun");
    wait_all(nodes, "torchrun");
}
