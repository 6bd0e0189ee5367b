//! The registered buffer pool: small frames are copied into a slot and sent from there.

use io_uring::IoUring;

/// The registered buffer pool.
pub(super) struct Slots {
    mem: Box<[u8]>,
    pub(super) size: usize,
    free: Vec<u16>,
}

impl Slots {
    pub(super) fn new(ring: &IoUring, size: usize, count: u16) -> Slots {
        let size = size.clamp(4096, 1 << 30);
        let mut mem = vec![0u8; size * count as usize].into_boxed_slice();
        let iovecs: Vec<libc::iovec> = mem
            .chunks_exact_mut(size)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr().cast(),
                iov_len: c.len(),
            })
            .collect();
        // SAFETY: the iovecs point into `mem`, which lives in the ring thread next to the ring
        // and is freed only after the ring (see `RingThread::run`'s teardown).
        let registered = !iovecs.is_empty()
            && match unsafe { ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("io_uring buffer registration refused ({e}); using plain ops");
                    false
                }
            };
        let free = if registered {
            (0..count).rev().collect()
        } else {
            Vec::new()
        };
        Slots { mem, size, free }
    }

    pub(super) fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    pub(super) fn give(&mut self, slot: u16) {
        self.free.push(slot);
    }

    pub(super) fn ptr(&mut self, slot: u16) -> *mut u8 {
        self.mem[slot as usize * self.size..].as_mut_ptr()
    }
}
