//! The GPU tests' collective matrix (`chorus_engine::testkit`), run through the host engine
//! on every machine: proves the cases, the inputs and the oracle, so that on a GPU a
//! difference can only be the device's.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chorus_engine::EngineConfig;
use chorus_engine::testkit::{
    Host, HostEngine, assert_clean, collectives, every_case, large_cases, matrix_configs,
    ring_exchange, run_world, sweep,
};

/// Bound on one world's run of the matrix.
const LIMIT: Duration = Duration::from_secs(240);

fn on_every_rank(
    n: u32,
    config: EngineConfig,
    f: impl Fn(&HostEngine) -> Result<(), String> + Send + Sync,
) {
    let failures = run_world(n, &[config], LIMIT, |engines| f(&engines[0]).err());
    assert_clean(failures.into_iter().flatten().collect());
}

#[test]
fn the_gpu_matrix_passes_on_the_host_engine() {
    for n in [2u32, 4] {
        let cases = every_case(n);
        for config in matrix_configs() {
            on_every_rank(n, config, |e| sweep(&Host, e, &cases));
        }
        let cases = large_cases(n);
        on_every_rank(n, EngineConfig::default(), |e| {
            sweep(&Host, e, &cases)?;
            ring_exchange(&Host, e, 500)
        });
    }
}

#[test]
fn the_matrix_covers_every_collective_dtype_and_reduction() {
    use chorus_protocol::{Collective, DType};
    let cases = every_case(4);
    for c in collectives() {
        for d in DType::ALL {
            let with: Vec<_> = cases
                .iter()
                .filter(|k| k.collective == c && k.dtype == d)
                .collect();
            let want = if matches!(
                c,
                Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
            ) {
                6
            } else {
                1
            };
            assert_eq!(with.len(), want, "{c} over {d}");
        }
    }
    assert!(cases.iter().any(|k| k.in_place) && cases.iter().any(|k| !k.in_place));
}
