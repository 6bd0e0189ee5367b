//! A communicator lineage (a communicator and the ones shrunk or grown from it), as the
//! control thread runs it: one [`LineageTask`] per lineage owns the control plane's
//! `Node` and everything around it, and the application reads [`Shared`] and talks to the
//! task through a [`Handle`] (the messages are in [`crate::runtime::mailbox`]).
//!
//! One job per file:
//! - [`task`]: the task — its loop, and carrying out what the policy decides ([`action`]);
//! - [`policy`]: every decision, sans-IO (fed `now` from the runtime's `Clock`), in the
//!   manner of `chorus_control::Node`, with its parts: [`waiters`] (shrink and grow
//!   bookkeeping), [`joiners`] (admission), [`departure`] (leaving), [`aborts`] (events
//!   turned into aborts);
//! - [`channels`]: the control-stream pool and its bounded close-after-flush;
//! - [`exits`]: same-host process exits (pidfd).

mod aborts;
mod action;
mod channels;
mod departure;
mod exits;
mod joiners;
mod policy;
mod task;
#[cfg(test)]
mod tests;
mod waiters;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use chorus_protocol::Epoch;
use chorus_protocol::message::PeerStatus;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::runtime::mailbox::{LineageMsg, Request};
pub(crate) use task::LineageTask;

/// What the application reads without asking the task.
#[derive(Default)]
pub(crate) struct Shared {
    health: Mutex<Vec<PeerStatus>>,
    /// The first failure recorded (one-way: set once, never cleared).
    async_error: OnceLock<Error>,
    /// The newest epoch a communicator of this lineage was built for.
    newest: AtomicU64,
}

impl Shared {
    pub(crate) fn health(&self) -> Vec<PeerStatus> {
        self.health.lock().clone()
    }

    fn set_health(&self, health: Vec<PeerStatus>) {
        *self.health.lock() = health;
    }

    pub(crate) fn async_error(&self) -> Option<Error> {
        self.async_error.get().cloned()
    }

    pub(crate) fn record_error(&self, error: Error) {
        let _ = self.async_error.set(error);
    }

    /// The newest epoch a communicator of this lineage was built for.
    pub(crate) fn newest_epoch(&self) -> Epoch {
        Epoch(self.newest.load(Ordering::Acquire))
    }

    /// Records that a communicator for `epoch` exists (epochs only grow).
    pub(crate) fn built(&self, epoch: Epoch) {
        self.newest.fetch_max(epoch.get(), Ordering::AcqRel);
    }
}

/// The application's handle on a running lineage task.
pub(crate) struct Handle {
    pub(crate) tx: mpsc::UnboundedSender<LineageMsg>,
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    /// Sends a request; `false` if the task has ended.
    pub(crate) fn request(&self, request: Request) -> bool {
        self.tx.send(LineageMsg::Request(request)).is_ok()
    }
}
