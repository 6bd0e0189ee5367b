//! What the runtime hands a node: frames, connection events, local evidence, timer expiry
//! and commands.

use chorus_protocol::message::{Message, PeerInfo, RevokeCause};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

/// One input to [`crate::Node::handle`]. A connection event or local evidence names the peer
/// by its rank at `epoch`: the epoch of the control stream it concerns (or, for a process
/// exit, of the table the runtime looked the process up in). Events about another epoch
/// than the node's are refused, so closing the previous epoch's streams (SPEC 11.2) is
/// never mistaken for a departure.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A control frame received from a member.
    Frame(Received),
    /// A connection to `peer` completed its handshake (a sign of life).
    ConnectionOpened { peer: Rank, epoch: Epoch },
    /// `peer` closed the connection with an application code (QUIC `CONNECTION_CLOSE`, or
    /// TCP's departure frame). A departure code means it left; `EVICTED` means it removed
    /// this member in an agreed epoch.
    ConnectionClosed {
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    },
    /// The connection to `peer` failed without an application close (reset, unreachable,
    /// transport idle timeout). Acted on at once: the peer is declared dead.
    ConnectionLost {
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    },
    /// `peer`'s process was seen to exit (pidfd on this host, or the launcher; a launcher's
    /// `Notice` with origin `Rank::NONE` arrives this way too).
    PeerExited {
        peer: Rank,
        epoch: Epoch,
        status: i32,
        witness: Witness,
    },
    /// The deadline from [`crate::Node::poll_timeout`] passed (any input also runs due timers).
    Timeout,
    /// A local request from the application or the runtime.
    Command(Command),
}

/// A control frame and its header, as the runtime decoded it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// The sender's rank at `epoch` (the header's sender field).
    pub from: Rank,
    pub comm: CommId,
    pub epoch: Epoch,
    pub message: Message,
}

/// Who saw a process exit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Witness {
    /// A pidfd on this host.
    Pidfd,
    /// The launcher that spawned it.
    Launcher,
}

/// Local requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Leave the communicator: send `Depart` to every neighbour, then close every
    /// connection with `code` (principle 1). The node is inert afterwards.
    Depart { code: CloseCode, detail: String },
    /// Abort locally: a departure with `CloseCode::ABORTED`. Never waits on a peer; repeats
    /// are no-ops.
    Abort,
    /// Revoke the communicator at the current epoch on every member; `cause` names the
    /// member whose departure or failure under running operations made this member revoke
    /// (`None`: the application asked).
    Revoke { cause: Option<RevokeCause> },
    /// Agree with the other survivors on the next epoch without the absent members.
    Shrink,
    /// Admit these processes as new members at the next epoch (grow). This member
    /// coordinates the agreement; the runtime welcomes them when it is agreed.
    Admit(Vec<PeerInfo>),
}
