//! GPU tests: the device on real device memory, collectives across ranks sharing one GPU
//! (threads and processes), and abort of kernels blocked on an absent peer. Without a GPU
//! each test returns after one line (per process) saying what was skipped and why.

#![allow(clippy::unwrap_used)]

use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chorus_cuda::local::{connect_all, peer_index};
use chorus_cuda::testing::{Rank as R, gpu_or_skip};
use chorus_cuda::{CudaDevice, CudaError, DeviceLink, LinkConfig, reference};
use chorus_engine::device::Device;
use chorus_engine::link::{CancelReason, Link};
use chorus_protocol::{CloseCode, DType, Rank, ReduceOp};
use half::{bf16, f16};

const T: Duration = Duration::from_secs(20);

fn small_config() -> LinkConfig {
    // Small slots and only two, so payloads wrap around the slots many times.
    LinkConfig {
        slot_bytes: 64 << 10,
        slots: 2,
        ..LinkConfig::default()
    }
}

/// Element `i` of rank `r`'s input: small integers, so every reduction order is exact.
fn value(dtype: DType, op: ReduceOp, r: usize, i: usize) -> Vec<u8> {
    let fp8 = matches!(dtype, DType::F8E4M3 | DType::F8E5M2);
    let signed = dtype.is_float() || matches!(dtype, DType::I8 | DType::I32 | DType::I64);
    let v: i64 = match op {
        ReduceOp::Prod => 1 + ((i + r) % 2) as i64,
        // fp8 has 2-3 mantissa bits: keep every partial sum of 4 ranks (doubled by
        // PreMulSum) at most 8 in magnitude, where E5M2 is still exact.
        _ if fp8 => ((i + r) % 3) as i64 - 1,
        _ => ((i * 7 + r * 3) % 9) as i64 - if signed { 4 } else { 0 },
    };
    let f = v as f32;
    match dtype {
        DType::F32 => f.to_le_bytes().to_vec(),
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
        DType::F16 => f16::from_f32(f).to_bits().to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f32(f).to_bits().to_le_bytes().to_vec(),
        DType::F8E4M3 => vec![reference::f32_to_e4m3(f)],
        DType::F8E5M2 => vec![reference::f32_to_e5m2(f)],
        DType::I8 => vec![v as i8 as u8],
        DType::U8 => vec![v as u8],
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        DType::U32 => (v as u32).to_le_bytes().to_vec(),
        DType::I64 => v.to_le_bytes().to_vec(),
        DType::U64 => (v as u64).to_le_bytes().to_vec(),
    }
}

fn input(dtype: DType, op: ReduceOp, r: usize, n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| value(dtype, op, r, i)).collect()
}

/// What an all-reduce of every rank's input gives.
fn expected(dtype: DType, op: ReduceOp, world: usize, n: usize, scalar: f64) -> Vec<u8> {
    let base = if matches!(op, ReduceOp::Avg | ReduceOp::PreMulSum) {
        ReduceOp::Sum
    } else {
        op
    };
    let prep = |mut v: Vec<u8>| {
        if op == ReduceOp::PreMulSum {
            reference::scale(dtype, &mut v, scalar);
        }
        v
    };
    let mut acc = prep(input(dtype, op, 0, n));
    for r in 1..world {
        reference::reduce(dtype, base, &mut acc, &prep(input(dtype, op, r, n)));
    }
    if op == ReduceOp::Avg {
        reference::scale(dtype, &mut acc, 1.0 / world as f64);
    }
    acc
}

#[test]
fn every_reduction_and_scale_matches_the_reference_on_device_memory() {
    let Some(gpu) = gpu_or_skip("GPU tests") else {
        return;
    };
    let dev = CudaDevice::on(gpu).unwrap();
    for dtype in DType::ALL {
        let n = 4099;
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let (a, b) = (input(dtype, op, 0, n), input(dtype, op, 1, n));
            let mut da = dev.buffer(a.len()).unwrap();
            let mut db = dev.buffer(b.len()).unwrap();
            dev.upload(&mut da, 0, &a, T).unwrap();
            dev.upload(&mut db, 0, &b, T).unwrap();
            dev.reduce(&mut da, 0, &db, 0, a.len(), dtype, op).unwrap();
            let got = dev.download(&da, 0, a.len(), T).unwrap();
            let mut want = a.clone();
            reference::reduce(dtype, op, &mut want, &b);
            assert_eq!(got, want, "{op} over {dtype}");
        }
        for factor in [0.5, 1.0 / 3.0, -2.0] {
            let a = input(dtype, ReduceOp::Sum, 2, n);
            let mut da = dev.buffer(a.len()).unwrap();
            dev.upload(&mut da, 0, &a, T).unwrap();
            dev.scale(&mut da, 0, a.len(), dtype, factor).unwrap();
            let mut want = a.clone();
            reference::scale(dtype, &mut want, factor);
            assert_eq!(
                dev.download(&da, 0, a.len(), T).unwrap(),
                want,
                "scale {dtype} by {factor}"
            );
        }
    }
    // Packing, unpacking, overlapping copies, and the errors of bad regions.
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut m = dev.buffer(data.len()).unwrap();
    dev.upload(&mut m, 0, &data, T).unwrap();
    let p = dev.pack(&m, 100, 5000).unwrap();
    let mut out = dev.buffer(6000).unwrap();
    dev.unpack(&mut out, 1000, &p).unwrap();
    assert_eq!(dev.download(&out, 1000, 5000, T).unwrap(), data[100..5100]);
    dev.copy_within(&mut m, 0, 10, 5000).unwrap();
    let got = dev.download(&m, 0, data.len(), T).unwrap();
    assert_eq!(got[10..5010], data[..5000]);
    assert!(
        dev.unpack(&mut out, 2000, &p).is_err(),
        "payload past the end"
    );
    assert!(
        dev.reduce(&mut m, 0, &out, 0, 6, DType::F32, ReduceOp::Sum)
            .is_err(),
        "misaligned"
    );
    assert!(
        dev.reduce(&mut m, 0, &out, 0, 8, DType::F32, ReduceOp::Avg)
            .is_err(),
        "avg has no kernel"
    );
    dev.synchronize(T).unwrap();
}

fn run_collectives(world: usize) {
    let Some(gpu) = gpu_or_skip("GPU tests") else {
        return;
    };
    let devices: Vec<CudaDevice> = (0..world)
        .map(|_| CudaDevice::on(gpu.clone()).unwrap())
        .collect();
    let links = connect_all(&devices, &small_config()).unwrap();
    std::thread::scope(|s| {
        for (me, (dev, row)) in devices.iter().zip(&links).enumerate() {
            s.spawn(move || {
                let rank = R {
                    device: dev,
                    links: row,
                    me,
                    world,
                };
                let mut seq = 0u64;
                for dtype in DType::ALL {
                    for op in ReduceOp::ALL {
                        for n in [1usize, 1000, 66_000] {
                            seq += 1;
                            let data = input(dtype, op, me, n);
                            let mut buf = dev.buffer(data.len()).unwrap();
                            dev.upload(&mut buf, 0, &data, T).unwrap();
                            rank.all_reduce(&mut buf, data.len(), dtype, op, 2.0, seq)
                                .unwrap();
                            dev.synchronize(T).unwrap();
                            let got = dev.download(&buf, 0, data.len(), T).unwrap();
                            assert_eq!(
                                got,
                                expected(dtype, op, world, n, 2.0),
                                "all-reduce {op} {dtype} n={n} world={world} rank {me}"
                            );
                        }
                    }
                    // Reduce onto the last rank.
                    seq += 1;
                    let data = input(dtype, ReduceOp::Max, me, 777);
                    let mut buf = dev.buffer(data.len()).unwrap();
                    dev.upload(&mut buf, 0, &data, T).unwrap();
                    rank.reduce(&mut buf, data.len(), dtype, ReduceOp::Max, world - 1, seq)
                        .unwrap();
                    dev.synchronize(T).unwrap();
                    if me == world - 1 {
                        let got = dev.download(&buf, 0, data.len(), T).unwrap();
                        assert_eq!(
                            got,
                            expected(dtype, ReduceOp::Max, world, 777, 1.0),
                            "reduce {dtype}"
                        );
                    }
                }
                // Broadcast moves bytes from rank 1 to everyone.
                let block = 100_003;
                let mine: Vec<u8> = (0..block).map(|i| (i * 13 + me * 101) as u8).collect();
                let mut b = dev.buffer(block).unwrap();
                dev.upload(&mut b, 0, &mine, T).unwrap();
                rank.broadcast(&mut b, block, 1, 9001).unwrap();
                dev.synchronize(T).unwrap();
                let from1: Vec<u8> = (0..block).map(|i| (i * 13 + 101) as u8).collect();
                assert_eq!(dev.download(&b, 0, block, T).unwrap(), from1, "broadcast");
            });
        }
    });
    drop(links);
    for d in &devices {
        d.synchronize(T).unwrap();
    }
}

#[test]
fn collectives_are_correct_at_2_ranks_on_one_gpu() {
    run_collectives(2);
}

#[test]
fn collectives_are_correct_at_4_ranks_on_one_gpu() {
    run_collectives(4);
}

#[test]
fn all_gather_and_all_to_all_place_every_block() {
    let Some(gpu) = gpu_or_skip("GPU tests") else {
        return;
    };
    let world = 3;
    let devices: Vec<CudaDevice> = (0..world)
        .map(|_| CudaDevice::on(gpu.clone()).unwrap())
        .collect();
    let links = connect_all(&devices, &small_config()).unwrap();
    let block = 70_001;
    let blockof = |r: usize, salt: usize| -> Vec<u8> {
        (0..block).map(|i| (i * 7 + r * 31 + salt) as u8).collect()
    };
    std::thread::scope(|s| {
        for (me, (dev, row)) in devices.iter().zip(&links).enumerate() {
            s.spawn(move || {
                let rank = R {
                    device: dev,
                    links: row,
                    me,
                    world,
                };
                let mut all = dev.buffer(block * world).unwrap();
                dev.upload(&mut all, me * block, &blockof(me, 0), T)
                    .unwrap();
                rank.all_gather(&mut all, block, 1).unwrap();
                dev.synchronize(T).unwrap();
                let want: Vec<u8> = (0..world).flat_map(|r| blockof(r, 0)).collect();
                assert_eq!(
                    dev.download(&all, 0, block * world, T).unwrap(),
                    want,
                    "all-gather at {me}"
                );
                // send block p = blockof(me, p + 1); rank p receives it at block `me`.
                let mut send = dev.buffer(block * world).unwrap();
                for p in 0..world {
                    dev.upload(&mut send, p * block, &blockof(me, p + 1), T)
                        .unwrap();
                }
                let mut recv = dev.buffer(block * world).unwrap();
                rank.all_to_all(&send, &mut recv, block, 2).unwrap();
                dev.synchronize(T).unwrap();
                let want: Vec<u8> = (0..world).flat_map(|src| blockof(src, me + 1)).collect();
                assert_eq!(
                    dev.download(&recv, 0, block * world, T).unwrap(),
                    want,
                    "all-to-all at {me}"
                );
            });
        }
    });
}

#[test]
fn abort_retires_a_kernel_blocked_on_an_absent_peer_and_the_context_lives_on() {
    let Some(gpu) = gpu_or_skip("GPU tests") else {
        return;
    };
    let devices: Vec<CudaDevice> = (0..2)
        .map(|_| CudaDevice::on(gpu.clone()).unwrap())
        .collect();
    let links = connect_all(&devices, &small_config()).unwrap();
    let (l0, l1) = (&links[0][0], &links[1][0]);
    l1.freeze_for_test();
    // More sends than slots: the third waits for a peer that never takes the first.
    let src = devices[0].buffer(64 << 10).unwrap();
    for step in 0..3 {
        let p = devices[0].pack(&src, 0, 64 << 10).unwrap();
        chorus_cuda::testing::block_on(l0.send(tag(step), p)).unwrap();
    }
    // A bounded synchronisation reports the blocked work instead of hanging.
    let start = Instant::now();
    let err = devices[0]
        .synchronize(Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(err, CudaError::Timeout { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the timeout took {:?}",
        start.elapsed()
    );
    // Abort: the waiting kernel returns within a millisecond.
    let t0 = Instant::now();
    l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
    while l0.flush(Duration::from_micros(50)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "abort did not retire the kernel"
        );
    }
    let retire = t0.elapsed();
    eprintln!("abort retired the blocked kernel in {retire:?}");
    assert!(
        retire < Duration::from_millis(1),
        "retiring took {retire:?}"
    );
    assert!(l0.retired().0 > 0, "the wait should record its abort");
    // The operation is an error, never a silent success.
    let err = devices[0].synchronize(T).unwrap_err();
    assert!(matches!(err, CudaError::Aborted { .. }), "{err}");
    l1.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
    drop(links);
    // A new communicator on the same context works.
    let links = connect_all(&devices, &small_config()).unwrap();
    std::thread::scope(|s| {
        for (me, (dev, row)) in devices.iter().zip(&links).enumerate() {
            s.spawn(move || {
                let rank = R {
                    device: dev,
                    links: row,
                    me,
                    world: 2,
                };
                let data = input(DType::F32, ReduceOp::Sum, me, 50_000);
                let mut buf = dev.buffer(data.len()).unwrap();
                dev.upload(&mut buf, 0, &data, T).unwrap();
                rank.all_reduce(&mut buf, data.len(), DType::F32, ReduceOp::Sum, 1.0, 1)
                    .unwrap();
                dev.synchronize(T).unwrap();
                assert_eq!(
                    dev.download(&buf, 0, data.len(), T).unwrap(),
                    expected(DType::F32, ReduceOp::Sum, 2, 50_000, 1.0)
                );
            });
        }
    });
    let _ = peer_index(0, 1);
}

fn tag(step: u32) -> chorus_engine::link::Tag {
    chorus_engine::link::Tag {
        collective: chorus_protocol::Collective::SendRecv,
        op: chorus_protocol::OpSeq(1),
        step,
        offset: 0,
        dtype: DType::U8,
    }
}

/// The child half of `ranks_in_two_processes_share_the_gpu_through_ipc`; inert otherwise.
#[test]
fn ipc_child() {
    let Ok(path) = std::env::var("CHORUS_CUDA_IPC_SOCKET") else {
        return;
    };
    let dev = CudaDevice::new(0).unwrap();
    let socket = UnixStream::connect(path).unwrap();
    let link = DeviceLink::connect(&dev, Rank(1), Rank(0), socket, &small_config()).unwrap();
    ipc_all_reduce(&dev, link, 1);
}

fn ipc_all_reduce(dev: &CudaDevice, link: DeviceLink, me: usize) {
    let links = [link];
    let rank = R {
        device: dev,
        links: &links,
        me,
        world: 2,
    };
    let data = input(DType::BF16, ReduceOp::Sum, me, 300_001);
    let mut buf = dev.buffer(data.len()).unwrap();
    dev.upload(&mut buf, 0, &data, T).unwrap();
    rank.all_reduce(&mut buf, data.len(), DType::BF16, ReduceOp::Sum, 1.0, 1)
        .unwrap();
    dev.synchronize(T).unwrap();
    assert_eq!(
        dev.download(&buf, 0, data.len(), T).unwrap(),
        expected(DType::BF16, ReduceOp::Sum, 2, 300_001, 1.0)
    );
}

#[test]
fn ranks_in_two_processes_share_the_gpu_through_ipc() {
    if std::env::var("CHORUS_CUDA_IPC_SOCKET").is_ok() {
        return;
    }
    let Some(gpu) = gpu_or_skip("GPU tests") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("chorus-ipc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("link.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "ipc_child", "--nocapture", "--test-threads=1"])
        .env("CHORUS_CUDA_IPC_SOCKET", &path)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let socket = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline && child.try_wait().unwrap().is_none() => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child never connected: {e}");
            }
        }
    };
    socket.set_nonblocking(false).unwrap();
    let dev = CudaDevice::on(gpu).unwrap();
    let link = DeviceLink::connect(&dev, Rank(0), Rank(1), socket, &small_config()).unwrap();
    ipc_all_reduce(&dev, link, 0);
    // The child exits on its own; it is killed if it does not within the deadline.
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "child failed: {status}");
    let _ = std::fs::remove_dir_all(&dir);
}
