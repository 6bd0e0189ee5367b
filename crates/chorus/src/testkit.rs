//! What the crate's unit tests share.

use chorus_protocol::Rank;
use chorus_protocol::message::{PeerInfo, WireAddr};

/// A peer table entry for `rank` on another host, with a fingerprint and an incarnation
/// of its own.
pub(crate) fn peer_info(rank: u32) -> PeerInfo {
    PeerInfo {
        rank: Rank(rank),
        host: "h#000000000000".into(),
        pid: 100 + rank,
        control: WireAddr {
            ip: [0; 16],
            port: 1,
        },
        data: WireAddr {
            ip: [0; 16],
            port: 2,
        },
        fingerprint: [rank as u8; 32],
        caps: 0,
        incarnation: u64::from(rank) + 7,
    }
}
