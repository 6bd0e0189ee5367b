//! Starting a lineage's task, and the application's handle on it.

use std::sync::Arc;

use chorus_protocol::message::Welcome;
use chorus_protocol::{CloseCode, Rank};
use tokio::sync::{mpsc, oneshot};

use super::published::Published;
use super::task::LineageTask;
use crate::error::Error;
use crate::runtime::Session;
use crate::runtime::mailbox::{LineageMsg, Request};

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
