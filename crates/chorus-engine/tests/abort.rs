//! Aborts, failures and bad input: every operation ends, promptly, with a named error.

#![allow(clippy::unwrap_used, clippy::useless_vec)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::local::mesh;
use chorus_engine::{
    AbortReason, Buffer, CancelReason, Context, Engine, EngineConfig, HeldLimit, HostDevice, Link,
    LinkError, LinkFuture, LocalLink, Op, OpErrorKind, Reduction, Tag,
};
use chorus_protocol::message::{Evidence, OpState};
use chorus_protocol::{CloseCode, Collective, DType, Rank};
use futures::executor::block_on;

type Eng = Engine<HostDevice, LocalLink<Bytes>>;

/// The bound the feature promises is 10 ms; this margin is for a loaded 2-core machine.
const PROMPT: Duration = Duration::from_millis(200);

/// Engines for every rank of a world of `n`, under `parent`.
fn engines(n: u32, parent: &Context, config: &EngineConfig) -> Vec<Eng> {
    mesh::<Bytes>(n, HeldLimit::default())
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            Engine::new(
                Rank(r as u32),
                n,
                links,
                Arc::new(HostDevice),
                parent,
                config.clone(),
            )
            .unwrap()
        })
        .collect()
}

/// Wait until `e` has a running operation blocked on a peer; return its snapshot.
fn wait_blocked(e: &Eng) -> chorus_engine::OpSnapshot {
    let start = Instant::now();
    loop {
        if let Some(op) = e.running().first() {
            let s = op.snapshot();
            if s.waiting_on.is_some() {
                return s;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "op never blocked"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn op_blocked_on_a_silent_peer_returns_promptly_after_abort() {
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    let (e0, _silent) = (&es[0], &es[1]);
    let mut worst = Duration::ZERO;
    thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let h = s.spawn(move || {
            let mut buf = vec![0u8; 4096];
            let r = block_on(e0.all_reduce(
                Buffer::InPlace(&mut buf[..]),
                1024,
                DType::F32,
                Reduction::Sum,
            ));
            tx.send(Instant::now()).unwrap();
            r
        });
        let snap = wait_blocked(e0);
        assert_eq!(snap.collective, Collective::AllReduce);
        assert_eq!(snap.waiting_on, Some(Rank(1)));
        assert_eq!(snap.state, OpState::Running);
        thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        assert!(
            e0.context()
                .abort(AbortReason::requested("user pressed ^C"))
        );
        let t1 = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("op never returned");
        worst = worst.max(t1 - t0);
        let err = h.join().unwrap().unwrap_err();
        assert_eq!(
            err.kind,
            OpErrorKind::Aborted(AbortReason::requested("user pressed ^C"))
        );
        assert_eq!(err.peer, Some(Rank(1)));
        assert!(err.step.is_some());
        // In place and blocked on the first receive: nothing was written yet.
        assert!(!err.partial_output);
        let text = err.to_string();
        assert!(text.contains("all-reduce") && text.contains("r1") && text.contains("^C"));
    });
    eprintln!("abort to return: {worst:?}");
    assert!(worst < PROMPT, "took {worst:?}");
    assert!(e0.running().is_empty());
}

#[test]
fn aborting_a_parent_releases_an_op_blocked_on_a_split_child() {
    // The gap of seed 001: a split child must not have its own abort flag.
    let root = Context::root();
    let parent = engines(3, &root, &EngineConfig::default());
    let sibling = engines(2, &root, &EngineConfig::default());
    // A child communicator of ranks {0, 1} split from the parent, over its own links.
    let child: Vec<Eng> = mesh::<Bytes>(2, HeldLimit::default())
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            Engine::new(
                Rank(r as u32),
                2,
                links,
                Arc::new(HostDevice),
                parent[r].context(),
                EngineConfig::default(),
            )
            .unwrap()
        })
        .collect();
    let c0 = &child[0];
    thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let h = s.spawn(move || {
            let mut buf = vec![7u8; 64];
            let r = block_on(c0.broadcast(Buffer::InPlace(&mut buf[..]), 64, DType::U8, Rank(1)));
            tx.send(Instant::now()).unwrap();
            r
        });
        wait_blocked(c0);
        let reason = AbortReason::PeerFailed {
            rank: Rank(2),
            evidence: Evidence::MissedDeadline {
                silent_ms: 3000,
                deadline_ms: 2000,
            },
        };
        let t0 = Instant::now();
        parent[0].context().abort(reason.clone());
        let t1 = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("child op never returned");
        assert!(t1 - t0 < PROMPT, "took {:?}", t1 - t0);
        let err = h.join().unwrap().unwrap_err();
        assert_eq!(err.kind, OpErrorKind::Aborted(reason));
        assert_eq!(err.peer, Some(Rank(1)));
        assert!(err.to_string().contains("peer r2 failed"));
    });
    // Siblings and the other ranks' communicators are untouched.
    assert!(!root.is_aborted());
    assert!(!sibling[0].context().is_aborted());
    assert!(!parent[1].context().is_aborted());
    assert!(child[0].context().is_aborted());
}

/// A link that forwards the first `pass` sends and then swallows the rest: a peer that
/// froze mid-operation.
struct Freezing {
    inner: Arc<LocalLink<Bytes>>,
    left: AtomicUsize,
}

impl Link<Bytes> for Freezing {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }
    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        let passing = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if passing {
            self.inner.send(tag, payload)
        } else {
            Box::pin(std::future::ready(Ok(())))
        }
    }
    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        self.inner.recv(tag)
    }
    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason)
    }
}

#[test]
fn abort_mid_pipeline_reports_the_step_and_partial_output() {
    // Rank 2 freezes after a few dozen chunks of a long, finely chunked ring all-reduce;
    // the others are mid-pipeline when the runtime's deadline aborts everything.
    let n = 3;
    let root = Context::root();
    let config = EngineConfig {
        chunk_bytes: 1024,
        pipeline_depth: 4,
        overrides: chorus_engine::Overrides {
            all_reduce: Some(chorus_engine::Algorithm::Ring),
            ..Default::default()
        },
        ..EngineConfig::default()
    };
    let es: Vec<Engine<HostDevice, dyn Link<Bytes>>> = mesh::<Bytes>(n, HeldLimit::default())
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            let links: Vec<Arc<dyn Link<Bytes>>> = links
                .into_iter()
                .map(|l| -> Arc<dyn Link<Bytes>> {
                    if r == 2 {
                        Arc::new(Freezing {
                            inner: l,
                            left: AtomicUsize::new(40),
                        })
                    } else {
                        l
                    }
                })
                .collect();
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
        .collect();
    let count = 256 * 1024;
    let results: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = es
            .iter()
            .map(|e| {
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
        // Wait until rank 0 is past its first steps and stuck.
        let start = Instant::now();
        loop {
            let stuck = es[0]
                .running()
                .first()
                .map(|p| p.snapshot())
                .filter(|s| s.step > 0 && s.waiting_on.is_some());
            if let Some(s) = stuck {
                assert_eq!(s.algorithm, "ring");
                assert!(s.steps > s.step);
                thread::sleep(Duration::from_millis(30));
                if es[0].running().first().map(|p| p.step()) == Some(s.step) {
                    break;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(20), "never got stuck");
            thread::sleep(Duration::from_millis(2));
        }
        root.abort(AbortReason::timeout("all-reduce op0", 30_000));
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        let err = res.unwrap_err();
        assert_eq!(
            err.kind,
            OpErrorKind::Aborted(AbortReason::timeout("all-reduce op0", 30_000)),
            "r{r}"
        );
        assert!(err.step.unwrap() > 0, "r{r}: {err}");
        assert!(err.partial_output, "r{r}: {err}");
        assert!(err.to_string().contains("partial"), "r{r}: {err}");
    }
}

#[test]
fn concurrent_aborts_from_many_threads_agree_on_the_first_reason() {
    for _ in 0..5 {
        let root = Context::root();
        let es = engines(2, &root, &EngineConfig::default());
        let e0 = &es[0];
        thread::scope(|s| {
            let h = s.spawn(move || {
                let mut a = vec![0u8; 64];
                let mut b = vec![0u8; 64];
                let ops = vec![
                    Op::AllReduce {
                        buf: Buffer::InPlace(&mut a[..]),
                        count: 64,
                        dtype: DType::U8,
                        reduction: Reduction::Sum,
                    },
                    Op::AllGather {
                        buf: Buffer::InPlace(&mut b[..]),
                        count: 32,
                        dtype: DType::U8,
                    },
                ];
                block_on(e0.group(ops))
            });
            wait_blocked(e0);
            let threads = 16;
            let barrier = Arc::new(Barrier::new(threads));
            let wins: usize = (0..threads)
                .map(|i| {
                    let ctx = e0.context().clone();
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        ctx.abort(AbortReason::requested(format!("thread {i}")))
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum();
            assert_eq!(wins, 1);
            let reason = e0.context().reason().unwrap();
            let err = h.join().unwrap().unwrap_err();
            assert_eq!(err.kind, OpErrorKind::Aborted(reason));
        });
    }
}

#[test]
fn first_reason_wins_and_later_ops_fail_fast() {
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    let e0 = &es[0];
    thread::scope(|s| {
        let h = s.spawn(move || block_on(e0.barrier()));
        wait_blocked(e0);
        e0.context().abort(AbortReason::Revoked {
            origin: Some(Rank(1)),
        });
        e0.context().abort(AbortReason::Shutdown);
        let err = h.join().unwrap().unwrap_err();
        assert_eq!(
            err.abort_reason(),
            Some(&AbortReason::Revoked {
                origin: Some(Rank(1))
            })
        );
    });
    // Later operations fail at once, naming the first failure.
    let t = Instant::now();
    let err = block_on(e0.barrier()).unwrap_err();
    assert!(t.elapsed() < PROMPT);
    assert!(matches!(err.kind, OpErrorKind::Poisoned(_)));
    assert_eq!(
        err.abort_reason(),
        Some(&AbortReason::Revoked {
            origin: Some(Rank(1))
        })
    );
    assert!(!err.partial_output);
}

#[test]
fn an_aborted_communicator_fails_new_ops_without_running_them() {
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    root.abort(AbortReason::Evicted);
    let mut buf = vec![3u8; 8];
    let err =
        block_on(es[0].all_reduce(Buffer::InPlace(&mut buf[..]), 8, DType::U8, Reduction::Sum))
            .unwrap_err();
    assert_eq!(err.kind, OpErrorKind::Aborted(AbortReason::Evicted));
    assert!(!err.partial_output);
    assert_eq!(buf, vec![3u8; 8]);
}

#[test]
fn a_timeout_on_one_op_context_ends_that_op() {
    // The runtime's deadline path: make the op context, arm a timer on it, submit.
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    let e0 = &es[0];
    let op_ctx = e0.op_context();
    thread::scope(|s| {
        let ctx = op_ctx.clone();
        let h = s.spawn(move || block_on(e0.run_in(&ctx, Op::Barrier)));
        wait_blocked(e0);
        // The watchdog can also find the op through its progress.
        let running = e0.running();
        assert!(running[0].context().descends_from(&op_ctx));
        op_ctx.abort(AbortReason::timeout("barrier op0", 5_000));
        let err = h.join().unwrap().unwrap_err();
        assert_eq!(
            err.kind,
            OpErrorKind::Aborted(AbortReason::timeout("barrier op0", 5_000))
        );
    });
    // Only the operation was aborted, not the communicator; but it is poisoned.
    assert!(!e0.context().is_aborted());
    assert!(e0.poisoned().is_some());
    // A context from elsewhere is refused.
    let err = block_on(es[1].run_in(&Context::root(), Op::Barrier)).unwrap_err();
    assert!(matches!(err.kind, OpErrorKind::InvalidArgument(_)));
}

#[test]
fn ranks_calling_different_collectives_get_a_named_tag_mismatch() {
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    let errs: Vec<_> = thread::scope(|s| {
        let h0 = s.spawn(|| {
            let mut buf = vec![1u8; 64];
            block_on(es[0].all_reduce(Buffer::InPlace(&mut buf[..]), 64, DType::U8, Reduction::Sum))
        });
        let h1 = s.spawn(|| {
            let mut buf = vec![1u8; 128];
            block_on(es[1].all_gather(Buffer::InPlace(&mut buf[..]), 64, DType::U8))
        });
        vec![h0.join().unwrap(), h1.join().unwrap()]
    });
    for err in errs {
        let err = err.unwrap_err();
        match &err.kind {
            OpErrorKind::Link(LinkError::TagMismatch { expected, got }) => {
                assert_ne!(expected.collective, got.collective);
            }
            k => panic!("expected a tag mismatch, got {k:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("tag mismatch"), "{text}");
        assert!(
            text.contains("all-reduce") && text.contains("all-gather"),
            "{text}"
        );
    }
}

#[test]
fn a_departed_peer_fails_the_op_and_names_it() {
    // Rank 1 calls a different collective than rank 0 and fails; its runtime then cancels
    // its links (departure is a message), which ends rank 0's wait.
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    thread::scope(|s| {
        let h0 = s.spawn(|| {
            let mut buf = vec![1u8; 64];
            block_on(es[0].all_reduce(Buffer::InPlace(&mut buf[..]), 64, DType::U8, Reduction::Sum))
        });
        let mut buf = vec![1u8; 64];
        let e1 = block_on(es[1].broadcast(Buffer::InPlace(&mut buf[..]), 64, DType::U8, Rank(0)))
            .unwrap_err();
        assert!(matches!(
            e1.kind,
            OpErrorKind::Link(LinkError::TagMismatch { .. })
        ));
        es[1]
            .link(Rank(0))
            .unwrap()
            .cancel(CancelReason::new(CloseCode::ABORTED, "tag mismatch"));
        let e0 = h0.join().unwrap().unwrap_err();
        assert_eq!(e0.peer, Some(Rank(1)));
        assert!(matches!(
            e0.kind,
            OpErrorKind::Link(LinkError::PeerDeparted {
                code: CloseCode::ABORTED,
                ..
            })
        ));
    });
}

#[test]
fn a_vanished_peer_is_a_lost_connection() {
    let root = Context::root();
    let mut es = engines(2, &root, &EngineConfig::default());
    let e1 = es.pop().unwrap();
    let e0 = es.pop().unwrap();
    thread::scope(|s| {
        let h = s.spawn(|| block_on(e0.barrier()));
        wait_blocked(&e0);
        drop(e1);
        let err = h.join().unwrap().unwrap_err();
        assert!(matches!(
            err.kind,
            OpErrorKind::Link(LinkError::ConnectionLost { .. })
        ));
        assert_eq!(err.peer, Some(Rank(1)));
    });
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let root = Context::root();
    let es = engines(3, &root, &EngineConfig::default());
    let e = &es[0];
    let short = [0u8; 4];
    let mut out = [0u8; 4];
    let err = block_on(e.all_reduce(
        Buffer::Separate {
            send: &short[..],
            recv: &mut out[..],
        },
        2,
        DType::F32,
        Reduction::Sum,
    ))
    .unwrap_err();
    assert!(matches!(err.kind, OpErrorKind::InvalidArgument(_)));
    assert!(err.to_string().contains("holds 4 bytes"));
    for op in [
        Op::Broadcast {
            buf: Buffer::InPlace(&mut out[..]),
            count: 1,
            dtype: DType::U8,
            root: Rank(7),
        },
        Op::Send {
            buf: &short[..],
            count: 1,
            dtype: DType::U8,
            peer: Rank(0),
        },
        Op::AllGather {
            buf: Buffer::InPlace(&mut [0u8; 4][..]),
            count: usize::MAX / 2,
            dtype: DType::U64,
        },
    ] {
        let e2 = &es[1];
        let err = block_on(e2.run(op)).unwrap_err();
        // The first bad call poisons; later ones name it.
        assert!(matches!(
            err.root_cause().kind,
            OpErrorKind::InvalidArgument(_)
        ));
    }
    // Bad engine setups.
    let links = mesh::<Bytes>(2, HeldLimit::default()).remove(0);
    assert!(
        Engine::new(
            Rank(2),
            2,
            links.clone(),
            Arc::new(HostDevice),
            &root,
            EngineConfig::default()
        )
        .is_err()
    );
    assert!(
        Engine::new(
            Rank(0),
            3,
            links.clone(),
            Arc::new(HostDevice),
            &root,
            EngineConfig::default()
        )
        .is_err()
    );
    let mut bad = EngineConfig::default();
    bad.overrides.broadcast = Some(chorus_engine::Algorithm::Bruck);
    assert!(Engine::new(Rank(0), 2, links, Arc::new(HostDevice), &root, bad).is_err());
}

#[test]
fn finished_ops_leave_nothing_behind() {
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    thread::scope(|s| {
        for e in &es {
            s.spawn(move || {
                for _ in 0..50 {
                    let mut buf = vec![1u8; 1 << 16];
                    block_on(e.all_reduce(
                        Buffer::InPlace(&mut buf[..]),
                        1 << 16,
                        DType::U8,
                        Reduction::Sum,
                    ))
                    .unwrap();
                }
            });
        }
    });
    for e in &es {
        assert!(e.running().is_empty());
        assert_eq!(e.context().child_count(), 0);
        // Every credit and chunk was claimed: nothing is left held on the links.
        let peer = Rank(1 - e.rank().0);
        assert_eq!(e.link(peer).unwrap().held(), 0);
    }
}

#[test]
fn a_dropped_op_future_is_recorded_and_poisons() {
    struct Count(AtomicUsize, AtomicUsize);
    impl chorus_engine::OpObserver for Count {
        fn started(&self, _: &Arc<chorus_engine::OpProgress>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn finished(
            &self,
            op: &Arc<chorus_engine::OpProgress>,
            r: Result<(), &chorus_engine::OpError>,
        ) {
            assert!(r.is_err());
            assert_eq!(op.state(), OpState::Aborted);
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }
    let root = Context::root();
    let count = Arc::new(Count(AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut es = engines(2, &root, &EngineConfig::default());
    let e0 = es.remove(0).with_observer(count.clone());
    {
        let mut fut = std::pin::pin!(e0.barrier());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(e0.running().len(), 1);
    }
    assert!(e0.running().is_empty());
    assert_eq!(count.0.load(Ordering::Relaxed), 1);
    assert_eq!(count.1.load(Ordering::Relaxed), 1);
    let first = e0.poisoned().expect("poisoned");
    assert!(first.to_string().contains("dropped"));
    let err = block_on(e0.barrier()).unwrap_err();
    assert!(matches!(err.kind, OpErrorKind::Poisoned(_)));
}

#[test]
fn engines_and_their_futures_can_cross_threads() {
    fn send_sync<T: Send + Sync + ?Sized>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Engine<HostDevice, dyn Link<Bytes>>>();
    send_sync::<Context>();
    let root = Context::root();
    let es = engines(2, &root, &EngineConfig::default());
    let mut buf = [0u8; 4];
    let fut = es[0].all_reduce(Buffer::InPlace(&mut buf[..]), 1, DType::F32, Reduction::Sum);
    send(&fut);
    drop(fut);
}
