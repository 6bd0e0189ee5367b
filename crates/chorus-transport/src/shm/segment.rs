//! A segment: one anonymous shared mapping (a sealed `memfd`) two ranks share, holding the
//! control words and the two rings of `ring.rs`'s layout.
//!
//! The memfd has no name in any filesystem (`/dev/shm` stays empty) and dies with the last
//! mapping or descriptor, so a SIGKILLed rank leaves nothing behind. The creator seals it
//! against shrinking and growing before it passes it on, and the receiver refuses a memfd
//! without those seals: a peer that could shrink the file would make our next access to the
//! vanished pages a `SIGBUS`.
//!
//! This is the only place in the shm transport that dereferences the mapping. The peer can
//! write any byte at any time; so words are only ever accessed atomically, ring bytes are
//! only ever copied (never referenced in place), and every offset comes from the checked
//! [`Layout`], never from the segment's contents.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::ring::{Layout, RingError, Side, SlotHead, Spans, offsets};

/// The seals a segment must carry: its size is fixed for its whole life.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A mapped segment. Dropping it unmaps it.
#[derive(Debug)]
pub(crate) struct Segment {
    base: NonNull<u8>,
    layout: Layout,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; every access through `Segment` is an atomic
// word or a copy, both fine from any thread.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` hands out only atomics and copies.
unsafe impl Sync for Segment {}

/// Why a segment could not be made or accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: rustix::io::Errno,
    },
    #[error("segment is not sealed against resizing")]
    Unsealed,
    #[error("{0}")]
    Format(#[from] RingError),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> SegmentError {
    move |source| SegmentError::Os { what, source }
}

impl Segment {
    /// Creates, sizes, seals and maps a new segment with rings of (about) `capacity` bytes.
    pub(crate) fn create(capacity: usize) -> Result<Segment, SegmentError> {
        let layout = Layout::new(capacity);
        let fd = rustix::fs::memfd_create(
            "chorus-shm",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, layout.size() as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(os("seal"))?;
        let seg = Segment::map(fd, layout)?;
        let header = layout.header();
        // SAFETY: the mapping is at least `DATA_OFFSET` bytes and nobody else has it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), seg.base.as_ptr(), header.len());
        }
        Ok(seg)
    }

    /// Accepts a segment a peer passed: sealed, its header well formed, its length the one
    /// the header implies.
    pub(crate) fn accept(fd: OwnedFd, max_capacity: usize) -> Result<Segment, SegmentError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(os("get seals"))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(SegmentError::Unsealed);
        }
        let len = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_size;
        let len = u64::try_from(len).unwrap_or(0);
        let mut header = [0u8; 24];
        let n = rustix::io::pread(&fd, &mut header, 0).map_err(os("read segment header"))?;
        let layout = Layout::parse(&header[..n], len)?;
        if layout.capacity() > max_capacity.max(1) as u64 {
            return Err(RingError::Capacity(layout.capacity()).into());
        }
        Segment::map(fd, layout)
    }

    fn map(fd: OwnedFd, layout: Layout) -> Result<Segment, SegmentError> {
        // SAFETY: a fresh shared mapping of a sealed file of exactly `layout.size()` bytes;
        // no existing memory is affected.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                layout.size(),
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(SegmentError::Os {
            what: "mmap",
            source: rustix::io::Errno::NOMEM,
        })?;
        Ok(Segment { base, layout, fd })
    }

    /// Faults in this end's mapping of the whole segment (`MADV_POPULATE_WRITE`: a shared
    /// memfd's pages are allocated and mapped writable, no byte changed), so that the first
    /// pass of traffic through a ring does not take a page fault every 4 KiB on each end,
    /// which a bench's warm-up (or a job's first steps) would otherwise pay for a whole
    /// ring: between two ranks, 8 KiB all-reduces took 1.6 µs instead of 2.6 and 32 KiB 3.5
    /// instead of 4.2 (4 MiB rings, `chorus bench all-reduce -n 2 -b 2K -e 128K -f 4 -w 125
    /// -i 500 --transport shm`, four alternated rounds, medians).
    ///
    /// The link's pump calls it on its own thread as it starts, not set-up: faulting in a
    /// default segment (two 2 MiB rings) took 2.0–2.9 ms on the end that allocates its
    /// pages (20 fresh memfds, `madvise` timed alone), which set-up would spend on a
    /// runtime thread. Done at set-up (`MAP_POPULATE`), it made a shrink racing a second
    /// failure (`tests/tests/detection.rs`) fail 3 times in 15 runs, against none in 8
    /// without it and none in 10 from the pump. Best effort: a kernel before 5.14 refuses
    /// the advice, and the traffic faults the pages in as before.
    pub(crate) fn prefault(&self) {
        // SAFETY: the range is exactly this mapping; populating it changes no byte.
        let _ = unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().cast(),
                self.layout.size(),
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The descriptor, to pass to the peer.
    pub(crate) fn fd(&self) -> impl AsFd + '_ {
        self.fd.as_fd()
    }

    /// The 32-bit word at `off` (a control word of the layout).
    pub(crate) fn word32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= super::ring::DATA_OFFSET);
        // SAFETY: `off` is one of the layout's word offsets: aligned, inside the mapping,
        // which lives as long as `self`. Shared memory is only ever accessed atomically
        // here, so a concurrent write by the peer is not a data race.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The 64-bit word at `off` (a ring index).
    pub(crate) fn word64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= super::ring::DATA_OFFSET);
        // SAFETY: as in `word32`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Stores the head of the mailbox slot at `slot` (its count and payload are the
    /// caller's, published after this).
    pub(crate) fn store_slot_head(&self, slot: usize, head: &SlotHead) {
        use std::sync::atomic::Ordering::Relaxed;
        self.word32(slot + offsets::SLOT_LEN)
            .store(head.len, Relaxed);
        self.word64(slot + offsets::SLOT_OP).store(head.op, Relaxed);
        self.word32(slot + offsets::SLOT_STEP)
            .store(head.step, Relaxed);
        self.word32(slot + offsets::SLOT_CODES)
            .store(head.codes, Relaxed);
        self.word64(slot + offsets::SLOT_OFFSET)
            .store(head.offset, Relaxed);
    }

    /// Loads the head of the mailbox slot at `slot`, as the writer left it (read its count
    /// first, with acquire).
    pub(crate) fn load_slot_head(&self, slot: usize) -> SlotHead {
        use std::sync::atomic::Ordering::Relaxed;
        SlotHead {
            len: self.word32(slot + offsets::SLOT_LEN).load(Relaxed),
            op: self.word64(slot + offsets::SLOT_OP).load(Relaxed),
            step: self.word32(slot + offsets::SLOT_STEP).load(Relaxed),
            codes: self.word32(slot + offsets::SLOT_CODES).load(Relaxed),
            offset: self.word64(slot + offsets::SLOT_OFFSET).load(Relaxed),
        }
    }

    /// Copies `src` into the control area (the header page and the mailboxes, before the
    /// rings) at `off`: a mailbox slot's payload.
    pub(crate) fn put_bytes(&self, off: usize, src: &[u8]) {
        assert!(
            off + src.len() <= super::ring::DATA_OFFSET,
            "bytes outside the control area"
        );
        // SAFETY: the destination lies inside the mapping's control area (asserted above)
        // and cannot overlap `src`, private memory. The peer may read these bytes while we
        // write them; it only ever copies them.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(off), src.len());
        }
    }

    /// Copies the control area's bytes at `off` into `dst` (a mailbox slot's payload).
    pub(crate) fn get_bytes(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off + dst.len() <= super::ring::DATA_OFFSET,
            "bytes outside the control area"
        );
        // SAFETY: the source lies inside the mapping's control area (asserted above); the
        // destination is private memory. The peer may write the source meanwhile: the bytes
        // are a payload no rule constrains, so garbage is the peer's wrong data.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), dst.as_mut_ptr(), dst.len());
        }
    }

    /// Sets side `s`'s one-way closed word and wakes the other side, whatever it sleeps
    /// for: the connection-level close.
    pub(crate) fn close(&self, s: Side) {
        self.word32(self.layout.closed(s))
            .store(1, std::sync::atomic::Ordering::SeqCst);
        let bell = self.word32(self.layout.bell(s.peer()));
        bell.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        super::futex::wake(bell);
    }

    /// Copies `src` into the ring side `s` writes, at `spans` (which the ring's arithmetic
    /// keeps inside the ring; `src` is exactly their length).
    pub(crate) fn copy_in(&self, s: Side, spans: &Spans, src: &[u8]) {
        let data = self.layout.data(s);
        let (a, b) = src.split_at(spans.first.len().min(src.len()));
        for (span, part) in [(&spans.first, a), (&spans.second, b)] {
            let n = part.len().min(span.len());
            if n == 0 {
                continue;
            }
            assert!(
                data.start + span.start + n <= data.end,
                "span outside the ring"
            );
            // SAFETY: the destination lies inside the mapping (asserted above) and cannot
            // overlap `src`, which is private memory. The peer may read these bytes while
            // we write them; it only ever copies them, so the worst it sees is garbage.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    part.as_ptr(),
                    self.base.as_ptr().add(data.start + span.start),
                    n,
                );
            }
        }
    }

    /// Appends the bytes at `spans` of the ring side `s` writes to `dst`.
    pub(crate) fn copy_out(&self, s: Side, spans: &Spans, dst: &mut bytes::BytesMut) {
        let data = self.layout.data(s);
        dst.reserve(spans.len());
        for span in [&spans.first, &spans.second] {
            if span.is_empty() {
                continue;
            }
            assert!(data.start + span.end <= data.end, "span outside the ring");
            let spare = dst.spare_capacity_mut();
            let n = span.len().min(spare.len());
            // SAFETY: the source lies inside the mapping (asserted above); the destination
            // is `n` bytes of `dst`'s spare capacity, private memory. The peer may write
            // the source meanwhile; the bytes are copied, then parsed, so garbage is a
            // protocol error, never unsoundness.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(data.start + span.start),
                    spare.as_mut_ptr().cast::<u8>(),
                    n,
                );
                dst.set_len(dst.len() + n);
            }
        }
    }

    /// Copies the bytes at `spans` of the ring side `s` writes into `dst`, which is
    /// exactly as long as the spans.
    pub(crate) fn copy_out_to(&self, s: Side, spans: &Spans, dst: &mut [u8]) {
        let data = self.layout.data(s);
        assert_eq!(
            dst.len(),
            spans.len(),
            "destination and spans differ in length"
        );
        let mut at = 0;
        for span in [&spans.first, &spans.second] {
            if span.is_empty() {
                continue;
            }
            assert!(data.start + span.end <= data.end, "span outside the ring");
            let n = span.len();
            // SAFETY: the source lies inside the mapping (asserted above); the destination
            // is `n` bytes of `dst` (the lengths are asserted equal above). The peer may
            // write the source meanwhile: the bytes are a chunk's payload, which no rule
            // constrains, so garbage is the peer's wrong data, never unsoundness.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(data.start + span.start),
                    dst.as_mut_ptr().add(at),
                    n,
                );
            }
            at += n;
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base` and the length are those `mmap` returned; nothing borrows the
        // mapping past `self` (every accessor's borrow is tied to `&self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.layout.size()) };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::shm::ring::{Consumer, Producer};

    fn dup(seg: &Segment) -> OwnedFd {
        seg.fd().as_fd().try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_second_mapping_sees_the_first_ones_words_and_bytes() {
        let a = Segment::create(4096).unwrap();
        let b = Segment::accept(dup(&a), 1 << 20).unwrap();
        a.word32(a.layout().bell(Side::Acceptor))
            .store(7, Ordering::SeqCst);
        assert_eq!(
            b.word32(b.layout().bell(Side::Acceptor))
                .load(Ordering::SeqCst),
            7
        );
        let l = *a.layout();
        let (mut p, mut c) = (Producer::new(&l), Consumer::new(&l));
        for round in 0..3u8 {
            let msg: Vec<u8> = (0..3000).map(|i| (i as u8) ^ round).collect();
            let w = p.writable(c.head(), msg.len()).unwrap();
            a.copy_in(Side::Connector, &w, &msg);
            let tail = p.produce(msg.len());
            let r = c.readable(tail, usize::MAX).unwrap();
            let mut out = bytes::BytesMut::new();
            b.copy_out(Side::Connector, &r, &mut out);
            c.consume(r.len());
            assert_eq!(&out[..], &msg[..], "round {round} (the second wraps)");
        }
    }

    #[test]
    fn an_unsealed_or_malformed_segment_is_refused() {
        let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 12288).unwrap();
        assert!(matches!(
            Segment::accept(fd, 1 << 20),
            Err(SegmentError::Unsealed)
        ));
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 12288).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SEALS).unwrap();
        assert!(matches!(
            Segment::accept(fd, 1 << 20),
            Err(SegmentError::Format(RingError::Magic))
        ));
        let big = Segment::create(1 << 16).unwrap();
        assert!(matches!(
            Segment::accept(dup(&big), 4096),
            Err(SegmentError::Format(RingError::Capacity(_)))
        ));
    }

    /// Minor page faults this thread has taken so far.
    fn minor_faults() -> i64 {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `getrusage` fills the struct it is given.
        assert_eq!(
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) },
            0
        );
        // SAFETY: zeroed, then filled by a successful call.
        unsafe { u.assume_init() }.ru_minflt
    }

    #[test]
    fn a_prefaulted_mapping_takes_no_page_fault_on_either_end() {
        let a = Segment::create(1 << 20).unwrap();
        let b = Segment::accept(dup(&a), 1 << 20).unwrap();
        let pages = a.layout().size() / 4096;
        for seg in [&a, &b] {
            seg.prefault();
            let before = minor_faults();
            for page in 0..pages {
                // SAFETY: every offset is inside the mapping; each byte is written back unchanged.
                unsafe {
                    let p = seg.base.as_ptr().add(page * 4096);
                    p.write_volatile(p.read_volatile());
                }
            }
            let taken = minor_faults() - before;
            // Without `prefault` each end takes a fault per page (517 of these 518).
            assert!(taken < 16, "{taken} faults touching {pages} pages");
        }
    }

    #[test]
    fn a_sealed_segment_cannot_be_shrunk_by_its_peer() {
        let a = Segment::create(4096).unwrap();
        let fd = dup(&a);
        assert!(rustix::fs::ftruncate(&fd, 100).is_err());
    }
}
