//! Single-thread memcpy bandwidth: the ceiling for any reduction that reads and writes
//! host memory from one core, which is what each rank of every system here does.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::peer::sweep::Bytes;

/// Copy bandwidth at one size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemcpyPoint {
    pub size: Bytes,
    /// Bytes copied per second, in GB/s (10^9 B/s): each byte is read once and written once.
    pub gbs: f64,
}

/// Copies `size` bytes between two buffers as many times as fit in `budget` (at least
/// three), for each size, and reports the rate. Buffers are touched first so that page
/// faults are not timed.
pub fn measure_memcpy(sizes: &[Bytes], budget: Duration) -> Vec<MemcpyPoint> {
    let Some(max) = sizes.iter().map(|s| s.0).max() else {
        return Vec::new();
    };
    let Ok(len) = usize::try_from(max) else {
        return Vec::new();
    };
    let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut dst = vec![1u8; len];
    sizes
        .iter()
        .filter_map(|&size| {
            let n = usize::try_from(size.0).ok()?;
            Some(MemcpyPoint {
                size,
                gbs: rate(&src[..n], &mut dst[..n], budget),
            })
        })
        .collect()
}

fn rate(src: &[u8], dst: &mut [u8], budget: Duration) -> f64 {
    // Small copies are timed in batches, so the clock is not what is measured.
    let batch = (1 << 20) / src.len().max(1) + 1;
    dst.copy_from_slice(black_box(src));
    let started = Instant::now();
    let mut copies: u64 = 0;
    loop {
        for _ in 0..batch {
            dst.copy_from_slice(black_box(src));
            black_box(&mut *dst);
        }
        copies += batch as u64;
        let elapsed = started.elapsed();
        if elapsed >= budget && copies >= 3 {
            return (copies as f64 * src.len() as f64) / elapsed.as_secs_f64() / 1e9;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_gets_a_positive_rate() {
        let sizes = [Bytes(8), Bytes(4096), Bytes(1 << 20)];
        let points = measure_memcpy(&sizes, Duration::from_millis(5));
        assert_eq!(points.iter().map(|p| p.size).collect::<Vec<_>>(), sizes);
        assert!(
            points.iter().all(|p| p.gbs.is_finite() && p.gbs > 0.0),
            "{points:?}"
        );
    }

    #[test]
    fn no_sizes_no_points() {
        assert!(measure_memcpy(&[], Duration::from_millis(1)).is_empty());
    }
}
