//! The device's completion hook: every operation that ran settles its device once before it
//! reports `Ok`, a settle error fails (and poisons) the operation, and an abort during the
//! settle is reported as the abort. The reads of received payloads name their operation, and
//! an operation that fails tells the device to forget it.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::Bytes;
use chorus_engine::local::mesh;
use chorus_engine::{
    AbortReason, Buffer, Context, Device, DeviceError, Engine, EngineConfig, HeldLimit, HostBuffer,
    HostDevice, LocalLink, Op, OpErrorKind, Reduction,
};
use chorus_protocol::{DType, Rank, ReduceOp};
use futures::executor::block_on;

/// What a [`Settling`] device does when the engine settles it.
#[derive(Clone)]
enum Then {
    Succeed,
    Fail(DeviceError),
    /// Abort the operation's context (a deadline firing during the wait), then fail.
    AbortAndFail,
}

/// The host device, counting settles and answering them as told.
struct Settling {
    calls: AtomicUsize,
    then: Mutex<Then>,
    /// The context of every settle, to check it is the operation's.
    seen: Mutex<Vec<Context>>,
    /// The context every read of a received payload named.
    read_in: Mutex<Vec<Context>>,
    /// The contexts the engine told the device to forget.
    forgot: Mutex<Vec<Context>>,
}

impl Settling {
    fn new() -> Self {
        Settling {
            calls: AtomicUsize::new(0),
            then: Mutex::new(Then::Succeed),
            seen: Mutex::new(Vec::new()),
            read_in: Mutex::new(Vec::new()),
            forgot: Mutex::new(Vec::new()),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Device for Settling {
    type Mem = [u8];
    type Owned = HostBuffer;
    type Payload = Bytes;

    fn name(&self) -> &str {
        "settling"
    }
    fn len(&self, mem: &[u8]) -> usize {
        mem.len()
    }
    fn alloc(&self, bytes: usize) -> Result<HostBuffer, DeviceError> {
        HostDevice.alloc(bytes)
    }
    fn copy(
        &self,
        dst: &mut [u8],
        dst_off: usize,
        src: &[u8],
        src_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        HostDevice.copy(dst, dst_off, src, src_off, len)
    }
    fn copy_within(
        &self,
        mem: &mut [u8],
        src_off: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        HostDevice.copy_within(mem, src_off, dst_off, len)
    }
    fn reduce(
        &self,
        dst: &mut [u8],
        dst_off: usize,
        src: &[u8],
        src_off: usize,
        len: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        HostDevice.reduce(dst, dst_off, src, src_off, len, dtype, op)
    }
    fn scale(
        &self,
        mem: &mut [u8],
        off: usize,
        len: usize,
        dtype: DType,
        factor: f64,
    ) -> Result<(), DeviceError> {
        HostDevice.scale(mem, off, len, dtype, factor)
    }
    fn pack(&self, src: &[u8], off: usize, len: usize) -> Result<Bytes, DeviceError> {
        HostDevice.pack(src, off, len)
    }
    fn payload_len(&self, payload: &Bytes) -> usize {
        payload.len()
    }
    fn unpack(&self, dst: &mut [u8], off: usize, payload: &Bytes) -> Result<(), DeviceError> {
        HostDevice.unpack(dst, off, payload)
    }
    fn unpack_reduce(
        &self,
        dst: &mut [u8],
        off: usize,
        payload: &Bytes,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), DeviceError> {
        HostDevice.unpack_reduce(dst, off, payload, dtype, op)
    }

    fn unpack_for(
        &self,
        op: &Context,
        dst: &mut [u8],
        off: usize,
        payload: &Bytes,
    ) -> Result<(), DeviceError> {
        self.read_in.lock().unwrap().push(op.clone());
        HostDevice.unpack(dst, off, payload)
    }
    fn unpack_reduce_for(
        &self,
        op: &Context,
        dst: &mut [u8],
        off: usize,
        payload: &Bytes,
        dtype: DType,
        reduce: ReduceOp,
    ) -> Result<(), DeviceError> {
        self.read_in.lock().unwrap().push(op.clone());
        HostDevice.unpack_reduce(dst, off, payload, dtype, reduce)
    }
    fn forget(&self, op: &Context) {
        self.forgot.lock().unwrap().push(op.clone());
    }

    fn settle(&self, op: &Context) -> Result<(), DeviceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(op.clone());
        match self.then.lock().unwrap().clone() {
            Then::Succeed => Ok(()),
            Then::Fail(e) => Err(e),
            Then::AbortAndFail => {
                op.abort(AbortReason::requested("deadline while settling"));
                Err(DeviceError::Wait("settle abandoned".into()))
            }
        }
    }
}

type Eng = Engine<Settling, LocalLink<Bytes>>;

fn world(n: u32, parent: &Context) -> Vec<Eng> {
    mesh::<Bytes>(n, HeldLimit::default())
        .into_iter()
        .enumerate()
        .map(|(r, links)| {
            Engine::new(
                Rank(r as u32),
                n,
                links,
                Arc::new(Settling::new()),
                parent,
                EngineConfig::default(),
            )
            .unwrap()
        })
        .collect()
}

/// Every kind of operation, once, on rank `e`; returns how many ran.
fn every_op(e: &Eng) -> usize {
    let n = e.world() as usize;
    let r = e.rank().0 as usize;
    let count = 64;
    let bytes = count * 4;
    let mut buf = vec![1u8; bytes * n];
    let mut out = vec![0u8; bytes * n];
    let mut ops = 0;
    let mut go = |op: Op<'_, [u8]>| {
        block_on(e.run(op)).unwrap();
        ops += 1;
    };
    go(Op::AllReduce {
        buf: Buffer::InPlace(&mut buf[..bytes]),
        count,
        dtype: DType::F32,
        reduction: Reduction::Avg,
    });
    go(Op::Reduce {
        buf: Buffer::Separate {
            send: &buf[..bytes],
            recv: &mut out[..bytes],
        },
        count,
        dtype: DType::F32,
        reduction: Reduction::PreMulSum(0.5),
        root: Rank(0),
    });
    go(Op::Broadcast {
        buf: Buffer::InPlace(&mut buf[..bytes]),
        count,
        dtype: DType::F32,
        root: Rank(0),
    });
    go(Op::AllGather {
        buf: Buffer::Separate {
            send: &buf[..bytes],
            recv: &mut out[..],
        },
        count,
        dtype: DType::F32,
    });
    go(Op::ReduceScatter {
        buf: Buffer::Separate {
            send: &buf[..],
            recv: &mut out[..bytes],
        },
        count,
        dtype: DType::F32,
        reduction: Reduction::Sum,
    });
    go(Op::AllToAll {
        buf: Buffer::Separate {
            send: &buf[..],
            recv: &mut out[..],
        },
        count,
        dtype: DType::F32,
    });
    go(Op::Gather {
        buf: Buffer::Separate {
            send: &buf[..bytes],
            recv: &mut out[..],
        },
        count,
        dtype: DType::F32,
        root: Rank(0),
    });
    go(Op::Scatter {
        buf: Buffer::Separate {
            send: &buf[..],
            recv: &mut out[..bytes],
        },
        count,
        dtype: DType::F32,
        root: Rank(0),
    });
    go(Op::Barrier);
    if n > 1 {
        let peer = Rank(((r + 1) % n) as u32);
        let from = Rank(((r + n - 1) % n) as u32);
        // Post the receive first, then send: both run together as a group.
        block_on(e.group(vec![
            Op::Recv {
                buf: &mut out[..bytes],
                count,
                dtype: DType::F32,
                peer: from,
            },
            Op::Send {
                buf: &buf[..bytes],
                count,
                dtype: DType::F32,
                peer,
            },
        ]))
        .unwrap();
        ops += 2;
    }
    ops
}

#[test]
fn every_operation_settles_its_device_once_in_its_own_context() {
    for n in [1u32, 2, 3] {
        let root = Context::root();
        let es = world(n, &root);
        let ran: Vec<usize> = thread::scope(|s| {
            let hs: Vec<_> = es.iter().map(|e| s.spawn(|| every_op(e))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (e, ops) in es.iter().zip(ran) {
            let dev = e.device();
            assert_eq!(dev.calls(), ops, "settles at rank {} of {n}", e.rank());
            let seen = dev.seen.lock().unwrap();
            let read_in = dev.read_in.lock().unwrap();
            assert_eq!(
                read_in.is_empty(),
                n == 1,
                "reads at rank {} of {n}",
                e.rank()
            );
            for ctx in read_in.iter() {
                assert!(
                    seen.iter().any(|s| s.same(ctx)),
                    "a read named a context no settle judged"
                );
            }
            assert!(dev.forgot.lock().unwrap().is_empty(), "nothing failed");
            drop((seen, read_in));
            for ctx in dev.seen.lock().unwrap().iter() {
                assert!(ctx.descends_from(e.context()), "not under the engine");
                assert!(
                    !e.context().descends_from(ctx),
                    "the engine's own context, not the operation's"
                );
            }
        }
    }
}

#[test]
fn a_settle_error_fails_the_operation_and_poisons_the_communicator() {
    let root = Context::root();
    let es = world(2, &root);
    let broken = DeviceError::Wait("stream synchronize on test did not finish".into());
    *es[0].device().then.lock().unwrap() = Then::Fail(broken.clone());
    let results: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = es
            .iter()
            .map(|e| {
                s.spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    block_on(e.all_reduce(
                        Buffer::InPlace(&mut buf[..]),
                        1024,
                        DType::F32,
                        Reduction::Sum,
                    ))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let err = results[0].as_ref().unwrap_err();
    assert_eq!(err.kind, OpErrorKind::Device(broken));
    assert!(err.partial_output, "{err}");
    assert!(results[1].is_ok(), "the other rank's device settled");
    assert_eq!(es[0].device().calls(), 1);
    // The failed operation's record is forgotten: the next operation is not judged by it.
    let forgot = es[0].device().forgot.lock().unwrap().clone();
    let seen = es[0].device().seen.lock().unwrap().clone();
    assert_eq!(forgot.len(), 1);
    assert!(forgot[0].same(&seen[0]), "forgot another operation");
    assert!(es[1].device().forgot.lock().unwrap().is_empty());
    // The communicator is unusable afterwards, and nothing more is settled.
    let mut buf = [0u8; 16];
    let again =
        block_on(es[0].all_reduce(Buffer::InPlace(&mut buf[..]), 4, DType::F32, Reduction::Sum))
            .unwrap_err();
    assert!(matches!(again.kind, OpErrorKind::Poisoned(_)), "{again}");
    assert_eq!(es[0].device().calls(), 1);
}

#[test]
fn an_abort_while_settling_is_reported_as_the_abort() {
    let root = Context::root();
    let es = world(1, &root);
    *es[0].device().then.lock().unwrap() = Then::AbortAndFail;
    let mut buf = [0u8; 64];
    let err = block_on(es[0].all_reduce(
        Buffer::InPlace(&mut buf[..]),
        16,
        DType::F32,
        Reduction::PreMulSum(2.0),
    ))
    .unwrap_err();
    assert_eq!(
        err.abort_reason(),
        Some(&AbortReason::requested("deadline while settling")),
        "{err}"
    );
    // Only the operation was aborted, not the communicator.
    assert!(!es[0].context().is_aborted());
}

#[test]
fn an_operation_that_fails_before_it_ends_is_not_settled() {
    let root = Context::root();
    let es = world(1, &root);
    let mut short = [0u8; 8];
    let err = block_on(es[0].all_reduce(
        Buffer::InPlace(&mut short[..]),
        16,
        DType::F32,
        Reduction::Sum,
    ))
    .unwrap_err();
    assert!(matches!(err.kind, OpErrorKind::InvalidArgument(_)), "{err}");
    assert_eq!(es[0].device().calls(), 0);
    // Whatever it recorded, the device is told to forget it.
    assert_eq!(es[0].device().forgot.lock().unwrap().len(), 1);
}
