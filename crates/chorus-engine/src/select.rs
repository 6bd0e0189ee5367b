//! Algorithm selection by collective, size and world.
//!
//! The all-reduce defaults come from ranks as processes over real TCP links (the data-plane
//! benchmark, `benches/benches/dataplane`), which is where they matter: there the latency
//! terms are socket round trips and the bandwidth terms are copies through the kernel, and
//! the crossovers sit higher than between threads (`benches/engine_allreduce.rs`, kept for
//! the in-process picture).
//!
//! # Measured crossovers (loopback TCP, io_uring, f32 sum, median of 3 interleaved runs)
//!
//! `cargo bench -p chorus-benches --bench dataplane -- case -n N -b S -e S --algo A`, on a
//! 2-core machine shared with other builds (load average 6–7, so ±50% run to run); wall
//! time per all-reduce, best in bold:
//!
//! | ranks | size    | ring        | recursive doubling | halving-doubling |
//! |-------|---------|-------------|--------------------|------------------|
//! | 2     | 16 KiB  | 28 µs       | **5 µs**           | 29 µs            |
//! | 2     | 64 KiB  | 35 µs       | **30 µs**          | 37 µs            |
//! | 2     | 256 KiB | 91–144 µs   | **55–71 µs**       | 94–147 µs        |
//! | 2     | 1 MiB   | 830 µs      | 778 µs             | 1003 µs          |
//! | 2     | 4 MiB   | **1060 µs** | 3134 µs            | 2617 µs          |
//! | 2     | 16 MiB  | **6.3 ms**  | 20.9 ms            |                  |
//! | 4     | 64 KiB  | 301 µs      | 299 µs             | **175 µs**       |
//! | 4     | 256 KiB | 1235 µs     | 951 µs             | **476 µs**       |
//! | 4     | 1 MiB   | 3878 µs     | 3863 µs            | **1318 µs**      |
//! | 4     | 2 MiB   | 4325 µs     |                    | **3488 µs**      |
//! | 4     | 4 MiB   | **7.6 ms**  | 22.6 ms            | 12.8 ms          |
//! | 4     | 8 MiB   | **17.7 ms** |                    | 20.2 ms          |
//!
//! A second series through the whole stack (`chorus bench all-reduce -n 4 -w 5 -i 30
//! --transport tcp` with `CHORUS_ALGO=all-reduce=ring|halving-doubling`, three interleaved
//! rounds, a quieter machine) moved the 4-rank crossover down: in-place µs per call,
//!
//! | ranks | size | ring | halving-doubling |
//! |-------|------|------|------------------|
//! | 4 | 512 KiB | 404–565 | **263–271** |
//! | 4 | 1 MiB | 844–914 | **744–758** |
//! | 4 | 2 MiB | **1802–2151** | 2203–2361 |
//! | 4 | 4 MiB | **4071–5029** | 4805–5560 |
//! | 4 | 8 MiB | **8910–9480** | 11259–12038 |
//!
//! A third series, 2026-12-01 (after the TCP close change; same command, in-place µs per
//! call, three interleaved rounds of `-w 3 -i 15`, other builds running, load 1.6–4),
//! moved it up again: with four ranks on two cores every one of the ring's 2(n−1) = 6
//! dependent steps waits for a descheduled rank, against halving-doubling's 2 log n = 4,
//! and below 8 MiB that outweighs the ring's smaller volume per step:
//!
//! | ranks | size | ring | halving-doubling |
//! |-------|------|------|------------------|
//! | 4 | 2 MiB | 8408 / 9057 / 9734 | **5781 / 5427 / 7537** |
//! | 4 | 4 MiB | 18224 / 16739 / 19194 | **13071 / 12295 / 12141** |
//! | 4 | 8 MiB | 26961 / 22706 / 27747 | 25881 / 27286 / 24352 |
//! | 4 | 16 MiB | **45474 / 50735 / 39069** | 48729 / 49337 / 50197 |
//!
//! (`for a in ring halving-doubling; do CHORUS_ALGO=all-reduce=$a flock /work/bench.lock
//! chorus bench all-reduce --transport tcp -n 4 -b 2M -e 8M -f 2 -w 3 -i 15; done`, and
//! `-b 2M -e 16M -f 8` for 16 MiB; out of place the margin is wider still, 16 MiB
//! included: 52–57 ms against 57–78 ms.)
//!
//! A fourth series, 2026-12-02, for the pair crossover, moved it down from 1 MiB to 256 KiB.
//! Across two network namespaces joined by a veth pair (the path TCP is for, now that peers
//! on one host use shm) the ring beat recursive doubling by 2–5× from 256 KiB; on shm it
//! won from 32 KiB; on loopback TCP it lost by 1.1–1.4× at 128–256 KiB and won from
//! 512 KiB. In-place µs per call, medians of 5–6 interleaved rounds, `-w 5 -i 30`, load
//! 2–7 (other builds and profilers running):
//!
//! | ranks | path | size | recursive doubling | ring |
//! |-------|------|------|--------------------|------|
//! | 2 | veth | 64 KiB | **40** | 53 |
//! | 2 | veth | 128 KiB | 65–179 | 64–70 |
//! | 2 | veth | 256 KiB | 255–509 | **97–103** |
//! | 2 | veth | 512 KiB | 486–909 | **246–297** |
//! | 2 | veth | 1 MiB | 992–1390 | **528–732** |
//! | 2 | shm | 128 KiB | 27 | **17** |
//! | 2 | shm | 256 KiB | 53 | **38** |
//! | 2 | shm | 512 KiB | 100 | **44** |
//! | 2 | loopback | 256 KiB | **84–214** | 116–230 |
//! | 2 | loopback | 512 KiB | 332–690 | **174–356** |
//!
//! (`CHORUS_ALGO=all-reduce=recursive-doubling|ring chorus bench all-reduce -n 2 -b 64K -e
//! 1M -w 5 -i 30 --transport tcp|shm`, alternated in rounds under the bench lock;
//! across namespaces one rank per namespace with `--nnodes 2`, as `benches/peer/netns.sh`
//! runs it.)
//!
//! Hence: in a world of two, recursive doubling (a single pipelined exchange) below 256 KiB
//! and the ring from there (it reduces half as much and its two phases pipeline by chunk);
//! in larger worlds recursive doubling below 64 KiB, halving-doubling below 8 MiB, the ring
//! above. The broadcast/reduce (binomial tree below 256 KiB), all-gather (Bruck below
//! 64 KiB) and reduce-scatter (recursive halving below 1 MiB) crossovers were not measured
//! separately; they follow the same latency-versus-bandwidth argument and are configuration
//! like the others.
//!
//! A fifth series, 2026-12-02, on shared memory at 4 ranks (2 cores), in place, GB/s, four
//! alternating rounds at load 4–11 (`CHORUS_ALGO=all-reduce=… chorus bench all-reduce -n 4
//! --transport shm -b 256K -e 4M -f 2 -w 5 -i 30`):
//!
//! | size | ring | halving-doubling | recursive doubling |
//! |---|---|---|---|
//! | 256 KiB | **2.10** | 1.57 | 1.13 |
//! | 512 KiB | **2.35** | 1.82 | 0.98 |
//! | 1 MiB | **1.93** | 1.37 | 1.12 |
//! | 2 MiB | **2.00** | 1.37 | 0.94 |
//! | 4 MiB | **2.10** | 1.34 | 0.75 |
//!
//! (out of place the ring won from 512 KiB, 1.64–1.79 against 0.90–1.45). With no network
//! under it a step is a copy and a wake-up, not a round trip, so the ring's longer chain
//! costs little and its single neighbour keeps each copy streaming. A world whose links all
//! share memory therefore takes the ring from 256 KiB ([`Thresholds::shared_memory`], applied
//! by the runtime when every link of an epoch is shm); a mixed world keeps the network's.

use chorus_protocol::Collective;

#[cfg(doc)]
use crate::config::Thresholds;
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
        Collective::AllReduce if world == 2 => {
            o.all_reduce
                .unwrap_or(if bytes < t.all_reduce_pair_doubling_below {
                    Algorithm::RecursiveDoubling
                } else {
                    Algorithm::Ring
                })
        }
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
        // A world of two has no halving-doubling step: one exchange, then the ring.
        assert_eq!(
            select(Collective::AllReduce, 128 << 10, 2, &c),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 256 << 10, 4, &c),
            Algorithm::HalvingDoubling
        );
        // The measured pair crossover (module docs): the ring from 256 KiB.
        assert_eq!(
            select(Collective::AllReduce, (256 << 10) - 4, 2, &c),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 256 << 10, 2, &c),
            Algorithm::Ring
        );
        // The measured 4-rank crossover (module docs): halving-doubling to 8 MiB.
        assert_eq!(
            select(Collective::AllReduce, 4 << 20, 4, &c),
            Algorithm::HalvingDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, (8 << 20) - 4, 4, &c),
            Algorithm::HalvingDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 8 << 20, 4, &c),
            Algorithm::Ring
        );
        // Over shared memory (module docs): the ring from 256 KiB, the rest unchanged.
        let shm = EngineConfig {
            thresholds: c.thresholds.clone().shared_memory(),
            ..EngineConfig::default()
        };
        assert_eq!(
            select(Collective::AllReduce, (256 << 10) - 4, 4, &shm),
            Algorithm::HalvingDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 256 << 10, 4, &shm),
            Algorithm::Ring
        );
        assert_eq!(
            select(Collective::AllReduce, 8, 4, &shm),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(
            select(Collective::AllReduce, 128 << 10, 2, &shm),
            Algorithm::RecursiveDoubling
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
