//! Which transport carries the data link to one peer: the decision alone, with no IO, so
//! the mixed-world rule (shared memory within a host, the network across) is unit-tested
//! apart from the sockets that carry it out (`links.rs`).

use chorus_protocol::caps;
use chorus_protocol::message::PeerInfo;

use super::host_identity;

/// The transport of one data link.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// A shared-memory segment (same kernel boot, pid and network namespace).
    Shm,
    /// TCP, in the session's flavour (io_uring or epoll).
    Tcp,
    /// QUIC.
    Quic,
}

/// What this member runs, the inputs of every per-peer choice.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Carriers<'a> {
    /// The session serves shm links (`CHORUS_TRANSPORT` `auto` or `shm`).
    pub(crate) shm: bool,
    /// The session serves TCP data links (every transport but `quic`).
    pub(crate) tcp: bool,
    /// This member's host identity (`host_identity::identity`).
    pub(crate) host: &'a str,
}

impl Carriers<'_> {
    /// The carrier of the data link to `peer`: shared memory when both ends serve it and
    /// the peer shares this host and network namespace, else the network.
    pub(crate) fn for_peer(&self, peer: &PeerInfo) -> Carrier {
        if self.shm
            && peer.caps & caps::SHM != 0
            && host_identity::same_network(self.host, &peer.host)
        {
            Carrier::Shm
        } else {
            self.across()
        }
    }

    /// The carrier to a peer that shared memory cannot reach.
    pub(crate) fn across(&self) -> Carrier {
        if self.tcp {
            Carrier::Tcp
        } else {
            Carrier::Quic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    const HERE: &str = "node#0123456789ab/00000001";
    const OTHER_NETNS: &str = "node#0123456789ab/00000002";
    const OTHER_HOST: &str = "node2#ba9876543210/00000001";

    fn peer(host: &str, caps: u64) -> PeerInfo {
        let mut p = testkit::peer_info(1);
        p.host = host.to_owned();
        p.caps = caps;
        p
    }

    const AUTO: Carriers<'static> = Carriers {
        shm: true,
        tcp: true,
        host: HERE,
    };

    #[test]
    fn a_mixed_world_uses_shm_within_the_host_and_tcp_across() {
        let all = caps::TCP | caps::QUIC | caps::SHM;
        assert_eq!(AUTO.for_peer(&peer(HERE, all)), Carrier::Shm);
        assert_eq!(AUTO.for_peer(&peer(OTHER_HOST, all)), Carrier::Tcp);
        assert_eq!(
            AUTO.for_peer(&peer(OTHER_NETNS, all)),
            Carrier::Tcp,
            "another network namespace on this kernel is another host to shm"
        );
    }

    #[test]
    fn a_same_host_peer_without_shm_gets_tcp() {
        // The peer forced `tcp`: it has no shm listener to connect to.
        assert_eq!(
            AUTO.for_peer(&peer(HERE, caps::TCP | caps::QUIC)),
            Carrier::Tcp
        );
    }

    #[test]
    fn a_forced_network_transport_never_uses_shm() {
        let all = caps::TCP | caps::QUIC | caps::SHM;
        let tcp = Carriers { shm: false, ..AUTO };
        assert_eq!(tcp.for_peer(&peer(HERE, all)), Carrier::Tcp);
        let quic = Carriers {
            shm: false,
            tcp: false,
            host: HERE,
        };
        assert_eq!(quic.for_peer(&peer(HERE, all)), Carrier::Quic);
        assert_eq!(quic.across(), Carrier::Quic);
    }

    #[test]
    fn an_unknown_host_is_never_same_host() {
        let unknown = Carriers {
            host: "unknown#000000000000/00000000",
            ..AUTO
        };
        let all = caps::TCP | caps::QUIC | caps::SHM;
        assert_eq!(
            unknown.for_peer(&peer("unknown#000000000000/00000000", all)),
            Carrier::Tcp
        );
    }
}
