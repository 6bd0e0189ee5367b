//! Process-group bookkeeping: every rank runs in a process group of its own, so one
//! `kill(-pgid)` reaches it and anything it forked (seed 000's descriptor holders); this
//! process is a child subreaper, so those grandchildren, orphaned when their rank dies,
//! become its children and are reaped here rather than left as zombies. [`leftovers`] is
//! what test 9 asserts empty.

use std::process::Child;
use std::sync::Once;
use std::time::{Duration, Instant};

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    /// `R`, `S`, `T` (stopped), `Z` (zombie), ...
    pub state: char,
    pub comm: String,
}

/// Makes this process the reaper of its descendants' orphans (once; process-wide).
pub fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument and touches
        // no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            tracing_free_warn("cannot become a child subreaper; orphans go to init");
        }
    });
}

fn tracing_free_warn(msg: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("chorus-tests: {msg}: {}", std::io::Error::last_os_error());
    }
}

/// Every process (zombies included) whose process group is one of `pgids`.
pub fn group_members(pgids: &[i32]) -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .filter(|p| pgids.contains(&p.pgrp))
        .collect()
}

/// Parses `/proc/<pid>/stat`; `None` if the process is gone or the file is unreadable.
pub fn stat(pid: i32) -> Option<ProcInfo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        pgrp,
        state,
        comm,
    })
}

/// Sends `signal` to every process of the group `pgid`.
pub fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// Kills every process of `pgids`, waits for `children` (the ranks) and reaps any orphan
/// of those groups that became ours; returns what is still there after `budget`.
pub fn clean_up(pgids: &[i32], children: &mut [Child], budget: Duration) -> Vec<ProcInfo> {
    let deadline = Instant::now() + budget;
    let me = std::process::id() as i32;
    loop {
        for &pgid in pgids {
            signal_group(pgid, libc::SIGKILL);
        }
        for child in children.iter_mut() {
            let _ = child.try_wait();
        }
        for p in group_members(pgids) {
            if p.ppid == me && !children.iter().any(|c| c.id() as i32 == p.pid) {
                // SAFETY: waitpid on a specific pid that is our child (an adopted orphan);
                // WNOHANG never blocks. No other code waits for these pids.
                unsafe {
                    libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG);
                }
            }
        }
        let left = group_members(pgids);
        let children_done = children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(Some(_))));
        if (left.is_empty() && children_done) || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
