//! A member's place in one epoch of a communicator: which communicator, which epoch, how
//! many members, and which of them it is.

use chorus_protocol::message::Welcome;
use chorus_protocol::{CommId, Epoch, Rank};
use thiserror::Error;

/// One epoch of a communicator as one member holds it. Valid by construction: `rank` is
/// below `world`, and `world` is at least 1.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct View {
    comm: CommId,
    epoch: Epoch,
    world: u32,
    rank: Rank,
}

impl View {
    /// The view of member `rank` in a world of `world` members.
    pub fn new(comm: CommId, epoch: Epoch, world: u32, rank: Rank) -> Result<View, ViewError> {
        if world == 0 {
            return Err(ViewError::EmptyWorld);
        }
        if rank.get() >= world {
            return Err(ViewError::RankOutOfRange { rank, world });
        }
        Ok(View {
            comm,
            epoch,
            world,
            rank,
        })
    }

    /// The view a `Welcome` gives member `rank`, after checking the table is ordered by rank.
    pub fn from_welcome(welcome: &Welcome, rank: Rank) -> Result<View, ViewError> {
        for (i, peer) in welcome.members.iter().enumerate() {
            if peer.rank.index() != i {
                return Err(ViewError::TableOrder {
                    index: i,
                    rank: peer.rank,
                });
            }
        }
        let world = u32::try_from(welcome.members.len()).map_err(|_| ViewError::TooLarge)?;
        View::new(welcome.comm, welcome.epoch, world, rank)
    }

    /// The view of the member whose certificate has `fingerprint` in a `Welcome` (a grow
    /// joiner finding its rank in the table it was sent).
    pub fn for_member(welcome: &Welcome, fingerprint: &[u8; 32]) -> Result<View, ViewError> {
        let rank = welcome
            .members
            .iter()
            .find(|p| &p.fingerprint == fingerprint)
            .map(|p| p.rank)
            .ok_or(ViewError::NotInTable)?;
        View::from_welcome(welcome, rank)
    }

    pub fn comm(&self) -> CommId {
        self.comm
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    pub fn rank(&self) -> Rank {
        self.rank
    }
}

/// A view that cannot exist.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ViewError {
    #[error("world size is zero")]
    EmptyWorld,
    #[error("rank {rank} is outside a world of {world}")]
    RankOutOfRange { rank: Rank, world: u32 },
    #[error("member table entry {index} holds {rank}; entries must be ordered by rank")]
    TableOrder { index: usize, rank: Rank },
    #[error("member table has more than 2^32 entries")]
    TooLarge,
    #[error("this member is not in the table")]
    NotInTable,
}

#[cfg(test)]
mod tests {
    use chorus_protocol::message::{PeerInfo, WireAddr};

    use super::*;

    fn peer(rank: u32) -> PeerInfo {
        PeerInfo {
            rank: Rank(rank),
            host: "h".into(),
            pid: rank,
            control: WireAddr {
                ip: [0; 16],
                port: 1,
            },
            data: WireAddr {
                ip: [0; 16],
                port: 2,
            },
            fingerprint: [rank as u8 + 1; 32],
            caps: 0,
            incarnation: 0,
        }
    }

    #[test]
    fn a_joiner_finds_itself_in_its_welcome() {
        let welcome = Welcome {
            comm: CommId(3),
            epoch: Epoch(4),
            members: (0..3).map(peer).collect(),
        };
        let v = View::for_member(&welcome, &[3; 32]).unwrap();
        assert_eq!(
            (v.rank(), v.world(), v.epoch(), v.comm()),
            (Rank(2), 3, Epoch(4), CommId(3))
        );
        assert_eq!(
            View::for_member(&welcome, &[9; 32]),
            Err(ViewError::NotInTable)
        );
        let shuffled = Welcome {
            members: vec![peer(1), peer(0)],
            ..welcome
        };
        assert!(matches!(
            View::from_welcome(&shuffled, Rank(0)),
            Err(ViewError::TableOrder { .. })
        ));
    }

    #[test]
    fn rejects_impossible_views() {
        assert_eq!(
            View::new(CommId(1), Epoch(0), 0, Rank(0)),
            Err(ViewError::EmptyWorld)
        );
        assert_eq!(
            View::new(CommId(1), Epoch(0), 4, Rank(4)),
            Err(ViewError::RankOutOfRange {
                rank: Rank(4),
                world: 4
            })
        );
        let v = View::new(CommId(1), Epoch(3), 4, Rank(2)).unwrap();
        assert_eq!((v.world(), v.rank(), v.epoch()), (4, Rank(2), Epoch(3)));
    }
}
