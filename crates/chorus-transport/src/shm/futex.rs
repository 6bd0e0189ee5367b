//! Sleeping on a word of the segment: `futex` wait and wake on shared (not process-private)
//! memory, so either process can wake the other.
//!
//! Every wait is bounded: the caller passes its timeout, and a wait never outlives it
//! (a peer that never rings does not hold a thread forever).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Sleeps while `word` holds `seen`, at most `timeout`. Returns early on a wake, on a
/// change of the word, or on a signal; the caller re-checks what it waits for.
pub(crate) fn wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = futex::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // EAGAIN (the word moved), ETIMEDOUT and EINTR all mean: look again.
    let _ = futex::wait(word, futex::Flags::empty(), seen, Some(&ts));
}

/// Wakes every thread (of any process) sleeping on `word`.
pub(crate) fn wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), u32::MAX);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_wait_ends_at_its_timeout_or_at_once_on_a_wake() {
        let w = AtomicU32::new(0);
        let t = Instant::now();
        wait(&w, 0, Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(25));
        let t = Instant::now();
        wait(&w, 1, Duration::from_secs(5));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a moved word returns at once"
        );

        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.fetch_add(1, Ordering::SeqCst);
            wake(&w2);
        });
        let t = Instant::now();
        wait(&w, 0, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        waker.join().unwrap();
    }
}
