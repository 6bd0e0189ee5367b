//! A departure in progress (sans-IO): when a member that is leaving may stop waiting for
//! the control streams still being opened, so that its departure reaches them.

use std::collections::HashSet;

use chorus_control::Instant;
use chorus_protocol::{CloseCode, Epoch, Rank};

/// A departure in progress (see `Request::Depart`).
pub(super) struct Departure {
    pub(super) code: CloseCode,
    pub(super) detail: String,
    /// When to stop waiting for streams still being opened.
    pub(super) until: Instant,
    /// Peers known absent when the departure began: nobody waits to tell them.
    pub(super) absent: HashSet<(Epoch, Rank)>,
    /// The departure went out on at least one stream: the members that got it spread it
    /// (a notice), so streams still being opened are not waited for any more.
    pub(super) delivered: bool,
}

impl Departure {
    /// True once nothing is left to wait for at `now`: the departure was delivered, or no
    /// stream to a present member of `epoch` (only this epoch's members need it; older
    /// epochs' streams are moot) is still `connecting`, or the time is up.
    pub(super) fn settled<'a>(
        &self,
        now: Instant,
        epoch: Epoch,
        mut connecting: impl Iterator<Item = &'a (Epoch, Rank)>,
    ) -> bool {
        let waiting =
            !self.delivered && connecting.any(|k| k.0 == epoch && !self.absent.contains(k));
        !waiting || now >= self.until
    }
}
