//! `LinkHealth`: what a device link's receive side records when an abort retires its waits,
//! and what a received payload keeps of the link it came through, so that whoever reads the
//! payload later can tell whether its bytes are the peer's.
//!
//! A retired wait records its message's generation (1-based index) as the first retired
//! one; the abort word is one-way, so every later message on that link is suspect too, and a
//! payload whose last message is at or after the first retired generation is spoiled.
//! Which operation read what (`Reads`) is kept per operation, so an operation is judged by
//! its own reads: never by those of one that failed before it or runs beside it.

use std::sync::{Arc, Weak};

use chorus_engine::context::Context;
use chorus_protocol::Rank;
use parking_lot::Mutex;

use crate::mapped::MappedHost;
use crate::region::{RECV_RETIRED, Region};

/// Abort word and the first-retired records in the link's mapped host memory.
pub(crate) const ABORT: usize = 0;
pub(crate) const RETIRED_SEND: usize = 64;
pub(crate) const RETIRED_RECV: usize = 128;

/// One link end's abort word and retirement records.
pub(crate) struct LinkHealth {
    pub(crate) peer: Rank,
    words: MappedHost,
    /// This end's region: its `recv_retired` word is what a gate on another link reads
    /// before forwarding a payload from this one, so the region lives as long as this.
    region: Arc<Region>,
}

impl LinkHealth {
    pub(crate) fn new(peer: Rank, words: MappedHost, region: Arc<Region>) -> Self {
        LinkHealth {
            peer,
            words,
            region,
        }
    }

    pub(crate) fn abort_set(&self) -> bool {
        self.words.load_u32(ABORT) != 0
    }

    /// Retire every device wait on this link, now and later (one-way).
    pub(crate) fn set_abort(&self) {
        self.words.store_u32(ABORT, 1);
    }

    /// Device address of a word of the mapped memory.
    pub(crate) fn word_ptr(&self, offset: usize) -> u64 {
        self.words.device_ptr(offset)
    }

    /// Device address of this end's `recv_retired` word in device memory.
    pub(crate) fn recv_retired_dev(&self) -> u64 {
        self.region.ptr + RECV_RETIRED
    }

    /// The first message generation whose send (`RETIRED_SEND`) or receive (`RETIRED_RECV`)
    /// wait was retired, 0 for none.
    pub(crate) fn first_retired(&self, which: usize) -> u64 {
        self.words.load_u64(which)
    }

    /// Whether a payload received through this link whose last message has generation
    /// `last` may hold bytes that are not the peer's. Only meaningful once the stream that
    /// received it has run past it.
    pub(crate) fn spoiled(&self, last: u64) -> bool {
        spoiled(self.first_retired(RETIRED_RECV), last)
    }
}

/// A payload ending at generation `last` is spoiled if a wait at or before it retired.
pub(crate) fn spoiled(first_retired: u64, last: u64) -> bool {
    first_retired != 0 && first_retired <= last
}

/// The payloads a device's operations have read and not yet answered for: for each operation
/// (`K`: its context, or `None` for reads made outside the engine) and each link they came
/// through, the latest generation read. An operation's settle takes its own entries and no
/// other's; an operation that failed forgets its own. Weak, so the record never keeps a
/// dropped link's memory: a link is alive while an operation that reads through it is.
pub(crate) struct Reads<T, K = Option<Context>> {
    read: Mutex<Vec<Entry<T, K>>>,
}

struct Entry<T, K> {
    op: K,
    link: Weak<T>,
    last: u64,
}

/// What names an operation in the record.
pub(crate) trait OpKey: Clone {
    fn same(&self, other: &Self) -> bool;
}

impl OpKey for Option<Context> {
    fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Some(a), Some(b)) => a.same(b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl<T, K> Default for Reads<T, K> {
    fn default() -> Self {
        Reads {
            read: Mutex::new(Vec::new()),
        }
    }
}

impl<T, K: OpKey> Reads<T, K> {
    /// Record that operation `op` has read a payload through `link` ending at generation
    /// `last` (call after queueing the read, so a settle that takes the record first covers
    /// it).
    pub(crate) fn note(&self, op: &K, link: &Arc<T>, last: u64) {
        let mut read = self.read.lock();
        read.retain(|e| e.link.strong_count() > 0);
        match read
            .iter_mut()
            .find(|e| e.op.same(op) && std::ptr::eq(e.link.as_ptr(), Arc::as_ptr(link)))
        {
            Some(e) => e.last = e.last.max(last),
            None => read.push(Entry {
                op: op.clone(),
                link: Arc::downgrade(link),
                last,
            }),
        }
    }

    /// Everything recorded for `op`, leaving none of it (and all the others') in the record.
    pub(crate) fn take(&self, op: &K) -> Vec<(Arc<T>, u64)> {
        let mut taken = Vec::new();
        self.read.lock().retain(|e| {
            if !e.op.same(op) {
                return true;
            }
            taken.extend(e.link.upgrade().map(|l| (l, e.last)));
            false
        });
        taken
    }

    /// Drop everything recorded for `op`.
    pub(crate) fn forget(&self, op: &K) {
        self.read.lock().retain(|e| !e.op.same(op));
    }
}

/// Links a send stream has forwarded payloads from: kept alive (their `recv_retired` words
/// are read by gates on that stream) until the link that holds this list is dropped after
/// draining its streams. At most one entry per link of the process.
pub(crate) struct Origins<T> {
    held: Mutex<Vec<Arc<T>>>,
}

impl<T> Default for Origins<T> {
    fn default() -> Self {
        Origins {
            held: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Origins<T> {
    pub(crate) fn hold(&self, link: &Arc<T>) {
        let mut held = self.held.lock();
        if !held.iter().any(|h| Arc::ptr_eq(h, link)) {
            held.push(link.clone());
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_payloads_at_or_after_the_first_retired_wait_are_spoiled() {
        assert!(!spoiled(0, 1), "nothing retired");
        assert!(!spoiled(0, u64::MAX));
        assert!(!spoiled(5, 4), "its data arrived before the abort");
        assert!(spoiled(5, 5));
        assert!(spoiled(5, 9));
        assert!(spoiled(1, 1));
    }

    impl OpKey for u32 {
        fn same(&self, other: &Self) -> bool {
            self == other
        }
    }

    #[test]
    fn the_reads_keep_the_latest_generation_per_link_and_empty_on_take() {
        let reads = Reads::<u8, u32>::default();
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        reads.note(&0, &a, 3);
        reads.note(&0, &b, 7);
        reads.note(&0, &a, 9);
        reads.note(&0, &a, 4);
        let mut got: Vec<(u8, u64)> = reads.take(&0).into_iter().map(|(l, g)| (*l, g)).collect();
        got.sort_unstable();
        assert_eq!(got, vec![(1, 9), (2, 7)]);
        assert!(reads.take(&0).is_empty(), "taken");
        reads.note(&0, &a, 1);
        assert_eq!(reads.take(&0).len(), 1);
    }

    #[test]
    fn each_operation_answers_only_for_its_own_reads() {
        let reads = Reads::<u8, u32>::default();
        let (old, new) = (Arc::new(1u8), Arc::new(2u8));
        // Operation 1 read through a link an abort later spoiled, and failed.
        reads.note(&1, &old, 5);
        // Operation 2, concurrent or later, on another link and on the same one.
        reads.note(&2, &new, 3);
        reads.note(&2, &old, 2);
        let mut two: Vec<(u8, u64)> = reads.take(&2).into_iter().map(|(l, g)| (*l, g)).collect();
        two.sort_unstable();
        assert_eq!(
            two,
            vec![(1, 2), (2, 3)],
            "operation 2's, at its own generations"
        );
        // Operation 1 failed without settling: it forgets, and a later settle sees nothing.
        reads.forget(&1);
        assert!(reads.take(&1).is_empty());
        reads.note(&3, &new, 4);
        assert_eq!(reads.take(&3).len(), 1);
        assert!(reads.read.lock().is_empty());
    }

    #[test]
    fn engine_operations_and_direct_reads_are_apart() {
        let reads = Reads::<u8>::default();
        let root = Context::root();
        let (a, b) = (root.child(), root.child());
        let link = Arc::new(1u8);
        reads.note(&Some(a.clone()), &link, 1);
        reads.note(&None, &link, 2);
        assert_eq!(reads.take(&Some(b)).len(), 0);
        assert_eq!(
            reads
                .take(&None)
                .into_iter()
                .map(|(_, g)| g)
                .collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(
            reads
                .take(&Some(a))
                .into_iter()
                .map(|(_, g)| g)
                .collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[test]
    fn the_reads_forget_dropped_links_and_keeps_none_alive() {
        let reads = Reads::<u8, u32>::default();
        let a = Arc::new(1u8);
        let weak = Arc::downgrade(&a);
        reads.note(&0, &a, 2);
        drop(a);
        assert!(weak.upgrade().is_none(), "the record held the link");
        assert!(reads.take(&0).is_empty());
        // Dead entries are pruned as new ones arrive, so the record stays small.
        for i in 0..100 {
            reads.note(&0, &Arc::new(i as u8), 1);
        }
        assert!(reads.read.lock().len() <= 1);
    }

    #[test]
    fn origins_hold_each_link_once_until_dropped() {
        let origins = Origins::default();
        let a = Arc::new(1u8);
        let weak = Arc::downgrade(&a);
        origins.hold(&a);
        origins.hold(&a);
        origins.hold(&Arc::new(2u8));
        assert_eq!(origins.len(), 2);
        drop(a);
        assert!(weak.upgrade().is_some(), "held for the gates");
        drop(origins);
        assert!(weak.upgrade().is_none());
    }
}
