//! A job of `chorus-test-rank` processes on loopback, hosted by a bootstrap root in this
//! process.
//!
//! Ranks are addressed by [`Slot`]: the order they were started in (slot `i` is initial rank
//! `i`; a grow joiner gets the next slot), which stays fixed while shrink and grow renumber
//! ranks. Every wait on a rank's report has a deadline and its panic names what it waited
//! for, with the recent reports of every rank and the tail of each rank's stderr.
//!
//! Jobs run one at a time in a process (a lock): the tests assert latency bounds, and two
//! jobs on a 2-core machine would measure each other. Dropping a job kills and reaps every
//! process it started (see [`crate::reap`]); [`Job::close`] does the same and returns what it
//! could not remove, for test 9 to assert empty.

#![allow(clippy::print_stderr)] // diagnostics of a failed test go to the test's stderr

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use chorus::{Config, RootHost, UniqueId};
use parking_lot::{Mutex, MutexGuard};

use crate::clock::{mono_ns, ms_between};
use crate::event::Event;
use crate::reap::{self, ProcInfo};

/// A rank process's fixed index in its job (its initial rank; joiners after).
pub type Slot = usize;

/// How to start a job.
#[derive(Clone, Debug)]
pub struct JobSpec {
    pub world: u32,
    /// Environment of every rank (`CHORUS_*` knobs, `CT_*` scenario settings).
    pub env: Vec<(String, String)>,
    /// Extra environment of one slot.
    pub slot_env: Vec<(Slot, String, String)>,
    /// How long the whole start (root, processes, every `ready`) may take.
    pub start_timeout: Duration,
}

impl JobSpec {
    /// A job of `world` ranks. `CHORUS_TESTS_LOG` (a tracing filter) in this process's
    /// environment turns on the ranks' logs (kept in their stderr files on failure);
    /// `CHORUS_TESTS_TRANSPORT` sets the ranks' `CHORUS_TRANSPORT` (default: theirs, `auto`),
    /// so the whole suite can run over one transport.
    pub fn new(world: u32) -> Self {
        let mut env: Vec<(String, String)> = std::env::var("CHORUS_TESTS_LOG")
            .map(|f| vec![("CT_LOG".to_owned(), f)])
            .unwrap_or_default();
        if let Ok(t) = std::env::var("CHORUS_TESTS_TRANSPORT") {
            env.push(("CHORUS_TRANSPORT".to_owned(), t));
        }
        JobSpec {
            world,
            env,
            slot_env: Vec::new(),
            start_timeout: Duration::from_secs(60),
        }
    }

    /// Sets a variable for every rank.
    pub fn env(mut self, var: &str, value: impl ToString) -> Self {
        self.env.push((var.to_owned(), value.to_string()));
        self
    }

    /// Sets a variable for one slot.
    pub fn slot_env(mut self, slot: Slot, var: &str, value: impl ToString) -> Self {
        self.slot_env
            .push((slot, var.to_owned(), value.to_string()));
        self
    }

    /// The value the ranks get for `var`, if set.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(v, _)| v == var)
            .map(|(_, x)| x.as_str())
    }
}

struct Proc {
    /// `None` once handed to the reaper.
    child: Option<Child>,
    pid: i32,
    stdin: Option<ChildStdin>,
    pgid: i32,
    stderr_path: PathBuf,
    /// Reports read but not yet consumed by a wait.
    queue: VecDeque<Event>,
}

/// A running job; see the module docs.
pub struct Job {
    pub spec: JobSpec,
    bin: PathBuf,
    root: Option<RootHost>,
    token: UniqueId,
    procs: Vec<Proc>,
    /// Every report of every slot, in arrival order, for diagnostics.
    log: Vec<(Slot, Event)>,
    reports: Receiver<(Slot, Option<Event>)>,
    reports_tx: Sender<(Slot, Option<Event>)>,
    /// `ready` (or `joined`) of each slot.
    ready: Vec<Event>,
    dir: PathBuf,
    closed: bool,
    /// When the job started (`mono_ns`), for `CHORUS_TESTS_TRACE`.
    born: u64,
    _serial: MutexGuard<'static, ()>,
}

/// One job at a time per process (see the module docs).
static SERIAL: Mutex<()> = Mutex::new(());

impl Job {
    /// Starts a root for `spec.world` ranks and the ranks themselves (`bin` is the
    /// `chorus-test-rank` executable), and waits until every rank reported `ready`.
    pub fn start(bin: &Path, spec: JobSpec) -> Job {
        let serial = SERIAL.lock();
        reap::become_subreaper();
        let mut config = Config::default();
        config.init_timeout = spec.start_timeout;
        let root = match RootHost::start(
            "127.0.0.1:0".parse().expect("a literal address"),
            spec.world,
            &config,
        ) {
            Ok(r) => r,
            Err(e) => panic!("cannot start the bootstrap root: {e}"),
        };
        let token = root.unique_id().clone();
        let dir =
            std::env::temp_dir().join(format!("chorus-tests-{}-{}", std::process::id(), mono_ns()));
        let _ = std::fs::create_dir_all(&dir);
        let (reports_tx, reports) = mpsc::channel();
        let mut job = Job {
            spec,
            bin: bin.to_owned(),
            root: Some(root),
            token,
            procs: Vec::new(),
            log: Vec::new(),
            reports,
            reports_tx,
            ready: Vec::new(),
            dir,
            closed: false,
            born: mono_ns(),
            _serial: serial,
        };
        let world = job.spec.world;
        let token = job.token.to_token();
        for slot in 0..world as usize {
            let mut env = vec![
                ("CHORUS_UNIQUE_ID".to_owned(), token.clone()),
                ("CHORUS_RANK".to_owned(), slot.to_string()),
                ("CHORUS_WORLD_SIZE".to_owned(), world.to_string()),
            ];
            env.extend(job.slot_vars(slot));
            job.spawn(env);
        }
        let deadline = Instant::now() + job.spec.start_timeout;
        for slot in 0..world as usize {
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = job.wait_for(slot, "ready", left);
            job.ready.push(ready);
        }
        job
    }

    fn slot_vars(&self, slot: Slot) -> Vec<(String, String)> {
        let mut env = self.spec.env.clone();
        env.extend(
            self.spec
                .slot_env
                .iter()
                .filter(|(s, _, _)| *s == slot)
                .map(|(_, k, v)| (k.clone(), v.clone())),
        );
        env
    }

    /// Starts one more process that joins with `grow_token` (the members must call grow);
    /// returns its slot. Its `joined` report is waited for with [`Job::wait_for`].
    pub fn spawn_joiner(&mut self, grow_token: &str) -> Slot {
        let slot = self.procs.len();
        let mut env = self.slot_vars(slot);
        env.push(("CT_JOIN".to_owned(), grow_token.to_owned()));
        self.spawn(env);
        slot
    }

    fn spawn(&mut self, env: Vec<(String, String)>) {
        use std::os::unix::process::CommandExt;
        let slot = self.procs.len();
        let stderr_path = self.dir.join(format!("slot{slot}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", stderr_path.display()));
        let mut cmd = Command::new(&self.bin);
        // Nothing of this process's launch environment leaks into a rank's detection.
        for (var, _) in std::env::vars_os() {
            if let Some(v) = var.to_str()
                && (v.starts_with("CHORUS_")
                    || v.starts_with("CT_")
                    || v.starts_with("SLURM_")
                    || v.starts_with("OMPI_")
                    || matches!(
                        v,
                        "RANK" | "WORLD_SIZE" | "LOCAL_RANK" | "MASTER_ADDR" | "MASTER_PORT"
                    ))
            {
                cmd.env_remove(v);
            }
        }
        cmd.envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .process_group(0);
        // SAFETY: the closure runs between fork and exec and only calls prctl and getppid,
        // which are async-signal-safe. A rank dies with the thread that started it, so a
        // test that is killed outright still leaves no rank behind; one whose test died
        // before the signal was armed finds another parent and does not start.
        let test = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != test {
                    // ESRCH: the parent is gone. Nothing is allocated between fork and exec.
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        let pgid = child.id() as i32;
        let stdout = child.stdout.take();
        let stdin = child.stdin.take();
        let tx = self.reports_tx.clone();
        if let Some(stdout) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let event = match serde_json::from_str(&line) {
                        Ok(v) => Event(v),
                        Err(_) => Event(serde_json::json!({"ev": "garbled", "line": line})),
                    };
                    if tx.send((slot, Some(event))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((slot, None));
            });
        }
        self.procs.push(Proc {
            pid: child.id() as i32,
            child: Some(child),
            stdin,
            pgid,
            stderr_path,
            queue: VecDeque::new(),
        });
    }

    /// The job's token (root address, secret, communicator).
    pub fn token(&self) -> &UniqueId {
        &self.token
    }

    /// The bootstrap root, while it runs.
    pub fn root(&self) -> Option<&RootHost> {
        self.root.as_ref()
    }

    /// Number of processes started (ranks and joiners).
    pub fn slots(&self) -> usize {
        self.procs.len()
    }

    /// A slot's `ready` report (its addresses, pid, fingerprint, grow token).
    pub fn ready(&self, slot: Slot) -> &Event {
        &self.ready[slot]
    }

    pub fn pid(&self, slot: Slot) -> i32 {
        self.procs[slot].pid
    }

    /// Sends a command line to a slot (ignored if its stdin is gone).
    pub fn send(&mut self, slot: Slot, command: &str) {
        if let Some(stdin) = self.procs[slot].stdin.as_mut() {
            let _ = writeln!(stdin, "{command}");
            let _ = stdin.flush();
        }
    }

    /// Sends a command to several slots.
    pub fn send_all(&mut self, slots: &[Slot], command: &str) {
        for &s in slots {
            self.send(s, command);
        }
    }

    /// Signals a slot's process (not its group); returns the time just before the signal.
    pub fn signal(&mut self, slot: Slot, signal: i32) -> u64 {
        let pid = self.pid(slot);
        let t = mono_ns();
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
        t
    }

    /// The next report of `slot` named `ev`, skipping others; panics (with diagnostics) on
    /// the deadline, on the slot's end, or on an `error` report.
    pub fn wait_for(&mut self, slot: Slot, ev: &str, timeout: Duration) -> Event {
        self.wait_any(slot, &[ev], timeout)
    }

    /// The next report of `slot` named one of `evs`.
    pub fn wait_any(&mut self, slot: Slot, evs: &[&str], timeout: Duration) -> Event {
        match self.try_wait_any(slot, evs, timeout) {
            Ok(e) => e,
            Err(why) => self.fail(&format!("slot {slot} waiting for {evs:?}: {why}")),
        }
    }

    /// Like [`Job::wait_any`], but returns why it did not come instead of panicking.
    pub fn try_wait_any(
        &mut self,
        slot: Slot,
        evs: &[&str],
        timeout: Duration,
    ) -> Result<Event, String> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(e) = self.procs[slot].queue.pop_front() {
                if evs.contains(&e.ev()) {
                    return Ok(e);
                }
                if matches!(e.ev(), "error" | "garbled" | "init-failed") {
                    return Err(format!("the rank reported {e}"));
                }
                if e.ev() == "end-of-output" {
                    self.procs[slot].queue.push_front(e);
                    return Err("the rank's output ended".into());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((s, event)) => self.take_report(s, event),
                Err(RecvTimeoutError::Timeout) => return Err(format!("nothing in {timeout:?}")),
                Err(RecvTimeoutError::Disconnected) => return Err("no more reports".into()),
            }
        }
    }

    /// Files a report of slot `s` (`None`: its output ended).
    fn take_report(&mut self, s: Slot, event: Option<Event>) {
        let event = event.unwrap_or_else(|| Event(serde_json::json!({"ev": "end-of-output"})));
        if std::env::var_os("CHORUS_TESTS_TRACE").is_some() {
            let t = if event.t() == 0 { mono_ns() } else { event.t() };
            eprintln!("{:>9.1} ms  {s}: {event}", ms_between(self.born, t));
        }
        self.log.push((s, event.clone()));
        self.procs[s].queue.push_back(event);
    }

    /// Reports of `slot` received so far and not consumed, named `ev` (without waiting).
    pub fn pending(&mut self, slot: Slot, ev: &str) -> Vec<Event> {
        while let Ok((s, event)) = self.reports.try_recv() {
            self.take_report(s, event);
        }
        self.procs[slot]
            .queue
            .iter()
            .filter(|e| e.ev() == ev)
            .cloned()
            .collect()
    }

    /// Waits (bounded) for a slot's process to exit; its exit status.
    pub fn wait_exit(&mut self, slot: Slot, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.procs[slot].child.as_mut().map(|c| c.try_wait());
            match status {
                Some(Ok(Some(status))) => return status,
                Some(Ok(None)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => self.fail(&format!("slot {slot} did not exit within {timeout:?}")),
            }
        }
    }

    /// Process groups of every slot (each rank leads its own).
    pub fn pgids(&self) -> Vec<i32> {
        self.procs.iter().map(|p| p.pgid).collect()
    }

    /// Every process of the job's groups that is still there (zombies included).
    pub fn live_processes(&self) -> Vec<ProcInfo> {
        reap::group_members(&self.pgids())
    }

    /// Kills and reaps everything the job started; returns what could not be removed
    /// (test 9: must be empty). Stops the root.
    pub fn close(mut self) -> Vec<ProcInfo> {
        self.clean_up()
    }

    fn clean_up(&mut self) -> Vec<ProcInfo> {
        self.closed = true;
        let pgids = self.pgids();
        for p in &mut self.procs {
            // Closing stdin first lets a rank that is still reading commands end itself.
            p.stdin.take();
        }
        let mut children: Vec<Child> = self
            .procs
            .iter_mut()
            .filter_map(|p| p.child.take())
            .collect();
        let left = reap::clean_up(&pgids, &mut children, Duration::from_secs(10));
        self.root.take();
        left
    }

    /// Panics with `why`, every rank's recent reports and the tail of its stderr.
    pub fn fail(&mut self, why: &str) -> ! {
        let mut text = format!("{why}\n--- reports (slot: event) ---\n");
        let skip = self.log.len().saturating_sub(80);
        for (s, e) in &self.log[skip..] {
            text.push_str(&format!("  {s}: {e}\n"));
        }
        for (slot, p) in self.procs.iter().enumerate() {
            let err = std::fs::read_to_string(&p.stderr_path).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(25).collect();
            if !tail.is_empty() {
                text.push_str(&format!("--- slot {slot} stderr (last lines) ---\n"));
                for l in tail.into_iter().rev() {
                    text.push_str(&format!("  {l}\n"));
                }
            }
        }
        panic!("{text}");
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let keep = std::env::var_os("CHORUS_TESTS_KEEP").is_some();
        if self.closed && !keep {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        if keep {
            eprintln!("chorus-tests: rank logs kept in {}", self.dir.display());
        }
        if self.closed {
            return;
        }
        let left = self.clean_up();
        if !left.is_empty() {
            eprintln!("chorus-tests: processes left behind: {left:?}");
        }
        // Keep stderr logs of a failed test for a post-mortem.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("chorus-tests: rank logs kept in {}", self.dir.display());
        }
    }
}
