//! The registry: which communicators and epochs this process serves, what rank it holds in
//! each, where their control traffic goes, and the inbound data links that arrived before
//! the local side asked for them.
//!
//! Listeners consult it to admit or refuse every incoming connection (an unknown
//! communicator or epoch is refused with `unknown-comm`, so a stranger or a stale peer is
//! turned away before it costs anything), and route what they admit to the right place.
//!
//! At most one data link per `(comm, epoch, peer)` (SPEC 19): while one is parked or held
//! and has not failed, another claiming the same peer (a replayed `Hello` on TCP, which is
//! not bound to its connection, or a confused peer) is closed with `duplicate-rank`, and
//! the live link keeps working. So is a link claiming this member's own rank, or a rank
//! above it (this member dials those itself).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::{CancelReason, Link};
use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::sync::{mpsc, oneshot};

use super::mailbox::{DataLink, LineageMsg};

/// How many inbound data links may wait unclaimed at once: a peer cannot make this process
/// hold more than this many connections for epochs it has not set up yet.
const MAX_PARKED: usize = 4096;

/// How many past epochs' removed ranks a communicator remembers, to refuse their
/// handshakes with `evicted` rather than `stale-epoch` (the control plane's commit history
/// is as long).
const FENCED_EPOCHS: usize = 8;

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
    /// Inbound links handed out, while their holder keeps them: the slot is taken.
    held: HashMap<(CommId, Epoch, Rank), Weak<dyn Link<Bytes>>>,
}

struct CommEntry {
    /// This member's rank at each epoch it serves.
    ranks: BTreeMap<Epoch, Rank>,
    /// The ranks of each past epoch that the epoch after it removed (the newest few).
    fenced: BTreeMap<Epoch, Vec<Rank>>,
    /// The control driver of the lineage this communicator belongs to.
    lineage: mpsc::UnboundedSender<LineageMsg>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
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
            fenced: BTreeMap::new(),
            lineage: lineage.clone(),
        });
        entry.ranks.insert(epoch, rank);
        entry.lineage = lineage;
    }

    /// The epoch after `epoch` removed `removed` (ranks of `epoch`): a handshake of theirs
    /// at `epoch` is refused with `evicted` from now on (SPEC 14), whether or not this
    /// member still serves `epoch`.
    pub(crate) fn fence(&self, comm: CommId, epoch: Epoch, removed: &[Rank]) {
        let mut inner = self.lock();
        let Some(entry) = inner.comms.get_mut(&comm) else {
            return;
        };
        if removed.is_empty() {
            return;
        }
        entry.fenced.insert(epoch, removed.to_vec());
        while entry.fenced.len() > FENCED_EPOCHS {
            entry.fenced.pop_first();
        }
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
        inner
            .held
            .retain(|(c, e, _), _| !(*c == comm && *e == epoch));
    }

    /// The admission decision for an incoming connection from `sender` (the transport's
    /// `Admission`).
    pub(crate) fn admit(
        &self,
        comm: CommId,
        epoch: Epoch,
        sender: Rank,
        role: Role,
    ) -> Result<Rank, (CloseCode, String)> {
        let inner = self.lock();
        let Some(entry) = inner.comms.get(&comm) else {
            return Err((
                CloseCode::UNKNOWN_COMM,
                format!("{comm} is not served here"),
            ));
        };
        if matches!(role, Role::Member | Role::Data)
            && entry
                .fenced
                .get(&epoch)
                .is_some_and(|r| r.contains(&sender))
        {
            // A rank the next epoch removed: tell it, so that a member cut off while the
            // others agreed learns it is out once it reaches them (SPEC 5.3, 14).
            return Err((
                CloseCode::EVICTED,
                format!("{sender} was removed from {comm} after {epoch}"),
            ));
        }
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

    /// Why an inbound data link from `peer` for `comm` at `epoch` would be refused with
    /// `duplicate-rank` if it arrived now (see [`Registry::deliver`]), if it would be: lets
    /// the listener refuse a connection before a link reads it.
    pub(crate) fn refusal(&self, comm: CommId, epoch: Epoch, peer: Rank) -> Option<String> {
        self.lock().refusal(&(comm, epoch, peer))
    }

    /// An inbound data link arrived: hand it to whoever waits for it, or park it; refuse
    /// it with `duplicate-rank` if a live link already holds its slot, or if it claims this
    /// member's own rank.
    pub(crate) fn deliver(&self, comm: CommId, epoch: Epoch, peer: Rank, link: DataLink) {
        let mut inner = self.lock();
        let key = (comm, epoch, peer);
        if let Some(detail) = inner.refusal(&key) {
            drop(inner);
            refuse(&link, detail);
            return;
        }
        let link = match inner.waiters.remove(&key) {
            Some(waiter) => {
                let weak = Arc::downgrade(&link);
                match waiter.send(link) {
                    Ok(()) => {
                        inner.held.insert(key, weak);
                        return;
                    }
                    Err(link) => link,
                }
            }
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
        // A parked link that failed may be replaced (`taken` said it is not live).
        inner.parked.insert(key, (link, now));
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
                let weak = Arc::downgrade(&link);
                if tx.send(link).is_ok() {
                    inner.held.insert(key, weak);
                }
            }
            None => {
                inner.waiters.insert(key, tx);
            }
        }
        rx
    }
}

impl Inner {
    /// Why a link for `key` is refused with `duplicate-rank`: it claims this member's own
    /// rank, a rank this member dials, or a slot a live link holds.
    fn refusal(&mut self, key: &(CommId, Epoch, Rank)) -> Option<String> {
        let &(comm, epoch, peer) = key;
        let own = self
            .comms
            .get(&comm)
            .and_then(|e| e.ranks.get(&epoch))
            .copied();
        if own == Some(peer) {
            return Some(format!("{peer} is this member's own rank"));
        }
        // The lower rank of a pair dials the higher (`links.rs`): this member's link to a
        // rank above it is one it opened, so a link arriving from such a rank (a replayed
        // `Hello`, or one claiming a rank past the world) would be a second one. Parked, it
        // would sit unclaimed holding a connection; it is refused like any duplicate.
        if let Some(own) = own
            && peer > own
        {
            return Some(format!(
                "{peer} is above this member's {own}: this member dials it"
            ));
        }
        if self.taken(key) {
            tracing::warn!(%comm, %epoch, %peer, "a second data link for a live one; refusing it");
            return Some(format!("{peer} already has a live data link at {epoch}"));
        }
        None
    }

    /// Whether a live link holds `key`'s slot: parked, or handed out and still held, and
    /// not failed.
    fn taken(&mut self, key: &(CommId, Epoch, Rank)) -> bool {
        if let Some((parked, _)) = self.parked.get(key) {
            return parked.failure().is_none();
        }
        match self.held.get(key).and_then(Weak::upgrade) {
            Some(held) => held.failure().is_none(),
            None => {
                self.held.remove(key);
                false
            }
        }
    }
}

/// Closes a refused link with `duplicate-rank`: its sender learns why at once.
fn refuse(link: &DataLink, detail: String) {
    link.cancel(CancelReason::new(CloseCode::DUPLICATE_RANK, detail));
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_engine::{HeldLimit, LinkError, LocalLink, Tag};
    use chorus_protocol::{Collective, DType, OpSeq};
    use futures::FutureExt;

    const COMM: CommId = CommId(9);
    const EPOCH: Epoch = Epoch(0);
    // Inbound links come from lower ranks (the lower rank of a pair dials).
    const ME: Rank = Rank(1);
    const PEER: Rank = Rank(0);

    fn registry() -> Registry {
        let r = Registry::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        r.serve(COMM, EPOCH, ME, tx);
        r
    }

    /// A rank the next epoch removed is refused with `evicted` at the old epoch, served or
    /// retired; anyone else at a retired epoch with `stale-epoch`, as before.
    #[test]
    fn a_removed_ranks_handshake_at_its_old_epoch_is_refused_with_evicted() {
        let r = registry();
        let (tx, _rx) = mpsc::unbounded_channel();
        r.serve(COMM, Epoch(1), Rank(0), tx);
        r.fence(COMM, EPOCH, &[Rank(3)]);
        let code = |sender, epoch, role| r.admit(COMM, epoch, sender, role).map_err(|e| e.0);
        assert_eq!(code(Rank(3), EPOCH, Role::Member), Err(CloseCode::EVICTED));
        assert_eq!(code(Rank(3), EPOCH, Role::Data), Err(CloseCode::EVICTED));
        assert_eq!(code(Rank(0), EPOCH, Role::Member), Ok(ME), "still served");
        r.retire(COMM, EPOCH);
        assert_eq!(code(Rank(3), EPOCH, Role::Member), Err(CloseCode::EVICTED));
        assert_eq!(
            code(Rank(0), EPOCH, Role::Member),
            Err(CloseCode::STALE_EPOCH)
        );
        assert_eq!(code(Rank(0), Epoch(1), Role::Member), Ok(Rank(0)));
        assert_eq!(
            code(Rank(3), EPOCH, Role::Status),
            Ok(Rank(0)),
            "a status client is not a member"
        );
    }

    /// This member's end of a link from `from` (for the registry), and the sender's end.
    fn inbound(from: Rank) -> (DataLink, LocalLink<Bytes>) {
        let (ours, theirs) = LocalLink::pair(ME, from, HeldLimit::default());
        let ours = Tracked {
            inner: ours,
            cancelled: std::sync::OnceLock::new(),
        };
        (Arc::new(ours), theirs)
    }

    /// An in-process link that reports its failure once cancelled, as network links do.
    struct Tracked {
        inner: LocalLink<Bytes>,
        cancelled: std::sync::OnceLock<CancelReason>,
    }

    impl Link<Bytes> for Tracked {
        fn peer(&self) -> Rank {
            self.inner.peer()
        }
        fn send(&self, tag: Tag, payload: Bytes) -> chorus_engine::LinkFuture<'_, ()> {
            self.inner.send(tag, payload)
        }
        fn recv(&self, tag: Tag) -> chorus_engine::LinkFuture<'_, Bytes> {
            self.inner.recv(tag)
        }
        fn cancel(&self, reason: CancelReason) {
            let _ = self.cancelled.set(reason.clone());
            self.inner.cancel(reason);
        }
        fn failure(&self) -> Option<LinkError> {
            self.cancelled.get().cloned().map(LinkError::Cancelled)
        }
    }

    fn tag(step: u32) -> Tag {
        Tag {
            collective: Collective::SendRecv,
            op: OpSeq(1),
            step,
            offset: 0,
            dtype: DType::U8,
        }
    }

    // In-process links resolve at once or never: each check polls once, so none can hang.

    /// Whether `link` still carries a payload from its sender end.
    fn works(ours: &DataLink, theirs: &LocalLink<Bytes>, step: u32) -> bool {
        let data = Bytes::from(vec![step as u8; 8]);
        matches!(
            theirs.send(tag(step), data.clone()).now_or_never(),
            Some(Ok(()))
        ) && matches!(ours.recv(tag(step)).now_or_never(), Some(Ok(got)) if got == data)
    }

    /// Whether the sender end saw its link closed with `duplicate-rank`.
    fn refused(theirs: &LocalLink<Bytes>) -> bool {
        matches!(
            theirs.recv(tag(99)).now_or_never(),
            Some(Err(LinkError::PeerDeparted { code, .. })) if code == CloseCode::DUPLICATE_RANK
        )
    }

    /// The link parked or delivered for `PEER`, which must be there already.
    fn claimed(r: &Registry) -> DataLink {
        r.claim(COMM, EPOCH, PEER)
            .try_recv()
            .expect("a link is there to claim")
    }

    #[test]
    fn a_second_link_for_a_live_rank_is_refused_and_the_live_one_keeps_working() {
        let r = registry();
        let (live, live_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, live);
        // A replay while the first is parked.
        let (replay, replay_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, replay);
        assert!(refused(&replay_sender));
        let held = claimed(&r);
        assert!(
            works(&held, &live_sender, 1),
            "the first link is the one claimed"
        );
        // Another while it is held.
        let (again, again_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, again);
        assert!(refused(&again_sender));
        assert!(works(&held, &live_sender, 2), "the live link is untouched");
    }

    #[test]
    fn a_second_link_is_refused_when_the_first_went_to_a_waiter() {
        let r = registry();
        let wait = r.claim(COMM, EPOCH, PEER);
        let (live, live_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, live);
        let mut wait = wait;
        let held = wait.try_recv().expect("the waiter got the link");
        let (replay, replay_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, replay);
        assert!(refused(&replay_sender));
        assert!(works(&held, &live_sender, 1));
    }

    #[test]
    fn a_link_claiming_this_members_own_rank_is_refused() {
        let r = registry();
        let (mine, mine_sender) = inbound(ME);
        r.deliver(COMM, EPOCH, ME, mine);
        assert!(refused(&mine_sender));
    }

    #[test]
    fn a_link_claiming_a_rank_above_this_member_is_refused_not_parked() {
        let r = registry();
        for above in [Rank(2), Rank(7), Rank(u32::MAX - 1)] {
            let (link, sender) = inbound(above);
            r.deliver(COMM, EPOCH, above, link);
            assert!(refused(&sender), "{above}");
            assert!(r.lock().parked.is_empty(), "{above} was parked");
        }
        // A link from below is still taken.
        let (live, live_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, live);
        assert!(works(&claimed(&r), &live_sender, 1));
    }

    #[test]
    fn a_failed_or_released_link_frees_its_slot() {
        let r = registry();
        let (first, _first_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, first);
        let held = claimed(&r);
        held.cancel(CancelReason::new(CloseCode::ABORTED, "test"));
        let (second, second_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, second);
        let again = claimed(&r);
        assert!(
            works(&again, &second_sender, 1),
            "a failed link's peer may reconnect"
        );
        drop(again);
        let (third, third_sender) = inbound(PEER);
        r.deliver(COMM, EPOCH, PEER, third);
        let last = claimed(&r);
        assert!(
            works(&last, &third_sender, 2),
            "a dropped link frees its slot"
        );
    }
}
