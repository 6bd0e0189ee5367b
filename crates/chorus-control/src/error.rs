//! Why a node refused an input. A refusal changes no membership state; the runtime may count
//! them, trace them, or close the connection with [`InputError::close_code`].

use chorus_protocol::message::Kind;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use thiserror::Error;

/// An input the node did not act on.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum InputError {
    /// The frame belongs to an epoch this member has left (principle 6: rejected after the
    /// commit). The node may answer with the commit the sender missed.
    #[error("stale frame from {frame}; this member is at {current}")]
    StaleEpoch { frame: Epoch, current: Epoch },
    /// The frame belongs to an epoch this member has not installed yet.
    #[error("frame from future {frame}; this member is at {current}")]
    FutureEpoch { frame: Epoch, current: Epoch },
    #[error("frame for {comm}; this node serves {expected}")]
    UnknownComm { comm: CommId, expected: CommId },
    #[error("{rank} is outside the world of {world}")]
    RankOutOfRange { rank: Rank, world: u32 },
    /// The sender is known dead or departed at this epoch.
    #[error("frame from absent {rank}")]
    FromAbsent { rank: Rank },
    /// The frame is not a control-plane message.
    #[error("{kind:?} is not a control message")]
    NotControl { kind: Kind },
    /// The frame is a control message but makes no sense here.
    #[error("invalid {kind:?}: {reason}")]
    Invalid { kind: Kind, reason: String },
    /// The node departed or was evicted and acts on nothing.
    #[error("node is no longer a member")]
    Inactive,
}

impl InputError {
    /// The code to close the connection with, for refusals that mean the peer is broken.
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            InputError::UnknownComm { .. } => Some(CloseCode::UNKNOWN_COMM),
            InputError::RankOutOfRange { .. }
            | InputError::NotControl { .. }
            | InputError::Invalid { .. } => Some(CloseCode::PROTOCOL_VIOLATION),
            InputError::StaleEpoch { .. }
            | InputError::FutureEpoch { .. }
            | InputError::FromAbsent { .. }
            | InputError::Inactive => None,
        }
    }
}
