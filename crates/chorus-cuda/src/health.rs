//! `LinkHealth`: what a device link's receive side records when an abort retires its waits,
//! and what a received payload keeps of the link it came through, so that whoever reads the
//! payload later can tell whether its bytes are the peer's.
//!
//! A retired wait records its message's generation (1-based index) as the first retired
//! one; the abort word is one-way, so every later message on that link is suspect too, and a
//! payload whose last message is at or after the first retired generation is spoiled.

use std::sync::{Arc, Weak};

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

/// The payloads a device has read since it last settled: for each link they came through,
/// the latest generation read. Weak, so the record never keeps a dropped link's memory: a link
/// is alive while an operation that reads through it is.
pub(crate) struct Reads<T> {
    read: Mutex<Vec<(Weak<T>, u64)>>,
}

impl<T> Default for Reads<T> {
    fn default() -> Self {
        Reads {
            read: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Reads<T> {
    /// Record that a payload through `link` ending at generation `last` has been read (call
    /// after queueing the read, so a settle that takes the record first covers it).
    pub(crate) fn note(&self, link: &Arc<T>, last: u64) {
        let mut read = self.read.lock();
        read.retain(|(w, _)| w.strong_count() > 0);
        match read
            .iter_mut()
            .find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(link)))
        {
            Some((_, at)) => *at = (*at).max(last),
            None => read.push((Arc::downgrade(link), last)),
        }
    }

    /// Everything recorded so far, leaving the record empty.
    pub(crate) fn take(&self) -> Vec<(Arc<T>, u64)> {
        let read = std::mem::take(&mut *self.read.lock());
        read.into_iter()
            .filter_map(|(w, last)| w.upgrade().map(|l| (l, last)))
            .collect()
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

    #[test]
    fn the_reads_keep_the_latest_generation_per_link_and_empty_on_take() {
        let reads = Reads::default();
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        reads.note(&a, 3);
        reads.note(&b, 7);
        reads.note(&a, 9);
        reads.note(&a, 4);
        let mut got: Vec<(u8, u64)> = reads.take().into_iter().map(|(l, g)| (*l, g)).collect();
        got.sort_unstable();
        assert_eq!(got, vec![(1, 9), (2, 7)]);
        assert!(reads.take().is_empty(), "taken");
        reads.note(&a, 1);
        assert_eq!(reads.take().len(), 1);
    }

    #[test]
    fn the_reads_forget_dropped_links_and_keeps_none_alive() {
        let reads = Reads::default();
        let a = Arc::new(1u8);
        let weak = Arc::downgrade(&a);
        reads.note(&a, 2);
        drop(a);
        assert!(weak.upgrade().is_none(), "the record held the link");
        assert!(reads.take().is_empty());
        // Dead entries are pruned as new ones arrive, so the record stays small.
        for i in 0..100 {
            reads.note(&Arc::new(i as u8), 1);
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
