//! What the runtime's parts hand each other: the messages a lineage's task receives
//! ([`LineageMsg`], [`Request`]) with what they carry ([`NextEpoch`], [`EpochHooks`],
//! [`DataLink`]), and how a peer's "not yet" refusal reads ([`not_yet`]).
//!
//! A leaf: the registry routes these messages, the data links are built and handed over as
//! these types, and the lineage consumes them, so none of those needs another's module.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use chorus_control::Agreed;
use chorus_engine::{Link, LinkError};
use chorus_protocol::message::{Message, PeerInfo, Role};
use chorus_protocol::{CloseCode, Epoch, Rank};
use chorus_transport::{ControlChannel, TransportError};
use tokio::sync::oneshot;

use crate::error::Error;
use crate::recorder::Recorder;

/// A data link as the engine holds it.
pub(crate) type DataLink = Arc<dyn Link<Bytes>>;

/// Messages to a lineage's task.
pub(crate) enum LineageMsg {
    /// A control stream, accepted by the endpoint or opened by the lineage.
    Channel {
        peer: Rank,
        epoch: Epoch,
        role: Role,
        channel: Arc<ControlChannel>,
    },
    /// A frame read from a stream.
    Frame {
        id: u64,
        peer: Rank,
        epoch: Epoch,
        role: Role,
        message: Message,
    },
    /// A stream ended.
    ChannelDown { id: u64, error: LinkError },
    /// An attempt to open a stream gave up; `refused` is the acceptor's `Reject` code, if
    /// it answered with one.
    ConnectFailed {
        peer: Rank,
        epoch: Epoch,
        refused: Option<CloseCode>,
    },
    /// A peer's process on this host exited.
    Exited { peer: Rank, epoch: Epoch },
    /// How that exit ended the peer: `Some(code)` if its data link carried its departure
    /// first, `None` if it died (see `exits::settle`).
    ExitedAs {
        peer: Rank,
        epoch: Epoch,
        end: Option<CloseCode>,
    },
    /// An operation saw its data link to `peer` lost without a departure.
    DataLost { peer: Rank, epoch: Epoch },
    /// An operation saw `peer` depart on its data link with `code` (after everything `peer`
    /// sent on it: the link delivers in order).
    DataDeparted {
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    },
    /// A request from the application.
    Request(Request),
}

/// What the application asks of a lineage.
pub(crate) enum Request {
    /// Agree with the survivors on the next epoch; the reply is the agreement and its table,
    /// or an error by `deadline` (the caller's one bound for its whole `shrink()`).
    Shrink {
        after: Epoch,
        deadline: std::time::Instant,
        reply: oneshot::Sender<Result<NextEpoch, Error>>,
    },
    /// Admit `joiners` new processes (this member coordinates when it is rank 0), or wait
    /// for the agreement that admits them.
    Grow {
        after: Epoch,
        joiners: u32,
        deadline: std::time::Instant,
        reply: oneshot::Sender<Result<NextEpoch, Error>>,
    },
    /// Revoke the communicator at the current epoch everywhere.
    Revoke { reply: oneshot::Sender<()> },
    /// Leave with `code`: departures sent and streams closed before the reply.
    Depart {
        code: CloseCode,
        detail: String,
        reply: oneshot::Sender<()>,
    },
    /// Attach a new epoch's data-plane state, so failures abort its operations.
    Attach(Weak<EpochHooks>),
}

/// An agreed next epoch with its peer table.
#[derive(Clone, Debug)]
pub(crate) struct NextEpoch {
    pub(crate) agreed: Agreed,
    pub(crate) table: Vec<PeerInfo>,
}

/// What a lineage needs of an epoch's data plane: the context to abort and the links to
/// cancel when the control plane declares someone gone.
pub(crate) struct EpochHooks {
    pub(crate) epoch: Epoch,
    /// Aborted by failures at this epoch; parent of the engine's context.
    pub(crate) ctx: chorus_engine::Context,
    pub(crate) links: Vec<DataLink>,
    pub(crate) recorder: Arc<Recorder>,
    /// The epoch's links are still being built: any member leaving (even gracefully)
    /// makes the build impossible, so it aborts.
    pub(crate) building: bool,
}

/// The peer refused because it does not serve this communicator or epoch yet.
pub(crate) fn not_yet(e: &TransportError) -> bool {
    matches!(e.code(), CloseCode::UNKNOWN_COMM)
        || matches!(e, TransportError::ConnectTimeout { .. })
}
