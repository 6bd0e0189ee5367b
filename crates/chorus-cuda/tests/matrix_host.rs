//! The GPU tests' collective matrix (tests/common), run through the host engine on every
//! machine: proves the cases, the inputs and the oracle, so that on a GPU a difference can
//! only be the device's.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::thread;

use bytes::Bytes;
use chorus_engine::local::mesh;
use chorus_engine::{Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink};
use chorus_protocol::Rank;
use common::{assert_clean, configs, every_case, large_cases, ring_exchange, sweep};

type HostEngine = Engine<HostDevice, LocalLink<Bytes>>;

fn world(n: u32, config: &EngineConfig) -> Vec<HostEngine> {
    let root = Context::root();
    mesh::<Bytes>(n, HeldLimit::bytes(64 << 20))
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            Engine::new(
                Rank(r as u32),
                n,
                links,
                Arc::new(HostDevice),
                &root,
                config.clone(),
            )
            .unwrap()
        })
        .collect()
}

fn on_every_rank(engines: &[HostEngine], f: impl Fn(&HostEngine) -> Result<(), String> + Sync) {
    let failures: Vec<String> = thread::scope(|s| {
        let hs: Vec<_> = engines.iter().map(|e| s.spawn(|| f(e))).collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    });
    assert_clean(failures);
}

#[test]
fn the_gpu_matrix_passes_on_the_host_engine() {
    for n in [2u32, 4] {
        for config in configs() {
            let engines = world(n, &config);
            let cases = every_case(n);
            on_every_rank(&engines, |e| sweep(e, &cases));
        }
        let engines = world(n, &EngineConfig::default());
        let cases = large_cases(n);
        on_every_rank(&engines, |e| {
            sweep(e, &cases)?;
            ring_exchange(e, 500)
        });
    }
}

#[test]
fn the_matrix_covers_every_collective_dtype_and_reduction() {
    use chorus_protocol::{Collective, DType};
    let cases = every_case(4);
    for c in common::COLLECTIVES {
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
