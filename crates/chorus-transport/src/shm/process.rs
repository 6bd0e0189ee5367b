//! The peer's process, watched through a pidfd: a process gone on this host is conclusive
//! death evidence (principle 2), and it does not depend on who else holds the segment's
//! descriptor (a forked child keeps the mapping alive, not the peer).

use std::os::fd::OwnedFd;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags};

/// A pidfd on the peer's process, when the kernel let us open one.
#[derive(Debug)]
pub(crate) struct PeerProcess {
    pid: i32,
    fd: Option<OwnedFd>,
}

impl PeerProcess {
    /// Watches `pid` (the `SO_PEERCRED` of the handshake's socket, read while the peer was
    /// connected, so the pid cannot have been reused yet). Without a pidfd (pid 0 from
    /// another pid namespace, an old kernel) nothing is watched and the heartbeat
    /// deadline covers the peer as any other.
    pub(crate) fn watch(pid: i32) -> PeerProcess {
        // pidfds are close-on-exec by construction.
        let fd = Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::NONBLOCK).ok());
        if fd.is_none() {
            tracing::debug!(pid, "no pidfd for the shm peer; liveness by heartbeat only");
        }
        PeerProcess { pid, fd }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited (its pidfd is readable), without waiting.
    pub(crate) fn exited(&self) -> bool {
        let Some(fd) = &self.fd else {
            return false;
        };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        matches!(rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_is_not_exited_and_a_reaped_one_is() {
        let me = PeerProcess::watch(std::process::id() as i32);
        assert!(!me.exited());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let p = PeerProcess::watch(child.id() as i32);
        child.wait().unwrap();
        // A reaped child's pid may be gone before pidfd_open; then nothing is watched.
        if p.fd.is_some() {
            assert!(p.exited());
        }
        assert!(!PeerProcess::watch(0).exited(), "no pid, no evidence");
    }
}
