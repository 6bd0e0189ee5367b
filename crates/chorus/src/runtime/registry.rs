//! The registry: which communicators and epochs this process serves, what rank it holds in
//! each, where their control traffic goes, and the inbound data links that arrived before
//! the local side asked for them.
//!
//! Listeners consult it to admit or refuse every incoming connection (an unknown
//! communicator or epoch is refused with `unknown-comm`, so a stranger or a stale peer is
//! turned away before it costs anything), and route what they admit to the right place.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::sync::{mpsc, oneshot};

use super::mailbox::{DataLink, LineageMsg};

/// How many inbound data links may wait unclaimed at once: a peer cannot make this process
/// hold more than this many connections for epochs it has not set up yet.
const MAX_PARKED: usize = 4096;

#[derive(Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    comms: HashMap<CommId, CommEntry>,
    /// Inbound links nobody asked for yet, with when they arrived.
    parked: HashMap<(CommId, Epoch, Rank), (DataLink, Instant)>,
    /// Local waits for an inbound link.
    waiters: HashMap<(CommId, Epoch, Rank), oneshot::Sender<DataLink>>,
}

struct CommEntry {
    /// This member's rank at each epoch it serves.
    ranks: BTreeMap<Epoch, Rank>,
    /// The control driver of the lineage this communicator belongs to.
    lineage: mpsc::UnboundedSender<LineageMsg>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section is a handful of map operations that cannot leave the maps
        // half-updated, so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serve `comm` at `epoch` as `rank`, its control traffic going to `lineage`.
    pub(crate) fn serve(
        &self,
        comm: CommId,
        epoch: Epoch,
        rank: Rank,
        lineage: mpsc::UnboundedSender<LineageMsg>,
    ) {
        let mut inner = self.lock();
        let entry = inner.comms.entry(comm).or_insert_with(|| CommEntry {
            ranks: BTreeMap::new(),
            lineage: lineage.clone(),
        });
        entry.ranks.insert(epoch, rank);
        entry.lineage = lineage;
    }

    /// Stop serving `comm` at `epoch` (and drop what waits for it).
    pub(crate) fn retire(&self, comm: CommId, epoch: Epoch) {
        let mut inner = self.lock();
        if let Some(entry) = inner.comms.get_mut(&comm) {
            entry.ranks.remove(&epoch);
            if entry.ranks.is_empty() {
                inner.comms.remove(&comm);
            }
        }
        inner
            .parked
            .retain(|(c, e, _), _| !(*c == comm && *e == epoch));
        inner
            .waiters
            .retain(|(c, e, _), _| !(*c == comm && *e == epoch));
    }

    /// The admission decision for an incoming connection (the transport's `Admission`).
    pub(crate) fn admit(
        &self,
        comm: CommId,
        epoch: Epoch,
        role: Role,
    ) -> Result<Rank, (CloseCode, String)> {
        let inner = self.lock();
        let Some(entry) = inner.comms.get(&comm) else {
            return Err((
                CloseCode::UNKNOWN_COMM,
                format!("{comm} is not served here"),
            ));
        };
        match role {
            Role::Member | Role::Data => entry.ranks.get(&epoch).copied().ok_or_else(|| {
                let newest = entry.ranks.keys().next_back().copied().unwrap_or_default();
                if epoch < newest {
                    (
                        CloseCode::STALE_EPOCH,
                        format!("{comm} is at {newest}, not {epoch}"),
                    )
                } else {
                    (
                        CloseCode::UNKNOWN_COMM,
                        format!("{comm} is not (yet) at {epoch}"),
                    )
                }
            }),
            Role::Status | Role::Launcher | Role::Joiner => entry
                .ranks
                .iter()
                .next_back()
                .map(|(_, r)| *r)
                .ok_or((CloseCode::UNKNOWN_COMM, format!("{comm} has no epoch"))),
            Role::Bootstrap => Err((
                CloseCode::PROTOCOL_VIOLATION,
                "this member is not a bootstrap root".into(),
            )),
        }
    }

    /// Where `comm`'s control traffic goes.
    pub(crate) fn lineage(&self, comm: CommId) -> Option<mpsc::UnboundedSender<LineageMsg>> {
        self.lock().comms.get(&comm).map(|e| e.lineage.clone())
    }

    /// An inbound data link arrived: hand it to whoever waits for it, or park it.
    pub(crate) fn deliver(&self, comm: CommId, epoch: Epoch, peer: Rank, link: DataLink) {
        let mut inner = self.lock();
        let key = (comm, epoch, peer);
        let link = match inner.waiters.remove(&key) {
            Some(waiter) => match waiter.send(link) {
                Ok(()) => return,
                Err(link) => link,
            },
            None => link,
        };
        let now = Instant::now();
        // Links parked for long were never claimed (their set-up failed); let them go.
        inner
            .parked
            .retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(600));
        if inner.parked.len() >= MAX_PARKED {
            tracing::warn!(%comm, %epoch, %peer, "too many unclaimed data links; refusing one");
            return;
        }
        if let Some((old, _)) = inner.parked.insert(key, (link, now)) {
            // A second link for the same slot: the peer reconnected; the newer one wins.
            drop(old);
        }
    }

    /// The inbound data link from `peer` for `comm` at `epoch`: at once if it is parked,
    /// otherwise when it arrives (the receiver resolves with an error if the wait is
    /// retired).
    pub(crate) fn claim(
        &self,
        comm: CommId,
        epoch: Epoch,
        peer: Rank,
    ) -> oneshot::Receiver<DataLink> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        let key = (comm, epoch, peer);
        match inner.parked.remove(&key) {
            Some((link, _)) => {
                let _ = tx.send(link);
            }
            None => {
                inner.waiters.insert(key, tx);
            }
        }
        rx
    }
}
