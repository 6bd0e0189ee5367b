//! A network namespace of the test's own, entered by the calling thread, with an nftables
//! table that can silence one rank's ports both ways while its process stays alive (no FIN,
//! no RST, no exit: a partitioned host as its peers see it).
//!
//! [`Netns::enter`] creates the namespace (`ip netns add`), brings its loopback up and moves
//! the calling thread into it (`setns`), so the bootstrap root this thread starts and every
//! rank it spawns live inside, as if run under `ip netns exec`. Dropping the guard moves the
//! thread back and deletes the namespace, its table with it, also when the test panics.
//! Where this cannot work (not root, no `ip` or `nft`), `enter` says why and the test skips
//! with one line. `.ci/netns-deps` installs the tools.

#![allow(clippy::print_stderr)] // the skip line and cleanup trouble go to the test's stderr

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use crate::clock::mono_ns;

/// The nftables table the cut lives in.
const TABLE: &str = "chorus_cut";

/// The calling thread's own network namespace, left on drop.
pub struct Netns {
    name: String,
    /// The thread's namespace before `enter`, to go back to.
    home: File,
}

impl Netns {
    /// Creates a namespace and moves the calling thread into it; `Err` says why it cannot
    /// (the caller skips).
    pub fn enter(label: &str) -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (network namespaces and nftables)".into());
        }
        for tool in ["ip", "nft"] {
            let found = Command::new(tool)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            if !found {
                return Err(format!("no `{tool}` (run .ci/netns-deps)"));
            }
        }
        let home = File::open("/proc/thread-self/ns/net")
            .map_err(|e| format!("cannot open this thread's namespace: {e}"))?;
        let name = format!(
            "chorus-{label}-{}-{}",
            std::process::id(),
            mono_ns() % 1_000_000
        );
        run("ip", &["netns", "add", &name])?;
        // From here on the guard removes the namespace, whatever fails next.
        let ns = Netns { name, home };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        let path = format!("/var/run/netns/{}", ns.name);
        let target = File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
        // SAFETY: both descriptors are open network-namespace files; setns only changes the
        // calling thread's namespace.
        if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        Ok(ns)
    }

    /// Drops every packet from or to these ports (UDP `udp`, TCP `tcp`) from now on, both
    /// ways: on loopback each packet leaves through the output hook once, from whichever
    /// end sent it.
    pub fn silence(&self, udp: &[u16], tcp: &[u16]) -> Result<(), String> {
        self.exec(&["nft", "add", "table", "inet", TABLE])?;
        self.exec(&[
            "nft",
            "add chain inet chorus_cut out { type filter hook output priority 0 ; policy accept ; }",
        ])?;
        for (proto, ports) in [("udp", udp), ("tcp", tcp)] {
            for port in ports {
                for dir in ["sport", "dport"] {
                    let rule = format!("add rule inet {TABLE} out {proto} {dir} {port} drop");
                    self.exec(&["nft", &rule])?;
                }
            }
        }
        Ok(())
    }

    /// Runs a command inside the namespace (whatever thread calls it).
    fn exec(&self, argv: &[&str]) -> Result<(), String> {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(argv);
        run("ip", &args)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // SAFETY: `home` is the namespace this thread came from, still open.
        if unsafe { libc::setns(self.home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "cannot return to the original network namespace: {}",
                std::io::Error::last_os_error()
            );
        }
        if let Err(e) = run("ip", &["netns", "del", &self.name]) {
            eprintln!("cannot delete network namespace {}: {e}", self.name);
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
