//! What a communicator tells about itself: its members ([`Member`]), its view of their
//! health ([`Health`], [`PeerHealth`]) and its flight recorder ([`RecentOp`]). These are
//! chorus's own types, with plain numbers for ranks and epochs; the wire protocol's
//! messages they are read from stay inside.

use std::net::SocketAddr;
use std::time::Duration;

use chorus_protocol::Collective;
use chorus_protocol::message::{Evidence, OpRecord, OpState, PeerInfo, PeerState, PeerStatus};

use crate::error::Error;
use crate::runtime::socket_addr;

/// A member of a communicator, as its peer table lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// Its rank at the communicator's epoch.
    pub rank: u32,
    /// Its host and process-id namespace (`hostname#<digest>`): equal for members whose
    /// process ids mean the same processes.
    pub host: String,
    /// Its process id, on its host.
    pub pid: u32,
    /// Its control-plane (QUIC) endpoint.
    pub control: SocketAddr,
    /// Its data-plane endpoint.
    pub data: SocketAddr,
    /// SHA-256 of its QUIC certificate, which its peers pin.
    pub fingerprint: [u8; 32],
    /// Distinguishes a restarted process reusing a rank.
    pub incarnation: u64,
}

impl From<&PeerInfo> for Member {
    fn from(p: &PeerInfo) -> Member {
        Member {
            rank: p.rank.get(),
            host: p.host.clone(),
            pid: p.pid,
            control: socket_addr(&p.control),
            data: socket_addr(&p.data),
            fingerprint: p.fingerprint,
            incarnation: p.incarnation,
        }
    }
}

/// The health of a communicator, as `ncclCommGetAsyncError` and a ledger would tell it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Health {
    /// This member's rank.
    pub rank: u32,
    /// The communicator's membership generation.
    pub epoch: u64,
    /// The number of members.
    pub world: u32,
    /// This member's view of every member: state, last heard, evidence.
    pub peers: Vec<PeerHealth>,
    /// The first failure recorded on this communicator, if any.
    pub async_error: Option<Error>,
    /// How late the watched peers' heartbeats arrived.
    pub heartbeat_lateness: HeartbeatLateness,
}

/// How late the heartbeats of the peers this member watches arrived: for each, the time
/// past one heartbeat interval since the previous one, over the member's life. What the
/// heartbeat deadline has to absorb before a live peer would be declared dead.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeartbeatLateness {
    /// Heartbeats measured.
    pub count: u64,
    /// The median lateness (to the histogram's 1/8 resolution).
    pub p50: Duration,
    /// The 99th percentile (same resolution).
    pub p99: Duration,
    /// The largest, exactly.
    pub max: Duration,
}

impl From<&chorus_control::Lateness> for HeartbeatLateness {
    fn from(l: &chorus_control::Lateness) -> Self {
        HeartbeatLateness {
            count: l.count(),
            p50: l.quantile(0.5),
            p99: l.quantile(0.99),
            max: l.max(),
        }
    }
}

/// One member as another sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerHealth {
    /// The member's rank.
    pub rank: u32,
    /// Where it stands.
    pub state: PeerCondition,
    /// How long ago it was last heard from (`None`: never).
    pub last_heard: Option<Duration>,
    /// How its death or departure was established, once it was.
    pub evidence: Option<Evidence>,
}

/// Where a member stands in another's view.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerCondition {
    /// Not heard from yet.
    Joining,
    /// Heard from within the deadline.
    Alive,
    /// Silent for a while, not yet past the deadline (local and reversible).
    Suspect,
    /// Declared dead: every operation that involves it is aborted.
    Dead,
    /// Left the communicator.
    Departed,
}

impl From<&PeerStatus> for PeerHealth {
    fn from(p: &PeerStatus) -> PeerHealth {
        PeerHealth {
            rank: p.rank.get(),
            state: match p.state {
                PeerState::Joining => PeerCondition::Joining,
                PeerState::Alive => PeerCondition::Alive,
                PeerState::Suspect => PeerCondition::Suspect,
                PeerState::Dead => PeerCondition::Dead,
                PeerState::Departed => PeerCondition::Departed,
            },
            last_heard: (p.last_heard_ms != u64::MAX)
                .then(|| Duration::from_millis(p.last_heard_ms)),
            evidence: p.evidence,
        }
    }
}

/// One operation in the flight recorder.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecentOp {
    /// Its sequence number on the communicator (`op<seq>` in errors).
    pub seq: u64,
    /// The collective (`None` for one this version does not name).
    pub collective: Option<Collective>,
    /// The bytes it moves.
    pub bytes: u64,
    /// The algorithm that runs it.
    pub algorithm: String,
    /// Where it stands.
    pub phase: OpPhase,
    /// The step it is at (or ended at).
    pub step: u32,
    /// The rank it is blocked on, if it is blocked.
    pub waiting_on: Option<u32>,
    /// Since it started.
    pub age: Duration,
    /// How long it ran (so far, if still running).
    pub elapsed: Duration,
}

/// Where an operation in the flight recorder stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpPhase {
    /// Submitted, not started.
    Queued,
    /// Running.
    Running,
    /// Completed.
    Done,
    /// Failed.
    Failed,
    /// Aborted.
    Aborted,
}

impl From<&OpRecord> for RecentOp {
    fn from(r: &OpRecord) -> RecentOp {
        RecentOp {
            seq: r.seq.get(),
            collective: Collective::from_code(r.collective),
            bytes: r.bytes,
            algorithm: r.algorithm.clone(),
            phase: match r.state {
                OpState::Queued => OpPhase::Queued,
                OpState::Running => OpPhase::Running,
                OpState::Done => OpPhase::Done,
                OpState::Failed => OpPhase::Failed,
                OpState::Aborted => OpPhase::Aborted,
            },
            step: r.step,
            waiting_on: r.waiting_on.map(|p| p.get()),
            age: Duration::from_millis(r.age_ms),
            elapsed: Duration::from_millis(r.elapsed_ms),
        }
    }
}
