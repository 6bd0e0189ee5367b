//! What the engine puts on its links: a small all-reduce is one payload per peer per step
//! and no flow-control traffic, pipelined exchanges keep the data a link holds for its
//! peer within the window (`pipeline_depth` chunks) however far ahead sends run, and links
//! that take borrowed bytes (`Link::send_bytes`) get the same results as links that take
//! packed payloads, also when they refuse the bytes for now; links that reduce what they
//! receive (`Link::recv_reduce_into`) get the same results as links that deliver payloads.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use chorus_engine::link::{CancelReason, LinkFuture, Reducer, Tag};
use chorus_engine::{
    AbortReason, Algorithm, Buffer, Context, Engine, EngineConfig, HeldLimit, HostDevice, Link,
    LocalLink, Reduction,
};
use chorus_protocol::{DType, Rank};
use futures::executor::block_on;

/// Tag steps with this bit are credits (the engine's `run::CREDIT`).
const CREDIT: u32 = 1 << 31;

/// Counts what a rank sends: data payloads and credits.
struct Counting {
    inner: Arc<LocalLink<Bytes>>,
    data: AtomicUsize,
    credits: AtomicUsize,
}

impl Link<Bytes> for Counting {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }
    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        let counter = if tag.step & CREDIT != 0 {
            &self.credits
        } else {
            &self.data
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.inner.send(tag, payload)
    }
    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        self.inner.recv(tag)
    }
    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason)
    }
}

type Counted = Engine<HostDevice, Counting>;

/// A world whose links count, over a mesh that fails any link holding more than `held`.
fn world(
    n: u32,
    root: &Context,
    config: &EngineConfig,
    held: HeldLimit<Bytes>,
) -> Vec<(Counted, Vec<Arc<Counting>>)> {
    chorus_engine::local::mesh::<Bytes>(n, held)
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            let links: Vec<Arc<Counting>> = links
                .into_iter()
                .map(|inner| {
                    Arc::new(Counting {
                        inner,
                        data: AtomicUsize::new(0),
                        credits: AtomicUsize::new(0),
                    })
                })
                .collect();
            let e = Engine::new(
                Rank(r as u32),
                n,
                links.clone(),
                Arc::new(HostDevice),
                root,
                config.clone(),
            )
            .unwrap();
            (e, links)
        })
        .collect()
}

fn all_reduce_everywhere(world: &[(Counted, Vec<Arc<Counting>>)], count: usize) {
    std::thread::scope(|s| {
        let handles: Vec<_> = world
            .iter()
            .map(|(e, _)| {
                s.spawn(move || {
                    let mut buf = vec![1u8; count * 4];
                    block_on(e.all_reduce(
                        Buffer::InPlace(&mut buf[..]),
                        count,
                        DType::F32,
                        Reduction::Sum,
                    ))
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    });
}

#[test]
fn a_small_all_reduce_is_one_payload_per_peer_per_round_and_no_credits() {
    for n in [2u32, 4] {
        let config = EngineConfig::default();
        let w = world(n, &Context::root(), &config, HeldLimit::default());
        assert_eq!(
            w[0].0
                .algorithm_for(chorus_protocol::Collective::AllReduce, 8),
            Algorithm::RecursiveDoubling
        );
        all_reduce_everywhere(&w, 2);
        let rounds = n.trailing_zeros() as usize;
        for (r, (_, links)) in w.iter().enumerate() {
            let data: usize = links.iter().map(|l| l.data.load(Ordering::Relaxed)).sum();
            let credits: usize = links
                .iter()
                .map(|l| l.credits.load(Ordering::Relaxed))
                .sum();
            assert_eq!(data, rounds, "r{r} of {n}: one payload per round");
            assert_eq!(credits, 0, "r{r} of {n}: no flow control for one chunk");
        }
    }
}

#[test]
fn sends_ahead_of_receives_stay_within_the_window() {
    // Many small chunks through every exchange-based and ring schedule; each link may hold
    // at most `depth` chunks for its peer, or it fails with Overflow and so does the test.
    let chunk = 1024;
    for depth in [2usize, 4, 8] {
        for algo in [
            Algorithm::RecursiveDoubling,
            Algorithm::HalvingDoubling,
            Algorithm::Ring,
        ] {
            for n in [2u32, 3, 4] {
                let mut config = EngineConfig {
                    chunk_bytes: chunk,
                    pipeline_depth: depth,
                    ..EngineConfig::default()
                };
                config.overrides.all_reduce = Some(algo);
                let root = Context::root();
                let w = world(n, &root, &config, HeldLimit::bytes((depth * chunk) as u64));
                // A deadlock would hang the world: the watchdog aborts it, and the
                // all-reduce then fails instead.
                let (done, finished) = std::sync::mpsc::channel::<()>();
                let watchdog = std::thread::spawn(move || {
                    let waited = finished.recv_timeout(Duration::from_secs(60));
                    if waited == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                        root.abort(AbortReason::requested("test watchdog"));
                    }
                });
                all_reduce_everywhere(&w, 64 * 1024);
                drop(done);
                watchdog.join().unwrap();
                let credits: usize = w
                    .iter()
                    .flat_map(|(_, links)| links.iter())
                    .map(|l| l.credits.load(Ordering::Relaxed))
                    .sum();
                assert!(
                    credits > 0,
                    "{algo} at {n}: 256 KiB in 1 KiB chunks needs credit"
                );
                for (_, links) in &w {
                    for l in links {
                        assert_eq!(l.inner.held(), 0, "{algo} at {n}: left data on a link");
                    }
                }
            }
        }
    }
}

/// Takes borrowed bytes, copying them for the in-process link; every third offer is
/// refused for now (pending on first poll, as a full send window is), which the engine must
/// answer by dropping it and sending a packed payload instead.
struct Borrowing {
    inner: Arc<LocalLink<Bytes>>,
    offers: AtomicUsize,
    taken: AtomicUsize,
}

impl Link<Bytes> for Borrowing {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }
    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        self.inner.send(tag, payload)
    }
    fn send_bytes<'a>(&'a self, tag: Tag, data: &'a [u8]) -> Option<LinkFuture<'a, ()>> {
        let n = self.offers.fetch_add(1, Ordering::Relaxed);
        if n % 3 == 2 {
            return Some(Box::pin(std::future::pending()));
        }
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(self.inner.send(tag, Bytes::copy_from_slice(data)))
    }
    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        self.inner.recv(tag)
    }
    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason)
    }
}

type BorrowingEngine = Engine<HostDevice, Borrowing>;

#[test]
fn links_that_borrow_the_bytes_give_the_same_results() {
    let n = 3u32;
    let count = 40_000;
    for algo in [
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
        Algorithm::Ring,
    ] {
        let mut config = EngineConfig {
            chunk_bytes: 4096,
            pipeline_depth: 4,
            ..EngineConfig::default()
        };
        config.overrides.all_reduce = Some(algo);
        let root = Context::root();
        let world: Vec<(BorrowingEngine, Vec<Arc<Borrowing>>)> =
            chorus_engine::local::mesh::<Bytes>(n, HeldLimit::default())
                .into_iter()
                .enumerate()
                .map(|(r, links)| {
                    let links: Vec<Arc<Borrowing>> = links
                        .into_iter()
                        .map(|inner| {
                            Arc::new(Borrowing {
                                inner,
                                offers: AtomicUsize::new(0),
                                taken: AtomicUsize::new(0),
                            })
                        })
                        .collect();
                    let e = Engine::new(
                        Rank(r as u32),
                        n,
                        links.clone(),
                        Arc::new(HostDevice),
                        &root,
                        config.clone(),
                    )
                    .unwrap();
                    (e, links)
                })
                .collect();
        let results: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = world
                .iter()
                .enumerate()
                .map(|(r, (e, _))| {
                    s.spawn(move || {
                        let input: Vec<u8> = (0..count)
                            .flat_map(|i| ((i * 3 + r) as i32).to_ne_bytes())
                            .collect();
                        let mut out = vec![0u8; count * 4];
                        block_on(e.all_reduce(
                            Buffer::separate(&input, &mut out),
                            count,
                            DType::I32,
                            Reduction::Sum,
                        ))
                        .unwrap();
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, out) in results.iter().enumerate() {
            for (i, x) in out.chunks_exact(4).enumerate() {
                let want: i32 = (0..n as usize).map(|q| (i * 3 + q) as i32).sum();
                assert_eq!(
                    i32::from_ne_bytes(x.try_into().unwrap()),
                    want,
                    "{algo} r{r} [{i}]"
                );
            }
        }
        let taken: usize = world
            .iter()
            .flat_map(|(_, l)| l.iter())
            .map(|l| l.taken.load(Ordering::Relaxed))
            .sum();
        let offers: usize = world
            .iter()
            .flat_map(|(_, l)| l.iter())
            .map(|l| l.offers.load(Ordering::Relaxed))
            .sum();
        assert!(
            taken > 0 && taken < offers,
            "{algo}: {taken} of {offers} taken"
        );
    }
}

/// A link that reduces received payloads itself (`Link::recv_reduce_into`), handing the
/// engine's reducer blocks of three elements, as a transport reducing from its buffers
/// piece by piece does.
struct Reducing {
    inner: Arc<LocalLink<Bytes>>,
    reduced: AtomicUsize,
}

impl Link<Bytes> for Reducing {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }
    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        self.inner.send(tag, payload)
    }
    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        self.inner.recv(tag)
    }
    fn recv_reduce_into<'a>(
        &'a self,
        tag: Tag,
        dst: &'a mut [u8],
        reduce: Reducer<'a>,
    ) -> Option<LinkFuture<'a, usize>> {
        Some(Box::pin(async move {
            let p = self.inner.recv(tag).await?;
            if p.len() == dst.len() {
                let block = 3 * tag.dtype.size();
                for (d, s) in dst.chunks_mut(block).zip(p.chunks(block)) {
                    reduce(d, s);
                }
                self.reduced.fetch_add(1, Ordering::Relaxed);
            }
            Ok(p.len())
        }))
    }
    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason)
    }
}

type ReducingEngine = Engine<HostDevice, Reducing>;

fn reducing_world(n: u32, config: &EngineConfig, root: &Context) -> Vec<ReducingEngine> {
    chorus_engine::local::mesh::<Bytes>(n, HeldLimit::default())
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            let links: Vec<Arc<Reducing>> = links
                .into_iter()
                .map(|inner| {
                    Arc::new(Reducing {
                        inner,
                        reduced: AtomicUsize::new(0),
                    })
                })
                .collect();
            Engine::new(
                Rank(r as u32),
                n,
                links,
                Arc::new(HostDevice),
                root,
                config.clone(),
            )
            .unwrap()
        })
        .collect()
}

/// Links that reduce what they receive give the same results as links that deliver
/// payloads: all-reduce by every algorithm that reduces received chunks (in and out of
/// place, sum and max, and `Avg`, whose division the engine does), the ring's
/// reduce-scatter and its reduce chain; and they are asked to.
#[test]
fn links_that_reduce_what_they_receive_give_the_same_results() {
    let n = 3u32;
    let count = 30_001;
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 1000) as i32 - 500;
    for algo in [
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
        Algorithm::Ring,
    ] {
        let mut config = EngineConfig {
            chunk_bytes: 4096,
            pipeline_depth: 4,
            ..EngineConfig::default()
        };
        config.overrides.all_reduce = Some(algo);
        config.overrides.reduce_scatter = Some(Algorithm::Ring);
        config.overrides.reduce = Some(Algorithm::Ring);
        let root = Context::root();
        let world = reducing_world(n, &config, &root);
        let ints = |r: usize, len: usize| -> Vec<u8> {
            (0..len).flat_map(|i| value(r, i).to_ne_bytes()).collect()
        };
        let out: Vec<[Vec<u8>; 5]> = std::thread::scope(|s| {
            let hs: Vec<_> = world
                .iter()
                .enumerate()
                .map(|(r, e)| {
                    s.spawn(move || {
                        let input = ints(r, count);
                        let mut sum = vec![0u8; count * 4];
                        block_on(e.all_reduce(
                            Buffer::separate(&input, &mut sum),
                            count,
                            DType::I32,
                            Reduction::Sum,
                        ))
                        .unwrap();
                        let mut max = input.clone();
                        block_on(e.all_reduce(
                            Buffer::InPlace(&mut max),
                            count,
                            DType::I32,
                            Reduction::Max,
                        ))
                        .unwrap();
                        let mut avg: Vec<u8> = (0..count)
                            .flat_map(|i| f64::from(value(r, i)).to_ne_bytes())
                            .collect();
                        block_on(e.all_reduce(
                            Buffer::InPlace(&mut avg),
                            count,
                            DType::F64,
                            Reduction::Avg,
                        ))
                        .unwrap();
                        let all = ints(r, count * n as usize);
                        let mut scattered = vec![0u8; count * 4];
                        block_on(e.reduce_scatter(
                            Buffer::separate(&all, &mut scattered),
                            count,
                            DType::I32,
                            Reduction::Sum,
                        ))
                        .unwrap();
                        let mut reduced = input.clone();
                        block_on(e.reduce(
                            Buffer::InPlace(&mut reduced),
                            count,
                            DType::I32,
                            Reduction::Sum,
                            Rank(1),
                        ))
                        .unwrap();
                        [sum, max, avg, scattered, reduced]
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let int = |b: &[u8]| i32::from_ne_bytes(b.try_into().unwrap());
        let ranks = 0..n as usize;
        for (r, [sum, max, avg, scattered, reduced]) in out.iter().enumerate() {
            for i in 0..count {
                let at = i * 4..i * 4 + 4;
                let want: i32 = ranks.clone().map(|q| value(q, i)).sum();
                assert_eq!(int(&sum[at.clone()]), want, "{algo} sum r{r} [{i}]");
                let top = ranks.clone().map(|q| value(q, i)).max().unwrap();
                assert_eq!(int(&max[at.clone()]), top, "{algo} max r{r} [{i}]");
                let mean = f64::from_ne_bytes(avg[i * 8..i * 8 + 8].try_into().unwrap());
                assert!(
                    (mean - f64::from(want) / f64::from(n)).abs() < 1e-9,
                    "{algo} avg r{r} [{i}]: {mean}"
                );
                let j = r * count + i;
                let want: i32 = ranks.clone().map(|q| value(q, j)).sum();
                assert_eq!(int(&scattered[at.clone()]), want, "scatter r{r} [{i}]");
                if r == 1 {
                    let want: i32 = ranks.clone().map(|q| value(q, i)).sum();
                    assert_eq!(int(&reduced[at]), want, "reduce [{i}]");
                }
            }
        }
        let reduced: usize = world
            .iter()
            .flat_map(|e| (0..n).filter_map(|p| e.link(Rank(p))))
            .map(|l| l.reduced.load(Ordering::Relaxed))
            .sum();
        assert!(reduced > 0, "{algo}: no link reduced");
    }
}
