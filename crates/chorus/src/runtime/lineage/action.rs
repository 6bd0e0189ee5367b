//! What the lineage's policy decides and its task carries out, in order.

use chorus_engine::context::AbortReason;
use chorus_protocol::message::Welcome;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use super::aborts::Scope;
use super::waiters::Reply;
use crate::error::Error;
use crate::runtime::mailbox::NextEpoch;

/// What the policy decided that the lineage's task carries out, in order.
pub(super) enum Action {
    /// Record the lineage's first failure (later ones are ignored).
    Record(Error),
    /// Abort the attached epochs `scope` names with `reason`.
    Abort { scope: Scope, reason: AbortReason },
    /// Cancel the data links to `peer` at `epoch` with `code`.
    CancelLinks {
        epoch: Epoch,
        peer: Rank,
        code: CloseCode,
    },
    /// Answer a shrink or grow.
    Answer {
        reply: Reply,
        result: Result<NextEpoch, Error>,
    },
    /// Send `welcome` on the joiner's stream `chan`.
    Welcome { chan: u64, welcome: Welcome },
    /// Route `comm` at `epoch` (where this member is `rank`) to this lineage.
    Serve {
        comm: CommId,
        epoch: Epoch,
        rank: Rank,
    },
    /// Refuse handshakes at `epoch` from `removed` (ranks the next epoch dropped) with
    /// `evicted`.
    Fence {
        comm: CommId,
        epoch: Epoch,
        removed: Vec<Rank>,
    },
    /// Watch the same-host peers of `epoch`'s table (replacing older watches).
    Watch(Epoch),
}
