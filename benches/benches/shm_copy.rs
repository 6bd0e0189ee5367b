//! Single copy (CMA, `process_vm_readv`) against the pipelined shm ring, side by side in one
//! run: what issue 16 asks to evaluate before keeping either for large messages.
//!
//! ```sh
//! cargo bench -p chorus-benches --bench shm_copy
//! ```
//!
//! Both move one message of `size` bytes from a sender thread to a receiver thread, the
//! sender's buffer being reusable when the transfer ends (as a link's send must allow):
//! - `ring`: the shm link's path. The sender copies 64 KiB pieces into a 4 MiB ring (the
//!   link's default when the figures below were taken; 2 MiB since, see
//!   `TransportConfig::shm_ring`) and publishes each piece's tail; the receiver copies each piece out as it appears and
//!   publishes its head. Two copies, overlapped.
//! - `cma`: Open MPI's CMA path. The sender publishes its buffer's address; the receiver
//!   copies it with one `process_vm_readv` and acknowledges, which frees the buffer. One
//!   copy, by the kernel, plus the round trip of the acknowledgement.
//!
//! Threads of one process stand in for two processes: `process_vm_readv` on our own pid
//! takes the same kernel path (pin the remote pages, copy), and the ring is the same bytes.
//!
//! Each size runs twice: with a `cold` source (written once, so the receiver never waits on
//! the sender's core for it) and a `hot` one (rewritten before each message, as an
//! all-reduce's sender has just reduced what it sends). The sender and the receiver are
//! pinned to different CPUs, as two ranks on an idle machine run.
//!
//! On this project's 2-core AMD EPYC VM (Linux 6.18) the comparison does not hold still.
//! Two runs of the whole bench on 2026-12-05, three minutes apart (19:18 and 19:21 UTC,
//! load average ~1.7, nothing else running), medians, one direction:
//!
//! | size | ring, cold | cma, cold | ring, hot | cma, hot |
//! |---:|---:|---:|---:|---:|
//! | 64 KiB | 1.7 / 11.4 µs | 6.1 / 6.4 µs | 2.3 / 22.8 µs | 14.9 / 42.5 µs |
//! | 256 KiB | 6.7 / 39.9 µs | 20.4 / 21.6 µs | 43.1 / 9.4 µs | 157 / 52.2 µs |
//! | 1 MiB | 30.7 / 152 µs | 83.1 / 83.5 µs | 429 / 43.3 µs | 601 / 605 µs |
//! | 16 MiB | 1.63 / 2.78 ms | 3.60 / 3.82 ms | 2.14 / 2.74 ms | 4.69 / 4.70 ms |
//!
//! With a cold source the single copy's times repeat within 6 % and the ring's move by up
//! to 6.7×: the single copy won by 1.8× up to 1 MiB in the second run (and lost by 1.4× at
//! 16 MiB), and lost by 2.2–3.6× at every size in the first. With a hot source both move
//! (the ring's by up to 10×, the single copy's by up to 3×). Pinning did not remove the
//! swing. Presumably the VM's two CPUs do not keep the same place on the host's cores (the
//! ring's copies are cross-core traffic, a single copy mostly is not), but nothing here
//! shows it. Earlier figures (2026-12-01 under a
//! load average of ~20; 2026-12-05 18:00 and 18:20 UTC) are not kept: the first two ran
//! unpinned, and the third pinned both threads to one CPU from the second measurement on
//! (the CPU count it used, `available_parallelism`, shrank to one once the measuring
//! thread was pinned).
//!
//! What does decide on this machine is a real job. Open MPI's 4-rank shared-memory
//! all-reduce of 2 MiB here took 698–743 µs with its default single-copy mechanism (CMA)
//! and 1078–1106 µs with `--mca btl_vader_single_copy_mechanism none` (two interleaved
//! rounds each), the latter the same as chorus's ring (1218–1263 µs in the same hour). A
//! single copy halves the CPU work per byte, which is what counts when ranks outnumber
//! cores; that is the case it would be built for. Rerun this where the choice is made
//! again, twice.

#![allow(
    clippy::unwrap_used,
    reason = "a benchmark: a failed set-up is a failed run"
)]

use std::cell::UnsafeCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const CAPACITY: usize = 4 << 20;
const PIECE: usize = 64 << 10;
const SIZES: [usize; 4] = [64 << 10, 256 << 10, 1 << 20, 16 << 20];

/// Bytes two threads share, each side touching only the spans the indices give it.
struct Shared(UnsafeCell<Vec<u8>>);

// SAFETY: the ring protocol gives each byte to one thread at a time (the producer writes
// only `[tail, head + CAPACITY)`, the consumer reads only `[head, tail)`, with
// release/acquire on the indices), and the CMA sender does not touch its buffer between
// publishing it and reading the acknowledgement.
unsafe impl Sync for Shared {}

impl Shared {
    fn new(len: usize, fill: u8) -> Self {
        Shared(UnsafeCell::new(vec![fill; len]))
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: only the pointer is taken; accesses follow the protocol above.
        unsafe { (*self.0.get()).as_mut_ptr() }
    }
}

/// Pins the calling thread to CPU `cpu` (modulo the CPUs there are). The sender and the
/// receiver are pinned to different CPUs, as two ranks on an idle machine run: left to the
/// scheduler, two threads of one process often share a core, where every copy stays in one
/// cache and the figures swing by 10× from one run to the next.
///
/// The CPUs counted are those the process could run on before the first pin (so a cpuset
/// that excludes CPU 0 still gets two of its own, and a thread already pinned does not
/// narrow the choice); a failed pin fails the run rather than measure unpinned.
fn pin_to(cpu: usize) {
    static ALLOWED: OnceLock<Vec<usize>> = OnceLock::new();
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let ids = ALLOWED.get_or_init(|| {
        // SAFETY: a zeroed `cpu_set_t` is a valid empty set, `size` bytes long, which the
        // call fills.
        let allowed = unsafe {
            let mut allowed: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, size, &mut allowed),
                0,
                "sched_getaffinity"
            );
            allowed
        };
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `i` is below the set's size.
            .filter(|&i| unsafe { libc::CPU_ISSET(i, &allowed) })
            .collect()
    });
    // SAFETY: as above; the call only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(ids[cpu % ids.len()], &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Waits for `cond`, spinning a little and then yielding (the machine may be crowded).
fn wait_until(cond: impl Fn() -> bool) {
    let mut tries = 0u32;
    while !cond() {
        tries += 1;
        if tries < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// `iters` messages of `size` bytes through the ring; the time from the first byte in to
/// the last byte out of each, summed.
fn ring(iters: u64, size: usize, source: Source) -> Duration {
    let ring = Shared::new(CAPACITY, 0);
    let (head, tail) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut src = vec![7u8; size];
    let mut dst = vec![0u8; size];
    let start = Instant::now();
    std::thread::scope(|s| {
        pin_to(1);
        s.spawn(|| {
            pin_to(0);
            let mut t = 0u64;
            for i in 0..iters {
                if source == Source::Hot {
                    src.fill(source.byte(i));
                }
                let mut sent = 0;
                while sent < size {
                    let free = CAPACITY - (t - head.load(Ordering::Acquire)) as usize;
                    let n = free.min(PIECE).min(size - sent);
                    if n == 0 {
                        wait_until(|| {
                            CAPACITY - (t - head.load(Ordering::Acquire)) as usize >= PIECE
                        });
                        continue;
                    }
                    copy_in(&ring, t, &src[sent..sent + n]);
                    t += n as u64;
                    sent += n;
                    tail.store(t, Ordering::Release);
                }
            }
        });
        let mut h = 0u64;
        for _ in 0..iters {
            let mut got = 0;
            while got < size {
                let ready = (tail.load(Ordering::Acquire) - h) as usize;
                if ready == 0 {
                    wait_until(|| tail.load(Ordering::Acquire) != h);
                    continue;
                }
                let n = ready.min(PIECE).min(size - got);
                copy_out(&ring, h, &mut dst[got..got + n]);
                h += n as u64;
                got += n;
                head.store(h, Ordering::Release);
            }
        }
    });
    let last = source.byte(iters - 1);
    assert!(dst.iter().all(|&b| b == last));
    start.elapsed()
}

fn copy_in(ring: &Shared, at: u64, bytes: &[u8]) {
    let off = (at % CAPACITY as u64) as usize;
    let first = bytes.len().min(CAPACITY - off);
    // SAFETY: `[at, at + len)` is the producer's (free) span; both pieces lie inside the ring.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.ptr().add(off), first);
        std::ptr::copy_nonoverlapping(bytes.as_ptr().add(first), ring.ptr(), bytes.len() - first);
    }
}

fn copy_out(ring: &Shared, at: u64, out: &mut [u8]) {
    let off = (at % CAPACITY as u64) as usize;
    let first = out.len().min(CAPACITY - off);
    // SAFETY: `[at, at + len)` is published and not yet consumed; both pieces lie inside.
    unsafe {
        std::ptr::copy_nonoverlapping(ring.ptr().add(off), out.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(ring.ptr(), out.as_mut_ptr().add(first), out.len() - first);
    }
}

/// `iters` messages of `size` bytes by `process_vm_readv` from the sender's buffer, each
/// acknowledged before the sender may reuse it.
fn cma(iters: u64, size: usize, source: Source) -> Duration {
    let src = Shared::new(size, 7);
    let (posted, taken) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut dst = vec![0u8; size];
    let pid = std::process::id() as libc::pid_t;
    let start = Instant::now();
    std::thread::scope(|s| {
        pin_to(1);
        s.spawn(|| {
            pin_to(0);
            for i in 1..=iters as usize {
                if source == Source::Hot {
                    // SAFETY: the receiver acknowledged the previous message, so the buffer
                    // is the sender's alone until it posts this one.
                    unsafe { std::ptr::write_bytes(src.ptr(), source.byte(i as u64 - 1), size) };
                }
                posted.store(i, Ordering::Release);
                wait_until(|| taken.load(Ordering::Acquire) == i);
            }
        });
        for i in 1..=iters as usize {
            wait_until(|| posted.load(Ordering::Acquire) == i);
            let local = libc::iovec {
                iov_base: dst.as_mut_ptr().cast(),
                iov_len: size,
            };
            let remote = libc::iovec {
                iov_base: src.ptr().cast(),
                iov_len: size,
            };
            // SAFETY: both iovecs describe live buffers of `size` bytes; the kernel checks
            // the remote one against our own address space.
            let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            assert_eq!(n, size as isize, "{}", std::io::Error::last_os_error());
            taken.store(i, Ordering::Release);
        }
    });
    let last = source.byte(iters - 1);
    assert!(dst.iter().all(|&b| b == last));
    start.elapsed()
}

/// Where the sender's bytes are when a message starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Written once before the run: clean in every cache, so the receiver's reads never wait
    /// on the sender's core.
    Cold,
    /// Rewritten by the sender before each message, as an all-reduce's sender has just
    /// reduced what it sends: the receiver's reads pull modified lines from the other core.
    Hot,
}

impl Source {
    /// The byte every position of message `i` holds.
    fn byte(self, i: u64) -> u8 {
        match self {
            Source::Cold => 7,
            Source::Hot => (i % 251) as u8 + 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Source::Cold => "cold",
            Source::Hot => "hot",
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("shm_copy");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    for source in [Source::Cold, Source::Hot] {
        for size in SIZES {
            g.throughput(Throughput::Bytes(size as u64));
            let id = |path: &str| BenchmarkId::new(format!("{path}/{}", source.name()), size);
            g.bench_with_input(id("ring"), &size, |b, &n| {
                b.iter_custom(|iters| ring(iters, n, source));
            });
            g.bench_with_input(id("cma"), &size, |b, &n| {
                b.iter_custom(|iters| cma(iters, n, source));
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
