//! What a lineage's task publishes for the application to read without asking it: the
//! health ledger, the heartbeat lateness, the first failure, and the newest epoch built.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use chorus_protocol::Epoch;
use chorus_protocol::message::PeerStatus;
use parking_lot::Mutex;

use crate::error::Error;
use crate::introspection::HeartbeatLateness;

/// What the application reads without asking the task.
#[derive(Default)]
pub(crate) struct Published {
    health: Mutex<Vec<PeerStatus>>,
    lateness: Mutex<HeartbeatLateness>,
    /// The first failure recorded (one-way: set once, never cleared).
    async_error: OnceLock<Error>,
    /// The newest epoch a communicator of this lineage was built for.
    newest: AtomicU64,
}

impl Published {
    pub(crate) fn health(&self) -> Vec<PeerStatus> {
        self.health.lock().clone()
    }

    pub(super) fn set_health(&self, health: Vec<PeerStatus>) {
        *self.health.lock() = health;
    }

    pub(crate) fn heartbeat_lateness(&self) -> HeartbeatLateness {
        *self.lateness.lock()
    }

    pub(super) fn set_heartbeat_lateness(&self, lateness: HeartbeatLateness) {
        *self.lateness.lock() = lateness;
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
