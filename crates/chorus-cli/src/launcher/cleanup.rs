//! Leaving nothing behind: after the ranks are gone, whatever they started is killed and
//! reaped too — processes still in a rank's process group, and descendants that escaped it
//! (a new session, a double fork), which reach the launcher because it is a child
//! subreaper.

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

/// Makes orphaned descendants of this process its children (not init's), so they can be
/// found, killed and reaped. Best effort: without it, only the ranks' groups are cleaned.
pub(crate) fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(
            "cannot become a child subreaper ({e}); escaped descendants may outlive the job"
        );
    }
}

/// Sends SIGKILL to process group `pgid`; true when the group still had members.
pub(crate) fn kill_group(pgid: u32, signal: Signal) -> bool {
    match pid(pgid) {
        Some(p) => rustix::process::kill_process_group(p, signal).is_ok(),
        None => false,
    }
}

/// Sends `signal` to one process; false when it is gone.
pub(crate) fn kill_one(target: u32, signal: Signal) -> bool {
    match pid(target) {
        Some(p) => rustix::process::kill_process(p, signal).is_ok(),
        None => false,
    }
}

/// Kills every child this process still has (leftovers re-parented to the subreaper) and
/// reaps them, waiting at most `budget`. Returns how many leftovers were killed and how many
/// could not be reaped in time.
pub(crate) fn sweep_children(budget: Duration) -> (usize, usize) {
    let me = std::process::id();
    let deadline = Instant::now() + budget;
    let mut killed = std::collections::BTreeSet::new();
    loop {
        for (child, zombie) in children_of(me) {
            // A zombie is already dead; it only needs reaping.
            if !zombie && kill_one(child, Signal::KILL) {
                killed.insert(child);
            }
        }
        reap_any();
        let left = children_of(me);
        if left.is_empty() {
            return (killed.len(), 0);
        }
        if Instant::now() >= deadline {
            return (killed.len(), left.len());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reaps every child that has ended, without waiting; returns them with their status.
pub(crate) fn reap_any() -> Vec<(u32, rustix::process::WaitStatus)> {
    let mut reaped = Vec::new();
    loop {
        // `wait`, not `waitpid(None)`: the latter is pid 0, the caller's own process group,
        // and every rank has a group of its own.
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => reaped.push((pid.as_raw_nonzero().get() as u32, status)),
            Ok(None) | Err(_) => return reaped,
        }
    }
}

/// The processes whose parent is `parent`, from `/proc` (threads are not listed there),
/// each with whether it is a zombie.
fn children_of(parent: u32) -> Vec<(u32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != parent)
        .filter_map(|p| {
            let (state, ppid) = stat(p)?;
            (ppid == parent).then_some((p, state == 'Z'))
        })
        .collect()
}

/// The state and parent of `pid`, from `/proc/PID/stat` (the two fields after the
/// parenthesised name, which may itself contain spaces and parentheses).
fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

fn pid(raw: u32) -> Option<Pid> {
    i32::try_from(raw).ok().and_then(Pid::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_read_from_proc() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(stat(child.id()).map(|s| s.1), Some(me));
        assert!(children_of(me).contains(&(child.id(), false)));
        assert!(kill_one(child.id(), Signal::KILL));
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert_eq!(stat(u32::MAX - 1), None);
    }
}
