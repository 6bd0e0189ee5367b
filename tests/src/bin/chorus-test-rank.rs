//! `chorus-test-rank`: one rank of a multi-process test job.
//!
//! It joins the job from its environment (`CHORUS_UNIQUE_ID`, `CHORUS_RANK`,
//! `CHORUS_WORLD_SIZE` and any other `CHORUS_*` knob, through `Comm::from_env`), or joins a
//! running communicator when `CT_JOIN` holds a grow token. Then it does what the harness
//! says on stdin, one command per line, and reports what happens on stdout as JSON lines
//! (one object per line; `ev` names the event; `t` is `CLOCK_MONOTONIC` in nanoseconds, the
//! harness's clock too on the same host). stdout is this program's protocol, so printing to
//! it is the point here.
//!
//! The all-reduce loop checks every result exactly (integer-valued `f64`s) and carries one
//! extra element, the finish flag: the loop ends on the first iteration (after a minimum
//! per epoch) whose reduced flag is non-zero, so every member stops at the same operation
//! whichever of them heard `finish` first.
//!
//! Environment (besides `CHORUS_*`):
//! - `CT_JOIN`: a grow token; `Comm::join` instead of init.
//! - `CT_DIE_BEFORE_INIT=R`: the rank whose rank variable is `R` does not join: it reports
//!   `doomed`, waits (bounded by its lifetime) for the command `die`, then reports `died` and
//!   exits with code 3 (a rank lost before the job has its peer table).
//! - `CT_FORK_HOLDER=1`: fork a child that sleeps holding every descriptor, right after init
//!   (seed 000).
//! - `CT_ON_FAIL`: what the loop does after a failed operation: `shrink` (and keep looping),
//!   `destroy` (and exit), `idle` (default).
//! - `CT_START=loop`: start looping right after `ready` instead of waiting for `loop`.
//! - `CT_MIN_ITERS`: iterations per epoch before a finish is honoured (default 5).
//! - `CT_SIZES`: element counts the loop cycles through (default `1,1024,65536`).
//! - `CT_LIFETIME_S`: the process gives up and exits after this long (default 300).
//! - `CT_OLD=destroy`: after a shrink, destroy the old communicator (default: drop it).
//! - `CT_LOG`: a tracing filter (`chorus=debug`); logs go to stderr.
//! - `CT_COMMANDS`, `CT_EVENTS`: files to follow for commands and to append reports to,
//!   instead of stdin and stdout (for ranks started by `chorus run`, whose stdin is closed
//!   and whose stdout is shared); `%r` in either is replaced by the rank (`CHORUS_RANK`,
//!   else `RANK`, else `SLURM_PROCID`).
//!
//! Commands: `loop`, `finish`, `destroy`, `abort`, `shrink`, `grow N`, `split-abort MS`,
//! `split-wait`, `send PEER N TIMES`, `recv PEER N DELAY_MS TIMES`, `health`, `recent N`
//! (the flight recorder's newest N operations), `exit`. Unknown commands are reported as
//! `error` events.

#![allow(clippy::print_stdout)]
// `chorus::Error` is large by design (structured fields); the library allows it too.
#![allow(clippy::result_large_err)]

use std::io::{BufRead, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use chorus::{Comm, Config, Error, Reduction, UniqueId};
use serde_json::{Value, json};

fn main() {
    let started = Instant::now();
    if let Ok(filter) = std::env::var("CT_LOG") {
        // Logs go to stderr, which the harness keeps per rank for a failed test.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    let lifetime = Duration::from_secs(env_u64("CT_LIFETIME_S", 300));
    let commands = match slot_path("CT_COMMANDS") {
        Some(path) => spawn_file_reader(path),
        None => spawn_stdin_reader(),
    };
    if let Ok(doomed) = std::env::var("CT_DIE_BEFORE_INIT")
        && ["CHORUS_RANK", "RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .is_some_and(|r| r == doomed)
    {
        emit(json!({"ev": "doomed", "pid": std::process::id()}));
        while commands
            .recv_timeout(lifetime)
            .is_ok_and(|c| c.trim() != "die")
        {}
        emit(json!({"ev": "died", "pid": std::process::id()}));
        std::process::exit(3);
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => fail_exit("config", &e.to_string()),
    };
    let init_start = Instant::now();
    let comm = match std::env::var("CT_JOIN") {
        Ok(token) => {
            let token =
                UniqueId::parse(&token).unwrap_or_else(|e| fail_exit("token", &e.to_string()));
            Comm::join_blocking(&token, config)
        }
        Err(_) => Comm::from_env_blocking(config),
    };
    let comm = match comm {
        Ok(c) => c,
        Err(e) => {
            emit(json!({"ev": "init-failed", "kind": kind(&e), "detail": e.to_string()}));
            std::process::exit(2);
        }
    };
    let me = comm.members()[comm.rank() as usize].clone();
    emit(json!({
        "ev": if std::env::var("CT_JOIN").is_ok() { "joined" } else { "ready" },
        "rank": comm.rank(),
        "world": comm.size(),
        "epoch": comm.epoch(),
        "comm": comm.id().get(),
        "pid": std::process::id(),
        "ms": ms(init_start.elapsed()),
        "control": me.control.to_string(),
        "data": me.data.to_string(),
        "fingerprint": hex::encode(me.fingerprint),
        "grow_token": comm.grow_token().to_token(),
    }));
    if std::env::var("CT_FORK_HOLDER").as_deref() == Ok("1") {
        fork_holder();
    }
    let mut rank = Rank {
        comm: Some(comm),
        on_fail: std::env::var("CT_ON_FAIL").unwrap_or_else(|_| "idle".into()),
        min_iters: env_u64("CT_MIN_ITERS", 5),
        sizes: std::env::var("CT_SIZES")
            .ok()
            .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .filter(|v: &Vec<usize>| !v.is_empty())
            .unwrap_or_else(|| vec![1, 1024, 65536]),
        commands,
        finish: false,
        pending: Vec::new(),
        deadline: started + lifetime,
    };
    let start_looping = std::env::var("CT_START").as_deref() == Ok("loop");
    rank.serve(start_looping);
}

/// The rank's state between commands.
struct Rank {
    /// `None` once destroyed.
    comm: Option<Comm>,
    on_fail: String,
    min_iters: u64,
    sizes: Vec<usize>,
    commands: Receiver<String>,
    /// `finish` heard: contribute the flag.
    finish: bool,
    /// Commands heard while looping that only apply between loops.
    pending: Vec<String>,
    deadline: Instant,
}

/// What ended a loop.
enum Ended {
    Finished,
    /// The process should exit (destroyed, or told to).
    Exit,
}

impl Rank {
    fn serve(&mut self, mut looping: bool) {
        loop {
            if looping {
                match self.run_loop() {
                    Ended::Finished => looping = false,
                    Ended::Exit => break,
                }
                continue;
            }
            let command = if self.pending.is_empty() {
                match self.next_command() {
                    Some(c) => c,
                    None => break,
                }
            } else {
                self.pending.remove(0)
            };
            match self.idle_command(&command) {
                Some(next_looping) => looping = next_looping,
                None => break,
            }
        }
        // Leave without destroy if still a member: the harness decides how a rank ends.
        let code = 0;
        emit(json!({"ev": "exit", "code": code}));
        std::process::exit(code);
    }

    /// Waits for the next command (bounded by the process's lifetime).
    fn next_command(&mut self) -> Option<String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.commands.recv_timeout(left) {
            Ok(c) => Some(c),
            Err(RecvTimeoutError::Timeout) => {
                emit(json!({"ev": "error", "what": "lifetime", "detail": "no command in time"}));
                None
            }
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Carries out a command while idle; `Some(true)` to start looping, `None` to exit.
    fn idle_command(&mut self, command: &str) -> Option<bool> {
        let mut words = command.split_whitespace();
        match words.next().unwrap_or("") {
            "loop" => {
                self.finish = false;
                Some(true)
            }
            "finish" => Some(false),
            "destroy" => {
                self.destroy();
                None
            }
            "abort" => {
                self.abort();
                Some(false)
            }
            "exit" | "eof" => None,
            "grow" => {
                let n = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                self.grow(n);
                Some(false)
            }
            "split-abort" => {
                let delay = words.next().and_then(|w| w.parse().ok()).unwrap_or(100);
                self.split(Some(delay));
                Some(false)
            }
            "send" => {
                let peer = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let n = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                let times = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                self.send(peer, n, times);
                Some(false)
            }
            "recv" => {
                let peer = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let n = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                let delay = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let times = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                self.recv(peer, n, delay, times);
                Some(false)
            }
            "health" => {
                self.health();
                Some(false)
            }
            "recent" => {
                let max = words.next().and_then(|w| w.parse().ok()).unwrap_or(8);
                self.recent(max);
                Some(false)
            }
            // One shrink while idle (a rank whose failure left it idle asks later).
            "shrink" => {
                if self.shrink_once().is_ok() {
                    self.finish = false;
                }
                Some(false)
            }
            "split-wait" => {
                self.split(None);
                Some(false)
            }
            other => {
                emit(json!({"ev": "error", "what": "command", "detail": other}));
                Some(false)
            }
        }
    }

    fn comm(&self) -> &Comm {
        // Invariant: every caller runs before `destroy` takes the communicator, after which
        // the process exits.
        self.comm
            .as_ref()
            .unwrap_or_else(|| fail_exit("state", "no communicator"))
    }

    /// All-reduces until a finish is agreed, a failure is handled, or the process must end.
    fn run_loop(&mut self) -> Ended {
        let mut iter: u64 = 0;
        emit(
            json!({"ev": "looping", "epoch": self.comm().epoch(), "rank": self.comm().rank(), "world": self.comm().size()}),
        );
        loop {
            while let Ok(c) = self.commands.try_recv() {
                match c.split_whitespace().next().unwrap_or("") {
                    "finish" => self.finish = true,
                    "destroy" => {
                        self.destroy();
                        return Ended::Exit;
                    }
                    "abort" => self.abort(),
                    "exit" | "eof" => return Ended::Exit,
                    _ => self.pending.push(c),
                }
            }
            if Instant::now() > self.deadline {
                emit(json!({"ev": "error", "what": "lifetime", "detail": "still looping"}));
                return Ended::Exit;
            }
            let n = self.sizes[(iter as usize) % self.sizes.len()];
            match self.iteration(iter, n) {
                Ok(true) => {
                    let comm = self.comm();
                    // No member of this epoch is absent in this member's ledger (a member it
                    // does not watch may still read `Joining`: never heard from directly).
                    let alive = comm.health().peers.iter().all(|p| {
                        !matches!(
                            p.state,
                            chorus::PeerCondition::Dead | chorus::PeerCondition::Departed
                        )
                    });
                    let states: Vec<String> = comm
                        .health()
                        .peers
                        .iter()
                        .map(|p| format!("{:?}", p.state))
                        .collect();
                    let late = comm.health().heartbeat_lateness;
                    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
                    emit(json!({"ev": "finished", "epoch": comm.epoch(),
                        "rank": comm.rank(), "world": comm.size(), "iters": iter + 1,
                        "peers_alive": alive, "states": states,
                        "hb_count": late.count, "hb_late_p50_ms": ms(late.p50),
                        "hb_late_p99_ms": ms(late.p99), "hb_late_max_ms": ms(late.max)}));
                    self.finish = false;
                    return Ended::Finished;
                }
                Ok(false) => iter += 1,
                Err(e) => {
                    report_failure(&e, self.comm());
                    match self.on_fail.as_str() {
                        "shrink" => match self.shrink() {
                            true => iter = 0,
                            false => {
                                self.destroy();
                                return Ended::Exit;
                            }
                        },
                        "destroy" => {
                            self.destroy();
                            return Ended::Exit;
                        }
                        _ => return Ended::Finished,
                    }
                }
            }
        }
    }

    /// One checked all-reduce of `n` elements plus the finish flag; `Ok(true)` when the
    /// members agreed to finish.
    fn iteration(&self, iter: u64, n: usize) -> Result<bool, Error> {
        let comm = self.comm();
        let (rank, world) = (comm.rank() as f64, comm.size() as f64);
        let value = |r: f64, j: usize| (r + 1.0) * ((j % 7) as f64 + 1.0) + iter as f64;
        let mut buf: Vec<f64> = (0..n).map(|j| value(rank, j)).collect();
        buf.push(if self.finish { 1.0 } else { 0.0 });
        comm.blocking()
            .all_reduce_in_place(&mut buf, Reduction::Sum)?;
        let ranks_sum = world * (world + 1.0) / 2.0;
        for (j, got) in buf[..n].iter().enumerate() {
            let want = ranks_sum * ((j % 7) as f64 + 1.0) + world * iter as f64;
            if *got != want {
                emit(
                    json!({"ev": "error", "what": "result", "epoch": comm.epoch(),
                    "iter": iter, "index": j, "got": got, "want": want}),
                );
                std::process::exit(3);
            }
        }
        Ok(buf[n] > 0.0 && iter + 1 >= self.min_iters)
    }

    /// Shrinks to the survivors, again while a shrink fails because yet another member
    /// failed meanwhile (at most three tries); false if that failed (reported).
    fn shrink(&mut self) -> bool {
        for attempt in 1..=3 {
            match self.shrink_once() {
                Ok(()) => return true,
                Err(e) if attempt < 3 && e.is_recoverable_by_shrink() => continue,
                Err(_) => return false,
            }
        }
        false
    }

    fn shrink_once(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        let old_rank = self.comm().rank();
        match self.comm().blocking().shrink() {
            Ok(next) => {
                let shrunk = json!({"ev": "shrunk", "old_rank": old_rank, "rank": next.rank(),
                    "world": next.size(), "epoch": next.epoch(), "comm": next.id().get(),
                    "ms": ms(started.elapsed())});
                let old = self.comm.replace(next);
                let destroy = std::env::var("CT_OLD").as_deref() == Ok("destroy");
                // A dropped old communicator is gone once "shrunk" is read: a probe of its
                // epoch right after must find it retired (stale-epoch), not still served.
                let old = if destroy {
                    old
                } else {
                    drop(old);
                    None
                };
                emit(shrunk);
                if let Some(old) = old {
                    // Destroying the old epoch's communicator must leave the new one be.
                    let started = Instant::now();
                    let ok = old.destroy_blocking().is_ok();
                    emit(json!({"ev": "old-destroyed", "ok": ok, "ms": ms(started.elapsed())}));
                }
                Ok(())
            }
            Err(e) => {
                emit(
                    json!({"ev": "shrink-failed", "kind": kind(&e), "detail": e.to_string(),
                    "ms": ms(started.elapsed())}),
                );
                Err(e)
            }
        }
    }

    fn grow(&mut self, joiners: u32) {
        let started = Instant::now();
        match self.comm().blocking().grow(joiners) {
            Ok(next) => {
                emit(
                    json!({"ev": "grown", "rank": next.rank(), "world": next.size(),
                    "epoch": next.epoch(), "ms": ms(started.elapsed())}),
                );
                self.comm = Some(next);
            }
            Err(e) => emit(
                json!({"ev": "grow-failed", "kind": kind(&e), "detail": e.to_string(),
                "ms": ms(started.elapsed())}),
            ),
        }
    }

    /// Sends `n` patterned elements to `peer`, `times` times; reports when the last send
    /// returned.
    fn send(&self, peer: u32, n: usize, times: u32) {
        for k in 0..times {
            let buf: Vec<f64> = (0..n).map(|i| ((i + k as usize) % 1000) as f64).collect();
            if let Err(e) = self.comm().blocking().send(&buf, peer) {
                report_failure(&e, self.comm());
                return;
            }
        }
        emit(json!({"ev": "sent", "n": n, "times": times}));
    }

    /// After `delay_ms`, receives `n` elements from `peer`, `times` times, checking each.
    fn recv(&self, peer: u32, n: usize, delay_ms: u64, times: u32) {
        thread::sleep(Duration::from_millis(delay_ms));
        for k in 0..times {
            let mut buf = vec![-1.0f64; n];
            if let Err(e) = self.comm().blocking().recv(&mut buf, peer) {
                report_failure(&e, self.comm());
                return;
            }
            let intact = buf
                .iter()
                .enumerate()
                .all(|(i, v)| *v == ((i + k as usize) % 1000) as f64);
            if !intact {
                emit(json!({"ev": "received", "n": n, "times": k + 1, "intact": false}));
                return;
            }
        }
        emit(json!({"ev": "received", "n": n, "times": times, "intact": true}));
    }

    /// Reports this member's ledger and first recorded failure.
    fn health(&self) {
        let h = self.comm().health();
        let peers: Vec<Value> = h
            .peers
            .iter()
            .map(|p| {
                json!({"rank": p.rank, "state": format!("{:?}", p.state),
                    "evidence": p.evidence.map(|e| format!("{e:?}"))})
            })
            .collect();
        emit(
            json!({"ev": "health", "epoch": h.epoch, "world": h.world, "peers": peers,
            "async_error": h.async_error.map(|e| e.to_string())}),
        );
    }

    /// Reports the flight recorder's newest `max` operations.
    fn recent(&self, max: usize) {
        let ops: Vec<Value> = self
            .comm()
            .recent_ops(max)
            .iter()
            .map(|o| {
                json!({"seq": o.seq, "collective": o.collective.map(|c| c.to_string()),
                    "bytes": o.bytes, "algorithm": o.algorithm,
                    "phase": format!("{:?}", o.phase), "step": o.step})
            })
            .collect();
        emit(json!({"ev": "recent", "ops": ops}));
    }

    fn abort(&mut self) {
        let t = mono_ns();
        let started = Instant::now();
        self.comm().abort("the test told this rank to abort");
        let took = started.elapsed();
        emit(json!({"ev": "aborted", "t_start": t, "us": took.as_micros() as u64}));
        // The aborted communicator refuses further work at once.
        let mut probe = [0.0f64; 1];
        if let Err(e) = self
            .comm()
            .blocking()
            .all_reduce_in_place(&mut probe, Reduction::Sum)
        {
            emit(json!({"ev": "after-abort", "kind": kind(&e)}));
        }
    }

    fn destroy(&mut self) {
        let Some(comm) = self.comm.take() else { return };
        let t = mono_ns();
        let started = Instant::now();
        let result = comm.destroy_blocking();
        emit(
            json!({"ev": "destroyed", "t_start": t, "ms": ms(started.elapsed()),
            "us": started.elapsed().as_micros() as u64, "ok": result.is_ok()}),
        );
    }

    /// Seed 001: split by parity; the child all-reduces once. With `abort_after`, parent
    /// rank 0 blocks on a child operation its child peer never joins and another thread
    /// aborts the parent after that many milliseconds; the release is reported.
    fn split(&mut self, abort_after: Option<u64>) {
        let comm = self.comm();
        let color = comm.rank() % 2;
        let child = match comm.blocking().split(Some(color), comm.rank()) {
            Ok(Some(c)) => c,
            Ok(None) => {
                emit(json!({"ev": "error", "what": "split", "detail": "no child"}));
                return;
            }
            Err(e) => {
                emit(json!({"ev": "split-failed", "kind": kind(&e), "detail": e.to_string()}));
                return;
            }
        };
        let mut v = vec![comm.rank() as f64; 16];
        if let Err(e) = child.blocking().all_reduce_in_place(&mut v, Reduction::Sum) {
            emit(json!({"ev": "split-failed", "kind": kind(&e), "detail": e.to_string()}));
            return;
        }
        let want = if color == 0 { 2.0 } else { 4.0 };
        emit(
            json!({"ev": "split", "child_rank": child.rank(), "child_world": child.size(),
            "sum_ok": v[0] == want && world_is_four(comm)}),
        );
        match abort_after {
            Some(delay) if comm.rank() == 0 => {
                let (tx, rx) = mpsc::channel();
                thread::scope(|s| {
                    s.spawn(|| {
                        thread::sleep(Duration::from_millis(delay));
                        let t = mono_ns();
                        comm.abort("parent aborted by the test (seed 001)");
                        let _ = tx.send(t);
                    });
                    let mut w = vec![0.0f64; 16];
                    // The child's rank 1 never calls this: only the parent's abort ends it.
                    let result = child.blocking().all_reduce_in_place(&mut w, Reduction::Sum);
                    let released = mono_ns();
                    let aborted_at = rx.recv_timeout(Duration::from_secs(30)).unwrap_or(0);
                    match result {
                        Ok(()) => emit(json!({"ev": "error", "what": "split",
                            "detail": "blocked child operation succeeded"})),
                        Err(e) => emit(json!({"ev": "released", "kind": kind(&e),
                            "detail": e.to_string(), "t_abort": aborted_at, "t": released})),
                    }
                });
            }
            _ => {
                // Stay a member of the child (dropping it would depart) until told otherwise.
                let next = self.next_command();
                drop(child);
                if let Some(c) = next {
                    self.pending.push(c);
                }
            }
        }
    }
}

fn world_is_four(comm: &Comm) -> bool {
    comm.size() == 4
}

/// Reports a failed operation with everything the harness asserts on.
fn report_failure(e: &Error, comm: &Comm) {
    emit(json!({
        "ev": "failed",
        "kind": kind(e),
        "peer": e.peer,
        "evidence": e.evidence.map(|ev| format!("{ev:?}")),
        "detail": e.to_string(),
        "epoch": comm.epoch(),
        "rank": comm.rank(),
    }));
}

/// The error's stable token without the brackets (`peer-failed`, ...).
fn kind(e: &Error) -> String {
    e.kind()
        .token()
        .trim_start_matches("[chorus:")
        .trim_end_matches(']')
        .to_owned()
}

/// Prints one event with the current time, and flushes it (the harness reads line by line).
fn emit(mut v: Value) {
    if let Value::Object(m) = &mut v {
        m.entry("t").or_insert(json!(mono_ns()));
    }
    static EVENTS: std::sync::OnceLock<Option<std::sync::Mutex<std::fs::File>>> =
        std::sync::OnceLock::new();
    let file = EVENTS.get_or_init(|| {
        let path = slot_path("CT_EVENTS")?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()?;
        Some(std::sync::Mutex::new(file))
    });
    match file {
        // One write per line: a reader never sees half a report.
        Some(f) => {
            if let Ok(mut f) = f.lock() {
                let _ = f.write_all(format!("{v}\n").as_bytes());
            }
        }
        None => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{v}");
            let _ = out.flush();
        }
    }
}

/// `var`'s path with `%r` replaced by this process's rank as its launcher set it
/// (`CHORUS_RANK`, torchrun's `RANK`, Slurm's `SLURM_PROCID`).
fn slot_path(var: &str) -> Option<String> {
    let path = std::env::var(var).ok()?;
    let rank = ["CHORUS_RANK", "RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_default();
    Some(path.replace("%r", &rank))
}

/// Follows `path` (created if missing) for command lines, as `tail -f` would.
fn spawn_file_reader(path: String) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path);
        let Ok(file) = file else {
            let _ = tx.send("eof".to_owned());
            return;
        };
        let mut reader = std::io::BufReader::new(file);
        let mut line = String::new();
        loop {
            match reader.read_line(&mut line) {
                Ok(0) => thread::sleep(Duration::from_millis(20)),
                Ok(_) if line.ends_with('\n') => {
                    let command = line.trim().to_owned();
                    line.clear();
                    if !command.is_empty() && tx.send(command).is_err() {
                        return;
                    }
                }
                // Half a line: the rest is still being written.
                Ok(_) => thread::sleep(Duration::from_millis(5)),
                Err(_) => {
                    let _ = tx.send("eof".to_owned());
                    return;
                }
            }
        }
    });
    rx
}

fn fail_exit(what: &str, detail: &str) -> ! {
    emit(json!({"ev": "error", "what": what, "detail": detail}));
    std::process::exit(2);
}

/// Commands from stdin, one per line; `eof` when stdin closes (the harness went away).
fn spawn_stdin_reader() -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let line = line.trim().to_owned();
            if !line.is_empty() && tx.send(line).is_err() {
                return;
            }
        }
        let _ = tx.send("eof".to_owned());
    });
    rx
}

/// Seed 000: a child that sleeps holding a copy of every descriptor this process has.
fn fork_holder() {
    // SAFETY: getpid cannot fail.
    let rank = unsafe { libc::getpid() };
    // SAFETY: fork in a multi-threaded process; the child only calls async-signal-safe
    // functions (prctl, getppid, sleep, _exit) before it ends.
    let pid = unsafe { libc::fork() };
    match pid {
        0 => {
            // SAFETY: async-signal-safe calls only (see above); `_exit` never returns. The
            // holder dies with its rank (like a DataLoader worker watching its parent), so
            // a rank killed with its harness leaves nothing behind. A rank that died
            // before the holder's first instruction ran (a loaded machine may not schedule
            // a new child for milliseconds) sends no signal to a holder that asks after:
            // then its parent is already someone else, and it leaves at once.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != rank {
                    libc::_exit(0)
                }
                libc::sleep(120);
                libc::_exit(0)
            }
        }
        p if p > 0 => emit(json!({"ev": "forked", "child": p})),
        _ => emit(
            json!({"ev": "error", "what": "fork", "detail": std::io::Error::last_os_error().to_string()}),
        ),
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the host.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
