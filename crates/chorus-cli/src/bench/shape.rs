//! How nccl-tests turns a sweep size into counts, and times into bandwidths, per collective
//! (its `*GetCollByteCount` and `*GetBw`), so that chorus's numbers mean what people already
//! read in nccl-tests' tables.
//!
//! - all-reduce, broadcast, reduce, send-recv: `count = size / elt`, send and receive
//!   `count` elements.
//! - all-gather, reduce-scatter, all-to-all: the per-rank block is `size / elt / n`, rounded
//!   down to a multiple of 16 bytes' worth of elements; the printed size is the whole
//!   (`n × block`), the printed count the block.
//! - algbw = printed size / time; busbw = algbw × 2(n−1)/n (all-reduce), × (n−1)/n
//!   (all-gather, reduce-scatter, all-to-all), × 1 (broadcast, reduce, send-recv).

use super::options::Coll;

/// The buffers of one size at one world size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The size nccl-tests prints (bytes).
    pub(crate) size: u64,
    /// The count nccl-tests prints: the count argument of the call.
    pub(crate) count: usize,
    /// Elements in the send buffer.
    pub(crate) send: usize,
    /// Elements in the receive buffer.
    pub(crate) recv: usize,
}

impl Shape {
    pub(crate) fn new(coll: Coll, size: u64, elt: usize, n: u32) -> Shape {
        let (elt64, n64) = (elt as u64, u64::from(n.max(1)));
        let count = (size / elt64) as usize;
        let n = n64 as usize;
        let block = {
            let per = count / n;
            let align = (16 / elt).max(1);
            per - per % align
        };
        let (param, send, recv) = match coll {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
                (count, count, count)
            }
            Coll::AllGather => (block, block, block * n),
            Coll::ReduceScatter => (block, block * n, block),
            Coll::AllToAll => (block, block * n, block * n),
        };
        Shape {
            size: send.max(recv) as u64 * elt64,
            count: param,
            send,
            recv,
        }
    }
}

/// nccl-tests' bus bandwidth factor for `coll` on `n` ranks.
pub(crate) fn bus_factor(coll: Coll, n: u32) -> f64 {
    let n = f64::from(n.max(1));
    match coll {
        Coll::AllReduce => 2.0 * (n - 1.0) / n,
        Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
        Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
    }
}

/// (algbw, busbw) in GB/s (10⁹ B/s) for `size` bytes in `time_us`.
pub(crate) fn bandwidth(coll: Coll, size: u64, time_us: f64, n: u32) -> (f64, f64) {
    if time_us <= 0.0 || !time_us.is_finite() {
        return (0.0, 0.0);
    }
    let algbw = size as f64 / (time_us * 1e-6) / 1e9;
    (algbw, algbw * bus_factor(coll, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests() {
        // all-reduce: 1 MiB of float is 262144 elements each way.
        let s = Shape::new(Coll::AllReduce, 1 << 20, 4, 4);
        assert_eq!(
            (s.size, s.count, s.send, s.recv),
            (1 << 20, 262144, 262144, 262144)
        );
        // all-gather on 4 ranks: a 65536-element block each, 1 MiB received in all.
        let s = Shape::new(Coll::AllGather, 1 << 20, 4, 4);
        assert_eq!(
            (s.size, s.count, s.send, s.recv),
            (1 << 20, 65536, 65536, 262144)
        );
        // reduce-scatter on 3 ranks: 1000 B of float is 250 elements, 83 per rank, aligned
        // down to 80 (16 bytes = 4 floats): 960 B printed.
        let s = Shape::new(Coll::ReduceScatter, 1000, 4, 3);
        assert_eq!((s.size, s.count, s.send, s.recv), (960, 80, 240, 80));
        // all-to-all: both buffers hold n blocks.
        let s = Shape::new(Coll::AllToAll, 4096, 8, 4);
        assert_eq!((s.size, s.count, s.send, s.recv), (4096, 128, 512, 512));
        // too small to give every rank a block: a zero-size row, as nccl-tests prints.
        let s = Shape::new(Coll::AllGather, 8, 4, 4);
        assert_eq!((s.size, s.count), (0, 0));
    }

    #[test]
    fn bus_bandwidth_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(Coll::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Coll::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(Coll::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Coll::ReduceScatter, 2), 0.5);
        assert_eq!(bus_factor(Coll::AllToAll, 8), 0.875);
        assert_eq!(bus_factor(Coll::Broadcast, 4), 1.0);
        assert_eq!(bus_factor(Coll::Reduce, 4), 1.0);
        assert_eq!(bus_factor(Coll::SendRecv, 4), 1.0);
        let (alg, bus) = bandwidth(Coll::AllReduce, 1_000_000, 1000.0, 4);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 1.5).abs() < 1e-12);
        assert_eq!(bandwidth(Coll::AllReduce, 8, 0.0, 4), (0.0, 0.0));
    }
}
