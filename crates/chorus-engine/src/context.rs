//! Operation contexts and the abort tree.
//!
//! A [`Context`] is a node in a tree: the runtime holds a root, each communicator's engine holds a
//! child of its parent's context (split and shrink create children), and every operation runs in a
//! child of its communicator's context. [`Context::abort`] is one-way: the first reason wins and is
//! never cleared, later calls are no-ops, it never blocks on anything but a short local lock, and
//! it reaches every descendant, including those created after the abort (they are born aborted).
//! This is principle 4 of `docs/ARCHITECTURE.md`, and the gap seed `001` fell into: there, a split
//! child had its own abort flag and aborting the parent left a rank wedged on the child.
//!
//! [`Context::aborted`] is an executor-agnostic future (a registered [`Waker`], no runtime)
//! that every wait inside an operation races.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll, Waker};

use chorus_protocol::message::{Evidence, ExitStatus};
use chorus_protocol::{CloseCode, Collective, OpSeq, Rank};
use parking_lot::{Mutex, MutexGuard};

use crate::idmap::IdMap;

/// A node of the abort tree. Cloning gives another handle to the same node.
#[derive(Clone)]
pub struct Context {
    node: Arc<Node>,
}

/// Why a context was aborted. The runtime picks the reason; the engine only carries it into
/// the errors of the operations it ends.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum AbortReason {
    /// The application asked (`comm.abort()`), with its explanation.
    Requested {
        /// The application's explanation, passed on to the errors and the departures.
        detail: Arc<str>,
    },
    /// The failure detector declared a peer dead.
    PeerFailed {
        /// The dead peer, in the communicator's numbering at the aborted epoch.
        rank: Rank,
        /// What the verdict rests on (a lost connection, an exit, a missed deadline).
        evidence: Evidence,
    },
    /// A peer left the communicator (departure frame or connection close with a code).
    PeerDeparted {
        /// The peer that left.
        rank: Rank,
        /// The code its departure carried.
        code: CloseCode,
    },
    /// A deadline owned by the runtime expired: `wait` names the wait, `after_ms` the budget.
    Timeout {
        /// The wait that expired (`all-reduce op7 step 3 on r2`, `init`, ...).
        wait: Arc<str>,
        /// The budget that passed, in milliseconds.
        after_ms: u64,
    },
    /// The communicator was revoked (by `origin`, when known); nothing more runs at its epoch.
    Revoked {
        /// The member that revoked first, when known.
        origin: Option<Rank>,
    },
    /// The other members declared this rank dead; it must not act in the new epoch.
    Evicted,
    /// The process or library is shutting down.
    Shutdown,
    /// Another operation on the same communicator failed first, so this one cannot be
    /// trusted to complete (its peers may be stuck in the failed one).
    OpFailed {
        /// The operation that failed first.
        op: OpSeq,
        /// Its collective.
        collective: Collective,
    },
}

impl AbortReason {
    /// A user-requested abort.
    pub fn requested(detail: impl Into<Arc<str>>) -> Self {
        AbortReason::Requested {
            detail: detail.into(),
        }
    }

    /// A runtime deadline for the wait named `wait`.
    pub fn timeout(wait: impl Into<Arc<str>>, after_ms: u64) -> Self {
        AbortReason::Timeout {
            wait: wait.into(),
            after_ms,
        }
    }

    /// The close code a link cancelled for this reason carries to its peer.
    pub fn close_code(&self) -> CloseCode {
        match self {
            AbortReason::Requested { .. }
            | AbortReason::PeerFailed { .. }
            | AbortReason::PeerDeparted { .. }
            | AbortReason::OpFailed { .. } => CloseCode::ABORTED,
            AbortReason::Timeout { .. } => CloseCode::DEADLINE,
            AbortReason::Revoked { .. } => CloseCode::REVOKED,
            AbortReason::Evicted => CloseCode::EVICTED,
            AbortReason::Shutdown => CloseCode::LEFT,
        }
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::Requested { detail } => write!(f, "abort requested: {detail}"),
            AbortReason::PeerFailed { rank, evidence } => {
                write!(f, "peer {rank} failed: ")?;
                match evidence {
                    Evidence::Departed { code } => write!(f, "departed ({code})"),
                    Evidence::ConnectionLost { code } => write!(f, "connection lost ({code})"),
                    Evidence::MissedDeadline {
                        silent_ms,
                        deadline_ms,
                    } => write!(f, "silent for {silent_ms} ms (deadline {deadline_ms} ms)"),
                    Evidence::ProcessExited { status } => {
                        write!(f, "process exited ({})", ExitStatus(*status))
                    }
                    Evidence::LauncherWitness { status } => {
                        write!(f, "launcher saw exit ({})", ExitStatus(*status))
                    }
                }
            }
            AbortReason::PeerDeparted { rank, code } => write!(f, "peer {rank} departed ({code})"),
            AbortReason::Timeout { wait, after_ms } => {
                write!(f, "timed out after {after_ms} ms waiting for {wait}")
            }
            AbortReason::Revoked { origin: Some(r) } => write!(f, "communicator revoked by {r}"),
            AbortReason::Revoked { origin: None } => f.write_str("communicator revoked"),
            AbortReason::Evicted => f.write_str("this rank was evicted"),
            AbortReason::Shutdown => f.write_str("shutting down"),
            AbortReason::OpFailed { op, collective } => {
                write!(f, "{collective} {op} failed on this communicator")
            }
        }
    }
}

struct Node {
    /// Fast, lock-free check; set after `reason` is.
    aborted: AtomicBool,
    /// First reason wins; never cleared.
    reason: OnceLock<AbortReason>,
    state: Mutex<NodeState>,
    /// The parent and this node's key in its child table, so dropping a node unregisters it.
    parent: Option<(Arc<Node>, u64)>,
}

#[derive(Default)]
struct NodeState {
    next_key: u64,
    children: IdMap<u64, std::sync::Weak<Node>>,
    wakers: IdMap<u64, Waker>,
}

impl Node {
    fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some((parent, key)) = &self.parent {
            parent.lock().children.remove(key);
        }
    }
}

impl Context {
    /// A new root: no parent, not aborted.
    pub fn root() -> Self {
        Context {
            node: Arc::new(Node {
                aborted: AtomicBool::new(false),
                reason: OnceLock::new(),
                state: Mutex::new(NodeState::default()),
                parent: None,
            }),
        }
    }

    /// A new child. It is aborted whenever this context is, with the same reason; if this
    /// context is already aborted, the child is born aborted.
    pub fn child(&self) -> Self {
        let mut state = self.node.lock();
        let key = state.next_key;
        state.next_key += 1;
        let node = Arc::new(Node {
            aborted: AtomicBool::new(false),
            reason: OnceLock::new(),
            state: Mutex::new(NodeState::default()),
            parent: Some((self.node.clone(), key)),
        });
        // Checked under the parent's lock: `abort` sets the reason under the same lock before
        // it snapshots the children, so a child is either in that snapshot or sees the reason.
        if let Some(reason) = self.node.reason.get() {
            let _ = node.reason.set(reason.clone());
            node.aborted.store(true, Ordering::Release);
        } else {
            state.children.insert(key, Arc::downgrade(&node));
        }
        drop(state);
        Context { node }
    }

    /// Abort this context and every descendant with `reason`, unless already aborted (the
    /// first reason wins). Returns whether this call was the one that aborted it. Safe from
    /// any thread; never waits on anything but short local locks.
    pub fn abort(&self, reason: AbortReason) -> bool {
        // Iterative over the subtree, so a deep tree cannot overflow the stack.
        let mut pending = vec![self.node.clone()];
        let mut first = true;
        let mut won = false;
        while let Some(node) = pending.pop() {
            let (wakers, children) = {
                let mut state = node.lock();
                if node.reason.set(reason.clone()).is_err() {
                    // Already aborted: its descendants were (or are being) aborted by
                    // whoever won, with the winning reason.
                    first = false;
                    continue;
                }
                node.aborted.store(true, Ordering::Release);
                let wakers: Vec<Waker> = state.wakers.drain().map(|(_, w)| w).collect();
                let children: Vec<_> = state
                    .children
                    .drain()
                    .filter_map(|(_, c)| c.upgrade())
                    .collect();
                (wakers, children)
            };
            if first {
                won = true;
                first = false;
            }
            wakers.into_iter().for_each(Waker::wake);
            pending.extend(children);
        }
        won
    }

    /// True once aborted (by itself or through an ancestor).
    pub fn is_aborted(&self) -> bool {
        self.node.aborted.load(Ordering::Acquire)
    }

    /// The reason, once aborted.
    pub fn reason(&self) -> Option<AbortReason> {
        self.node.reason.get().cloned()
    }

    /// A future that resolves with the reason once this context is aborted.
    pub fn aborted(&self) -> Aborted {
        Aborted {
            node: self.node.clone(),
            key: None,
        }
    }

    /// True if `self` is `ancestor` or lies below it.
    pub fn descends_from(&self, ancestor: &Context) -> bool {
        let mut node = &self.node;
        loop {
            if Arc::ptr_eq(node, &ancestor.node) {
                return true;
            }
            match &node.parent {
                Some((parent, _)) => node = parent,
                None => return false,
            }
        }
    }

    /// True if `self` and `other` are handles to the same node (one operation's context, say).
    pub fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.node, &other.node)
    }

    /// Number of live children (for tests and diagnostics: finished operations must not
    /// accumulate in their communicator's context).
    pub fn child_count(&self) -> usize {
        self.node.lock().children.len()
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("reason", &self.node.reason.get())
            .finish_non_exhaustive()
    }
}

/// Resolves with the abort reason of a [`Context`]; see [`Context::aborted`]. Cheap to poll
/// repeatedly: the waker is registered once and replaced only when it changes.
pub struct Aborted {
    node: Arc<Node>,
    key: Option<u64>,
}

impl Aborted {
    /// The reason, if the context is aborted now: a lock-free look that registers nothing
    /// (polling the future registers its waker).
    pub fn now(&self) -> Option<AbortReason> {
        self.node.reason.get().cloned()
    }
}

impl Future for Aborted {
    type Output = AbortReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<AbortReason> {
        if let Some(reason) = self.node.reason.get() {
            return Poll::Ready(reason.clone());
        }
        let this = &mut *self;
        let mut state = this.node.lock();
        // Re-check under the lock: `abort` sets the reason before draining the wakers under
        // this same lock, so either we see the reason or our waker is drained and woken.
        if let Some(reason) = this.node.reason.get() {
            return Poll::Ready(reason.clone());
        }
        match this.key {
            Some(key) => match state.wakers.get_mut(&key) {
                Some(w) if w.will_wake(cx.waker()) => {}
                Some(w) => w.clone_from(cx.waker()),
                None => {
                    state.wakers.insert(key, cx.waker().clone());
                }
            },
            None => {
                let key = state.next_key;
                state.next_key += 1;
                state.wakers.insert(key, cx.waker().clone());
                this.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Aborted {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.node.lock().wakers.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn exit_statuses_read_as_codes_signals_or_unknown() {
        let dead = |status| {
            AbortReason::PeerFailed {
                rank: Rank(2),
                evidence: Evidence::ProcessExited { status },
            }
            .to_string()
        };
        assert!(
            dead(3).ends_with("process exited (status 3)"),
            "{}",
            dead(3)
        );
        assert!(
            dead(-9).ends_with("process exited (signal 9)"),
            "{}",
            dead(-9)
        );
        assert!(
            dead(i32::MIN).ends_with("process exited (status unknown)"),
            "{}",
            dead(i32::MIN)
        );
    }

    #[test]
    fn first_reason_wins_and_is_never_cleared() {
        let root = Context::root();
        assert!(!root.is_aborted());
        assert!(root.abort(AbortReason::requested("first")));
        assert!(!root.abort(AbortReason::Shutdown));
        assert!(root.is_aborted());
        assert_eq!(root.reason(), Some(AbortReason::requested("first")));
    }

    #[test]
    fn abort_reaches_every_descendant_and_later_children() {
        let root = Context::root();
        let comm = root.child();
        let split = comm.child();
        let op = split.child();
        let sibling = root.child();
        comm.abort(AbortReason::Evicted);
        assert!(comm.is_aborted() && split.is_aborted() && op.is_aborted());
        assert_eq!(op.reason(), Some(AbortReason::Evicted));
        assert!(!root.is_aborted() && !sibling.is_aborted());
        let late = split.child();
        assert_eq!(late.reason(), Some(AbortReason::Evicted));
        // A child's own earlier reason is kept: the first reason wins per node.
        let a = Context::root();
        let b = a.child();
        b.abort(AbortReason::Shutdown);
        a.abort(AbortReason::Evicted);
        assert_eq!(b.reason(), Some(AbortReason::Shutdown));
    }

    #[test]
    fn dropped_children_are_unregistered() {
        let root = Context::root();
        let kids: Vec<_> = (0..100).map(|_| root.child()).collect();
        assert_eq!(root.child_count(), 100);
        drop(kids);
        assert_eq!(root.child_count(), 0);
    }

    #[test]
    fn same_is_node_identity() {
        let root = Context::root();
        let a = root.child();
        assert!(a.same(&a.clone()));
        assert!(!a.same(&root.child()));
        assert!(!a.same(&root));
    }

    #[test]
    fn descends_from() {
        let root = Context::root();
        let a = root.child();
        let b = a.child();
        assert!(b.descends_from(&root) && b.descends_from(&a) && b.descends_from(&b));
        assert!(!a.descends_from(&b));
        assert!(!b.descends_from(&Context::root()));
    }

    #[test]
    fn aborted_future_wakes_a_blocked_thread() {
        let root = Context::root();
        let op = root.child().child();
        let waiter = thread::spawn(move || futures::executor::block_on(op.aborted()));
        thread::sleep(Duration::from_millis(20));
        root.abort(AbortReason::timeout("all-reduce op3", 30_000));
        let reason = waiter.join().unwrap();
        assert_eq!(reason, AbortReason::timeout("all-reduce op3", 30_000));
    }

    #[test]
    fn concurrent_aborts_agree_on_one_reason() {
        for _ in 0..20 {
            let root = Context::root();
            let leaves: Vec<_> = (0..8).map(|_| root.child().child()).collect();
            let threads = 16;
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let ctx = if i % 2 == 0 {
                        root.clone()
                    } else {
                        leaves[i % leaves.len()].clone()
                    };
                    let barrier = barrier.clone();
                    thread::spawn(move || {
                        barrier.wait();
                        ctx.abort(AbortReason::requested(format!("thread {i}")))
                    })
                })
                .collect();
            let won: usize = handles
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum();
            assert!(won >= 1);
            let root_reason = root.reason().unwrap();
            // Every leaf holds some thread's reason; a leaf aborted directly may keep its own,
            // but a leaf whose reason came from the root holds the root's.
            for leaf in &leaves {
                assert!(matches!(leaf.reason(), Some(AbortReason::Requested { .. })));
            }
            assert!(matches!(root_reason, AbortReason::Requested { .. }));
            assert!(!root.abort(AbortReason::Shutdown));
            assert_eq!(root.reason().unwrap(), root_reason);
        }
    }
}
