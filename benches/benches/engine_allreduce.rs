//! In-process all-reduce bus bandwidth at 2, 4 and 8 ranks for 1 KiB … 64 MiB, with the
//! engine's own choice of algorithm and with each all-reduce algorithm forced (the forced
//! runs are what the selector's crossover sizes come from).
//!
//! `cargo bench -p chorus-benches --bench engine_allreduce` (filter with a regex after `--`,
//! e.g. `-- '/auto/'`). Ranks are threads over `chorus_engine::local` links; each
//! iteration is one in-place f32 sum all-reduce on every rank, back to back as nccl-tests
//! runs them. Criterion's throughput is the bus bandwidth, `size * 2(n-1)/n / time`
//! (GiB/s in its output).

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::local::mesh;
use chorus_engine::{
    Algorithm, Buffer, Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink, Reduction,
};
use chorus_protocol::{DType, Rank};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::executor::block_on;

const MAX: usize = 64 << 20;
/// Forced algorithms only up to here: above it the ring wins by a wide margin and the
/// latency-optimal schedules only burn bench time.
const FORCED_MAX: usize = 4 << 20;

/// Engine configurations: the default selection, then each algorithm forced.
fn configs() -> Vec<(&'static str, EngineConfig)> {
    let mut v = vec![("auto", EngineConfig::default())];
    for a in [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
    ] {
        let mut c = EngineConfig::default();
        c.overrides.all_reduce = Some(a);
        v.push((a.name(), c));
    }
    v
}

/// Ranks as persistent threads, each holding one engine per configuration.
struct World {
    n: u32,
    cmds: Vec<Sender<(usize, usize, u64)>>,
    done: Receiver<Duration>,
    threads: Vec<JoinHandle<()>>,
}

impl World {
    fn new(n: u32) -> Self {
        let root = Context::root();
        let dev = Arc::new(HostDevice);
        let mut per_rank: Vec<Vec<Engine<HostDevice, LocalLink<Bytes>>>> =
            (0..n).map(|_| Vec::new()).collect();
        for (_, config) in configs() {
            for (r, links) in mesh::<Bytes>(n, HeldLimit::default())
                .into_iter()
                .enumerate()
            {
                per_rank[r].push(
                    Engine::new(Rank(r as u32), n, links, dev.clone(), &root, config.clone())
                        .unwrap(),
                );
            }
        }
        let (done_tx, done) = channel();
        let mut cmds = Vec::new();
        let mut threads = Vec::new();
        for engines in per_rank {
            let (tx, rx) = channel::<(usize, usize, u64)>();
            let done_tx = done_tx.clone();
            cmds.push(tx);
            threads.push(thread::spawn(move || {
                let mut buf = vec![0u8; MAX];
                for (config, bytes, iters) in rx {
                    let e = &engines[config];
                    let start = Instant::now();
                    for _ in 0..iters {
                        block_on(e.all_reduce(
                            Buffer::InPlace(&mut buf[..bytes]),
                            bytes / 4,
                            DType::F32,
                            Reduction::Sum,
                        ))
                        .unwrap();
                    }
                    done_tx.send(start.elapsed()).unwrap();
                }
            }));
        }
        World {
            n,
            cmds,
            done,
            threads,
        }
    }

    /// Run `iters` all-reduces of `bytes` on every rank; the slowest rank's time.
    fn run(&self, config: usize, bytes: usize, iters: u64) -> Duration {
        for tx in &self.cmds {
            tx.send((config, bytes, iters)).unwrap();
        }
        (0..self.n)
            .map(|_| self.done.recv().unwrap())
            .max()
            .unwrap_or_default()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.cmds.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn bench(c: &mut Criterion) {
    let sizes: Vec<usize> = (0..9).map(|i| 1024 << (2 * i)).collect();
    for n in [2u32, 4, 8] {
        let world = World::new(n);
        let mut g = c.benchmark_group(format!("allreduce/n{n}"));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(300));
        g.measurement_time(Duration::from_secs(1));
        for (ci, (name, _)) in configs().into_iter().enumerate() {
            for &bytes in &sizes {
                if ci > 0 && bytes > FORCED_MAX {
                    continue;
                }
                let bus = bytes as f64 * 2.0 * f64::from(n - 1) / f64::from(n);
                g.throughput(Throughput::Bytes(bus as u64));
                g.bench_with_input(BenchmarkId::new(name, bytes), &bytes, |b, &bytes| {
                    b.iter_custom(|iters| world.run(ci, bytes, iters))
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
