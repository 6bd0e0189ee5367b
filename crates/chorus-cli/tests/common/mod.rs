//! Running the real `chorus` binary from tests: output captured line by line as it comes,
//! every wait bounded, nothing left running when a test fails.
#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const CHORUS: &str = env!("CARGO_BIN_EXE_chorus");

/// A running `chorus …` with its output collected.
pub struct Proc {
    child: Option<Child>,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    lines: mpsc::Receiver<(bool, String)>,
    started: Instant,
}

/// How a finished `chorus …` went.
pub struct Done {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Done {
    pub fn code(&self) -> i32 {
        self.code
            .unwrap_or_else(|| panic!("killed by signal {:?}\n{}", self.signal, self.stderr))
    }
}

pub fn chorus(args: &[&str]) -> Command {
    let mut c = Command::new(CHORUS);
    c.args(args);
    c
}

impl Proc {
    pub fn start(mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        for (is_err, pipe, store) in [
            (
                false,
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                stdout.clone(),
            ),
            (true, Box::new(child.stderr.take().unwrap()), stderr.clone()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    store.lock().unwrap().push(line.clone());
                    let _ = tx.send((is_err, line));
                }
            });
        }
        Proc {
            child: Some(child),
            stdout,
            stderr,
            lines,
            started: Instant::now(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits (at most `limit`) for a line on stdout or stderr containing `needle`.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((_, line)) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no line with {needle:?} within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout.lock().unwrap().join("\n"),
                    self.stderr.lock().unwrap().join("\n")
                ),
            }
        }
    }

    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits at most `limit` for the command to end (killing it past the limit, and then
    /// failing the test).
    pub fn finish(mut self, limit: Duration) -> Done {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "chorus did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout.lock().unwrap().join("\n"),
                    self.stderr.lock().unwrap().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Let the readers drain what the process wrote before it exited.
        std::thread::sleep(Duration::from_millis(100));
        use std::os::unix::process::ExitStatusExt;
        Done {
            code: status.code(),
            signal: status.signal(),
            stdout: self.stdout.lock().unwrap().join("\n"),
            stderr: self.stderr.lock().unwrap().join("\n"),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `chorus args…` to its end (at most `limit`).
pub fn run(args: &[&str], limit: Duration) -> Done {
    Proc::start(chorus(args)).finish(limit)
}

/// True while `pid` exists (a zombie counts as gone: it runs nothing).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned));
            state.as_deref() != Some("Z")
        }
        Err(_) => false,
    }
}

/// True while process group `pgid` has a member.
pub fn group_alive(pgid: u32) -> bool {
    let pid = rustix::process::Pid::from_raw(pgid as i32).unwrap();
    rustix::process::test_kill_process_group(pid).is_ok()
}

/// Waits (up to a few seconds: init reaps what it inherits on its own time) until none of
/// `pids` runs, and none of them leads a process group that still has members.
pub fn assert_all_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&p| alive(p) || group_alive(p) && group_has_live(p))
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("processes left behind: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether group `pgid` has a member that is not a zombie.
fn group_has_live(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|p| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                return false;
            };
            let Some(i) = stat.rfind(')') else {
                return false;
            };
            let f: Vec<&str> = stat[i + 1..].split_whitespace().collect();
            f.len() > 3 && f[0] != "Z" && f[3].parse::<u32>().ok() == Some(pgid)
        })
}

/// The pids in the launcher's status lines (`rank N (pid P) …`).
pub fn rank_pids(stderr: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = stderr
        .lines()
        .filter_map(|l| {
            let at = l.find("(pid ")? + 5;
            l[at..].split(')').next()?.parse().ok()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// When rank `rank` ended, on the launcher's clock (from the job's start, the launcher's own
/// start-up excluded), read from its status line (`rank N (pid P) … at +S.SSs …`).
pub fn rank_end(stderr: &str, rank: u32) -> Duration {
    let head = format!("rank {rank} (pid ");
    let line = stderr
        .lines()
        .find(|l| l.contains(&head))
        .unwrap_or_else(|| panic!("no status line for rank {rank}:\n{stderr}"));
    let at = line
        .split(" at +")
        .nth(1)
        .and_then(|t| t.split('s').next())
        .and_then(|t| t.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no end time in {line:?}"));
    Duration::from_secs_f64(at)
}

/// A fresh directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("chorus-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
