//! The backend-independent half of every link: tag matching with held early arrivals, the
//! one-way terminal state (cancel, departure, loss), and the send window.
//!
//! Readers (an io_uring ring, a tokio task, a QUIC stream task) call [`Matcher::deliver`]
//! and [`Matcher::fail`]; the `Link` methods call [`Matcher::recv`] and
//! [`Matcher::acquire`]. Nothing here blocks a thread, and every wait ends when the link
//! fails, so `cancel` reaches every pending operation at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use chorus_engine::link::{LinkError, Tag};
use chorus_protocol::Rank;
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::{Semaphore, oneshot};

type Key = (u64, u32);

/// The maps keyed by a peer's tags: a fast hash (SipHash cost ~100 instructions on every
/// receive of a latency-bound path), seeded at random per process, so a peer cannot pick
/// tags that collide.
type TagMap<V> = foldhash::HashMap<Key, V>;

fn key(tag: &Tag) -> Key {
    (tag.op.get(), tag.step)
}

/// What one held early arrival costs beyond its payload (its map entry, tag and `Bytes`
/// handle), counted against the link's bound so a peer sending empty payloads under fresh
/// tags cannot grow the held map without limit.
pub(crate) const HELD_ENTRY_COST: u64 = 64;

/// The bytes an early arrival of `len` payload bytes counts against the bound.
fn held_cost(len: usize) -> u64 {
    len as u64 + HELD_ENTRY_COST
}

/// Shared state of one link.
#[derive(Debug)]
pub(crate) struct Matcher {
    peer: Rank,
    held_limit: u64,
    window: Semaphore,
    window_bytes: u32,
    /// Sends waiting in the window's queue.
    queued: AtomicUsize,
    /// Set once, with `State::terminal`, and never cleared: a look at the link's failure
    /// that takes no lock (see [`Matcher::has_failed`]).
    failed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set once; the first failure wins (principle 4: one-way).
    terminal: Option<LinkError>,
    /// Early arrivals by `(op, step)`; more than one under a key only from a peer that
    /// repeats a tag, so the first is held inline (no allocation per early arrival).
    held: TagMap<SmallVec<[(Tag, Bytes); 1]>>,
    held_bytes: u64,
    /// Registered receives by `(op, step)`, oldest first; one per key but for dropped
    /// receives whose tag is asked for again, so the first is held inline.
    waiters: TagMap<SmallVec<[Waiter; 1]>>,
}

impl State {
    fn take(&mut self, tag: &Tag) -> Option<Result<Bytes, LinkError>> {
        if let Some(LinkError::Cancelled(r)) = &self.terminal {
            return Some(Err(LinkError::Cancelled(r.clone())));
        }
        let k = key(tag);
        if let Some(q) = self.held.get_mut(&k)
            && !q.is_empty()
        {
            let (got, payload) = q.remove(0);
            if q.is_empty() {
                self.held.remove(&k);
            }
            self.held_bytes -= held_cost(payload.len());
            return Some(if got == *tag {
                Ok(payload)
            } else {
                Err(LinkError::TagMismatch {
                    expected: *tag,
                    got,
                })
            });
        }
        self.terminal.clone().map(Err)
    }
}

/// A registered receive (see [`Matcher::register`]).
pub(crate) struct Waiting<'m> {
    matcher: &'m Matcher,
    rx: oneshot::Receiver<Result<Bytes, LinkError>>,
}

impl Waiting<'_> {
    /// The result, if it has arrived.
    pub(crate) fn try_result(&mut self) -> Option<Result<Bytes, LinkError>> {
        match self.rx.try_recv() {
            Ok(result) => Some(result),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(self.lost())),
        }
    }

    fn lost(&self) -> LinkError {
        // The sender side lives in the map until delivered or failed; a dropped sender
        // means the whole link state went away.
        self.matcher
            .terminal()
            .unwrap_or_else(|| LinkError::ConnectionLost {
                detail: "link state dropped".into(),
            })
    }
}

impl std::future::Future for Waiting<'_> {
    type Output = Result<Bytes, LinkError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(self.lost())))
    }
}

#[derive(Debug)]
struct Waiter {
    tag: Tag,
    tx: oneshot::Sender<Result<Bytes, LinkError>>,
}

/// Counts a send waiting in the window's queue for as long as it waits (or is dropped).
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Credit for bytes handed to the wire, returned with [`Matcher::release`] once written.
#[derive(Debug)]
#[must_use]
pub(crate) struct Credit(pub(crate) u32);

impl Matcher {
    pub(crate) fn new(peer: Rank, held_limit: u64, send_window: u64) -> Self {
        let window_bytes = u32::try_from(send_window.max(1)).unwrap_or(u32::MAX >> 3);
        Self {
            peer,
            held_limit,
            window: Semaphore::new(window_bytes as usize),
            window_bytes,
            queued: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn peer(&self) -> Rank {
        self.peer
    }

    /// Whether sends wait in the window's queue: a send that would take no credit must not
    /// overtake them.
    pub(crate) fn has_queued(&self) -> bool {
        self.queued.load(Ordering::SeqCst) != 0
    }

    /// Whether the link has failed: [`Matcher::terminal`] is then `Some`, and stays so.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The terminal error, if the link has failed.
    pub(crate) fn terminal(&self) -> Option<LinkError> {
        self.state.lock().terminal.clone()
    }

    /// Fails the link with `err` unless it already failed; wakes every pending `recv` and
    /// `send`. Returns whether this call was the one that failed it.
    pub(crate) fn fail(&self, err: LinkError) -> bool {
        let waiters = {
            let mut st = self.state.lock();
            if st.terminal.is_some() {
                return false;
            }
            // A local cancel discards what was held; a peer's failure keeps it, because
            // those payloads were sent before the peer left and are still owed to `recv`.
            if matches!(err, LinkError::Cancelled(_)) {
                st.held.clear();
                st.held_bytes = 0;
            }
            st.terminal = Some(err.clone());
            self.failed.store(true, Ordering::SeqCst);
            std::mem::take(&mut st.waiters)
        };
        self.window.close();
        for w in waiters.into_values().flatten() {
            let _ = w.tx.send(Err(err.clone()));
        }
        true
    }

    /// The payload sent under `tag`'s `(op, step)`.
    pub(crate) async fn recv(&self, tag: Tag) -> Result<Bytes, LinkError> {
        match self.register(tag) {
            Ok(waiting) => waiting.await,
            Err(ready) => ready,
        }
    }

    /// The payload for `tag` if it is held, or the link's failure; `None` while neither has
    /// happened. Never registers anything, so a caller may ask again and again (a receive
    /// that reads the socket itself before it parks).
    pub(crate) fn take(&self, tag: &Tag) -> Option<Result<Bytes, LinkError>> {
        let mut st = self.state.lock();
        st.take(tag)
    }

    /// Like [`Matcher::take`], but when there is nothing yet, registers a waiter that
    /// [`Matcher::deliver`] or [`Matcher::fail`] completes: `Ok(waiting)`; `Err(result)`
    /// when the result is already here.
    pub(crate) fn register(&self, tag: Tag) -> Result<Waiting<'_>, Result<Bytes, LinkError>> {
        let mut st = self.state.lock();
        if let Some(ready) = st.take(&tag) {
            return Err(ready);
        }
        let (tx, rx) = oneshot::channel();
        st.waiters
            .entry(key(&tag))
            .or_default()
            .push(Waiter { tag, tx });
        Ok(Waiting { matcher: self, rx })
    }

    /// Whether a registered `recv` is still waiting (dropped ones are pruned): the progress
    /// thread keeps reading the socket for them.
    pub(crate) fn has_waiters(&self) -> bool {
        let mut st = self.state.lock();
        st.waiters.retain(|_, q| {
            q.retain(|w| !w.tx.is_closed());
            !q.is_empty()
        });
        !st.waiters.is_empty()
    }

    /// A payload arrived under `tag`. Errors with `Overflow` when the held bytes pass the
    /// bound; the caller then fails the link and closes the connection.
    pub(crate) fn deliver(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        let mut st = self.state.lock();
        if matches!(st.terminal, Some(LinkError::Cancelled(_))) {
            return Ok(());
        }
        let k = key(&tag);
        let mut payload = payload;
        if let Some(q) = st.waiters.get_mut(&k) {
            // Skip waiters whose `recv` future was dropped.
            while !q.is_empty() {
                let w = q.remove(0);
                let result = if w.tag == tag {
                    Ok(payload)
                } else {
                    Err(LinkError::TagMismatch {
                        expected: w.tag,
                        got: tag,
                    })
                };
                match w.tx.send(result) {
                    Ok(()) => {
                        if q.is_empty() {
                            st.waiters.remove(&k);
                        }
                        return Ok(());
                    }
                    Err(Ok(back)) => payload = back,
                    Err(Err(_)) => {
                        if q.is_empty() {
                            st.waiters.remove(&k);
                        }
                        return Ok(());
                    }
                }
            }
            st.waiters.remove(&k);
        }
        st.held_bytes += held_cost(payload.len());
        let held = st.held_bytes;
        st.held.entry(k).or_default().push((tag, payload));
        if held > self.held_limit {
            return Err(LinkError::Overflow {
                bytes: held,
                limit: self.held_limit,
            });
        }
        Ok(())
    }

    /// Waits for room to hand `len` bytes to the wire (bounded by the window, so a payload
    /// larger than the window waits for an empty window rather than forever).
    pub(crate) async fn acquire(&self, len: usize) -> Result<Credit, LinkError> {
        // The window is rarely full: take the permits without building a waiting future,
        // unless someone queued before us (the semaphore's queue is first come, first
        // served, and so must the stream be).
        if let Some(now) = self.try_acquire(len) {
            return now;
        }
        let n = self.credit_for(len);
        self.queued.fetch_add(1, Ordering::SeqCst);
        let acquired = Queued(&self.queued);
        let result = self.window.acquire_many(n).await;
        drop(acquired);
        match result {
            Ok(permit) => {
                permit.forget();
                Ok(Credit(n))
            }
            Err(_) => Err(self
                .terminal()
                .unwrap_or_else(|| LinkError::ConnectionLost {
                    detail: "send window closed".into(),
                })),
        }
    }

    /// [`Matcher::acquire`] without waiting: `None` when the credit is not there at once
    /// (or others wait for it first), the link's failure if it failed.
    pub(crate) fn try_acquire(&self, len: usize) -> Option<Result<Credit, LinkError>> {
        if let Some(err) = self.terminal() {
            return Some(Err(err));
        }
        if self.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let n = self.credit_for(len);
        let permit = self.window.try_acquire_many(n).ok()?;
        permit.forget();
        Some(Ok(Credit(n)))
    }

    /// The credit a send of `len` bytes takes: its length, at most the whole window.
    fn credit_for(&self, len: usize) -> u32 {
        u32::try_from(len)
            .unwrap_or(u32::MAX)
            .min(self.window_bytes)
    }

    /// Returns credit once the bytes are on the wire (or dropped by a failed link).
    pub(crate) fn release(&self, credit: Credit) {
        self.window.add_permits(credit.0 as usize);
    }

    /// Bytes held for `recv`s not yet posted.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.state.lock().held_bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chorus_engine::link::CancelReason;
    use chorus_protocol::{CloseCode, Collective, DType, OpSeq};

    use super::*;

    fn tag(op: u64, step: u32) -> Tag {
        Tag {
            collective: Collective::AllReduce,
            op: OpSeq(op),
            step,
            offset: 0,
            dtype: DType::F32,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn early_arrivals_are_held_in_order_and_matched_by_op_and_step() {
        let m = Matcher::new(Rank(1), 1 << 20, 1 << 20);
        m.deliver(tag(1, 0), Bytes::from_static(b"a")).unwrap();
        m.deliver(tag(1, 0), Bytes::from_static(b"b")).unwrap();
        m.deliver(tag(2, 0), Bytes::from_static(b"c")).unwrap();
        rt().block_on(async {
            assert_eq!(m.recv(tag(2, 0)).await.unwrap(), "c");
            assert_eq!(m.recv(tag(1, 0)).await.unwrap(), "a");
            assert_eq!(m.recv(tag(1, 0)).await.unwrap(), "b");
        });
        assert_eq!(m.held_bytes(), 0);
    }

    #[test]
    fn a_different_collective_under_the_same_op_and_step_is_a_mismatch() {
        let m = Matcher::new(Rank(1), 1 << 20, 1 << 20);
        let mut other = tag(1, 0);
        other.collective = Collective::Broadcast;
        m.deliver(other, Bytes::from_static(b"x")).unwrap();
        let err = rt().block_on(m.recv(tag(1, 0))).unwrap_err();
        assert_eq!(
            err,
            LinkError::TagMismatch {
                expected: tag(1, 0),
                got: other
            }
        );
    }

    #[test]
    fn held_bytes_past_the_bound_overflow() {
        let limit = 2 * HELD_ENTRY_COST + 10;
        let m = Matcher::new(Rank(1), limit, 1 << 20);
        m.deliver(tag(1, 0), Bytes::from(vec![0u8; 10])).unwrap();
        let err = m.deliver(tag(1, 1), Bytes::from(vec![0u8; 1])).unwrap_err();
        assert_eq!(
            err,
            LinkError::Overflow {
                bytes: limit + 1,
                limit
            }
        );
    }

    #[test]
    fn empty_early_arrivals_count_against_the_bound() {
        let m = Matcher::new(Rank(1), 1 << 16, 1 << 20);
        let mut sent = 0u32;
        let err = loop {
            match m.deliver(tag(1, sent), Bytes::new()) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent <= 1 << 16, "empty payloads never overflowed");
        };
        assert!(matches!(err, LinkError::Overflow { .. }), "{err:?}");
        assert_eq!(u64::from(sent + 1) * HELD_ENTRY_COST, m.held_bytes());
        assert!(m.held_bytes() > 1 << 16);
    }

    #[test]
    fn cancel_fails_pending_recvs_and_sends_and_the_first_reason_wins() {
        let m = Arc::new(Matcher::new(Rank(1), 1 << 20, 4));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let _credit = rt.block_on(m.acquire(4)).unwrap();
        let pending_recv = rt.spawn({
            let m = m.clone();
            async move { m.recv(tag(1, 0)).await }
        });
        let pending_send = rt.spawn({
            let m = m.clone();
            async move { m.acquire(4).await.map(|_| ()) }
        });
        std::thread::sleep(Duration::from_millis(20));
        let first = CancelReason::new(CloseCode::ABORTED, "first");
        assert!(m.fail(LinkError::Cancelled(first.clone())));
        assert!(!m.fail(LinkError::Cancelled(CancelReason::new(
            CloseCode::LEFT,
            "second"
        ))));
        let want = Err(LinkError::Cancelled(first));
        assert_eq!(rt.block_on(pending_recv).unwrap(), want);
        assert_eq!(
            rt.block_on(pending_send).unwrap(),
            want.clone().map(|_: Bytes| ())
        );
        assert_eq!(rt.block_on(m.recv(tag(5, 5))), want);
    }

    #[test]
    fn a_departed_peers_last_payloads_are_still_delivered() {
        let m = Matcher::new(Rank(1), 1 << 20, 1 << 20);
        m.deliver(tag(1, 0), Bytes::from_static(b"last")).unwrap();
        let gone = LinkError::PeerDeparted {
            code: CloseCode::NORMAL,
            detail: "done".into(),
        };
        m.fail(gone.clone());
        let rt = rt();
        assert_eq!(rt.block_on(m.recv(tag(1, 0))).unwrap(), "last");
        assert_eq!(rt.block_on(m.recv(tag(1, 1))), Err(gone));
    }

    #[test]
    fn a_dropped_recv_does_not_swallow_the_payload() {
        let m = Matcher::new(Rank(1), 1 << 20, 1 << 20);
        let rt = rt();
        rt.block_on(async {
            let fut = m.recv(tag(1, 0));
            // Poll once so the waiter is registered, then drop it.
            let _ = tokio::time::timeout(Duration::from_millis(1), fut).await;
        });
        m.deliver(tag(1, 0), Bytes::from_static(b"kept")).unwrap();
        assert_eq!(rt.block_on(m.recv(tag(1, 0))).unwrap(), "kept");
    }
}
