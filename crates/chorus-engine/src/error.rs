//! Errors of the engine: a failed operation ([`OpError`]) and a bad engine setup
//! ([`EngineError`]).
//!
//! An aborted operation is an error, never a silent `Ok` (principle 5): it says why, which
//! step it had reached, which peer it was waiting on, and whether the output buffer may hold
//! partial data.

use std::fmt;
use std::sync::Arc;

use chorus_protocol::{Collective, OpSeq, Rank};

use crate::context::AbortReason;
use crate::device::DeviceError;
use crate::link::LinkError;

/// Why an operation failed, with where it was.
#[derive(Clone, PartialEq, Debug)]
pub struct OpError {
    /// What went wrong.
    pub kind: OpErrorKind,
    /// The operation's collective.
    pub collective: Collective,
    /// The operation's sequence number, the same on every rank for the same call.
    pub op: OpSeq,
    /// The step (tag step, which encodes the chunk) the operation had reached, if it started
    /// communicating.
    pub step: Option<u32>,
    /// The peer the operation was waiting on (or sending to) when it failed.
    pub peer: Option<Rank>,
    /// True when the output buffer may hold partial data (the operation had written to it).
    pub partial_output: bool,
}

/// The cause of an [`OpError`].
#[derive(Clone, PartialEq, Debug, thiserror::Error)]
pub enum OpErrorKind {
    /// The operation's context was aborted.
    #[error("aborted: {0}")]
    Aborted(AbortReason),
    /// A link failed.
    #[error("link: {0}")]
    Link(LinkError),
    /// The device failed.
    #[error("device: {0}")]
    Device(DeviceError),
    /// A peer sent a payload of a different size than this rank expects (the ranks passed
    /// different counts or types).
    #[error("size mismatch: expected {expected} bytes, peer sent {got}")]
    SizeMismatch {
        /// The payload size this rank's schedule expects, in bytes.
        expected: usize,
        /// The size the peer sent, in bytes.
        got: usize,
    },
    /// The call's arguments are invalid on this rank.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An earlier operation on this communicator failed; the communicator is unusable (stale
    /// chunks of the failed operation may still be in flight) and must be aborted or shrunk.
    #[error("communicator unusable after an earlier failure: {0}")]
    Poisoned(Arc<OpError>),
}

impl OpError {
    /// The abort reason, if the operation (or the one that poisoned the communicator) was
    /// aborted.
    pub fn abort_reason(&self) -> Option<&AbortReason> {
        match &self.root_cause().kind {
            OpErrorKind::Aborted(r) => Some(r),
            _ => None,
        }
    }

    /// The first failure: for a [`OpErrorKind::Poisoned`] error, the error that poisoned the
    /// communicator; otherwise `self`.
    pub fn root_cause(&self) -> &OpError {
        match &self.kind {
            OpErrorKind::Poisoned(first) => first.root_cause(),
            _ => self,
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.collective, self.op)?;
        if let Some(step) = self.step {
            write!(f, " step {step}")?;
        }
        if let Some(peer) = self.peer {
            write!(f, " (peer {peer})")?;
        }
        write!(f, ": {}", self.kind)?;
        if self.partial_output {
            f.write_str("; output holds partial data")?;
        }
        Ok(())
    }
}

impl std::error::Error for OpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

/// Why an engine could not be built.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum EngineError {
    /// `rank` is not below `world`, or `world` is zero.
    #[error("rank {rank} outside a world of {world}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: Rank,
        /// The world size asked for.
        world: u32,
    },
    /// A link's peer is this rank or outside the world, or two links name the same peer.
    #[error("bad link set: {0}")]
    Links(String),
    /// The configuration cannot be used.
    #[error("bad configuration: {0}")]
    Config(String),
}
