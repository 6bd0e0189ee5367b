//! Engine configurations that force one algorithm per collective.

use crate::{Algorithm, EngineConfig, Overrides};

/// One config forcing `algos` (`[all-reduce, reduce, broadcast, all-gather, reduce-scatter]`).
pub fn forced(algos: [Algorithm; 5], chunk_bytes: usize, depth: usize) -> EngineConfig {
    EngineConfig {
        chunk_bytes,
        pipeline_depth: depth,
        overrides: Overrides {
            all_reduce: Some(algos[0]),
            reduce: Some(algos[1]),
            broadcast: Some(algos[2]),
            all_gather: Some(algos[3]),
            reduce_scatter: Some(algos[4]),
        },
        ..EngineConfig::default()
    }
}

/// The three forced configurations the matrix runs: every algorithm appears in one, with
/// small chunks and shallow pipelines so that small counts still pipeline and hit flow
/// control.
pub fn matrix_configs() -> Vec<EngineConfig> {
    use Algorithm::*;
    vec![
        forced([Ring, Ring, Ring, Ring, Ring], 256, 2),
        forced(
            [
                RecursiveDoubling,
                BinomialTree,
                BinomialTree,
                Bruck,
                HalvingDoubling,
            ],
            512,
            3,
        ),
        forced([HalvingDoubling, Ring, BinomialTree, Ring, Ring], 4096, 8),
    ]
}
