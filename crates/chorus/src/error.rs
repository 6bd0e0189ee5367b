//! `chorus::Error`: one error type for everything a framework calls, whose `Display` starts
//! with a stable `[chorus:<kind>]` token (principle 8: a Python or RPC layer that keeps only
//! the text can still tell what happened) and which carries structured fields (rank, peer,
//! op, step, epoch, evidence) for code that keeps the value.

use std::fmt;

use chorus_protocol::message::{Evidence, ExitStatus};
use chorus_protocol::{CloseCode, Collective, CommId, Epoch, OpSeq, Rank};

/// What went wrong, coarsely: the part of the token after `chorus:`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The communicator (or an ancestor) was aborted locally.
    Aborted,
    /// A peer died (crash, freeze past the deadline, lost connection).
    PeerFailed,
    /// A peer left explicitly.
    PeerDeparted,
    /// A deadline passed (operation, init, agreement, teardown).
    Timeout,
    /// The communicator was revoked; shrink or destroy it.
    Revoked,
    /// This member was declared dead by the others and is no longer part of the job.
    Evicted,
    /// This member's own view holds fewer live members than the quorum needs: it cannot win
    /// an agreement, so it gave up at once instead of deciding a membership of its own.
    NoQuorum,
    /// Ranks called different collectives (or with different arguments).
    Mismatch,
    /// The caller passed something unusable (buffer sizes, root out of range, ...).
    InvalidArgument,
    /// A `CHORUS_*` variable or launch environment is unusable.
    Config,
    /// Bootstrap failed (root unreachable, duplicate rank, world mismatch, auth failed).
    Bootstrap,
    /// A transport could not be set up or failed outside an operation.
    Transport,
    /// A peer sent bytes that violate the protocol.
    Protocol,
    /// The memory device failed or is absent.
    Device,
    /// The communicator was destroyed; it cannot be used any more.
    Destroyed,
    /// A bug in chorus.
    Internal,
}

impl ErrorKind {
    /// The stable token that starts this kind's messages.
    pub const fn token(self) -> &'static str {
        match self {
            ErrorKind::Aborted => "[chorus:aborted]",
            ErrorKind::PeerFailed => "[chorus:peer-failed]",
            ErrorKind::PeerDeparted => "[chorus:peer-departed]",
            ErrorKind::Timeout => "[chorus:timeout]",
            ErrorKind::Revoked => "[chorus:revoked]",
            ErrorKind::Evicted => "[chorus:evicted]",
            ErrorKind::NoQuorum => "[chorus:no-quorum]",
            ErrorKind::Mismatch => "[chorus:mismatch]",
            ErrorKind::InvalidArgument => "[chorus:invalid-argument]",
            ErrorKind::Config => "[chorus:config]",
            ErrorKind::Bootstrap => "[chorus:bootstrap]",
            ErrorKind::Transport => "[chorus:transport]",
            ErrorKind::Protocol => "[chorus:protocol]",
            ErrorKind::Device => "[chorus:device]",
            ErrorKind::Destroyed => "[chorus:destroyed]",
            ErrorKind::Internal => "[chorus:internal]",
        }
    }

    /// Every kind, for tests and for parsers of the token.
    pub const ALL: [ErrorKind; 16] = [
        ErrorKind::Aborted,
        ErrorKind::PeerFailed,
        ErrorKind::PeerDeparted,
        ErrorKind::Timeout,
        ErrorKind::Revoked,
        ErrorKind::Evicted,
        ErrorKind::NoQuorum,
        ErrorKind::Mismatch,
        ErrorKind::InvalidArgument,
        ErrorKind::Config,
        ErrorKind::Bootstrap,
        ErrorKind::Transport,
        ErrorKind::Protocol,
        ErrorKind::Device,
        ErrorKind::Destroyed,
        ErrorKind::Internal,
    ];

    /// The kind whose token starts `text`, for layers that only kept the message.
    pub fn from_text(text: &str) -> Option<ErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|k| text.starts_with(k.token()))
    }
}

/// An error from chorus. Cheap to clone; fields are public for programs that keep the value
/// (ranks and epochs as plain numbers, as everywhere in the public API).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Error {
    /// What went wrong, coarsely.
    pub kind: ErrorKind,
    /// Lowercase, human-readable: what happened.
    pub detail: String,
    /// The communicator it happened on.
    pub comm: Option<CommId>,
    /// The communicator's epoch.
    pub epoch: Option<u64>,
    /// This member's rank.
    pub rank: Option<u32>,
    /// The peer involved: the one that failed, departed, or was being waited on.
    pub peer: Option<u32>,
    /// The collective that failed.
    pub collective: Option<Collective>,
    /// The failed operation's sequence number on the communicator (`op<seq>`).
    pub op: Option<u64>,
    /// The step of the operation's algorithm it failed at.
    pub step: Option<u32>,
    /// How the failure was established.
    pub evidence: Option<Evidence>,
    /// The operation's output buffer holds partial data (principle 5).
    pub partial_output: bool,
    /// From the flight recorder: which rank this member's in-flight operations wait on.
    pub waiting_on: Option<u32>,
}

impl Error {
    /// An error of `kind` with `detail` and no structured fields yet.
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Error {
            kind,
            detail: detail.into(),
            comm: None,
            epoch: None,
            rank: None,
            peer: None,
            collective: None,
            op: None,
            step: None,
            evidence: None,
            partial_output: false,
            waiting_on: None,
        }
    }

    /// What went wrong, coarsely.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Sets where: communicator, epoch and this member's rank.
    pub(crate) fn at(mut self, comm: CommId, epoch: Epoch, rank: Rank) -> Self {
        self.comm = Some(comm);
        self.epoch = Some(epoch.get());
        self.rank = Some(rank.get());
        self
    }

    /// Names the peer involved.
    pub(crate) fn with_peer(mut self, peer: Rank) -> Self {
        self.peer = Some(peer.get());
        self
    }

    /// Says how the failure was established.
    pub(crate) fn with_evidence(mut self, evidence: Evidence) -> Self {
        self.evidence = Some(evidence);
        self
    }

    /// True when retrying on a shrunk communicator can succeed: a peer is gone, but this
    /// member is not.
    pub fn is_recoverable_by_shrink(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::PeerFailed
                | ErrorKind::PeerDeparted
                | ErrorKind::Revoked
                | ErrorKind::Timeout
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.token())?;
        if let Some(c) = self.collective {
            write!(f, " {c}")?;
            if let Some(op) = self.op {
                write!(f, " {}", OpSeq(op))?;
            }
            if let Some(step) = self.step {
                write!(f, " step {step}")?;
            }
        }
        if let Some(rank) = self.rank {
            write!(f, " on {}", Rank(rank))?;
            if let Some(epoch) = self.epoch {
                write!(f, "@{}", Epoch(epoch))?;
            }
        }
        write!(f, ": {}", self.detail)?;
        if let Some(peer) = self.peer {
            write!(f, " (peer {}", Rank(peer))?;
            if let Some(evidence) = &self.evidence {
                write!(f, ", {}", EvidenceText(evidence))?;
            }
            f.write_str(")")?;
        }
        if let Some(w) = self.waiting_on.filter(|w| Some(*w) != self.peer) {
            write!(f, "; was waiting on {}", Rank(w))?;
        }
        if self.partial_output {
            f.write_str("; output buffer holds partial data")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Evidence in words, as it appears in error messages.
pub struct EvidenceText<'a>(pub &'a Evidence);

impl fmt::Display for EvidenceText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self.0 {
            Evidence::Departed { code } => write!(f, "departed: {code}"),
            Evidence::ConnectionLost { code } => write!(f, "connection lost: {code}"),
            Evidence::MissedDeadline {
                silent_ms,
                deadline_ms,
            } => {
                write!(f, "silent for {silent_ms} ms, deadline {deadline_ms} ms")
            }
            Evidence::ProcessExited { status } => {
                write!(f, "process exited ({})", ExitStatus(status))
            }
            Evidence::LauncherWitness { status } => {
                write!(f, "launcher saw the process exit ({})", ExitStatus(status))
            }
        }
    }
}

/// The error kind a departure code maps to when it ends an operation.
pub fn kind_of_close(code: CloseCode) -> ErrorKind {
    match code {
        CloseCode::REVOKED => ErrorKind::Revoked,
        CloseCode::EVICTED => ErrorKind::Evicted,
        CloseCode::DEADLINE => ErrorKind::Timeout,
        CloseCode::PROTOCOL_VIOLATION
        | CloseCode::VERSION_MISMATCH
        | CloseCode::AUTH_FAILED
        | CloseCode::STALE_EPOCH
        | CloseCode::UNKNOWN_COMM => ErrorKind::Protocol,
        c if c.is_departure() => ErrorKind::PeerDeparted,
        _ => ErrorKind::PeerFailed,
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The public error for an engine operation's failure: the kind from its root cause (an
/// abort reason, a link failure, bad arguments), and every structured field the engine kept.
pub(crate) fn from_op(e: &chorus_engine::OpError) -> Error {
    use chorus_engine::OpErrorKind;
    use chorus_engine::link::LinkError;

    let root = e.root_cause();
    let mut out = match &root.kind {
        OpErrorKind::Aborted(reason) => from_abort(reason),
        OpErrorKind::Link(link) => {
            let (kind, evidence) = match link {
                LinkError::Cancelled(reason) => (kind_of_cancel(reason.code), None),
                LinkError::PeerDeparted { code, .. } => (
                    kind_of_close(*code),
                    Some(Evidence::Departed { code: *code }),
                ),
                LinkError::ConnectionLost { .. } => (
                    ErrorKind::PeerFailed,
                    Some(Evidence::ConnectionLost {
                        code: CloseCode::INTERNAL,
                    }),
                ),
                LinkError::TagMismatch { .. } => (ErrorKind::Mismatch, None),
                LinkError::Protocol { .. } | LinkError::Overflow { .. } => {
                    (ErrorKind::Protocol, None)
                }
            };
            let mut err = Error::new(kind, link.to_string());
            err.evidence = evidence;
            err
        }
        OpErrorKind::Device(d) => Error::new(ErrorKind::Device, d.to_string()),
        OpErrorKind::SizeMismatch { .. } => Error::new(ErrorKind::Mismatch, root.kind.to_string()),
        OpErrorKind::InvalidArgument(detail) => {
            Error::new(ErrorKind::InvalidArgument, detail.clone())
        }
        // `root_cause` never returns a poisoned error; keep the text if it ever did.
        OpErrorKind::Poisoned(_) => Error::new(ErrorKind::Aborted, root.kind.to_string()),
    };
    if !std::ptr::eq(root, e) {
        out.detail = format!(
            "communicator unusable after an earlier failure ({}): {}",
            root.op, out.detail
        );
    }
    out.collective = Some(root.collective);
    out.op = Some(root.op.get());
    out.step = root.step;
    out.peer = out.peer.or(root.peer.map(Rank::get));
    out.waiting_on = root.peer.map(Rank::get);
    out.partial_output = e.partial_output || root.partial_output;
    out
}

/// The public error for an abort reason: its kind, the peer and the evidence it names.
pub(crate) fn from_abort(reason: &chorus_engine::context::AbortReason) -> Error {
    use chorus_engine::context::AbortReason;

    let (kind, peer, evidence) = match reason {
        AbortReason::Requested { .. } => (ErrorKind::Aborted, None, None),
        AbortReason::PeerFailed { rank, evidence } => {
            (ErrorKind::PeerFailed, Some(*rank), Some(*evidence))
        }
        AbortReason::PeerDeparted { rank, code } => (
            kind_of_close(*code),
            Some(*rank),
            Some(Evidence::Departed { code: *code }),
        ),
        AbortReason::Timeout { .. } => (ErrorKind::Timeout, None, None),
        AbortReason::Revoked { .. } => (ErrorKind::Revoked, None, None),
        AbortReason::Evicted => (ErrorKind::Evicted, None, None),
        AbortReason::Shutdown => (ErrorKind::Destroyed, None, None),
        AbortReason::OpFailed { .. } => (ErrorKind::Aborted, None, None),
    };
    let mut err = Error::new(kind, reason.to_string());
    err.peer = peer.map(Rank::get);
    err.evidence = evidence;
    err
}

/// The kind of error a locally cancelled link reports: the cancel's own code says why.
fn kind_of_cancel(code: CloseCode) -> ErrorKind {
    match code {
        CloseCode::DEADLINE => ErrorKind::Timeout,
        CloseCode::REVOKED => ErrorKind::Revoked,
        CloseCode::EVICTED => ErrorKind::Evicted,
        c if c.is_graceful() => ErrorKind::Destroyed,
        _ => ErrorKind::Aborted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_starts_with_its_token() {
        for kind in ErrorKind::ALL {
            let e = Error::new(kind, "something happened");
            let text = e.to_string();
            assert!(text.starts_with(kind.token()), "{text}");
            assert_eq!(ErrorKind::from_text(&text), Some(kind));
        }
        let tokens: std::collections::HashSet<_> =
            ErrorKind::ALL.iter().map(|k| k.token()).collect();
        assert_eq!(tokens.len(), ErrorKind::ALL.len(), "tokens are distinct");
    }

    #[test]
    fn peer_failure_names_everything() {
        let mut e = Error::new(ErrorKind::PeerFailed, "peer failed during the operation")
            .at(CommId(1), Epoch(2), Rank(0))
            .with_peer(Rank(2))
            .with_evidence(Evidence::ProcessExited { status: -9 });
        e.collective = Some(Collective::AllReduce);
        e.op = Some(7);
        e.step = Some(3);
        e.partial_output = true;
        e.waiting_on = Some(2);
        assert_eq!(
            e.to_string(),
            "[chorus:peer-failed] all-reduce op7 step 3 on r0@e2: peer failed during the \
             operation (peer r2, process exited (signal 9)); output buffer holds partial data"
        );
        assert!(e.is_recoverable_by_shrink());
    }

    #[test]
    fn an_exit_seen_without_its_status_displays_without_panicking() {
        let e = Error::new(ErrorKind::PeerFailed, "peer failed")
            .with_peer(Rank(2))
            .with_evidence(Evidence::ProcessExited { status: i32::MIN });
        assert!(
            e.to_string()
                .ends_with("(peer r2, process exited (status unknown))"),
            "{e}"
        );
    }

    #[test]
    fn a_minority_cannot_recover_by_shrinking() {
        let e = Error::new(
            ErrorKind::NoQuorum,
            "3 of 4 members silent, majority needs 3",
        );
        assert!(e.to_string().starts_with("[chorus:no-quorum]"), "{e}");
        assert!(!e.is_recoverable_by_shrink());
    }

    #[test]
    fn close_codes_map_to_kinds() {
        assert_eq!(kind_of_close(CloseCode::NORMAL), ErrorKind::PeerDeparted);
        assert_eq!(kind_of_close(CloseCode::ABORTED), ErrorKind::PeerDeparted);
        assert_eq!(kind_of_close(CloseCode::REVOKED), ErrorKind::Revoked);
        assert_eq!(kind_of_close(CloseCode::AUTH_FAILED), ErrorKind::Protocol);
        assert_eq!(kind_of_close(CloseCode(0x7777)), ErrorKind::PeerFailed);
    }
}
