//! A communicator lineage (a communicator and the ones shrunk or grown from it), as the
//! control thread runs it: one [`LineageTask`] per lineage owns the control plane's
//! `Node` and everything around it, and the application reads [`Published`] and talks to the
//! task through a [`LineageHandle`] (the messages are in [`crate::runtime::mailbox`]).
//!
//! One job per file:
//! - [`task`]: the task — its loop, and carrying out what the policy decides ([`action`]);
//! - [`policy`]: every decision, sans-IO (fed `now` from the runtime's `Clock`), in the
//!   manner of `chorus_control::Node`, with its parts: [`waiters`] (shrink and grow
//!   bookkeeping), [`joiners`] (joiner admission), [`departure`] (leaving), [`aborts`] (events
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

use chorus_protocol::message::{PeerStatus, Welcome};
use chorus_protocol::{CloseCode, Epoch, Rank};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::runtime::Session;
use crate::runtime::mailbox::{LineageMsg, Request};
use task::LineageTask;

/// What the application reads without asking the task.
#[derive(Default)]
pub(crate) struct Published {
    health: Mutex<Vec<PeerStatus>>,
    /// The first failure recorded (one-way: set once, never cleared).
    async_error: OnceLock<Error>,
    /// The newest epoch a communicator of this lineage was built for.
    newest: AtomicU64,
}

impl Published {
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

/// The application's handle on a running lineage task; the task departs when the last
/// communicator holding it goes.
pub(crate) struct LineageHandle {
    tx: mpsc::UnboundedSender<LineageMsg>,
    published: Arc<Published>,
}

impl LineageHandle {
    /// What the application reads of the lineage.
    pub(crate) fn published(&self) -> &Published {
        &self.published
    }

    /// Sends a request; `false` if the task has ended.
    pub(crate) fn request(&self, request: Request) -> bool {
        self.tell(LineageMsg::Request(request))
    }

    /// Tells the lineage what an operation saw on a data link (evidence for the control
    /// plane); `false` if the task has ended.
    pub(crate) fn tell(&self, msg: LineageMsg) -> bool {
        self.tx.send(msg).is_ok()
    }
}

impl Drop for LineageHandle {
    fn drop(&mut self) {
        let (reply, _) = oneshot::channel();
        let _ = self.request(Request::Depart {
            code: CloseCode::NORMAL,
            detail: "communicator dropped".into(),
            reply,
        });
    }
}

/// Starts the lineage task of `welcome`'s communicator as `rank` on the session's control
/// thread, reading `inbox` (which may already hold messages that arrived while bootstrap
/// finished; `tx` is its sender).
pub(crate) fn start(
    session: &Arc<Session>,
    welcome: &Welcome,
    rank: Rank,
    tx: mpsc::UnboundedSender<LineageMsg>,
    inbox: mpsc::UnboundedReceiver<LineageMsg>,
) -> Result<LineageHandle, Error> {
    let published = Arc::new(Published::default());
    let task = LineageTask::new(
        session.clone(),
        welcome,
        rank,
        inbox,
        tx.clone(),
        published.clone(),
    )?;
    session.handle.spawn(task.run());
    Ok(LineageHandle { tx, published })
}
