//! Algorithm selection by collective, size and world.
//!
//! Defaults come from the in-process all-reduce benchmark (`benches/engine_allreduce.rs`);
//! see [`crate::config::Thresholds`] for the knobs. Over a real network the latency terms are
//! larger, which moves the crossovers up; the runtime may override them per transport.
//!
//! MEASUREMENTS

use chorus_protocol::Collective;

use crate::config::{Algorithm, EngineConfig};

/// The algorithm for `collective` on a buffer of `bytes` (as [`crate::config::Thresholds`]
/// measures it) in a world of `world` ranks.
pub fn select(
    collective: Collective,
    bytes: usize,
    world: u32,
    config: &EngineConfig,
) -> Algorithm {
    if world <= 1 {
        return Algorithm::Local;
    }
    let o = &config.overrides;
    let t = &config.thresholds;
    let small = |below: usize, fast: Algorithm| {
        if bytes < below { fast } else { Algorithm::Ring }
    };
    match collective {
        Collective::AllReduce => o
            .all_reduce
            .unwrap_or(if bytes < t.all_reduce_doubling_below {
                Algorithm::RecursiveDoubling
            } else if bytes < t.all_reduce_halving_below {
                Algorithm::HalvingDoubling
            } else {
                Algorithm::Ring
            }),
        Collective::Reduce => o
            .reduce
            .unwrap_or_else(|| small(t.tree_below, Algorithm::BinomialTree)),
        Collective::Broadcast => o
            .broadcast
            .unwrap_or_else(|| small(t.tree_below, Algorithm::BinomialTree)),
        Collective::AllGather => o
            .all_gather
            .unwrap_or_else(|| small(t.all_gather_bruck_below, Algorithm::Bruck)),
        Collective::ReduceScatter => o
            .reduce_scatter
            .unwrap_or_else(|| small(t.reduce_scatter_halving_below, Algorithm::HalvingDoubling)),
        Collective::AllToAll => Algorithm::Pairwise,
        Collective::Gather | Collective::Scatter => Algorithm::Linear,
        Collective::Barrier => Algorithm::Dissemination,
        Collective::SendRecv => Algorithm::Direct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_pick_latency_or_bandwidth_algorithms() {
        let c = EngineConfig::default();
        assert_eq!(
            select(Collective::AllReduce, 64, 8, &c),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 64 << 20, 8, &c),
            Algorithm::Ring
        );
        assert_eq!(
            select(Collective::AllReduce, 64 << 20, 1, &c),
            Algorithm::Local
        );
        assert_eq!(
            select(Collective::Broadcast, 8, 5, &c),
            Algorithm::BinomialTree
        );
        let mut forced = c.clone();
        forced.overrides.all_reduce = Some(Algorithm::HalvingDoubling);
        assert_eq!(
            select(Collective::AllReduce, 1, 3, &forced),
            Algorithm::HalvingDoubling
        );
    }

    #[test]
    fn every_choice_implements_its_collective() {
        let c = EngineConfig::default();
        for coll in Collective::ALL {
            for bytes in [0, 1 << 10, 1 << 16, 1 << 20, 1 << 26] {
                for world in [2, 3, 8, 16] {
                    let a = select(coll, bytes, world, &c);
                    assert!(Algorithm::for_collective(coll).contains(&a), "{coll} {a}");
                }
            }
        }
    }
}
