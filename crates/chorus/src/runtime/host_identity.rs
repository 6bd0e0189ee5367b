//! Host identity: which peers share this machine *and* this process-id namespace, so that a
//! peer's process id means the same process here (principle 2: a process gone on this host
//! is conclusive evidence, acted on at once).
//!
//! A hostname alone is not enough: containers on one machine share a hostname pattern but
//! not process ids, and two machines can share a hostname. The identity therefore adds the
//! kernel's boot id and the pid namespace, hashed.

use sha2::{Digest, Sha256};

/// `hostname#<12 hex digits>`: equal for two processes exactly when both run under the same
/// kernel boot and pid namespace (so `PeerInfo.pid` can be watched with pidfd).
pub(crate) fn identity() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pid_ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let digest = Sha256::new()
        .chain_update(boot_id.trim().as_bytes())
        .chain_update([0])
        .chain_update(pid_ns.as_bytes())
        .finalize();
    format!("{hostname}#{}", hex::encode(&digest[..6]))
}

/// True when `other` (a peer's `PeerInfo.host`) names this host and pid namespace. Without
/// a boot id or namespace to compare (no `/proc`), nothing is considered same-host.
pub(crate) fn is_local(mine: &str, other: &str) -> bool {
    mine == other && !mine.starts_with("unknown#")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_and_local() {
        let a = identity();
        assert_eq!(a, identity());
        assert!(a.contains('#'));
        assert!(is_local(&a, &a));
        assert!(!is_local(&a, "elsewhere#000000000000"));
        assert!(!is_local("unknown#1", "unknown#1"));
    }
}
