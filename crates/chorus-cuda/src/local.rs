//! Several ranks on one GPU as threads of this process: every pair joined by a device link.
//!
//! Streams: each rank has a main stream and two per link, so N ranks make N(2N - 1) streams
//! (28 at four ranks), more than the 8 hardware queues a context gets by default. That is
//! safe (no device wait is queued ahead of the work that ends it: `credit.rs`), but streams
//! sharing a queue run one after another; `CUDA_DEVICE_MAX_CONNECTIONS=32`, set before the
//! process starts, gives the links of up to four ranks queues of their own.

use std::os::unix::net::UnixStream;

use chorus_protocol::Rank;

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::link::{DeviceLink, LinkConfig};

/// Connect `devices.len()` ranks (rank `i` on `devices[i]`) pairwise. Returns, for each rank,
/// its links to every other rank in rank order (the link to rank `j` from rank `i` is at
/// index `j` if `j < i`, else `j - 1`; [`peer_index`] computes it).
pub fn connect_all(
    devices: &[CudaDevice],
    config: &LinkConfig,
) -> Result<Vec<Vec<DeviceLink>>, CudaError> {
    let n = devices.len();
    let mut links: Vec<Vec<Option<DeviceLink>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = UnixStream::pair().map_err(|e| CudaError::Link {
                peer: Rank(j as u32),
                detail: format!("socketpair: {e}"),
            })?;
            let (ri, rj) = (Rank(i as u32), Rank(j as u32));
            // Both ends handshake at once; the other end runs on a scoped thread.
            let (left, right) = std::thread::scope(|s| {
                let other = s.spawn(|| DeviceLink::connect(&devices[j], rj, ri, b, config));
                let here = DeviceLink::connect(&devices[i], ri, rj, a, config);
                let there = other.join().unwrap_or_else(|_| {
                    Err(CudaError::Link {
                        peer: ri,
                        detail: "the connecting thread panicked".into(),
                    })
                });
                (here, there)
            });
            links[i][j] = Some(left?);
            links[j][i] = Some(right?);
        }
    }
    Ok(links
        .into_iter()
        .map(|row| row.into_iter().flatten().collect())
        .collect())
}

/// Where rank `me`'s link to `peer` sits in its row from [`connect_all`].
pub fn peer_index(me: usize, peer: usize) -> usize {
    if peer < me { peer } else { peer - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_skip_the_rank_itself() {
        assert_eq!(peer_index(0, 1), 0);
        assert_eq!(peer_index(2, 0), 0);
        assert_eq!(peer_index(2, 3), 2);
        assert_eq!(peer_index(3, 2), 2);
    }
}
