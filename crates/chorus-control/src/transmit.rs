//! What a node asks the runtime to send, open and close.

use chorus_protocol::message::Message;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

/// A frame to send. `to` is a rank at `epoch`, which is the node's current epoch except for
/// catch-up replies to members still at an older one (keep the previous epochs' tables for
/// a while, see [`crate::Node`]). The runtime fills the header from `comm`, `epoch` and its
/// own rank at `epoch`.
#[derive(Clone, Debug, PartialEq)]
pub struct Transmit {
    pub to: Rank,
    pub comm: CommId,
    pub epoch: Epoch,
    pub message: Message,
}

/// A connection the node wants opened or closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnectionIntent {
    /// Open (or keep) a control connection to `peer` at `epoch`: an overlay neighbour.
    /// Pre-opening keeps the failure path free of handshakes.
    Open { peer: Rank, epoch: Epoch },
    /// Close the connection to `peer` at `epoch` with `code`. After a departure, flush the
    /// `Depart` frame queued just before (bounded) so the peer gets the reason; the code in
    /// the close carries the departure anyway.
    Close {
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    },
}
