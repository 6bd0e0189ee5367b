//! The staging path's wire protocol on the CPU: a host link that cuts every payload by the
//! same schedule `StagedLink` follows (`chorus_cuda::staging`: the header, the part tags,
//! the copy/send order, the receive's reassembly and length checks), with host copies where
//! the device's would be, under the GPU tests' whole collective matrix through the host
//! engine. Parts are small, so every payload crosses in many; a difference from the
//! sequential reference can only be the staging protocol's.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_cuda::staging::{
    HEADER_BYTES, Header, Parts, RecvPipeline, RecvStep, SendPipeline, SendStep, StageError,
    StagePlan,
};
use chorus_engine::link::{CancelReason, Link, LinkError, LinkFuture, Tag};
use chorus_engine::local::mesh;
use chorus_engine::testkit::{Host, every_case, large_cases, matrix_configs, sweep};
use chorus_engine::{AbortReason, Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink};
use chorus_protocol::{CloseCode, Collective, DType, OpSeq, Rank};

const LIMIT: Duration = Duration::from_secs(240);

/// `StagedLink`'s schedule with host memory for device memory.
struct HostStaged {
    inner: Arc<LocalLink<Bytes>>,
    plan: StagePlan,
}

fn violation(e: StageError) -> LinkError {
    LinkError::Protocol {
        code: CloseCode::PROTOCOL_VIOLATION,
        detail: e.to_string(),
    }
}

impl HostStaged {
    async fn send_staged(&self, tag: Tag, payload: Bytes) -> Result<(), LinkError> {
        let parts = Parts::new(tag).map_err(violation)?;
        let mut pipe = SendPipeline::new(&self.plan, payload.len()).map_err(violation)?;
        let mut slots: Vec<Option<Vec<u8>>> = vec![None; self.plan.depth() as usize];
        loop {
            let step = pipe.next();
            match &step {
                SendStep::Copy { slot, range, .. } => {
                    let s = &mut slots[*slot as usize];
                    assert!(s.is_none(), "slot {slot} reused before its part was sent");
                    *s = Some(payload[range.clone()].to_vec());
                }
                SendStep::AwaitCopy { .. } => {}
                SendStep::Send { part, slot, .. } => {
                    let data = slots[*slot as usize].take().unwrap();
                    let bytes = if *part == 0 {
                        let mut b = BytesMut::from(&pipe.header().encode()[..]);
                        b.extend_from_slice(&data);
                        b.freeze()
                    } else {
                        Bytes::from(data)
                    };
                    self.inner.send(parts.tag(*part), bytes).await?;
                }
                SendStep::Done => return Ok(()),
            }
            pipe.done(&step);
        }
    }

    async fn recv_staged(&self, tag: Tag) -> Result<Bytes, LinkError> {
        let parts = Parts::new(tag).map_err(violation)?;
        let mut pipe = RecvPipeline::new(&self.plan);
        let mut out: Vec<u8> = Vec::new();
        let mut held: Option<Bytes> = None;
        loop {
            let step = pipe.next();
            match &step {
                RecvStep::Recv { part } => {
                    let mut bytes = self.inner.recv(parts.tag(*part)).await?;
                    if *part == 0 {
                        let h = Header::decode(&bytes, 1 << 30).map_err(violation)?;
                        pipe.opened(h).map_err(violation)?;
                        let _ = bytes.split_to(HEADER_BYTES);
                        out = vec![0; h.total as usize];
                    }
                    pipe.check_len(*part, bytes.len()).map_err(violation)?;
                    held = Some(bytes);
                }
                RecvStep::AwaitSlot { .. } => {}
                RecvStep::Stage { range, .. } => {
                    out[range.clone()].copy_from_slice(&held.take().unwrap());
                }
                RecvStep::Done => return Ok(Bytes::from(out)),
            }
            pipe.done(&step);
        }
    }
}

impl Link<Bytes> for HostStaged {
    fn peer(&self) -> Rank {
        self.inner.peer()
    }
    fn send(&self, tag: Tag, payload: Bytes) -> LinkFuture<'_, ()> {
        Box::pin(self.send_staged(tag, payload))
    }
    fn recv(&self, tag: Tag) -> LinkFuture<'_, Bytes> {
        Box::pin(self.recv_staged(tag))
    }
    fn cancel(&self, reason: CancelReason) {
        self.inner.cancel(reason);
    }
}

type Staged = Engine<HostDevice, HostStaged>;

fn world(
    n: u32,
    plan: StagePlan,
    config: &EngineConfig,
) -> (Vec<Staged>, Vec<Arc<LocalLink<Bytes>>>) {
    let host = mesh::<Bytes>(n, HeldLimit::default());
    let root = Context::root();
    let all: Vec<Arc<LocalLink<Bytes>>> = host.iter().flatten().cloned().collect();
    let engines = host
        .into_iter()
        .enumerate()
        .map(|(r, row)| {
            let links = row
                .into_iter()
                .map(|inner| Arc::new(HostStaged { inner, plan }));
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
    (engines, all)
}

/// Runs `f` on every rank, one thread each; on the first failure or past `LIMIT` every
/// engine is aborted and every link cancelled, so nothing hangs.
fn run(
    engines: &[Staged],
    links: &[Arc<LocalLink<Bytes>>],
    f: impl Fn(&Staged) -> Result<(), String> + Sync,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        for e in engines {
            let (tx, f) = (tx.clone(), &f);
            s.spawn(move || {
                let _ = tx.send(f(e));
            });
        }
        drop(tx);
        let deadline = Instant::now() + LIMIT;
        let mut first = Ok(());
        for _ in engines {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| Err(format!("not done within {LIMIT:?}")));
            if r.is_err() && first.is_ok() {
                first = r;
                for e in engines {
                    e.context().abort(AbortReason::requested("a rank failed"));
                }
                for l in links {
                    l.cancel(CancelReason::new(CloseCode::ABORTED, "a rank failed"));
                }
            }
        }
        first
    })
}

#[test]
fn the_gpu_matrix_passes_over_the_staging_protocol_on_the_host() {
    // 16-byte parts, two slots: every engine chunk crosses in many parts.
    let plan = StagePlan::new(16, 2).unwrap();
    for n in [2u32, 4] {
        let cases = every_case(n);
        for config in matrix_configs() {
            let (engines, links) = world(n, plan, &config);
            if let Err(e) = run(&engines, &links, |e| sweep(&Host, e, &cases)) {
                panic!("{n} ranks, {:?}: {e}", config.overrides);
            }
        }
        let (engines, links) = world(
            n,
            StagePlan::new(4096, 3).unwrap(),
            &EngineConfig::default(),
        );
        run(&engines, &links, |e| sweep(&Host, e, &large_cases(n))).unwrap();
    }
}

#[test]
fn a_part_that_breaks_the_header_is_a_protocol_violation_not_a_panic() {
    let host = mesh::<Bytes>(2, HeldLimit::default());
    let plan = StagePlan::new(16, 2).unwrap();
    let receiver = HostStaged {
        inner: host[1][0].clone(),
        plan,
    };
    let tag = Tag {
        collective: Collective::AllReduce,
        op: OpSeq(1),
        step: 0,
        offset: 0,
        dtype: DType::U8,
    };
    let raw = &host[0][0];
    // Part 0 announces 40 bytes in 16-byte parts (3 parts) but part 1 holds 5.
    let mut p0 = Header {
        total: 40,
        chunk: 16,
    }
    .encode()
    .to_vec();
    p0.extend_from_slice(&[1; 16]);
    let parts = Parts::new(tag).unwrap();
    chorus_cuda::testing::block_on(async {
        raw.send(parts.tag(0), Bytes::from(p0)).await.unwrap();
        raw.send(parts.tag(1), Bytes::from(vec![2; 5]))
            .await
            .unwrap();
        let err = receiver.recv(tag).await.unwrap_err();
        assert!(
            matches!(&err, LinkError::Protocol { detail, .. } if detail.contains("part 1 holds 5")),
            "{err}"
        );
        // No header at all.
        let tag2 = Tag {
            op: OpSeq(2),
            ..tag
        };
        raw.send(tag2, Bytes::from_static(b"short")).await.unwrap();
        let err = receiver.recv(tag2).await.unwrap_err();
        assert!(
            matches!(&err, LinkError::Protocol { detail, .. } if detail.contains("header")),
            "{err}"
        );
    });
}
