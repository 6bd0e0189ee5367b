//! A node launcher's line to a bootstrap root that runs on another node (`chorus run
//! --nnodes N --node-rank I`, I > 0): it asks the root for the peer table at a steady pace,
//! which both proves the root still answers and, once every rank has joined, gives the
//! table that lets this launcher tell the job when one of *its own* ranks exits.
//!
//! The launcher is the witness for its node's ranks only: it sends `LauncherWitness`
//! notices to a rank's neighbours exactly as [`super::root::RootHost::witness_exit`] does,
//! and, for a rank that exits before the root has its table (it died before joining), to
//! the root, which then fails the bootstrap at once; nothing else. What to do when the root
//! goes quiet is the launcher's decision; this only reports when it last answered and why
//! the last ask failed.

use std::collections::VecDeque;
use std::thread;
use std::time::{Duration, Instant};

use chorus_protocol::message::PeerInfo;
use chorus_protocol::{CloseCode, Rank};
use chorus_transport::{Fingerprint, QuicEndpoint};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, ErrorKind};
use crate::status::{ask, client_endpoint};
use crate::unique_id::UniqueId;

/// How long one ask of the root may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long dropping a link waits for its thread.
const TEARDOWN: Duration = Duration::from_secs(3);

/// What the link learned so far.
#[derive(Debug, Default)]
struct Seen {
    /// When the root last answered.
    contact: Option<Instant>,
    /// Why the last ask failed (cleared by the next answer).
    error: Option<String>,
    /// The first epoch's peer table, once the root has one.
    members: Option<Vec<PeerInfo>>,
}

/// A running link to a remote root. Dropping it stops its thread (bounded).
pub struct RootLink {
    id: UniqueId,
    seen: Arc<Mutex<Seen>>,
    exits: mpsc::UnboundedSender<(Rank, i32)>,
    stop: Option<oneshot::Sender<()>>,
    exited: Option<std::sync::mpsc::Receiver<()>>,
}

impl std::fmt::Debug for RootLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootLink").field("id", &self.id).finish()
    }
}

impl RootLink {
    /// Starts asking the root `id` names, every `every`, on a thread of its own. It does not
    /// wait for an answer: see [`RootLink::last_contact`].
    pub fn start(id: UniqueId, every: Duration) -> Result<RootLink, Error> {
        let endpoint = client_endpoint(&id, ASK_TIMEOUT)?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (exits, exits_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = oneshot::channel();
        let (exited_tx, exited) = std::sync::mpsc::channel();
        let (task_id, task_seen) = (id.clone(), seen.clone());
        thread::Builder::new()
            .name("chorus-root-link".into())
            .spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(serve(
                        endpoint, task_id, every, task_seen, exits_rx, stop_rx,
                    ));
                }
                let _ = exited_tx.send(());
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::Internal,
                    format!("cannot start a root link: {e}"),
                )
            })?;
        Ok(RootLink {
            id,
            seen,
            exits,
            stop: Some(stop),
            exited: Some(exited),
        })
    }

    /// The token this link follows.
    pub fn unique_id(&self) -> &UniqueId {
        &self.id
    }

    /// When the root last answered ([`None`]: never yet).
    pub fn last_contact(&self) -> Option<Instant> {
        self.seen.lock().contact
    }

    /// Why the most recent ask failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.seen.lock().error.clone()
    }

    /// Whether the root has its peer table (every rank joined).
    pub fn bootstrapped(&self) -> bool {
        self.seen.lock().members.is_some()
    }

    /// Tells the job that `rank`'s process (one of this node's) exited with `status`
    /// (negative: killed by that signal): at once to the root while the peer table is not
    /// known yet, and once it is, to up to three of the rank's neighbours; best effort and
    /// bounded; it returns at once.
    pub fn witness_exit(&self, rank: u32, status: i32) {
        let _ = self.exits.send((Rank(rank), status));
    }
}

impl Drop for RootLink {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(exited) = self.exited.take()
            && exited.recv_timeout(TEARDOWN).is_err()
        {
            tracing::warn!("root link did not stop within {TEARDOWN:?}");
        }
    }
}

/// Asks the root every `every`; delivers witnessed exits once the table is known.
async fn serve(
    endpoint: QuicEndpoint,
    id: UniqueId,
    every: Duration,
    seen: Arc<Mutex<Seen>>,
    mut exits: mpsc::UnboundedReceiver<(Rank, i32)>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut pending: VecDeque<(Rank, i32)> = VecDeque::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(exit) = exits.recv() => {
                if seen.lock().members.is_none() {
                    // Before every rank joined only the root can act on it: it refuses
                    // every joiner at once instead of waiting out its deadline.
                    tokio::spawn(super::root::tell_root(
                        endpoint.clone(),
                        id.comm,
                        id.root,
                        Fingerprint(id.fingerprint),
                        exit.0,
                        exit.1,
                    ));
                }
                pending.push_back(exit);
            }
            _ = tick.tick() => {
                let deadline = Instant::now() + ASK_TIMEOUT;
                // A stop does not wait for an ask to a master that went silent.
                let answer = tokio::select! {
                    _ = &mut stop => break,
                    a = ask(&endpoint, id.comm, id.root, id.fingerprint, Rank::NONE, deadline) => a,
                };
                let mut seen = seen.lock();
                match answer {
                    Ok(reply) => {
                        seen.contact = Some(Instant::now());
                        seen.error = None;
                        if seen.members.is_none() && !reply.members.is_empty() {
                            seen.members = Some(reply.members);
                        }
                    }
                    Err(why) => seen.error = Some(why),
                }
            }
        }
        let table = seen.lock().members.clone();
        if let Some(table) = table {
            while let Some((rank, status)) = pending.pop_front() {
                tokio::spawn(super::root::witness(
                    endpoint.clone(),
                    id.comm,
                    table.clone(),
                    rank,
                    status,
                ));
            }
        }
    }
    endpoint.close(CloseCode::NORMAL, "root link stopped");
}
