//! Host identity: which peers share this machine *and* this process-id namespace, so that a
//! peer's process id means the same process here (principle 2: a process gone on this host
//! is conclusive evidence, acted on at once), and which of those also share this network
//! namespace, so that shared memory can carry their data links.
//!
//! A hostname alone is not enough: containers on one machine share a hostname pattern but
//! not process ids, and two machines can share a hostname. The identity therefore adds the
//! kernel's boot id and the pid namespace, hashed, and then the network namespace, hashed
//! on its own so that the two questions stay apart: network-namespace "hosts" on one kernel
//! keep watching each other's processes but talk over TCP.

use sha2::{Digest, Sha256};

/// `hostname#<12 hex digits>/<8 hex digits>`: the part before `/` is equal for two processes
/// exactly when both run under the same kernel boot and pid namespace (so `PeerInfo.pid` can
/// be watched with pidfd); the whole is equal when they also share the network namespace.
pub(crate) fn identity() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let namespace = |ns: &str| {
        std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let machine = Sha256::new()
        .chain_update(boot_id.trim().as_bytes())
        .chain_update([0])
        .chain_update(namespace("pid").as_bytes())
        .finalize();
    let net = Sha256::new()
        .chain_update(boot_id.trim().as_bytes())
        .chain_update([0])
        .chain_update(namespace("net").as_bytes())
        .finalize();
    format!(
        "{hostname}#{}/{}",
        hex::encode(&machine[..6]),
        hex::encode(&net[..4])
    )
}

/// True when `other` (a peer's `PeerInfo.host`) names this host and pid namespace. Without
/// a boot id or namespace to compare (no `/proc`), nothing is considered same-host.
pub(crate) fn is_local(mine: &str, other: &str) -> bool {
    machine(mine) == machine(other) && !mine.starts_with("unknown#")
}

/// True when `other` is local (as [`is_local`]) and also in this network namespace: the
/// peers an abstract Unix socket reaches, so a shared-memory segment can be handed over.
/// An identity without the network part (an older peer) never qualifies.
pub(crate) fn same_network(mine: &str, other: &str) -> bool {
    is_local(mine, other) && mine.contains('/') && mine == other
}

/// True unless `a` and `b` (two members' `PeerInfo.host`) name two network namespaces,
/// whatever their pid namespaces: traffic between two members for which this is true stays
/// in one kernel's loopback. A fact about two members rather than about this process, so
/// every member answers it alike for any pair. Without both network parts nothing is known
/// to cross a network, and it answers true.
pub(crate) fn one_network(a: &str, b: &str) -> bool {
    match (a.split_once('/'), b.split_once('/')) {
        (Some((_, net_a)), Some((_, net_b))) => net_a == net_b,
        _ => true,
    }
}

/// The identity without its network-namespace part.
fn machine(identity: &str) -> &str {
    identity.split_once('/').map_or(identity, |(m, _)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_and_local() {
        let a = identity();
        assert_eq!(a, identity());
        assert!(a.contains('#') && a.contains('/'));
        assert!(is_local(&a, &a));
        assert!(same_network(&a, &a));
        assert!(!is_local(&a, "elsewhere#000000000000/00000000"));
        assert!(!is_local("unknown#1/2", "unknown#1/2"));
    }

    #[test]
    fn another_network_namespace_is_local_but_not_the_same_network() {
        let (a, b) = ("h#0123456789ab/00000001", "h#0123456789ab/00000002");
        assert!(
            is_local(a, b),
            "one kernel and pid namespace: pidfd still applies"
        );
        assert!(!same_network(a, b), "an abstract socket cannot reach it");
        // A peer that sends no network part is watched, never given shared memory.
        assert!(is_local(a, "h#0123456789ab"));
        assert!(!same_network(a, "h#0123456789ab"));
        assert!(!same_network("h#0123456789ab", "h#0123456789ab"));
    }

    #[test]
    fn one_network_looks_only_at_the_network_part() {
        let here = "h#0123456789ab/00000001";
        assert!(one_network(here, here));
        assert!(!one_network(here, "h#0123456789ab/00000002"));
        assert!(!one_network(here, "h2#ba9876543210/00000003"));
        // Another pid namespace (a container sharing the host's network) is one network.
        assert!(one_network(here, "h#ffffffffffff/00000001"));
        // Without a network part nothing is known to cross a network.
        assert!(one_network(here, "h#0123456789ab"));
    }
}
