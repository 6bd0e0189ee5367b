//! One case: N rank processes of this program, their rendezvous, and rank 0's document
//! passed through to stdout. Bounded: past the deadline, or as soon as one rank fails, every
//! rank is killed; the driver runs this in a session of its own, so nothing survives it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::SECRET_ENV;

/// A command line to run rank 0 under (a profiler), for tuning runs.
const WRAP_ENV: &str = "CHORUS_DATAPLANE_RANK0_WRAP";

/// How long the ranks get to report their listening ports.
const RENDEZVOUS: Duration = Duration::from_secs(60);

/// Runs the ranks (`rank_args(r)` is rank r's command line after the program) and returns
/// the exit code for this process: 0 when every rank exited 0.
pub(crate) fn run(
    world: u32,
    rank_args: impl Fn(u32) -> Vec<String>,
    deadline: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let secret = chorus_transport::fresh::job_secret().to_bytes();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let mut ranks = Ranks(Vec::new());
    let (port_tx, port_rx) = mpsc::channel::<(u32, Result<u16, String>)>();
    let mut stdins: Vec<ChildStdin> = Vec::new();
    let mut readers = Vec::new();
    for r in 0..world {
        // A profiler for rank 0 (e.g. `valgrind --tool=callgrind`), for tuning runs.
        let wrap: Vec<String> = match std::env::var(WRAP_ENV) {
            Ok(w) if r == 0 => w.split_whitespace().map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        let mut cmd = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let mut child = cmd
            .args(rank_args(r))
            .env(SECRET_ENV, &hex)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start rank {r}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        stdins.push(child.stdin.take().ok_or("no stdin pipe")?);
        ranks.0.push(child);
        let tx = port_tx.clone();
        // Reads the rank's port, then passes rank 0's later lines (the document) through.
        readers.push(thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let port = match lines.next() {
                Some(Ok(l)) => l
                    .strip_prefix("listening ")
                    .and_then(|p| p.trim().parse().ok())
                    .ok_or_else(|| format!("rank {r} said {l:?}, not its port")),
                _ => Err(format!("rank {r} closed stdout before its port")),
            };
            let _ = tx.send((r, port));
            for line in lines.map_while(Result::ok) {
                if r == 0 {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                }
            }
        }));
    }
    drop(port_tx);
    let mut ports = vec![0u16; world as usize];
    for _ in 0..world {
        let (r, port) = port_rx
            .recv_timeout(RENDEZVOUS)
            .map_err(|_| format!("ranks did not report their ports within {RENDEZVOUS:?}"))?;
        ports[r as usize] = port?;
    }
    let line = format!(
        "peers {}\n",
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (r, stdin) in stdins.iter_mut().enumerate() {
        stdin
            .write_all(line.as_bytes())
            .map_err(|e| format!("tell rank {r} its peers: {e}"))?;
    }
    drop(stdins);
    ranks.wait(started + deadline)?;
    // Every rank has exited, so each reader sees the end of its pipe.
    for reader in readers {
        let _ = reader.join();
    }
    Ok(())
}

/// The rank processes; any still running when this is dropped are killed and reaped.
struct Ranks(Vec<Child>);

impl Ranks {
    /// Waits for every rank to exit 0; the first failure or the deadline ends them all.
    fn wait(&mut self, deadline: Instant) -> Result<(), String> {
        let mut done = vec![false; self.0.len()];
        while done.iter().any(|d| !d) {
            for (r, child) in self.0.iter_mut().enumerate() {
                if done[r] {
                    continue;
                }
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => done[r] = true,
                    Ok(Some(status)) => return Err(format!("rank {r} failed: {status}")),
                    Ok(None) => {}
                    Err(e) => return Err(format!("wait for rank {r}: {e}")),
                }
            }
            if Instant::now() >= deadline {
                return Err("the ranks did not finish before the deadline".into());
            }
            thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
