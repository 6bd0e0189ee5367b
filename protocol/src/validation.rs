//! Semantic validity rules of each message body (SPEC.md, "Messages"): the bounds and
//! orderings bytecheck cannot see. A decoded body that breaks one of them closes the
//! connection with `protocol-violation`; the encoder refuses to produce one.

use std::fmt;

use crate::dtype::{Collective, DType};
use crate::ids::Rank;
use crate::limits::{Limits, MAX_ALGORITHM, MAX_ASYNC_ERROR, MAX_DETAIL, MAX_HOST};
use crate::message::{
    Accept, Chunk, ChunkHeader, Commit, Depart, Evidence, Hello, HelloAck, Join, Message, Notice,
    PeerInfo, Promise, Proposal, Propose, Reject, Revoke, StatusReply, Verdict, Welcome,
};

/// The rule a message breaks. Every variant closes the connection with
/// `protocol-violation`; the fields say which field broke which bound, for the log line.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum Invalid {
    /// A string is longer than the spec allows (a detail, a host name, an algorithm name).
    #[error("{field} is {len} bytes, at most {max} allowed")]
    TooLong {
        /// The field, as SPEC.md names it.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The bound in bytes.
        max: usize,
    },
    /// A list has more entries than `Limits` allows (members, ranks, status rows).
    #[error("{field} has {len} entries, at most {max} allowed")]
    TooMany {
        /// The field, as SPEC.md names it.
        field: &'static str,
        /// Its number of entries.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A list that must have at least one entry (a peer table) has none.
    #[error("{field} is empty")]
    Empty {
        /// The field, as SPEC.md names it.
        field: &'static str,
    },
    /// A peer table entry whose rank is not its index (`members[i].rank == i`).
    #[error("members[{index}] has rank {rank}, expected r{index}")]
    RankOutOfPlace {
        /// The entry's index in the table.
        index: usize,
        /// The rank it claims.
        rank: Rank,
    },
    /// A rank set that is not strictly ascending (out of order, or a duplicate).
    #[error("{field} is not strictly ascending at index {index}")]
    NotAscending {
        /// The field, as SPEC.md names it.
        field: &'static str,
        /// The first index out of order.
        index: usize,
    },
    /// A rank no member can hold where a member is required (`Rank::NONE` as a coordinator,
    /// in a rank set, ...).
    #[error("{field} is {rank}, which no member can be")]
    BadRank {
        /// The field, as SPEC.md names it.
        field: &'static str,
        /// The rank found.
        rank: Rank,
    },
    /// A `Hello` whose version range is empty or starts at 0.
    #[error("version range {min}..={max} is empty or starts at 0")]
    BadVersionRange {
        /// `version_min` as sent.
        min: u16,
        /// `version_max` as sent.
        max: u16,
    },
    /// A `HelloAck` choosing version 0.
    #[error("version 0 does not exist")]
    ZeroVersion,
    /// A `Join` whose rank is outside its world, or a grow joiner's (world 0) that names a
    /// rank instead of `Rank::NONE`.
    #[error("join for world {world} names {rank}")]
    JoinRank {
        /// The `world` the join names.
        world: u32,
        /// The rank its `peer` claims.
        rank: Rank,
    },
    /// A `Notice` whose subject is its own origin (a member reports itself only by
    /// departing).
    #[error("notice about its own origin {rank}")]
    SelfNotice {
        /// The origin and subject.
        rank: Rank,
    },
    /// A `Revoke` whose cause is its own origin or a launcher's witness: a member revokes
    /// neither because of itself nor on a launcher's behalf.
    #[error("revoke caused by {subject} with evidence {evidence}")]
    RevokeCause {
        /// The cause's subject.
        subject: Rank,
        /// The evidence variant's name.
        evidence: &'static str,
    },
    /// A `Notice` whose evidence does not fit its verdict or origin: `Departed` without a
    /// departure (or the reverse), `Suspect` on conclusive evidence, a launcher witness that
    /// is not `Dead`, or no origin without a witness.
    #[error("verdict {verdict:?} with evidence {evidence}")]
    VerdictEvidence {
        /// The notice's verdict.
        verdict: Verdict,
        /// The evidence variant's name.
        evidence: &'static str,
    },
    /// A chunk header's collective code this version does not know.
    #[error("unknown collective code {0}")]
    UnknownCollective(u8),
    /// A chunk header's dtype code this version does not know.
    #[error("unknown dtype code {0}")]
    UnknownDType(u8),
    /// A chunk offset or length that is not a whole number of elements.
    #[error("{field} {value} is not a multiple of the {dtype} element size")]
    Misaligned {
        /// `offset` or `length`.
        field: &'static str,
        /// Its value in bytes.
        value: u64,
        /// The chunk's element type.
        dtype: DType,
    },
    /// A chunk whose `offset + length` overflows a `u64`.
    #[error("chunk offset {offset} + length {len} overflows")]
    ChunkOverflow {
        /// The header's byte offset.
        offset: u64,
        /// The payload's length in bytes.
        len: u64,
    },
    /// A chunk header whose reserved bytes are not zero (kept zero so a later version can
    /// give them a meaning).
    #[error("chunk header reserved bytes are not zero")]
    ChunkReserved,
    /// A rule of the stream's role (SPEC.md, "Roles"): a `Notice` with an origin on a
    /// `Launcher` stream, a `Join` naming another sender on a `Bootstrap` stream, ...
    #[error("{0}")]
    RoleRule(&'static str),
}

/// A body whose validity rules can be checked.
pub(crate) trait Validate {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid>;
}

impl Message {
    /// Checks the message against SPEC.md's rules for its kind under `limits`.
    pub fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        match self {
            Message::Hello(m) => m.validate(limits),
            Message::HelloAck(m) => m.validate(limits),
            Message::Reject(m) => m.validate(limits),
            Message::Join(m) => m.validate(limits),
            Message::Welcome(m) => m.validate(limits),
            Message::Heartbeat(_) => Ok(()),
            Message::Depart(m) => m.validate(limits),
            Message::Notice(m) => m.validate(limits),
            Message::Revoke(m) => m.validate(limits),
            Message::Prepare(m) => ballot_coordinator(m.ballot.coordinator),
            Message::Promise(m) => m.validate(limits),
            Message::Propose(m) => m.validate(limits),
            Message::Accept(m) => m.validate(limits),
            Message::Commit(m) => m.validate(limits),
            Message::Chunk(m) => m.validate(limits),
            Message::StatusRequest(_) => Ok(()),
            Message::StatusReply(m) => m.validate(limits),
        }
    }
}

impl Validate for Hello {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        if self.version_min == 0 || self.version_min > self.version_max {
            return Err(Invalid::BadVersionRange {
                min: self.version_min,
                max: self.version_max,
            });
        }
        Ok(())
    }
}

impl Validate for HelloAck {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        if self.version == 0 {
            return Err(Invalid::ZeroVersion);
        }
        Ok(())
    }
}

impl Validate for Reject {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        max_len("detail", self.detail.len(), MAX_DETAIL)
    }
}

impl Validate for Depart {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        max_len("detail", self.detail.len(), MAX_DETAIL)
    }
}

impl Validate for PeerInfo {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        max_len("host", self.host.len(), MAX_HOST)
    }
}

impl Validate for Join {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        self.peer.validate(limits)?;
        max_count("world", self.world as usize, limits.max_members)?;
        // A bootstrap join names a rank of the world it was started with; a grow joiner
        // (world 0) has no rank until a commit assigns one.
        let ok = if self.world == 0 {
            self.peer.rank == Rank::NONE
        } else {
            self.peer.rank.0 < self.world
        };
        if !ok {
            return Err(Invalid::JoinRank {
                world: self.world,
                rank: self.peer.rank,
            });
        }
        Ok(())
    }
}

impl Validate for Welcome {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        table(&self.members, limits)
    }
}

impl Validate for Notice {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        if self.subject == Rank::NONE {
            return Err(Invalid::BadRank {
                field: "subject",
                rank: self.subject,
            });
        }
        if self.origin == self.subject {
            return Err(Invalid::SelfNotice { rank: self.origin });
        }
        let evidence = evidence_name(&self.evidence);
        let consistent = match (self.verdict, self.evidence) {
            // Only a launcher (no rank) may witness, and a witness is all it may send.
            (_, Evidence::LauncherWitness { .. }) => self.verdict == Verdict::Dead,
            _ if self.origin == Rank::NONE => false,
            (Verdict::Departed, Evidence::Departed { .. }) => true,
            (Verdict::Departed, _) | (_, Evidence::Departed { .. }) => false,
            (Verdict::Suspect, Evidence::MissedDeadline { .. })
            | (Verdict::Suspect, Evidence::ConnectionLost { .. }) => true,
            (Verdict::Suspect, _) => false,
            (Verdict::Dead, _) => true,
        };
        if !consistent {
            return Err(Invalid::VerdictEvidence {
                verdict: self.verdict,
                evidence,
            });
        }
        Ok(())
    }
}

impl Validate for Revoke {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        if self.origin == Rank::NONE {
            return Err(Invalid::BadRank {
                field: "origin",
                rank: self.origin,
            });
        }
        if let Some(cause) = self.cause {
            if cause.subject == Rank::NONE {
                return Err(Invalid::BadRank {
                    field: "cause.subject",
                    rank: cause.subject,
                });
            }
            // A member does not revoke because of itself, nor on a launcher's behalf.
            if cause.subject == self.origin
                || matches!(cause.evidence, Evidence::LauncherWitness { .. })
            {
                return Err(Invalid::RevokeCause {
                    subject: cause.subject,
                    evidence: evidence_name(&cause.evidence),
                });
            }
        }
        Ok(())
    }
}

impl Validate for Proposal {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        ascending("removed", &self.removed, limits)?;
        joiners(&self.joiners, limits)
    }
}

impl Validate for Promise {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        ballot_coordinator(self.ballot.coordinator)?;
        if let Some((ballot, proposal)) = &self.accepted {
            ballot_coordinator(ballot.coordinator)?;
            proposal.validate(limits)?;
        }
        ascending("absent", &self.absent, limits)
    }
}

impl Validate for Propose {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        ballot_coordinator(self.ballot.coordinator)?;
        self.proposal.validate(limits)
    }
}

impl Validate for Accept {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        ballot_coordinator(self.ballot.coordinator)?;
        ascending("absent", &self.absent, limits)
    }
}

impl Validate for Commit {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        ballot_coordinator(self.ballot.coordinator)?;
        self.proposal.validate(limits)
    }
}

impl Validate for Chunk {
    fn validate(&self, _: &Limits) -> Result<(), Invalid> {
        validate_chunk_header(&self.header, self.payload.len() as u64)
    }
}

/// The rules of a chunk header for a payload of `len` bytes (shared by the decoder, which
/// checks before it splits the payload off, and the zero-copy encoder).
pub(crate) fn validate_chunk_header(h: &ChunkHeader, len: u64) -> Result<(), Invalid> {
    Collective::from_code(h.collective).ok_or(Invalid::UnknownCollective(h.collective))?;
    let dtype = DType::from_code(h.dtype).ok_or(Invalid::UnknownDType(h.dtype))?;
    let size = dtype.size() as u64;
    if !h.offset.is_multiple_of(size) {
        return Err(Invalid::Misaligned {
            field: "offset",
            value: h.offset,
            dtype,
        });
    }
    if !len.is_multiple_of(size) {
        return Err(Invalid::Misaligned {
            field: "payload length",
            value: len,
            dtype,
        });
    }
    if h.offset.checked_add(len).is_none() {
        return Err(Invalid::ChunkOverflow {
            offset: h.offset,
            len,
        });
    }
    Ok(())
}

impl Validate for StatusReply {
    fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        max_count("peers", self.peers.len(), limits.max_members)?;
        max_count("ops", self.ops.len(), limits.max_ops)?;
        for op in &self.ops {
            max_len("algorithm", op.algorithm.len(), MAX_ALGORITHM)?;
            Collective::from_code(op.collective)
                .ok_or(Invalid::UnknownCollective(op.collective))?;
        }
        if let Some(e) = &self.async_error {
            max_len("async_error", e.len(), MAX_ASYNC_ERROR)?;
        }
        if !self.members.is_empty() {
            table(&self.members, limits)?;
        }
        Ok(())
    }
}

/// A peer table: non-empty, bounded, `members[i].rank == i`, every entry valid.
fn table(members: &[PeerInfo], limits: &Limits) -> Result<(), Invalid> {
    if members.is_empty() {
        return Err(Invalid::Empty { field: "members" });
    }
    max_count("members", members.len(), limits.max_members)?;
    for (index, m) in members.iter().enumerate() {
        if m.rank.index() != index {
            return Err(Invalid::RankOutOfPlace {
                index,
                rank: m.rank,
            });
        }
        m.validate(limits)?;
    }
    Ok(())
}

/// A proposal's joiners: bounded, each entry valid, ranks consecutive (they are appended
/// after the kept members, in order).
fn joiners(joiners: &[PeerInfo], limits: &Limits) -> Result<(), Invalid> {
    max_count("joiners", joiners.len(), limits.max_members)?;
    let first = joiners.first().map(|j| j.rank.index()).unwrap_or(0);
    for (i, j) in joiners.iter().enumerate() {
        if j.rank == Rank::NONE || j.rank.index() != first + i {
            return Err(Invalid::RankOutOfPlace {
                index: i,
                rank: j.rank,
            });
        }
        j.validate(limits)?;
    }
    Ok(())
}

/// A rank set: bounded, strictly ascending (so duplicates are impossible), no `NONE`.
fn ascending(field: &'static str, ranks: &[Rank], limits: &Limits) -> Result<(), Invalid> {
    max_count(field, ranks.len(), limits.max_members)?;
    for (index, pair) in ranks.windows(2).enumerate() {
        if pair[0] >= pair[1] {
            return Err(Invalid::NotAscending {
                field,
                index: index + 1,
            });
        }
    }
    if let Some(&last) = ranks.last()
        && last == Rank::NONE
    {
        return Err(Invalid::BadRank { field, rank: last });
    }
    Ok(())
}

fn ballot_coordinator(rank: Rank) -> Result<(), Invalid> {
    if rank == Rank::NONE {
        return Err(Invalid::BadRank {
            field: "ballot coordinator",
            rank,
        });
    }
    Ok(())
}

fn max_len(field: &'static str, len: usize, max: usize) -> Result<(), Invalid> {
    if len > max {
        return Err(Invalid::TooLong { field, len, max });
    }
    Ok(())
}

fn max_count(field: &'static str, len: usize, max: u32) -> Result<(), Invalid> {
    if len > max as usize {
        return Err(Invalid::TooMany {
            field,
            len,
            max: max as usize,
        });
    }
    Ok(())
}

fn evidence_name(e: &Evidence) -> &'static str {
    match e {
        Evidence::Departed { .. } => "departed",
        Evidence::ConnectionLost { .. } => "connection-lost",
        Evidence::MissedDeadline { .. } => "missed-deadline",
        Evidence::ProcessExited { .. } => "process-exited",
        Evidence::LauncherWitness { .. } => "launcher-witness",
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Suspect => "suspect",
            Verdict::Dead => "dead",
            Verdict::Departed => "departed",
        })
    }
}
