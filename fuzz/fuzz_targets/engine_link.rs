//! The collective engine behind a link that lies.
//!
//! A world of 2–4 host engines runs 1–3 collectives of the matrix over in-process links;
//! every payload rank 0 receives passes through a hostile layer that, by the fuzz input,
//! hands it over intact, truncated, lengthened, with a byte flipped, replaced by the previous
//! payload (a duplicate, or a chunk out of order), fails the receive with any link error (a
//! wrong tag, a protocol violation, an overflow, a departure, a lost connection), closes the
//! link early, or never answers. Every future is polled on this thread with a no-op waker.
//!
//! Oracles:
//! - no panic;
//! - no hang: once a whole polling round completes no link operation and no collective,
//!   the round counts as idle; after `IDLE_ROUNDS` idle rounds the target aborts the world's
//!   context, and every collective must then end within `ABORT_ROUNDS` rounds;
//! - every collective ends `Ok` or with an `OpError` whose kind the injected fault explains
//!   (a wrong length is `SizeMismatch`, a link fault is `Link`, the target's abort is
//!   `Aborted`, a later operation on a failed communicator is `Poisoned`), never
//!   `InvalidArgument` or `Device`;
//! - an `Ok` result is the reference result unless a payload's content was altered (which
//!   no link without integrity can detect), and with no fault injected every rank ends `Ok`
//!   without the target's abort.
#![no_main]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use chorus_engine::local::mesh;
use chorus_engine::testkit::{every_case, layout, matrix_configs};
use chorus_engine::{
    AbortReason, Buffer, CancelReason, Context, Engine, EngineConfig, HeldLimit, HostDevice, Link,
    LinkError, LinkFuture, LocalLink, OpError, OpErrorKind, Tag,
};
use chorus_protocol::{CloseCode, DType, Rank};
use libfuzzer_sys::fuzz_target;

/// Idle polling rounds after which the target aborts the world: a round with no link
/// completion cannot be followed by one with any (everything runs on this thread).
const IDLE_ROUNDS: u32 = 4;
/// Rounds every collective gets to end once the world is aborted.
const ABORT_ROUNDS: u32 = 16;
/// The largest element count a case is cut to, so one input stays fast.
const MAX_COUNT: usize = 96;

fuzz_target!(|data: &[u8]| {
    let [world, config, ops @ ..] = data else {
        return;
    };
    let n = 2 + u32::from(*world % 3);
    let configs = matrix_configs();
    let config = match usize::from(*config) % (configs.len() + 1) {
        i if i < configs.len() => configs[i].clone(),
        _ => EngineConfig::default(),
    };
    let (picks, script) = ops.split_at(ops.len().min(3));
    if picks.is_empty() {
        return;
    }
    let all = every_case(n);
    let cases: Vec<_> = picks
        .iter()
        .map(|p| {
            let mut case = all[usize::from(*p) * 7 % all.len()].clone();
            case.count = 1 + case.count % MAX_COUNT;
            case
        })
        .collect();
    run(n, config, &cases, script);
});

/// What happened on the hostile links, for the oracles.
#[derive(Default)]
struct Record {
    /// Link operations completed anywhere: the progress measure.
    progress: AtomicU64,
    /// A payload's content was changed (undetectable without integrity).
    tampered: AtomicBool,
    /// A payload's length was changed.
    resized: AtomicBool,
    /// A link error was injected, or a link closed.
    failed: AtomicBool,
    /// Any fault at all (including a receive that never answers).
    faulted: AtomicBool,
}

fn run(n: u32, config: EngineConfig, cases: &[chorus_engine::testkit::Case], script: &[u8]) {
    let record = Arc::new(Record::default());
    let root = Context::root();
    let dev = Arc::new(HostDevice);
    let script = Arc::new(Mutex::new(script.to_vec()));
    let engines: Vec<Engine<HostDevice, Hostile>> = mesh::<Bytes>(n, HeldLimit::bytes(16 << 20))
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            let links = links.into_iter().map(|inner| {
                Arc::new(Hostile {
                    inner,
                    // Only rank 0's receives are attacked; the rest count progress.
                    script: (r == 0).then(|| script.clone()),
                    record: record.clone(),
                    broken: Mutex::new(None),
                    last: Mutex::new(None),
                })
            });
            Engine::new(Rank(r as u32), n, links, dev.clone(), &root, config.clone())
                .expect("a valid world")
        })
        .collect();

    // Each rank runs the cases in order; a failed operation poisons the rest.
    type Outcome = Vec<(Result<(), OpError>, bool)>;
    let mut futures: Vec<Pin<Box<dyn Future<Output = Outcome> + '_>>> = engines
        .iter()
        .map(|e| {
            let fut = async move {
                let mut out = Vec::new();
                for case in cases {
                    let (send, mut buf, want) = layout(case, e.rank().0, n);
                    let b = if case.in_place {
                        Buffer::InPlace(&mut buf[..])
                    } else {
                        Buffer::Separate {
                            send: &send[..],
                            recv: &mut buf[..],
                        }
                    };
                    let result = e.run(case.op(b)).await;
                    out.push((result, buf == want));
                }
                out
            };
            Box::pin(fut) as Pin<Box<dyn Future<Output = Outcome> + '_>>
        })
        .collect();

    let mut cx = TaskContext::from_waker(std::task::Waker::noop());
    let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
    let (mut idle, mut aborted, mut since_abort) = (0u32, false, 0u32);
    while outcomes.iter().any(Option::is_none) {
        let before = record.progress.load(Ordering::Relaxed);
        let mut ended = false;
        for (fut, slot) in futures.iter_mut().zip(outcomes.iter_mut()) {
            if slot.is_none()
                && let Poll::Ready(out) = fut.as_mut().poll(&mut cx)
            {
                *slot = Some(out);
                ended = true;
            }
        }
        let moved = ended || record.progress.load(Ordering::Relaxed) != before;
        if aborted {
            since_abort += 1;
            assert!(
                since_abort <= ABORT_ROUNDS,
                "hang: collectives still running {ABORT_ROUNDS} rounds after the abort"
            );
        } else if moved {
            idle = 0;
        } else {
            idle += 1;
            if idle >= IDLE_ROUNDS {
                root.abort(AbortReason::requested("fuzz: no progress"));
                aborted = true;
            }
        }
    }
    drop(futures);

    let faulted = record.faulted.load(Ordering::Relaxed);
    let tampered = record.tampered.load(Ordering::Relaxed);
    let resized = record.resized.load(Ordering::Relaxed);
    let failed = record.failed.load(Ordering::Relaxed);
    for (r, out) in outcomes.into_iter().enumerate() {
        let out = out.expect("every rank ended");
        let mut poisoned = false;
        for (k, (result, correct)) in out.into_iter().enumerate() {
            match result {
                Ok(()) => {
                    assert!(
                        correct || tampered,
                        "r{r} op {k} ({:?}) ended Ok with a wrong result",
                        cases[k]
                    );
                }
                Err(e) => {
                    assert!(faulted, "r{r} op {k} failed with no fault injected: {e}");
                    let explained = match &e.kind {
                        OpErrorKind::Aborted(_) => aborted,
                        OpErrorKind::Link(_) => failed || aborted || r != 0,
                        OpErrorKind::SizeMismatch { .. } => resized || tampered,
                        OpErrorKind::Poisoned(_) => poisoned,
                        OpErrorKind::InvalidArgument(_) | OpErrorKind::Device(_) => false,
                    };
                    assert!(explained, "r{r} op {k} ({:?}): unexplained {e}", cases[k]);
                    poisoned = true;
                }
            }
        }
    }
    assert!(
        faulted || !aborted,
        "no fault injected, yet the world made no progress"
    );
}

/// One in-process link whose receives follow the fuzz script (rank 0's) or pass through.
struct Hostile {
    inner: Arc<LocalLink<Bytes>>,
    script: Option<Arc<Mutex<Vec<u8>>>>,
    record: Arc<Record>,
    /// Set once the script broke the link: every later operation fails with it.
    broken: Mutex<Option<LinkError>>,
    /// The previous payload received, for duplicates and reordering.
    last: Mutex<Option<Bytes>>,
}

/// What the script does to one receive.
enum Fault {
    Pass,
    Truncate(usize),
    Extend(usize),
    Flip(usize, u8),
    Previous,
    Fail(LinkError),
    Close,
    Silence,
}

impl Hostile {
    fn next_fault(&self, tag: Tag) -> Fault {
        let Some(script) = &self.script else {
            return Fault::Pass;
        };
        let mut s = script.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() < 2 {
            return Fault::Pass;
        }
        let (op, arg) = (s[0], s[1]);
        s.drain(..2);
        let mut wrong = tag;
        match op % 16 {
            0..=5 => Fault::Pass,
            6 => Fault::Truncate(usize::from(arg)),
            7 => Fault::Extend(1 + usize::from(arg)),
            8 => Fault::Flip(usize::from(arg), 1 << (arg % 8)),
            9 => Fault::Previous,
            10 => {
                match arg % 4 {
                    0 => wrong.offset ^= 1 + u64::from(arg),
                    1 => wrong.step = wrong.step.wrapping_add(1),
                    2 => wrong.op.0 = wrong.op.0.wrapping_add(u64::from(arg) + 1),
                    _ => wrong.dtype = DType::ALL[usize::from(arg) % DType::ALL.len()],
                }
                Fault::Fail(LinkError::TagMismatch {
                    expected: tag,
                    got: wrong,
                })
            }
            11 => Fault::Fail(LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: "fuzz: bad frame".into(),
            }),
            12 => Fault::Fail(LinkError::Overflow {
                bytes: u64::from(arg) << 20,
                limit: 1 << 20,
            }),
            13 => Fault::Fail(LinkError::ConnectionLost {
                detail: "fuzz: reset".into(),
            }),
            14 => Fault::Close,
            _ => Fault::Silence,
        }
    }

    fn broken(&self) -> Option<LinkError> {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn mark(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::Relaxed);
        self.record.faulted.store(true, Ordering::Relaxed);
    }
}

impl Link<Bytes> for Hostile {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }

    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        Box::pin(async move {
            if let Some(e) = self.broken() {
                return Err(e);
            }
            self.inner.send(tag, payload).await?;
            self.record.progress.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        Box::pin(async move {
            if let Some(e) = self.broken() {
                return Err(e);
            }
            let fault = self.next_fault(tag);
            match &fault {
                Fault::Fail(e) => {
                    self.mark(&self.record.failed);
                    // A real link fails for good, and the peer sees it close.
                    *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                    self.inner.cancel(CancelReason::new(
                        CloseCode::PROTOCOL_VIOLATION,
                        "fuzz: link failed",
                    ));
                    return Err(e.clone());
                }
                Fault::Close => {
                    self.mark(&self.record.failed);
                    self.inner
                        .cancel(CancelReason::new(CloseCode::ABORTED, "fuzz: early close"));
                    let e = LinkError::PeerDeparted {
                        code: CloseCode::ABORTED,
                        detail: "fuzz: early close".into(),
                    };
                    *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                    return Err(e);
                }
                Fault::Silence => {
                    self.record.faulted.store(true, Ordering::Relaxed);
                    return std::future::pending().await;
                }
                _ => {}
            }
            let got = self.inner.recv(tag).await?;
            self.record.progress.fetch_add(1, Ordering::Relaxed);
            let previous = self
                .last
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(got.clone());
            Ok(match fault {
                Fault::Truncate(k) if !got.is_empty() => {
                    self.mark(&self.record.resized);
                    got.slice(..k % got.len())
                }
                Fault::Extend(k) => {
                    self.mark(&self.record.resized);
                    let mut v = got.to_vec();
                    v.resize(v.len() + k, 0xa5);
                    Bytes::from(v)
                }
                Fault::Flip(at, bit) if !got.is_empty() => {
                    self.mark(&self.record.tampered);
                    let mut v = got.to_vec();
                    let at = at % v.len();
                    v[at] ^= bit;
                    Bytes::from(v)
                }
                Fault::Previous => match previous {
                    Some(p) if p != got => {
                        self.mark(&self.record.tampered);
                        if p.len() != got.len() {
                            self.mark(&self.record.resized);
                        }
                        p
                    }
                    _ => got,
                },
                _ => got,
            })
        })
    }

    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason);
    }

    fn failure(&self) -> Option<LinkError> {
        self.broken().or_else(|| self.inner.failure())
    }
}
