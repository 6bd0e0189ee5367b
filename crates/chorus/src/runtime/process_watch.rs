//! Same-host process watching with pidfd: the fastest death evidence a peer on this
//! machine can give (principle 2). The runtime's control thread awaits [`ProcessWatch::exited`]
//! for every same-host peer; it resolves when the process is gone, however it ended
//! (SIGKILL included), without polling and without the peer's cooperation.

use std::io;
use std::os::fd::OwnedFd;

use rustix::process::{Pid, PidfdFlags, pidfd_open};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A handle on another process of this host that becomes readable when it exits.
#[derive(Debug)]
pub(crate) struct ProcessWatch {
    fd: AsyncFd<OwnedFd>,
}

impl ProcessWatch {
    /// Starts watching `pid`. Must be called inside a tokio runtime with IO enabled.
    /// Fails with `NotFound` if the process is already gone (itself evidence of exit).
    pub(crate) fn open(pid: u32) -> io::Result<Self> {
        let raw = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a process id"))?;
        let fd = pidfd_open(raw, PidfdFlags::NONBLOCK).map_err(|e| {
            if e == rustix::io::Errno::SRCH {
                io::Error::new(io::ErrorKind::NotFound, format!("process {pid} is gone"))
            } else {
                io::Error::from(e)
            }
        })?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("process watch outside a tokio runtime"));
        }
        // SAFETY: `fd` is an `OwnedFd` just returned by pidfd_open: valid, open, and owned by
        // the `AsyncFd` for its whole life, so its raw descriptor never changes or closes
        // while registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(ProcessWatch { fd })
    }

    /// Resolves once the process has exited. A pidfd becomes readable exactly then and
    /// stays readable, so there is no readiness to clear.
    pub(crate) async fn exited(&self) -> io::Result<()> {
        let _guard = self.fd.readable().await?;
        Ok(())
    }

    /// True if the process has already exited (non-blocking check).
    #[cfg(test)]
    pub(crate) fn has_exited(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        use std::os::fd::AsFd;
        let fd = self.fd.get_ref().as_fd();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&Timespec::default())), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn sees_a_killed_process_exit_promptly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        rt.block_on(async {
            let watch = ProcessWatch::open(child.id()).unwrap();
            assert!(!watch.has_exited());
            // Still alive: the wait must not resolve yet.
            let early = tokio::time::timeout(Duration::from_millis(50), watch.exited()).await;
            assert!(early.is_err(), "a live process does not look exited");
            child.kill().unwrap();
            tokio::time::timeout(Duration::from_secs(5), watch.exited())
                .await
                .expect("exit seen within the bound")
                .unwrap();
            assert!(watch.has_exited());
        });
        child.wait().unwrap();
    }

    #[test]
    fn a_gone_process_is_not_found() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut child = Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        rt.block_on(async {
            let err = ProcessWatch::open(child.id()).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotFound);
            assert_eq!(
                ProcessWatch::open(0).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        });
    }
}
