//! Shrink and grow requests waiting for the agreement that answers them (sans-IO: the
//! lineage's policy owns them and hands in `now`).

use chorus_control::Instant;
use chorus_protocol::Epoch;
use tokio::sync::oneshot;

use crate::error::Error;
use crate::runtime::mailbox::NextEpoch;

/// Where a waiter's answer goes.
pub(super) type Reply = oneshot::Sender<Result<NextEpoch, Error>>;

/// A request waiting for an agreement.
pub(super) struct Waiter {
    /// Answered by an agreement that leaves this epoch or a later one.
    pub(super) after: Epoch,
    /// A grow: only an agreement that admits joiners answers it.
    pub(super) grow: bool,
    pub(super) deadline: Instant,
    pub(super) reply: Reply,
}

impl Waiter {
    /// The agreement `next` answers this request.
    fn answered_by(&self, next: &NextEpoch) -> bool {
        next.agreed.previous >= self.after && (!self.grow || !next.agreed.joiners.is_empty())
    }

    /// "shrink" or "grow", for errors.
    pub(super) fn what(&self) -> &'static str {
        if self.grow { "grow" } else { "shrink" }
    }
}

/// The waiting requests, in arrival order.
#[derive(Default)]
pub(super) struct Waiters(Vec<Waiter>);

impl Waiters {
    pub(super) fn push(&mut self, waiter: Waiter) {
        self.0.push(waiter);
    }

    /// Takes the waiters `next` answers, leaving the others waiting.
    pub(super) fn answered(&mut self, next: &NextEpoch) -> Vec<Waiter> {
        self.take_where(|w| w.answered_by(next))
    }

    /// Takes the waiters whose deadline is past at `now`.
    pub(super) fn expired(&mut self, now: Instant) -> Vec<Waiter> {
        self.take_where(|w| now >= w.deadline)
    }

    /// Takes every waiter.
    pub(super) fn all(&mut self) -> Vec<Waiter> {
        std::mem::take(&mut self.0)
    }

    fn take_where(&mut self, pred: impl Fn(&Waiter) -> bool) -> Vec<Waiter> {
        let (taken, kept) = std::mem::take(&mut self.0).into_iter().partition(pred);
        self.0 = kept;
        taken
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}
