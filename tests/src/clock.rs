//! `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the host, so the time a
//! fault was injected here and the time a rank saw it there can be subtracted.

/// Now, in nanoseconds of `CLOCK_MONOTONIC`.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds from `from` to `to` (both `mono_ns`), negative if `to` is earlier.
pub fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}
