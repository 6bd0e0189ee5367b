//! Algorithm selection by collective, size and world.
//!
//! Defaults come from the in-process all-reduce benchmark (`benches/engine_allreduce.rs`);
//! see [`crate::config::Thresholds`] for the knobs. Over a real network the latency terms are
//! larger, which moves the crossovers up; the runtime may override them per transport.
//!
//! # Measured crossovers (in-process all-reduce, f32 sum)
//!
//! `cargo bench -p chorus-benches --bench engine_allreduce`, ranks as threads over
//! `chorus_engine::local` links on a shared 2-core machine (so every rank's compute and every
//! hand-off competes for the same two cores: latency terms are thread wake-ups, tens of µs).
//! Time per all-reduce, best algorithm in bold:
//!
//! | ranks | size    | ring     | recursive doubling | halving-doubling |
//! |-------|---------|----------|--------------------|------------------|
//! | 2     | 1 KiB   | 31 µs    | **12 µs**          | 42 µs            |
//! | 2     | 4 KiB   | 27 µs    | **12 µs**          | 22 µs            |
//! | 2     | 64 KiB  | **23 µs**| 27 µs              | 32 µs            |
//! | 2     | 1 MiB   | 182 µs*  | 312 µs             | 173 µs           |
//! | 4     | 16 KiB  | 99 µs    | **29 µs**          | 64 µs            |
//! | 4     | 64 KiB  | 92 µs    | **63 µs**          | 70 µs            |
//! | 4     | 256 KiB | 176 µs   | 127 µs             | **98 µs**        |
//! | 4     | 1 MiB   | 339 µs   | 458 µs             | **228 µs**       |
//! | 4     | 4 MiB   | 2444 µs  | 3338 µs            | **995 µs**       |
//! | 8     | 16 KiB  | 197 µs   | **99 µs**          | 144 µs           |
//! | 8     | 64 KiB  | 218 µs   | **119 µs**         | 146 µs           |
//! | 8     | 256 KiB | 320 µs   | 358 µs             | **193 µs**       |
//! | 8     | 1 MiB   | **768 µs** | 1364 µs          | 920 µs           |
//! | 8     | 4 MiB   | **3597 µs** | 14284 µs        | 6111 µs          |
//!
//! (*: the same ring run through the default selection measured 102 µs; run-to-run noise on
//! this shared machine is up to ±50%.) Hence the defaults: recursive doubling below 64 KiB,
//! halving-doubling from 64 KiB to 1 MiB, the pipelined ring above; in a world of two,
//! halving-doubling degenerates to the ring's exchange with more overhead, so the ring takes
//! over directly. The broadcast/reduce (binomial tree below 256 KiB), all-gather (Bruck
//! below 64 KiB) and reduce-scatter (recursive halving below 1 MiB) crossovers were not
//! measured separately; they follow the same latency-versus-bandwidth argument and the
//! all-reduce figures, and are configuration like the others.

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
