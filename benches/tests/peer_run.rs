//! `peer-run` end to end, and the peers' own programs where the peers are installed.
//!
//! The runner's tests use a fake `mpirun` (a shell script), so they need no peer; the tests
//! of `mpi_allreduce.c` and `gloo_allreduce.py` need Open MPI or torch and say so when they
//! skip.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use chorus_benches::peer::bench_doc::{BenchDoc, Row};
use chorus_engine::testkit::skip;

const PEER_RUN: &str = env!("CARGO_BIN_EXE_peer-run");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("chorus-peer-run-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an executable fake `mpirun` that answers `--version` like Open MPI 4.1.4 and
/// otherwise runs `body` with the real arguments (`$2` is the rank count).
fn fake_mpirun(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("mpirun");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'mpirun (Open MPI) 4.1.4'; exit 0; fi\n{body}\n"
    );
    fs::write(&path, script).unwrap();
    let mut perms = fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(&path, perms).unwrap();
    path
}

fn peer_run(dir: &Path, mpirun: &Path) -> Command {
    let mut cmd = Command::new(PEER_RUN);
    cmd.args([
        "--systems",
        "openmpi-tcp,chorus-tcp",
        "--ranks",
        "2",
        "--rounds",
        "1",
    ])
    .args(["-b", "8", "-e", "64K", "-f", "8", "--case-timeout", "120"])
    .args(["--python-missing", "not needed here"])
    .arg("--mpirun")
    .arg(mpirun)
    .arg("--mpi-program")
    .arg(PEER_RUN) // any existing file: the fake mpirun never runs it
    .arg("--chorus")
    .arg(dir.join("no-chorus"))
    .arg("--out")
    .arg(dir.join("out"))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// Live processes whose session id is `sid`.
fn session_members(sid: i32) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            (f.get(3)?.parse::<i32>().ok()? == sid && f[0] != "Z").then_some(pid)
        })
        .collect()
}

#[test]
fn a_fake_peer_document_becomes_the_three_report_files() {
    let dir = temp_dir("report");
    let doc = r#"printf '{"chorus_bench":1,"collective":"all-reduce","ranks":%s,"transport":"tcp","dtype":"float","op":"sum","warmup":2,"iters":5,"library":"fake","rows":[{"size":8,"count":2,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{"time_us":7.5,"algbw_gbs":0.001,"busbw_gbs":0.001,"wrong":0}},{"size":65536,"count":16384,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{"time_us":50.0,"algbw_gbs":1.3,"busbw_gbs":1.3,"wrong":0}}],"avg_busbw_gbs":0.65}\n' "$2""#;
    let mpirun = fake_mpirun(&dir, doc);
    let out = peer_run(&dir, &mpirun).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let md = fs::read_to_string(dir.join("out/report.md")).unwrap();
    assert!(md.contains("| size | Open MPI (tcp) |"), "{md}");
    assert!(md.contains("| 64 KiB | 1.311 |"), "{md}");
    assert!(md.contains("**chorus (tcp): not measured** —"), "{md}");
    assert!(md.contains("cargo build --release -p chorus-cli"), "{md}");
    assert!(md.contains("TCP loopback stream"), "{md}");
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("out/report.json")).unwrap()).unwrap();
    assert_eq!(json["worlds"][0]["ranks"], 2);
    assert!(fs::metadata(dir.join("out/busbw.png")).unwrap().len() > 1000);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), md.trim());
    let _ = fs::remove_dir_all(&dir);
}

/// The doc a fake prints: in-place times at 8 B and 64 KiB, for `ranks` taken from `$arg`.
fn doc_script(arg: &str, small_us: f64, large_us: f64) -> String {
    format!(
        r#"printf '{{"chorus_bench":1,"collective":"all-reduce","ranks":%s,"transport":"tcp","dtype":"float","op":"sum","warmup":2,"iters":5,"rows":[{{"size":8,"count":2,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{{"time_us":{small_us},"algbw_gbs":0,"busbw_gbs":0,"wrong":0}}}},{{"size":65536,"count":16384,"type":"float","redop":"sum","root":-1,"out_of_place":null,"in_place":{{"time_us":{large_us},"algbw_gbs":0,"busbw_gbs":0,"wrong":0}}}}],"avg_busbw_gbs":0}}\n' "{arg}""#
    )
}

#[test]
fn a_chorus_document_adds_its_column_ratios_and_targets() {
    let dir = temp_dir("chorus");
    let mpirun = fake_mpirun(&dir, &doc_script("$2", 7.5, 50.0));
    // A stand-in for `chorus bench`: records its arguments, prints a document for -n ($4).
    let chorus = dir.join("no-chorus");
    let args_file = dir.join("chorus.args");
    let body = format!(
        "echo \"$@\" > {}\n{}",
        args_file.display(),
        doc_script("$4", 5.0, 60.0)
    );
    fs::write(&chorus, format!("#!/bin/sh\n{body}\n")).unwrap();
    let mut perms = fs::metadata(&chorus).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(&chorus, perms).unwrap();

    let out = peer_run(&dir, &mpirun).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(&args_file).unwrap().trim(),
        // 8 B … 64 KiB: every size makes the small sizes' 25 times the calls
        "bench all-reduce -n 2 -b 8 -e 64K -f 8 -w 125 -i 500 --transport tcp --json"
    );
    let md = fs::read_to_string(dir.join("out/report.md")).unwrap();
    assert!(
        md.contains("| size | chorus (tcp) | Open MPI (tcp) | chorus ÷ Open MPI (tcp) |"),
        "{md}"
    );
    assert!(md.contains("| 64 KiB | 1.092 | 1.311 | 0.83× |"), "{md}");
    assert!(
        md.contains("| Open MPI (tcp) | 7.5 | 7.5 | 1.50× |"),
        "{md}"
    );
    assert!(
        md.contains("- NOT met: bus bandwidth ≥ Open MPI (tcp) at every size from 64 KiB"),
        "{md}"
    );
    assert!(
        md.contains("- met: 8 B latency ≤ Open MPI (tcp) — 5.0 µs vs 7.5 µs"),
        "{md}"
    );
    assert!(!md.contains("not measured"), "{md}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn sigint_stops_the_run_kills_the_running_sweep_and_still_writes_the_report() {
    let dir = temp_dir("sigint");
    let marker = dir.join("fake.pid");
    // The fake writes its pid (its session id: the runner made it a session leader), puts a
    // grandchild in a process group of its own as mpirun does with ranks, and hangs.
    let mpirun = fake_mpirun(
        &dir,
        &format!(
            "echo $$ > {}; set -m; sleep 600 & sleep 600",
            marker.display()
        ),
    );
    let mut child = peer_run(&dir, &mpirun).spawn().unwrap();
    let waited = Instant::now();
    while !marker.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the fake mpirun never started"
        );
        sleep(Duration::from_millis(20));
    }
    sleep(Duration::from_millis(200));
    let sid: i32 = fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    assert!(!session_members(sid).is_empty());

    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "peer-run did not stop after SIGINT"
        );
        sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(
        session_members(sid).is_empty(),
        "left behind: {:?}",
        session_members(sid)
    );
    let md = fs::read_to_string(dir.join("out/report.md")).unwrap();
    assert!(md.contains("interrupted"), "{md}");
    let _ = fs::remove_dir_all(&dir);
}

fn find(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// Parses a peer's document and checks every measured mode counted `wrong` wrong elements.
fn check_doc(stdout: &[u8], ranks: u32, transport: &str, sizes: usize, wrong: u64) -> BenchDoc {
    let doc = BenchDoc::from_stdout(&String::from_utf8_lossy(stdout), ranks).unwrap();
    assert_eq!(doc.transport, transport);
    assert_eq!(doc.rows.len(), sizes);
    for row in &doc.rows {
        for m in [row.out_of_place, row.in_place].iter().flatten() {
            assert_eq!(m.wrong, wrong, "wrong results at {}", row.size);
        }
    }
    doc
}

/// 3 ranks and sizes of 1, 7, 49, … floats: splits that are not even, nor whole periods
/// of the check pattern.
const ODD_SWEEP: [&str; 10] = ["-b", "4", "-e", "300000", "-f", "7", "-w", "1", "-i", "2"];
const ODD_SIZES: usize = 6;

#[test]
fn mpi_allreduce_sweeps_right_results_over_tcp_and_shared_memory() {
    let (Some(mpicc), Some(mpirun)) = (find("mpicc"), find("mpirun")) else {
        skip("Open MPI is not installed; benches/peer/run.sh installs it");
        return;
    };
    let dir = temp_dir("mpi");
    let program = dir.join("mpi_allreduce");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/mpi_allreduce.c");
    let mut build = Command::new(mpicc);
    build
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&program)
        .arg(&source);
    assert!(build.status().unwrap().success());
    for (btl, transport) in [("tcp,self", "tcp"), ("self,vader", "shm")] {
        let mut cmd = Command::new(&mpirun);
        cmd.args(["-n", "3", "--oversubscribe", "--bind-to", "none"]);
        cmd.args(["--mca", "pml", "ob1", "--mca", "btl", btl]);
        if rustix::process::geteuid().is_root() {
            cmd.arg("--allow-run-as-root");
        }
        cmd.arg(&program).args(ODD_SWEEP).args(["-t", transport]);
        for corrupt in [0, 1] {
            let out = cmd
                .env("CHORUS_PEER_CORRUPT", corrupt.to_string())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            let doc = check_doc(&out.stdout, 3, transport, ODD_SIZES, corrupt);
            let both = |r: &Row| r.out_of_place.is_some() && r.in_place.is_some();
            assert!(doc.rows.iter().all(both));
        }
    }
    let bad = Command::new(&program)
        .args(["-b", "64", "-e", "8"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("need 4 <= MIN <= MAX"));
    let _ = fs::remove_dir_all(&dir);
}

/// A python with torch: `CHORUS_BENCH_PYTHON`, or the venv run.sh keeps in its cache.
fn torch_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHORUS_BENCH_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let cache = PathBuf::from(std::env::var_os("HOME")?).join(".cache/chorus-bench");
    fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|venv| venv.join(".complete").is_file())
        .map(|venv| venv.join("bin/python"))
}

const NO_TORCH: &str =
    "no python with torch (set CHORUS_BENCH_PYTHON, or run benches/peer/run.sh once)";

fn gloo(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/gloo_allreduce.py"));
    cmd
}

#[test]
fn gloo_allreduce_sweeps_right_results_in_place() {
    let Some(python) = torch_python() else {
        skip(NO_TORCH);
        return;
    };
    for corrupt in [0, 1] {
        let mut cmd = gloo(&python);
        cmd.args(["-n", "3", "--timeout", "120"]).args(ODD_SWEEP);
        let out = cmd
            .env("CHORUS_PEER_CORRUPT", corrupt.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = check_doc(&out.stdout, 3, "tcp", ODD_SIZES, corrupt);
        let in_place_only = |r: &Row| r.out_of_place.is_none() && r.in_place.is_some();
        assert!(doc.rows.iter().all(in_place_only));
        assert!(doc.library.unwrap().contains("gloo"));
    }
}

#[test]
fn gloo_launcher_stops_the_others_when_a_rank_dies() {
    let Some(python) = torch_python() else {
        skip(NO_TORCH);
        return;
    };
    let started = Instant::now();
    let mut cmd = gloo(&python);
    cmd.args(["-n", "2", "-b", "8", "-e", "8", "--timeout", "60"]);
    // Rank 1 exits after joining: rank 0 would wait in its first collective until the
    // 60 s timeout if the launcher did not stop it.
    let out = cmd.env("CHORUS_PEER_FAIL_RANK", "1").output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rank 1 exited with status 3"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
}
