//! GPU tests of the staged path: every collective x dtype x reduction of the engine on
//! device memory with its payloads staged through pinned host memory over host links
//! (`StagedLink` over the engine's in-process `LocalLink<Bytes>`, as it runs over tcp, quic
//! or shm), at 2 and 4 ranks; parts small enough that every payload is cut many times; and
//! an abort while a rank waits on a peer that never sends, which must end the operation and
//! leave every stream drained. Without a GPU each test returns after one line (per process)
//! saying what was skipped and why; the schedule itself is tested on the CPU
//! (`chorus_cuda::staging`).

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_cuda::testing::{OnGpu, block_on, gpu_or_skip};
use chorus_cuda::{CudaDevice, StagedConfig, StagedLink};
use chorus_engine::link::{CancelReason, Link};
use chorus_engine::local::mesh;
use chorus_engine::testkit::{every_case, large_cases, matrix_configs, sweep};
use chorus_engine::{
    AbortReason, Buffer, Context, Engine, EngineConfig, HeldLimit, LocalLink, Reduction,
};
use chorus_protocol::{CloseCode, DType, Rank};

const T: Duration = Duration::from_secs(20);
const LIMIT: Duration = Duration::from_secs(90);

type Staged = Engine<CudaDevice, StagedLink>;

/// Parts of 4 KiB, two slots: a 256 KiB engine chunk crosses in 64 parts.
fn small() -> StagedConfig {
    StagedConfig {
        chunk_bytes: 4 << 10,
        depth: 2,
        ..StagedConfig::default()
    }
}

struct World {
    engines: Vec<Staged>,
    host: Vec<Vec<Arc<LocalLink<Bytes>>>>,
}

impl World {
    fn new(devices: &[CudaDevice], staged: &StagedConfig, config: &EngineConfig) -> World {
        let n = devices.len() as u32;
        let host = mesh::<Bytes>(n, HeldLimit::default());
        let root = Context::root();
        let engines = devices
            .iter()
            .zip(&host)
            .enumerate()
            .map(|(r, (dev, row))| {
                let links = row.iter().map(|l| {
                    let inner: Arc<dyn Link<Bytes>> = l.clone();
                    Arc::new(StagedLink::new(dev, inner, staged).unwrap())
                });
                Engine::new(
                    Rank(r as u32),
                    n,
                    links,
                    Arc::new(dev.clone()),
                    &root,
                    config.clone(),
                )
                .unwrap()
            })
            .collect();
        World { engines, host }
    }

    /// Runs `f` on every rank, one thread each; past `LIMIT` or on the first failure every
    /// engine is aborted and every host link cancelled, so nothing hangs.
    fn run(&self, f: impl Fn(&Staged) -> Result<(), String> + Sync) -> Result<(), String> {
        let (tx, rx) = mpsc::channel::<Result<(), String>>();
        std::thread::scope(|s| {
            for e in &self.engines {
                let (tx, f) = (tx.clone(), &f);
                s.spawn(move || {
                    let _ = tx.send(f(e));
                });
            }
            drop(tx);
            let deadline = Instant::now() + LIMIT;
            let mut first = Ok(());
            for _ in 0..self.engines.len() {
                let left = deadline.saturating_duration_since(Instant::now());
                let r = rx
                    .recv_timeout(left)
                    .unwrap_or_else(|_| Err(format!("not done within {LIMIT:?}")));
                if r.is_err() && first.is_ok() {
                    first = r;
                    self.stop("a rank failed");
                }
            }
            first
        })
    }

    fn stop(&self, why: &str) {
        for e in &self.engines {
            e.context().abort(AbortReason::requested(why.to_string()));
        }
        for l in self.host.iter().flatten() {
            l.cancel(CancelReason::new(CloseCode::ABORTED, why.to_string()));
        }
    }
}

fn devices(n: usize) -> Option<Vec<CudaDevice>> {
    let gpu = gpu_or_skip("staged GPU tests")?;
    Some(
        (0..n)
            .map(|_| CudaDevice::on(gpu.clone()).unwrap())
            .collect(),
    )
}

fn matrix(n: usize) {
    let Some(devices) = devices(n) else {
        return;
    };
    let cases = every_case(n as u32);
    let started = Instant::now();
    for config in matrix_configs() {
        let world = World::new(&devices, &small(), &config);
        if let Err(e) = world.run(|e| sweep(&OnGpu, e, &cases)) {
            panic!("{:?}: {e}", config.overrides);
        }
    }
    let world = World::new(&devices, &StagedConfig::default(), &EngineConfig::default());
    world
        .run(|e| sweep(&OnGpu, e, &large_cases(n as u32)))
        .unwrap();
    drop(world);
    for d in &devices {
        d.synchronize(T).unwrap();
    }
    eprintln!("staged matrix at {n} ranks in {:?}", started.elapsed());
}

#[test]
fn every_collective_dtype_and_reduction_staged_at_2_ranks() {
    matrix(2);
}

#[test]
fn every_collective_dtype_and_reduction_staged_at_4_ranks() {
    matrix(4);
}

#[test]
fn an_abort_ends_a_staged_operation_waiting_on_a_silent_peer_and_the_streams_drain() {
    let Some(devices) = devices(2) else {
        return;
    };
    let world = World::new(&devices, &small(), &EngineConfig::default());
    let e0 = &world.engines[0];
    let dev = &devices[0];
    let mut buf = dev.buffer(1 << 20).unwrap();
    // Rank 1 never joins: rank 0's all-reduce waits on it until the abort.
    let (took, err) = std::thread::scope(|s| {
        let op = s.spawn(|| {
            let r = block_on(e0.all_reduce(
                Buffer::InPlace(&mut buf),
                (1 << 20) / 4,
                DType::F32,
                Reduction::Sum,
            ));
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!op.is_finished(), "finished without its peer");
        let at = Instant::now();
        e0.context().abort(AbortReason::requested("test abort"));
        let (r, done) = op.join().unwrap();
        (done.saturating_duration_since(at), r.unwrap_err())
    });
    assert_eq!(
        err.abort_reason(),
        Some(&AbortReason::requested("test abort")),
        "{err}"
    );
    assert!(took < Duration::from_millis(100), "the abort took {took:?}");
    let t = Instant::now();
    dev.synchronize(T).unwrap();
    assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    eprintln!(
        "staged abort-to-return {took:?}, stream drain {:?}",
        t.elapsed()
    );
    drop(buf);
}
