//! Recycled host buffers for the payloads [`crate::host_device::HostDevice`] packs.
//!
//! Every chunk an operation sends is copied into a payload the link owns until the bytes
//! are on the wire. Allocating a fresh chunk-sized buffer each time sends the allocator to
//! the kernel: glibc serves buffers past its mmap threshold with `mmap`, and trims the heap
//! when large buffers are freed, so each chunk pays for its pages again as it is first
//! written (a fault per 4 KiB page; measured at a third of a 2 MiB all-reduce's time at
//! 4 ranks). Buffers here are kept by power-of-two size class and handed out again, so a
//! steady stream of chunks reuses the same warm pages.
//!
//! Bounded: each class keeps at most [`KEEP_BYTES`] (and at least two buffers), the rest
//! go back to the allocator; classes below [`MIN_CLASS`] are not pooled at all (the
//! allocator's own caches serve them well).

use bytes::Bytes;
use parking_lot::Mutex;

/// Smallest pooled buffer, as a power of two (16 KiB).
const MIN_CLASS: u32 = 14;
/// Largest pooled buffer, as a power of two (64 MiB); larger payloads are not pooled.
const MAX_CLASS: u32 = 26;
/// Bytes each size class keeps for reuse.
const KEEP_BYTES: usize = 32 << 20;

const CLASSES: usize = (MAX_CLASS - MIN_CLASS + 1) as usize;

static POOL: [Mutex<Vec<Vec<u8>>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

/// A payload holding a copy of `src`, in a recycled buffer when `src` is large enough.
pub(crate) fn copy(src: &[u8]) -> Bytes {
    let Some(class) = class_of(src.len()) else {
        return Bytes::copy_from_slice(src);
    };
    let mut buf = take(class).unwrap_or_else(|| Vec::with_capacity(size_of_class(class)));
    buf.extend_from_slice(src);
    Bytes::from_owner(Pooled { buf, class })
}

/// The size class of a buffer for `len` bytes, if pooled.
fn class_of(len: usize) -> Option<usize> {
    if !(1 << MIN_CLASS..=1 << MAX_CLASS).contains(&len) {
        return None;
    }
    let bits = usize::BITS - (len - 1).leading_zeros();
    Some((bits.max(MIN_CLASS) - MIN_CLASS) as usize)
}

fn size_of_class(class: usize) -> usize {
    1 << (class + MIN_CLASS as usize)
}

fn take(class: usize) -> Option<Vec<u8>> {
    POOL[class].lock().pop()
}

fn give(class: usize, mut buf: Vec<u8>) {
    buf.clear();
    let size = size_of_class(class);
    let mut free = POOL[class].lock();
    if free.len() < (KEEP_BYTES / size).max(2) {
        free.push(buf);
    }
}

/// A pooled buffer behind a `Bytes`; it returns to its class when the last `Bytes` goes.
struct Pooled {
    buf: Vec<u8>,
    class: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        give(self.class, std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_exact_copies_and_buffers_come_back() {
        for len in [0, 1, 16 << 10, (16 << 10) + 1, 256 << 10, 1 << 20] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let p = copy(&src);
            assert_eq!(&p[..], &src[..], "{len}");
        }
        let class = class_of(256 << 10).unwrap();
        assert_eq!(class_of((128 << 10) + 1), Some(class));
        assert_eq!(class_of(1 << 10), None);
        assert_eq!(class_of((64 << 20) + 1), None);
        // A buffer dropped is the next one handed out: same pages, no new allocation.
        let first = copy(&vec![1u8; 200 << 10]);
        let ptr = first.as_ptr();
        drop(first);
        let second = copy(&vec![2u8; 250 << 10]);
        assert_eq!(second.as_ptr(), ptr);
        assert!(second.iter().all(|&b| b == 2));
        // Slices keep the buffer alive; it returns only when the last one goes.
        let a = copy(&vec![3u8; 100 << 10]);
        let tail = a.slice(50 << 10..);
        drop(a);
        assert!(tail.iter().all(|&b| b == 3));
        drop(tail);
    }

    #[test]
    fn each_class_keeps_a_bounded_number_of_buffers() {
        let class = class_of(64 << 20).unwrap();
        let many: Vec<Bytes> = (0..4).map(|_| copy(&vec![0u8; 64 << 20])).collect();
        drop(many);
        assert!(POOL[class].lock().len() <= 2);
    }
}
