//! The in-process [`Link`]: ranks as threads (or tasks) of one process.
//!
//! Used by the engine's own tests and benchmarks and by device crates that test their
//! `Device` without a network. It keeps the whole [`Link`] contract, so code that passes
//! over it meets the same rules over TCP or QUIC:
//!
//! - payloads are matched by `(op, step)`; early arrivals are held up to a [`HeldLimit`],
//!   past which the receiving side fails with [`LinkError::Overflow`] (and the sender sees
//!   the receiver close with a protocol-violation code);
//! - a payload whose other tag fields differ from the receive's fails that receive with
//!   [`LinkError::TagMismatch`];
//! - `send` takes ownership at once (it never waits for the peer);
//! - `cancel` fails everything on this side with [`LinkError::Cancelled`] immediately and
//!   shows the peer a departure ([`LinkError::PeerDeparted`] with the reason's code) once it
//!   has drained what had already arrived; dropping an endpoint shows the peer
//!   [`LinkError::ConnectionLost`] the same way.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll, Waker};

use bytes::Bytes;
use chorus_protocol::{CloseCode, Rank};
use parking_lot::{Mutex, MutexGuard};

use crate::link::{CancelReason, Link, LinkError, LinkFuture, Tag};

/// How much unclaimed data a receiving side holds before it fails with `Overflow`.
pub struct HeldLimit<P> {
    /// The most units held at once.
    pub limit: u64,
    /// The units a payload counts for (bytes for `Bytes`, or 1 per payload).
    pub measure: fn(&P) -> u64,
}

impl<P> Clone for HeldLimit<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for HeldLimit<P> {}

impl<P> fmt::Debug for HeldLimit<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLimit")
            .field("limit", &self.limit)
            .finish()
    }
}

impl<P> HeldLimit<P> {
    /// At most `n` payloads held, whatever their size.
    pub fn count(n: u64) -> Self {
        HeldLimit {
            limit: n,
            measure: |_| 1,
        }
    }
}

impl HeldLimit<Bytes> {
    /// At most `n` bytes held.
    pub fn bytes(n: u64) -> Self {
        HeldLimit {
            limit: n,
            measure: |b| b.len() as u64,
        }
    }
}

impl Default for HeldLimit<Bytes> {
    /// 1 GiB: far above what the engine keeps in flight (`pipeline_depth` chunks per link).
    fn default() -> Self {
        HeldLimit::bytes(1 << 30)
    }
}

/// For each rank of a `world`, its links to every other rank (ascending peer order).
pub fn mesh<P: Send + 'static>(world: u32, limit: HeldLimit<P>) -> Vec<Vec<Arc<LocalLink<P>>>> {
    let mut links: Vec<Vec<Arc<LocalLink<P>>>> = (0..world).map(|_| Vec::new()).collect();
    for a in 0..world {
        for b in a + 1..world {
            let (la, lb) = LocalLink::pair(Rank(a), Rank(b), limit);
            links[a as usize].push(Arc::new(la));
            links[b as usize].push(Arc::new(lb));
        }
    }
    for l in &mut links {
        l.sort_by_key(|l| l.peer);
    }
    links
}

/// One end of an in-process link between ranks `me` and `peer`.
pub struct LocalLink<P> {
    me: Rank,
    peer: Rank,
    /// Payloads from the peer to this end.
    inbox: Arc<Channel<P>>,
    /// Payloads from this end to the peer.
    outbox: Arc<Channel<P>>,
    cancelled: OnceLock<CancelReason>,
}

impl<P: Send + 'static> LocalLink<P> {
    /// The two ends of a link between ranks `a` and `b`.
    pub fn pair(a: Rank, b: Rank, limit: HeldLimit<P>) -> (Self, Self) {
        let ab = Arc::new(Channel::new(limit, b));
        let ba = Arc::new(Channel::new(limit, a));
        (
            LocalLink {
                me: a,
                peer: b,
                inbox: ba.clone(),
                outbox: ab.clone(),
                cancelled: OnceLock::new(),
            },
            LocalLink {
                me: b,
                peer: a,
                inbox: ab,
                outbox: ba,
                cancelled: OnceLock::new(),
            },
        )
    }

    /// This end's rank.
    pub fn me(&self) -> Rank {
        self.me
    }

    /// Units currently held unclaimed on this end (for tests of the bound).
    pub fn held(&self) -> u64 {
        self.inbox.lock().held_units
    }
}

impl<P: Send + 'static> Link<P> for LocalLink<P> {
    fn peer(&self) -> Rank {
        self.peer
    }

    fn send(&self, tag: Tag, payload: P) -> LinkFuture<'_, ()> {
        let result = self.outbox.deliver(tag, payload);
        Box::pin(std::future::ready(result))
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, P> {
        Box::pin(Recv {
            chan: self.inbox.clone(),
            key: (tag.op.get(), tag.step),
            expected: tag,
            registered: false,
        })
    }

    fn cancel(&self, reason: CancelReason) {
        if self.cancelled.set(reason.clone()).is_err() {
            return;
        }
        let departed = LinkError::PeerDeparted {
            code: reason.code,
            detail: reason.detail.to_string(),
        };
        let cancelled = LinkError::Cancelled(reason);
        {
            let mut s = self.inbox.lock();
            s.receiver_failed = Some(cancelled.clone());
            s.send_failed.get_or_insert(departed.clone());
            s.wake_all();
        }
        {
            let mut s = self.outbox.lock();
            s.send_failed = Some(cancelled);
            s.closed.get_or_insert(departed);
            s.wake_all();
        }
    }
}

impl<P> Drop for LocalLink<P> {
    fn drop(&mut self) {
        if self.cancelled.get().is_some() {
            return;
        }
        let lost = LinkError::ConnectionLost {
            detail: format!("{} dropped its end", self.me),
        };
        {
            let mut s = self.inbox.lock();
            s.send_failed.get_or_insert(lost.clone());
            s.wake_all();
        }
        {
            let mut s = self.outbox.lock();
            s.closed.get_or_insert(lost);
            s.wake_all();
        }
    }
}

impl<P> fmt::Debug for LocalLink<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLink")
            .field("me", &self.me)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

type Key = (u64, u32);

/// One direction of a link.
struct Channel<P> {
    state: Mutex<ChannelState<P>>,
    limit: HeldLimit<P>,
    /// The sending rank, for messages.
    from: Rank,
}

struct ChannelState<P> {
    held: HashMap<Key, (Tag, P)>,
    held_units: u64,
    waiting: HashMap<Key, Waiter<P>>,
    /// Fails receives before anything held is looked at (local cancel, overflow).
    receiver_failed: Option<LinkError>,
    /// Fails receives once nothing matching is held (the sender departed or was lost).
    closed: Option<LinkError>,
    /// Fails sends into this channel.
    send_failed: Option<LinkError>,
}

struct Waiter<P> {
    expected: Tag,
    waker: Waker,
    slot: Option<Result<P, LinkError>>,
}

impl<P> ChannelState<P> {
    fn wake_all(&mut self) {
        for w in self.waiting.values() {
            w.waker.wake_by_ref();
        }
    }
}

impl<P> Channel<P> {
    fn new(limit: HeldLimit<P>, from: Rank) -> Self {
        Channel {
            state: Mutex::new(ChannelState {
                held: HashMap::new(),
                held_units: 0,
                waiting: HashMap::new(),
                receiver_failed: None,
                closed: None,
                send_failed: None,
            }),
            limit,
            from,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ChannelState<P>> {
        self.state.lock()
    }

    fn deliver(&self, tag: Tag, payload: P) -> Result<(), LinkError> {
        let mut s = self.lock();
        if let Some(e) = &s.send_failed {
            return Err(e.clone());
        }
        if s.receiver_failed.is_some() {
            // The receiving side has failed but not cancelled: the data goes nowhere.
            return Ok(());
        }
        let key = (tag.op.get(), tag.step);
        if let Some(w) = s.waiting.get_mut(&key)
            && w.slot.is_none()
        {
            w.slot = Some(if w.expected == tag {
                Ok(payload)
            } else {
                Err(LinkError::TagMismatch {
                    expected: w.expected,
                    got: tag,
                })
            });
            w.waker.wake_by_ref();
            return Ok(());
        }
        if s.held.contains_key(&key) {
            let e = LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!("{} sent {tag} twice", self.from),
            };
            self.fail_receiver(&mut s, e);
            return Ok(());
        }
        let units = (self.limit.measure)(&payload);
        s.held_units += units;
        s.held.insert(key, (tag, payload));
        if s.held_units > self.limit.limit {
            let e = LinkError::Overflow {
                bytes: s.held_units,
                limit: self.limit.limit,
            };
            self.fail_receiver(&mut s, e);
        }
        Ok(())
    }

    /// The receiving side closes the link over bad input: its receives fail with `e`, the
    /// sender sees a protocol-violation departure.
    fn fail_receiver(&self, s: &mut ChannelState<P>, e: LinkError) {
        let detail = e.to_string();
        s.receiver_failed.get_or_insert(e);
        s.send_failed.get_or_insert(LinkError::PeerDeparted {
            code: CloseCode::PROTOCOL_VIOLATION,
            detail,
        });
        s.held.clear();
        s.held_units = 0;
        s.wake_all();
    }
}

struct Recv<P> {
    chan: Arc<Channel<P>>,
    key: Key,
    expected: Tag,
    registered: bool,
}

impl<P> Future for Recv<P> {
    type Output = Result<P, LinkError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut s = this.chan.lock();
        if let Some(e) = &s.receiver_failed {
            let e = e.clone();
            if this.registered {
                s.waiting.remove(&this.key);
                this.registered = false;
            }
            return Poll::Ready(Err(e));
        }
        if this.registered {
            let Some(w) = s.waiting.get_mut(&this.key) else {
                // Unreachable while registered (only this future removes its entry), but
                // a wrong answer is better than a panic.
                this.registered = false;
                return Poll::Ready(Err(LinkError::Protocol {
                    code: CloseCode::INTERNAL,
                    detail: format!("receive for {} lost its registration", this.expected),
                }));
            };
            if let Some(result) = w.slot.take() {
                s.waiting.remove(&this.key);
                this.registered = false;
                return Poll::Ready(result);
            }
            if let Some(e) = &s.closed {
                let e = e.clone();
                s.waiting.remove(&this.key);
                this.registered = false;
                return Poll::Ready(Err(e));
            }
            if let Some(w) = s.waiting.get_mut(&this.key)
                && !w.waker.will_wake(cx.waker())
            {
                w.waker.clone_from(cx.waker());
            }
            return Poll::Pending;
        }
        if let Some((tag, payload)) = s.held.remove(&this.key) {
            s.held_units -= (this.chan.limit.measure)(&payload);
            return Poll::Ready(if tag == this.expected {
                Ok(payload)
            } else {
                Err(LinkError::TagMismatch {
                    expected: this.expected,
                    got: tag,
                })
            });
        }
        if let Some(e) = &s.closed {
            return Poll::Ready(Err(e.clone()));
        }
        if s.waiting.contains_key(&this.key) {
            return Poll::Ready(Err(LinkError::Protocol {
                code: CloseCode::INTERNAL,
                detail: format!("two receives posted for {}", this.expected),
            }));
        }
        s.waiting.insert(
            this.key,
            Waiter {
                expected: this.expected,
                waker: cx.waker().clone(),
                slot: None,
            },
        );
        this.registered = true;
        Poll::Pending
    }
}

impl<P> Drop for Recv<P> {
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        let mut s = self.chan.lock();
        // A payload delivered to an abandoned receive goes back to the held set, so a later
        // receive of the same tag still finds it.
        if let Some(Waiter {
            slot: Some(Ok(payload)),
            expected,
            ..
        }) = s.waiting.remove(&self.key)
        {
            s.held_units += (self.chan.limit.measure)(&payload);
            s.held.insert(self.key, (expected, payload));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_protocol::{Collective, DType, OpSeq};
    use futures::executor::block_on;
    use std::thread;
    use std::time::{Duration, Instant};

    fn tag(op: u64, step: u32) -> Tag {
        Tag {
            collective: Collective::AllReduce,
            op: OpSeq(op),
            step,
            offset: 0,
            dtype: DType::F32,
        }
    }

    fn pair() -> (LocalLink<Bytes>, LocalLink<Bytes>) {
        LocalLink::pair(Rank(0), Rank(1), HeldLimit::bytes(64))
    }

    #[test]
    fn matches_by_op_and_step_in_any_order() {
        let (a, b) = pair();
        block_on(a.send(tag(1, 0), Bytes::from_static(b"zero"))).unwrap();
        block_on(a.send(tag(1, 1), Bytes::from_static(b"one"))).unwrap();
        assert_eq!(b.held(), 7);
        assert_eq!(block_on(b.recv(tag(1, 1))).unwrap(), "one");
        assert_eq!(block_on(b.recv(tag(1, 0))).unwrap(), "zero");
        assert_eq!(b.held(), 0);
        // A receive posted first is completed by the later send, across threads.
        let waiter = thread::spawn(move || block_on(b.recv(tag(2, 5))).map(|p| p.len()));
        thread::sleep(Duration::from_millis(10));
        block_on(a.send(tag(2, 5), Bytes::from_static(b"late"))).unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(4));
    }

    #[test]
    fn tag_mismatch_names_both_tags() {
        let (a, b) = pair();
        let mut other = tag(3, 0);
        other.collective = Collective::Broadcast;
        block_on(a.send(other, Bytes::new())).unwrap();
        match block_on(b.recv(tag(3, 0))) {
            Err(LinkError::TagMismatch { expected, got }) => {
                assert_eq!(expected.collective, Collective::AllReduce);
                assert_eq!(got.collective, Collective::Broadcast);
            }
            r => panic!("expected a mismatch, got {r:?}"),
        }
    }

    #[test]
    fn overflow_fails_the_receiver_and_tells_the_sender() {
        let (a, b) = pair();
        block_on(a.send(tag(1, 0), Bytes::from(vec![0u8; 60]))).unwrap();
        block_on(a.send(tag(1, 1), Bytes::from(vec![0u8; 10]))).unwrap();
        assert!(matches!(
            block_on(b.recv(tag(1, 0))),
            Err(LinkError::Overflow {
                bytes: 70,
                limit: 64
            })
        ));
        assert!(matches!(
            block_on(a.send(tag(1, 2), Bytes::new())),
            Err(LinkError::PeerDeparted {
                code: CloseCode::PROTOCOL_VIOLATION,
                ..
            })
        ));
    }

    #[test]
    fn cancel_is_prompt_local_and_seen_by_the_peer_as_departure() {
        let (a, b) = pair();
        let a = Arc::new(a);
        block_on(b.send(tag(1, 0), Bytes::from_static(b"early"))).unwrap();
        let a2 = a.clone();
        let waiter = thread::spawn(move || block_on(a2.recv(tag(9, 9))));
        thread::sleep(Duration::from_millis(10));
        let t = Instant::now();
        a.cancel(CancelReason::new(CloseCode::ABORTED, "test"));
        a.cancel(CancelReason::new(CloseCode::LEFT, "second"));
        let r = waiter.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        match r {
            Err(LinkError::Cancelled(reason)) => assert_eq!(&*reason.detail, "test"),
            r => panic!("{r:?}"),
        }
        // Local cancel fails even what had already arrived.
        assert!(matches!(
            block_on(a.recv(tag(1, 0))),
            Err(LinkError::Cancelled(_))
        ));
        assert!(matches!(
            block_on(a.send(tag(1, 0), Bytes::new())),
            Err(LinkError::Cancelled(_))
        ));
        assert!(matches!(
            block_on(b.send(tag(2, 0), Bytes::new())),
            Err(LinkError::PeerDeparted {
                code: CloseCode::ABORTED,
                ..
            })
        ));
        assert!(matches!(
            block_on(b.recv(tag(2, 0))),
            Err(LinkError::PeerDeparted { .. })
        ));
    }

    #[test]
    fn dropped_end_is_a_lost_connection_after_the_data() {
        let (a, b) = pair();
        block_on(a.send(tag(1, 0), Bytes::from_static(b"last words"))).unwrap();
        drop(a);
        assert_eq!(block_on(b.recv(tag(1, 0))).unwrap(), "last words");
        assert!(matches!(
            block_on(b.recv(tag(1, 1))),
            Err(LinkError::ConnectionLost { .. })
        ));
    }

    #[test]
    fn abandoned_receive_keeps_its_payload() {
        let (a, b) = pair();
        let mut fut = b.recv(tag(4, 0));
        let mut cx = TaskContext::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        block_on(a.send(tag(4, 0), Bytes::from_static(b"kept"))).unwrap();
        drop(fut);
        assert_eq!(block_on(b.recv(tag(4, 0))).unwrap(), "kept");
    }

    #[test]
    fn mesh_links_every_pair() {
        let m = mesh::<Bytes>(4, HeldLimit::default());
        for (r, links) in m.iter().enumerate() {
            let peers: Vec<u32> = links.iter().map(|l| l.peer().0).collect();
            let want: Vec<u32> = (0..4).filter(|&p| p != r as u32).collect();
            assert_eq!(peers, want);
        }
    }
}
