//! Turning the control plane's events into aborts (sans-IO): which operation contexts a
//! failure, a departure or a revoke ends, and the error each is reported as (principle 4).
//! The lineage's policy decides; its task carries the decisions out on the epochs' hooks.

use chorus_engine::context::AbortReason;
use chorus_protocol::message::{Evidence, PeerState, PeerStatus, RevokeCause};
use chorus_protocol::{CloseCode, Epoch, Rank};

use crate::error::{Error, ErrorKind, kind_of_close};

/// Which attached epochs an abort ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// Every operation of this epoch.
    Epoch(Epoch),
    /// Only this epoch's data links still being built (a graceful leave makes a build
    /// impossible, not the running operations).
    Building(Epoch),
    /// Every epoch of the lineage.
    All,
}

/// The abort reason and error for `rank` declared dead on `evidence`.
pub(super) fn failure(rank: Rank, evidence: Evidence) -> (AbortReason, Error) {
    let reason = AbortReason::PeerFailed { rank, evidence };
    let error = Error::new(ErrorKind::PeerFailed, reason.to_string())
        .with_peer(rank)
        .with_evidence(evidence);
    (reason, error)
}

/// The abort reason and error for `rank`'s departure with `code`.
pub(super) fn departure(rank: Rank, code: CloseCode) -> (AbortReason, Error) {
    let reason = AbortReason::PeerDeparted { rank, code };
    let error = Error::new(kind_of_close(code), reason.to_string())
        .with_peer(rank)
        .with_evidence(Evidence::Departed { code });
    (reason, error)
}

/// The abort reason and error for a revoke by `origin`. A revoke that answers a departure
/// or failure under running operations (see `Policy::data_departed`) names it: that is
/// what happened. The origin says so in `cause`; failing that (an origin that revoked on
/// the application's word), this member may know of a graceful departure itself
/// (`departed_here`: the lowest such rank, from the control plane or its own links).
pub(super) fn revoke(
    origin: Rank,
    cause: Option<RevokeCause>,
    departed_here: impl FnOnce() -> Option<Rank>,
) -> (AbortReason, Error) {
    match cause {
        Some(RevokeCause {
            subject,
            evidence: Evidence::Departed { code },
        }) => departure(subject, code),
        Some(RevokeCause { subject, evidence }) => failure(subject, evidence),
        None => match departed_here() {
            Some(rank) => departure(rank, CloseCode::NORMAL),
            None => {
                let reason = AbortReason::Revoked {
                    origin: Some(origin),
                };
                let error = Error::new(ErrorKind::Revoked, reason.to_string());
                (reason, error)
            }
        },
    }
}

/// Why an epoch whose members are `peers` cannot run operations (a member declared dead,
/// or one that left with a failure code; with `any_leave`, also one that left gracefully),
/// if so.
pub(super) fn absence(peers: Vec<PeerStatus>, any_leave: bool) -> Option<AbortReason> {
    peers.into_iter().find_map(|p| match (p.state, p.evidence) {
        (PeerState::Dead, Some(evidence)) => Some(AbortReason::PeerFailed {
            rank: p.rank,
            evidence,
        }),
        (PeerState::Departed, Some(Evidence::Departed { code }))
            if any_leave || !matches!(code, CloseCode::NORMAL | CloseCode::LEFT) =>
        {
            Some(AbortReason::PeerDeparted { rank: p.rank, code })
        }
        _ => None,
    })
}
