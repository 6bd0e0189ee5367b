//! The message catalogue: one body type per frame kind (SPEC.md, "Messages").
//!
//! Bodies other than `Chunk` are rkyv archives validated with bytecheck before use; `Chunk`
//! is a fixed-layout header followed by raw payload bytes, so a data chunk passes through the
//! decoder without a copy.

use bytes::Bytes;
use rkyv::{Archive, Deserialize, Serialize};

use crate::code::CloseCode;
use crate::ids::{CommId, Epoch, OpSeq, Rank};
use crate::limits::MAX_DETAIL;

/// Length of handshake nonces and proofs (HMAC-SHA256 output).
pub const PROOF_LEN: usize = 32;

/// Every frame kind, with its wire code.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Kind {
    /// Opens every stream, connector to acceptor: versions, role, nonce, proof of the secret.
    Hello = 0x01,
    /// The acceptor's answer to a valid `Hello`, proving the secret back.
    HelloAck = 0x02,
    /// A refusal with a close code; the stream closes with that code right after it.
    Reject = 0x03,
    /// A rank announcing itself to the bootstrap root, or a grow joiner asking to be admitted.
    Join = 0x10,
    /// The peer table a joiner is admitted into.
    Welcome = 0x11,
    /// Liveness, with a digest of what the sender knows (anti-entropy).
    Heartbeat = 0x20,
    /// An explicit departure with its reason; admitted on every stream, and nothing may follow it.
    Depart = 0x21,
    /// A liveness verdict about a member, flooded to every member.
    Notice = 0x22,
    /// The communicator at the header's epoch is unusable.
    Revoke = 0x23,
    /// Agreement phase 1a: a coordinator claims a ballot.
    Prepare = 0x30,
    /// Agreement phase 1b: a member's promise (or refusal) and what it accepted.
    Promise = 0x31,
    /// Agreement phase 2a: the coordinator's candidate for the next epoch.
    Propose = 0x32,
    /// Agreement phase 2b: a member's vote on a proposal.
    Accept = 0x33,
    /// The agreement's decision, flooded to every member.
    Commit = 0x34,
    /// Collective data on a `Data` stream: a fixed header and the raw payload.
    Chunk = 0x40,
    /// A status client (or the launcher) asking a member for its view.
    StatusRequest = 0x50,
    /// A member's ledger, flight recorder and, on request, peer table.
    StatusReply = 0x51,
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 17] = [
        Kind::Hello,
        Kind::HelloAck,
        Kind::Reject,
        Kind::Join,
        Kind::Welcome,
        Kind::Heartbeat,
        Kind::Depart,
        Kind::Notice,
        Kind::Revoke,
        Kind::Prepare,
        Kind::Promise,
        Kind::Propose,
        Kind::Accept,
        Kind::Commit,
        Kind::Chunk,
        Kind::StatusRequest,
        Kind::StatusReply,
    ];

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The kind for a wire code, or `None` for a code this version does not know.
    pub const fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            0x01 => Kind::Hello,
            0x02 => Kind::HelloAck,
            0x03 => Kind::Reject,
            0x10 => Kind::Join,
            0x11 => Kind::Welcome,
            0x20 => Kind::Heartbeat,
            0x21 => Kind::Depart,
            0x22 => Kind::Notice,
            0x23 => Kind::Revoke,
            0x30 => Kind::Prepare,
            0x31 => Kind::Promise,
            0x32 => Kind::Propose,
            0x33 => Kind::Accept,
            0x34 => Kind::Commit,
            0x40 => Kind::Chunk,
            0x50 => Kind::StatusRequest,
            0x51 => Kind::StatusReply,
            _ => return None,
        })
    }

    /// The stable kebab-case name SPEC.md uses (`hello-ack`, `status-reply`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::HelloAck => "hello-ack",
            Kind::Reject => "reject",
            Kind::Join => "join",
            Kind::Welcome => "welcome",
            Kind::Heartbeat => "heartbeat",
            Kind::Depart => "depart",
            Kind::Notice => "notice",
            Kind::Revoke => "revoke",
            Kind::Prepare => "prepare",
            Kind::Promise => "promise",
            Kind::Propose => "propose",
            Kind::Accept => "accept",
            Kind::Commit => "commit",
            Kind::Chunk => "chunk",
            Kind::StatusRequest => "status-request",
            Kind::StatusReply => "status-reply",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A decoded message: the body of one frame, typed.
#[derive(Clone, PartialEq, Debug)]
pub enum Message {
    /// Connector to acceptor, first frame of every stream.
    Hello(Hello),
    /// Acceptor to connector, answering a valid `Hello`.
    HelloAck(HelloAck),
    /// Refuses a handshake or a bootstrap, join or status request.
    Reject(Reject),
    /// On `Bootstrap` and `Joiner` streams, or relayed by a member on a `Member` stream.
    Join(Join),
    /// The root's (or an admitting member's) answer to a `Join`.
    Welcome(Welcome),
    /// To each observer, every heartbeat interval.
    Heartbeat(Heartbeat),
    /// On any stream: the sender is leaving (principle 1).
    Depart(Depart),
    /// A verdict spreading over fingers; from a launcher, a witnessed exit.
    Notice(Notice),
    /// Revocation of the header's epoch, spreading like a notice.
    Revoke(Revoke),
    /// Agreement phase 1a.
    Prepare(Prepare),
    /// Agreement phase 1b.
    Promise(Promise),
    /// Agreement phase 2a.
    Propose(Propose),
    /// Agreement phase 2b.
    Accept(Accept),
    /// The agreed next epoch.
    Commit(Commit),
    /// Collective data; the only kind a `Data` stream carries besides `Depart`.
    Chunk(Chunk),
    /// `chorus status` or the launcher asking a member.
    StatusRequest(StatusRequest),
    /// A member's answer to a `StatusRequest`.
    StatusReply(StatusReply),
}

impl Message {
    /// The frame kind that carries this message.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::HelloAck(_) => Kind::HelloAck,
            Message::Reject(_) => Kind::Reject,
            Message::Join(_) => Kind::Join,
            Message::Welcome(_) => Kind::Welcome,
            Message::Heartbeat(_) => Kind::Heartbeat,
            Message::Depart(_) => Kind::Depart,
            Message::Notice(_) => Kind::Notice,
            Message::Revoke(_) => Kind::Revoke,
            Message::Prepare(_) => Kind::Prepare,
            Message::Promise(_) => Kind::Promise,
            Message::Propose(_) => Kind::Propose,
            Message::Accept(_) => Kind::Accept,
            Message::Commit(_) => Kind::Commit,
            Message::Chunk(_) => Kind::Chunk,
            Message::StatusRequest(_) => Kind::StatusRequest,
            Message::StatusReply(_) => Kind::StatusReply,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Handshake

/// What a connection is for; chosen by the connecting side in its `Hello`.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum Role {
    /// A member's control connection to another member (heartbeats, notices, agreement).
    Member = 0,
    /// A member's data-plane connection to another member (chunks).
    Data = 1,
    /// A rank joining the bootstrap root at init.
    Bootstrap = 2,
    /// A new process asking a running communicator to admit it (grow).
    Joiner = 3,
    /// `chorus status`: reads the live state, may not send anything but `StatusRequest`.
    Status = 4,
    /// The job's launcher (`chorus run`): asks for status and reports, as a witness, that a
    /// rank's process exited (a `Notice` with `LauncherWitness` evidence and no origin rank).
    Launcher = 5,
}

/// The first frame on every connection, sent by the connecting side.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Hello {
    /// Lowest protocol version the sender speaks.
    pub version_min: u16,
    /// Highest protocol version the sender speaks.
    pub version_max: u16,
    /// What the stream is for; it fixes which kinds each side may send afterwards (SPEC.md,
    /// "Roles").
    pub role: Role,
    /// Fresh random bytes from the sender.
    pub nonce: [u8; PROOF_LEN],
    /// HMAC-SHA256 under the job secret over the handshake transcript (SPEC.md, "Handshake").
    pub proof: [u8; PROOF_LEN],
}

/// The accepting side's answer to a valid `Hello`.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct HelloAck {
    /// The version both sides will speak: the highest in both ranges.
    pub version: u16,
    /// Fresh random bytes from the acceptor.
    pub nonce: [u8; PROOF_LEN],
    /// HMAC-SHA256 under the job secret over the transcript including the `Hello`'s nonce,
    /// proving the acceptor knows the secret too.
    pub proof: [u8; PROOF_LEN],
}

/// A refusal; the connection is closed with the same code right after it.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Reject {
    /// Why: the stream closes with this same code right after the `Reject`.
    pub code: CloseCode,
    /// Human-readable, lowercase, at most `MAX_DETAIL` bytes.
    pub detail: String,
}

impl Reject {
    /// A rejection whose detail is cut (at a character boundary) to `MAX_DETAIL` bytes.
    pub fn new(code: CloseCode, detail: impl Into<String>) -> Self {
        Reject {
            code,
            detail: truncated(detail.into(), MAX_DETAIL),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bootstrap and membership tables

/// A socket address on the wire: an IPv6 address (IPv4 as IPv4-mapped) and a port.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct WireAddr {
    /// IPv6 address bytes, network order; an IPv4 address is IPv4-mapped (`::ffff:a.b.c.d`).
    pub ip: [u8; 16],
    /// Port, host order as a number (the encoding fixes the byte order).
    pub port: u16,
}

/// One member as the others need to know it: where to reach it and how to watch it.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct PeerInfo {
    /// Its rank in the table it appears in (`Rank::NONE` in a grow joiner's `Join`).
    pub rank: Rank,
    /// Host name, so same-host peers can be watched by process id.
    pub host: String,
    /// Process id on `host`: a same-host peer with the same pid namespace is watched by pidfd.
    pub pid: u32,
    /// Control-plane (QUIC) endpoint.
    pub control: WireAddr,
    /// Data-plane endpoint (per the transport in `caps`).
    pub data: WireAddr,
    /// SHA-256 of the member's self-signed QUIC certificate (DER), pinned by its peers.
    pub fingerprint: [u8; 32],
    /// Capability bits (SPEC.md, "Capabilities").
    pub caps: u64,
    /// Distinguishes a restarted process reusing a rank.
    pub incarnation: u64,
}

/// A rank announcing itself to the bootstrap root, or a joiner to a running communicator.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Join {
    /// The world size the sender was started with (0 for a grow joiner).
    pub world: u32,
    /// Who is joining: its endpoints, fingerprint and capabilities. On a `Bootstrap` stream
    /// `peer.rank` is the header's sender; a grow joiner sends `Rank::NONE`.
    pub peer: PeerInfo,
}

/// The root's answer once every rank has joined: the peer table of the first epoch, or a
/// joiner's admission into a later one.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Welcome {
    /// The communicator the table belongs to.
    pub comm: CommId,
    /// The epoch the table is valid for (0 after bootstrap).
    pub epoch: Epoch,
    /// Ordered by rank; `members[i].rank == i`.
    pub members: Vec<PeerInfo>,
}

// ---------------------------------------------------------------------------------------------
// Liveness

/// "I am alive", sent to each observer every heartbeat interval.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Heartbeat {
    /// Increments by one per heartbeat from this sender.
    pub seq: u64,
    /// Digest of what the sender knows at the header's epoch (the set of absent ranks and
    /// whether the epoch is revoked; `chorus-control`'s `Digest`). A receiver whose digest
    /// differs pushes what it knows back: anti-entropy that repairs a notice lost to loss
    /// or a partition without any per-notice acknowledgement.
    pub digest: u64,
}

/// An explicit departure: the sender is leaving, and why (principle 1).
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Depart {
    /// Why the sender leaves: `normal` (destroy), `left` (a caught signal), `aborted`, ...; the
    /// connection-level close that follows carries the same code.
    pub code: CloseCode,
    /// Human-readable, lowercase, at most `MAX_DETAIL` bytes.
    pub detail: String,
}

impl Depart {
    /// A departure whose detail is cut (at a character boundary) to `MAX_DETAIL` bytes, so
    /// that a long error text never stops a member from departing.
    pub fn new(code: CloseCode, detail: impl Into<String>) -> Self {
        Depart {
            code,
            detail: truncated(detail.into(), MAX_DETAIL),
        }
    }
}

/// What a notice asserts about its subject.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum Verdict {
    /// Missed a deadline on one observer; not yet absent.
    Suspect = 0,
    /// Declared dead; absent from the next epoch.
    Dead = 1,
    /// Left explicitly; absent from the next epoch.
    Departed = 2,
}

pub use evidence::{ArchivedEvidence, Evidence, EvidenceResolver};

// `Evidence` sits in a module of its own only to scope the `allow` below: rkyv's derive
// gives the variant fields of the `EvidenceResolver` it generates no docs. `Evidence`'s own
// fields are documented.
mod evidence {
    #![allow(missing_docs)]

    use rkyv::{Archive, Deserialize, Serialize};

    use crate::code::CloseCode;

    /// Why an observer reached its verdict.
    #[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
    #[rkyv(derive(Debug))]
    pub enum Evidence {
        /// The subject sent `Depart` (or a connection close) with this code.
        Departed {
            /// The departure's code (`normal`, `left`, `aborted`, ...).
            code: CloseCode,
        },
        /// The connection to the subject failed or closed without a departure.
        ConnectionLost {
            /// The close code seen, or `internal` for a reset or an error without one.
            code: CloseCode,
        },
        /// Nothing heard from the subject for `silent_ms` against a deadline of `deadline_ms`.
        MissedDeadline {
            /// How long the observer heard nothing, its own stalls excluded, in milliseconds.
            silent_ms: u64,
            /// The deadline that silence passed, in milliseconds.
            deadline_ms: u64,
        },
        /// The subject's process exited on the observer's host (pidfd). `status` as
        /// [`ExitStatus`](super::ExitStatus) reads it.
        ProcessExited {
            /// Exit code, negated signal number, or `i32::MIN` when unknown.
            status: i32,
        },
        /// The launcher saw the subject's process exit.
        LauncherWitness {
            /// Exit code, negated signal number, or `i32::MIN` when unknown.
            status: i32,
        },
    }
}

/// An exit status as `Evidence` carries it (SPEC.md): an exit code when non-negative, a
/// signal number negated, or `i32::MIN` when the observer could not learn it (a pidfd on a
/// process that is not its child). Displays as `status 3`, `signal 9` or `status unknown`.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct ExitStatus(pub i32);

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            i32::MIN => f.write_str("status unknown"),
            s if s < 0 => write!(f, "signal {}", s.unsigned_abs()),
            s => write!(f, "status {s}"),
        }
    }
}

/// A liveness verdict spreading by reliable broadcast.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Notice {
    /// The member that reached the verdict.
    pub origin: Rank,
    /// The member the verdict is about.
    pub subject: Rank,
    /// What the origin concluded; `Dead` and `Departed` are absorbing for the epoch.
    pub verdict: Verdict,
    /// Why the origin concluded it; the first evidence is kept and reported to the application.
    pub evidence: Evidence,
    /// Forwarding hops so far (0 when sent by the origin).
    pub hops: u16,
}

/// The communicator at the header's epoch is unusable; spreads to every member.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Revoke {
    /// The member that revoked first; later origins change nothing.
    pub origin: Rank,
    /// Forwarding hops so far (0 when sent by the origin).
    pub hops: u16,
    /// What made the origin revoke, when it was a member's departure or failure under
    /// running operations (`None` for a revoke the application asked for). Every member
    /// whose operations the revoke ends can then name that member, whichever of the revoke
    /// and the member's own word reaches it first.
    pub cause: Option<RevokeCause>,
}

/// The member whose departure or failure a [`Revoke`] answers, and the evidence.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct RevokeCause {
    /// The member that departed or failed.
    pub subject: Rank,
    /// How the origin learned it.
    pub evidence: Evidence,
}

// ---------------------------------------------------------------------------------------------
// Agreement and membership change

/// Orders agreement attempts: higher round wins; ties broken by coordinator rank.
#[derive(
    Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug,
)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct Ballot {
    /// Compared first; a coordinator that is refused retries with a higher round.
    pub round: u32,
    /// Breaks ties between coordinators of the same round; never `Rank::NONE`.
    pub coordinator: Rank,
}

/// A candidate membership for the next epoch.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Proposal {
    /// The new communicator's id and epoch.
    pub comm: CommId,
    /// The new epoch: the current one plus one.
    pub epoch: Epoch,
    /// Old-epoch ranks agreed absent (dead or departed), ascending.
    pub removed: Vec<Rank>,
    /// Members new in this epoch (grow), in their new rank order. The new table is the old
    /// one without `removed`, compacted `0..n` in old order, with these appended; survivors'
    /// entries are not repeated, because every member already holds them, so agreement
    /// messages stay O(changes) rather than O(world) at 100 000 ranks.
    pub joiners: Vec<PeerInfo>,
}

/// A coordinator claims a ballot and asks for any proposal already accepted.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Prepare {
    /// The ballot the coordinator claims.
    pub ballot: Ballot,
}

/// A member promises to ignore lower ballots and reports what it already accepted. Sent with
/// a higher `ballot` than the `Prepare`'s, it is a refusal naming the ballot promised instead.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Promise {
    /// The `Prepare`'s ballot when promising; a higher one when refusing (the ballot already
    /// promised).
    pub ballot: Ballot,
    /// The highest-ballot proposal this member already accepted for this epoch change, which the
    /// coordinator must re-propose if any member reports one.
    pub accepted: Option<(Ballot, Proposal)>,
    /// Old-epoch ranks this member knows to be absent.
    pub absent: Vec<Rank>,
}

/// The coordinator's proposal for the next epoch.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Propose {
    /// The ballot the proposal is made under.
    pub ballot: Ballot,
    /// The candidate next epoch.
    pub proposal: Proposal,
}

/// A member's vote on a proposal.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Accept {
    /// The ballot voted on, or the higher ballot promised when `ok` is false.
    pub ballot: Ballot,
    /// False when the member has promised a higher ballot (then `ballot` is that ballot).
    /// An absence the proposal lacks does not refuse it (a value that may already be chosen
    /// must stay acceptable); it is reported in `absent` for the next epoch's agreement.
    pub ok: bool,
    /// Current-epoch ranks this member knows absent (a rank set: ascending, no duplicates).
    pub absent: Vec<Rank>,
}

/// The decision: every member installs `proposal` as its next epoch.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct Commit {
    /// The ballot the proposal was chosen under.
    pub ballot: Ballot,
    /// The next epoch every member installs.
    pub proposal: Proposal,
}

// ---------------------------------------------------------------------------------------------
// Data plane

/// The fixed-layout header of a data chunk (SPEC.md, "Chunk"); the payload follows it.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct ChunkHeader {
    /// Wire code of the collective (`Collective::code`).
    pub collective: u8,
    /// Wire code of the element type (`DType::code`).
    pub dtype: u8,
    /// The operation the chunk belongs to (collective sequence number, or a point-to-point one).
    pub op: OpSeq,
    /// The payload's index among the operation's payloads on this link in this direction; credit
    /// returns set the high `CREDIT` bit (chorus-engine's `run` module). Matched with `op`.
    pub step: u32,
    /// Byte offset of the payload within the operation's buffer.
    pub offset: u64,
}

/// A data chunk: header plus payload (a slice of the receive buffer, never copied).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Chunk {
    /// Routing and tag fields; checked against the receive's tag (a mismatch is an error).
    pub header: ChunkHeader,
    /// The data: at most `max_chunk_payload` bytes, a multiple of the element size, sliced from
    /// the decoder's receive buffer without a copy.
    pub payload: Bytes,
}

// ---------------------------------------------------------------------------------------------
// Live inspection

/// Asks a member for its view of the communicator (`chorus status`).
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct StatusRequest {
    /// How many of the most recent flight-recorder entries to include.
    pub max_ops: u32,
    /// Include the member's current peer table (`StatusReply::members`), so a status client
    /// that only knows the root's address can reach every other member.
    pub with_members: bool,
}

/// A member's liveness state for one peer, as its ledger holds it.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum PeerState {
    /// Known from the table but not yet heard from.
    Joining = 0,
    /// Heard from within the deadline (also what a peer without a record reads as).
    Alive = 1,
    /// Silent past `suspect_after` on this observer: local and reversible, never absent.
    Suspect = 2,
    /// Declared dead; absorbing for the epoch.
    Dead = 3,
    /// Left explicitly; absorbing for the epoch.
    Departed = 4,
}

/// One row of a member's ledger.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct PeerStatus {
    /// The peer this row is about, in the member's current numbering.
    pub rank: Rank,
    /// The ledger's state for it.
    pub state: PeerState,
    /// Milliseconds since the member last heard from this peer (`u64::MAX`: never).
    pub last_heard_ms: u64,
    /// The evidence behind a `Dead` or `Departed` verdict (the first one kept), else `None`.
    pub evidence: Option<Evidence>,
}

/// Where an operation in the flight recorder stands.
#[derive(Archive, Serialize, Deserialize, Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum OpState {
    /// Submitted, not yet running.
    Queued = 0,
    /// Running: `step` and `waiting_on` say where.
    Running = 1,
    /// Completed successfully.
    Done = 2,
    /// Ended with an error of its own (a link or device failure, bad arguments).
    Failed = 3,
    /// Ended by an abort of its context (a peer's failure, a revoke, a timeout, the application).
    Aborted = 4,
}

/// One flight-recorder entry.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct OpRecord {
    /// The operation's sequence number on its communicator.
    pub seq: OpSeq,
    /// Wire code of the collective.
    pub collective: u8,
    /// Size of the operation's buffer as its algorithm measures it, in bytes.
    pub bytes: u64,
    /// The algorithm's name (`ring`, `recursive-doubling`, ...), at most 64 bytes.
    pub algorithm: String,
    /// Where it stands.
    pub state: OpState,
    /// The schedule step it had reached (0 before the first).
    pub step: u32,
    /// The peer this operation is blocked on, if it is blocked.
    pub waiting_on: Option<Rank>,
    /// Milliseconds since the operation started.
    pub age_ms: u64,
    /// How long it ran (so far, if still running), in milliseconds.
    pub elapsed_ms: u64,
}

/// A member's answer to `StatusRequest`.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
#[rkyv(derive(Debug))]
pub struct StatusReply {
    /// The answering member's rank, at its current epoch.
    pub rank: Rank,
    /// The member's current epoch (it may have shrunk or grown since the client's table).
    pub epoch: Epoch,
    /// Members at that epoch.
    pub world: u32,
    /// Its ledger: one row per peer it has a record for.
    pub peers: Vec<PeerStatus>,
    /// Its flight recorder, oldest first, at most the request's `max_ops` entries.
    pub ops: Vec<OpRecord>,
    /// The first error this member's communicator recorded, with its stable token.
    pub async_error: Option<String>,
    /// The member's current peer table when the request asked `with_members`, else empty.
    pub members: Vec<PeerInfo>,
}

/// `s` cut to at most `max` bytes at a character boundary.
fn truncated(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
