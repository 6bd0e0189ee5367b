//! Admission: the acceptor's policy, asked once a `Hello` has proved the job secret.

use std::sync::Arc;

use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

/// Tells an acceptor which rank it is in the communicator an authenticated `Hello` names
/// (at the connector's epoch; the third argument is the connector's rank, `Rank::NONE` if
/// it is not a member), or why it refuses the stream: an unknown communicator
/// (`UNKNOWN_COMM`), a stale epoch (`STALE_EPOCH`, or `EVICTED` for a connector removed
/// from the epochs after its own), a role it does not serve. The refusal reaches the
/// connector as a `Reject` with that code.
pub type Admission =
    Arc<dyn Fn(CommId, Epoch, Rank, Role) -> Result<Rank, (CloseCode, String)> + Send + Sync>;

/// An admission that accepts every communicator and role as `rank` (tests, single-comm use).
pub fn admit_all(rank: Rank) -> Admission {
    Arc::new(move |_, _, _, _| Ok(rank))
}
