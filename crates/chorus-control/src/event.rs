//! What a node tells the application.

use std::time::Duration;

use chorus_protocol::message::{Ballot, Evidence, PeerInfo, RevokeCause};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use crate::plan::Plan;
use crate::quorum::NoQuorum;

/// Something the application (or the runtime on its behalf) must know.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A watched peer has been silent for `silent` (local and reversible; not absent).
    PeerSuspect {
        epoch: Epoch,
        rank: Rank,
        silent: Duration,
    },
    /// A suspected peer was heard from again.
    PeerRecovered { epoch: Epoch, rank: Rank },
    /// `rank` is dead at `epoch`: abort every operation that involves it. `origin` reached
    /// the verdict; the notice took `hops` forwarding hops to get here.
    PeerDead {
        epoch: Epoch,
        rank: Rank,
        evidence: Evidence,
        origin: Rank,
        hops: u16,
    },
    /// `rank` left at `epoch` with `code`.
    PeerDeparted {
        epoch: Epoch,
        rank: Rank,
        code: CloseCode,
        origin: Rank,
        hops: u16,
    },
    /// The communicator at `epoch` was revoked by `origin`: no further operations at it.
    /// `cause`: the member whose departure or failure the origin answered, if it said.
    Revoked {
        epoch: Epoch,
        origin: Rank,
        cause: Option<RevokeCause>,
    },
    /// The members agreed on the next epoch; this member is `agreed.rank` in it.
    MembershipAgreed(Agreed),
    /// An agreement round at `epoch` ended without enough votes (`votes` of `needed`); the
    /// coordinator retries with a higher ballot. It repeats while votes that its view counts
    /// on do not arrive (lost, or members not yet declared absent); a coordinator whose view
    /// cannot reach a quorum starts no round at all (see [`Event::AgreementFailed`]).
    AgreementStalled {
        epoch: Epoch,
        ballot: Ballot,
        votes: u32,
        needed: u32,
    },
    /// The shrink this member's application asked for at `epoch` will not be decided for
    /// it: its view cannot reach a quorum, or the request's deadline
    /// ([`crate::Config::request_timeout`]) passed. The node stays a member (it still answers
    /// other coordinators), but coordinates no round it cannot win.
    AgreementFailed {
        epoch: Epoch,
        failure: AgreementFailure,
    },
    /// This member was removed or declared dead and must not act at `epoch` or later. The
    /// node is inert from now on.
    Evicted { epoch: Epoch, cause: Eviction },
}

/// An agreed membership change, as this member installs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Agreed {
    pub comm: CommId,
    /// The epoch being left.
    pub previous: Epoch,
    /// This member's rank in the new epoch.
    pub rank: Rank,
    /// The change: new epoch and world, removed old ranks, old → new rank mapping.
    /// `plan.apply(&old_table, &joiners)` builds the new peer table.
    pub plan: Plan,
    /// Members appended in this epoch, already carrying their new ranks.
    pub joiners: Vec<PeerInfo>,
    /// The ballot that decided it.
    pub ballot: Ballot,
}

impl Agreed {
    /// The new epoch.
    pub fn epoch(&self) -> Epoch {
        self.plan.epoch()
    }

    /// The new world size.
    pub fn world(&self) -> u32 {
        self.plan.world()
    }
}

/// Why a requested agreement was given up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgreementFailure {
    /// This member's view holds fewer live members than the quorum needs.
    NoQuorum(NoQuorum),
    /// Nothing was decided within `waited` of the request.
    Timeout { waited: Duration },
}

/// Why a member was evicted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// An agreed epoch removed it.
    Removed { epoch: Epoch },
    /// It learned it had been declared dead while it was stalled (frozen, descheduled).
    Declared { origin: Rank, evidence: Evidence },
    /// A member that removed it closed the connection with `EVICTED`.
    Closed { peer: Rank },
}
