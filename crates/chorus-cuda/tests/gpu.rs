//! GPU tests: every collective of the engine (`Engine<CudaDevice, DeviceLink>`) x dtype x
//! reduction on device memory, at 2 and 4 ranks sharing one GPU as threads and as processes
//! (CUDA IPC; and a few cases at 2 ranks in two processes with the root on the child); the
//! device's arithmetic on device memory; and abort of an operation whose kernels wait on an
//! absent peer (seed 002: the abort lands, the stream drains, the context is reused). Without a GPU each test returns after one
//! line (per process) saying what was skipped and why; the same matrix runs through the host
//! engine in tests/matrix_host.rs.

// The timings printed are for whoever runs the device check.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use chorus_cuda::testing::{GpuEngine, OnGpu, Stall, World, block_on, gpu_or_skip};
use chorus_cuda::{CudaDevice, CudaError, DeviceLink, LinkConfig, reference};
use chorus_engine::link::{CancelReason, Link};
use chorus_engine::testkit::{
    Case, Rig, check, every_case, input, large_cases, matrix_configs, ring_exchange, sweep,
};
use chorus_engine::{AbortReason, Buffer, Context, Device, Engine, EngineConfig};
use chorus_engine::{Reduction, device::DeviceError};
use chorus_protocol::{CloseCode, Collective, DType, Rank, ReduceOp};
use half::{bf16, f16};

/// Bound on every staging copy and synchronisation.
const T: Duration = Duration::from_secs(20);
/// Bound on one world's run of the matrix.
const LIMIT: Duration = Duration::from_secs(60);

fn small_links() -> LinkConfig {
    // Small slots and only two, so payloads wrap around the slots many times.
    LinkConfig {
        slot_bytes: 64 << 10,
        slots: 2,
        ..LinkConfig::default()
    }
}

fn devices(n: usize) -> Option<Vec<CudaDevice>> {
    let gpu = gpu_or_skip("GPU tests")?;
    Some(
        (0..n)
            .map(|_| CudaDevice::on(gpu.clone()).unwrap())
            .collect(),
    )
}

/// Every collective x dtype x reduction under every algorithm, large payloads and grouped
/// send/receive, at `n` ranks on one GPU.
fn matrix(n: usize) {
    let Some(devices) = devices(n) else {
        return;
    };
    let root = Context::root();
    let cases = every_case(n as u32);
    let started = Instant::now();
    for config in matrix_configs() {
        let world = World::new(&devices, &small_links(), &config, &root).unwrap();
        if let Err(e) = world.run(LIMIT, |e| sweep(&OnGpu, e, &cases)) {
            panic!("{:?}: {e}", config.overrides);
        }
    }
    let world = World::new(&devices, &small_links(), &EngineConfig::default(), &root).unwrap();
    let large = large_cases(n as u32);
    world
        .run(LIMIT, |e| {
            sweep(&OnGpu, e, &large)?;
            ring_exchange(&OnGpu, e, 500)
        })
        .unwrap();
    drop(world);
    for d in &devices {
        d.synchronize(T).unwrap();
    }
    eprintln!(
        "{} operations per rank at {n} ranks in {:?}",
        cases.len() * matrix_configs().len() + large.len() + 8,
        started.elapsed()
    );
}

#[test]
fn every_collective_dtype_and_reduction_at_2_ranks_on_one_gpu() {
    matrix(2);
}

#[test]
fn every_collective_dtype_and_reduction_at_4_ranks_on_one_gpu() {
    matrix(4);
}

/// Random finite values of `dtype`, with some near the top of the narrow floats' range so
/// that saturation (E4M3) and overflow to infinity (E5M2, f16) are exercised.
fn data(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 11
    };
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let r = next();
        let f = if i % 50 == 7 {
            [300.0, -420.0, 40_000.0, -60_000.0][(r % 4) as usize]
        } else {
            (r % 2001) as f32 / 100.0 - 10.0
        };
        match dtype {
            DType::F32 => out.extend(f.to_le_bytes()),
            DType::F64 => out.extend((f as f64 * 1.000001).to_le_bytes()),
            DType::F16 => out.extend(f16::from_f32(f).to_bits().to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f32(f).to_bits().to_le_bytes()),
            DType::F8E4M3 => out.push(reference::f32_to_e4m3(f)),
            DType::F8E5M2 => out.push(reference::f32_to_e5m2(f)),
            _ => out.extend_from_slice(&r.to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

#[test]
fn every_reduction_scale_and_divide_matches_the_reference_on_device_memory() {
    let Some(devices) = devices(1) else {
        return;
    };
    let dev = &devices[0];
    let n = 4099;
    for dtype in DType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let (a, b) = (data(dtype, n, 1), data(dtype, n, 2));
            let mut da = OnGpu.load(dev, &a);
            let db = OnGpu.load(dev, &b);
            dev.reduce(&mut da, 0, &db, 0, a.len(), dtype, op).unwrap();
            let mut want = a.clone();
            reference::reduce(dtype, op, &mut want, &b);
            assert_eq!(OnGpu.read(dev, &da), want, "{op} over {dtype}");
        }
        for factor in [0.5, 1.0 / 3.0, -2.0, 3.0, 1e19] {
            let a = data(dtype, n, 3);
            let mut da = OnGpu.load(dev, &a);
            dev.scale(&mut da, 0, a.len(), dtype, factor).unwrap();
            let mut want = a.clone();
            reference::scale(dtype, &mut want, factor);
            assert_eq!(OnGpu.read(dev, &da), want, "scale {dtype} by {factor}");
        }
        for divisor in [1u32, 2, 3, 4, 7, 1000] {
            let a = data(dtype, n, 4);
            let mut da = OnGpu.load(dev, &a);
            dev.divide(&mut da, 0, a.len(), dtype, divisor).unwrap();
            let mut want = a.clone();
            reference::divide(dtype, &mut want, divisor);
            assert_eq!(OnGpu.read(dev, &da), want, "divide {dtype} by {divisor}");
        }
    }
    // Packing, unpacking, overlapping copies, and the errors of bad regions.
    let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut m = OnGpu.load(dev, &bytes);
    let p = dev.pack(&m, 100, 5000).unwrap();
    let mut out = dev.buffer(6000).unwrap();
    dev.unpack(&mut out, 1000, &p).unwrap();
    assert_eq!(dev.download(&out, 1000, 5000, T).unwrap(), bytes[100..5100]);
    dev.copy_within(&mut m, 0, 10, 5000).unwrap();
    assert_eq!(OnGpu.read(dev, &m)[10..5010], bytes[..5000]);
    assert!(matches!(
        dev.unpack(&mut out, 2000, &p),
        Err(DeviceError::OutOfBounds { .. })
    ));
    assert!(matches!(
        dev.reduce(&mut m, 0, &out, 0, 6, DType::F32, ReduceOp::Sum),
        Err(DeviceError::Misaligned { .. })
    ));
    assert!(matches!(
        dev.reduce(&mut m, 0, &out, 0, 8, DType::F32, ReduceOp::Avg),
        Err(DeviceError::Unsupported { .. })
    ));
    dev.settle(&Context::root()).unwrap();
    dev.synchronize(T).unwrap();
}

#[test]
fn abort_retires_the_kernels_of_an_operation_blocked_on_an_absent_peer() {
    let Some(devices) = devices(2) else {
        return;
    };
    let root = Context::root();
    let world = World::new(&devices, &small_links(), &EngineConfig::default(), &root).unwrap();
    // Rank 1 never joins, and the take-outs its link queues never run (a peer whose GPU
    // work never comes, seed 002): it grants credit, so rank 0 queues its next messages, and
    // rank 0's kernels that wait for those slots to be freed wait for ever.
    let stall = Stall::on(devices[1].gpu(), world.link(1, 0).receive_stream_for_test()).unwrap();
    let e0 = &world.engines[0];
    let l0 = world.link(0, 1);
    let count = 1 << 20;
    let mut buf = devices[0].buffer(count).unwrap();
    let (done, result) = std::thread::scope(|s| {
        let op = s.spawn(|| {
            let r = block_on(e0.broadcast(Buffer::InPlace(&mut buf), count, DType::U8, Rank(0)));
            (Instant::now(), r)
        });
        // Blocked on the host (flow control) and on the device (slots full).
        let t = Instant::now();
        while e0.running().first().and_then(|o| o.snapshot().waiting_on) != Some(Rank(1))
            || l0.flush(Duration::from_micros(1)).is_ok()
        {
            assert!(t.elapsed() < T, "the operation never blocked");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        // A bounded synchronisation reports the blocked work instead of hanging.
        let t = Instant::now();
        let err = devices[0]
            .synchronize(Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(err, CudaError::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        e0.context().abort(AbortReason::requested("test abort"));
        let aborted = Instant::now();
        let (done, result) = op.join().unwrap();
        (done.saturating_duration_since(aborted), result)
    });
    let err = result.unwrap_err();
    assert_eq!(
        err.abort_reason(),
        Some(&AbortReason::requested("test abort")),
        "{err}"
    );
    assert!(done < Duration::from_millis(200), "the abort took {done:?}");
    // The runtime cancels the communicator's links on abort: the waiting kernel returns
    // within a millisecond (it records its retirement as it returns), and the work queued
    // behind it drains.
    assert!(l0.flush(Duration::from_micros(1)).is_err(), "still blocked");
    assert_eq!(l0.retired().0, 0);
    let t0 = Instant::now();
    l0.cancel(CancelReason::new(CloseCode::ABORTED, "test abort"));
    while l0.retired().0 == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "abort did not retire the kernel"
        );
        std::hint::spin_loop();
    }
    let retire = t0.elapsed();
    l0.flush(T).unwrap();
    let drained = t0.elapsed();
    eprintln!("abort retired the blocked kernel in {retire:?}; its stream drained in {drained:?}");
    assert!(
        retire < Duration::from_millis(1),
        "retiring took {retire:?}"
    );
    // The device's work is an error, never a silent success.
    let err = devices[0].synchronize(T).unwrap_err();
    assert!(matches!(err, CudaError::Aborted { .. }), "{err}");
    world.cancel_links("test over");
    stall.release();
    drop(stall);
    drop(buf);
    drop(world);
    // A new communicator on the same context works.
    let world = World::new(&devices, &small_links(), &EngineConfig::default(), &root).unwrap();
    let case = Case {
        id: 77,
        collective: Collective::AllReduce,
        dtype: DType::F32,
        reduction: Reduction::Sum,
        count: 50_000,
        in_place: true,
        root: 0,
    };
    world.run(LIMIT, |e| check(&OnGpu, e, &case)).unwrap();
    drop(world);
    for d in &devices {
        d.synchronize(T).unwrap();
    }
}

/// The cases the two processes run (rank 0 in the test, rank 1 in the child).
fn ipc_cases() -> Vec<Case> {
    [
        (Collective::AllReduce, DType::BF16, Reduction::Sum, 300_001),
        (Collective::AllReduce, DType::I32, Reduction::Avg, 70_001),
        (Collective::Broadcast, DType::U8, Reduction::Sum, 1 << 20),
        (Collective::ReduceScatter, DType::F32, Reduction::Max, 9_999),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (collective, dtype, reduction, count))| Case {
        id: 900 + i as u64,
        collective,
        dtype,
        reduction,
        count,
        in_place: i % 2 == 1,
        root: 1,
    })
    .collect()
}

fn ipc_rank(dev: CudaDevice, me: u32, link: DeviceLink) {
    let link = Arc::new(link);
    let engine: GpuEngine = Engine::new(
        Rank(me),
        2,
        [link.clone()],
        Arc::new(dev),
        &Context::root(),
        EngineConfig::default(),
    )
    .unwrap();
    let (done, finished) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        // A peer that never comes must not leave this rank waiting: abort as the runtime
        // would.
        let (engine, link) = (&engine, &link);
        s.spawn(move || {
            if finished.recv_timeout(LIMIT).is_err() {
                engine
                    .context()
                    .abort(AbortReason::requested("ipc watchdog"));
                link.cancel(CancelReason::new(CloseCode::ABORTED, "ipc watchdog"));
            }
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for case in ipc_cases() {
                check(&OnGpu, engine, &case).unwrap();
            }
            ring_exchange(&OnGpu, engine, 700).unwrap();
        }));
        let _ = done.send(());
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    });
}

/// Not a test on its own: the child process `ranks_in_two_processes_share_the_gpu_through_ipc`
/// starts (with `--ignored`) as the second rank; inert without its socket.
#[test]
#[ignore = "run by ranks_in_two_processes_share_the_gpu_through_ipc"]
fn ipc_child() {
    let Ok(path) = std::env::var("CHORUS_CUDA_IPC_SOCKET") else {
        return;
    };
    let dev = CudaDevice::new(0).unwrap();
    let socket = UnixStream::connect(path).unwrap();
    let link = DeviceLink::connect(&dev, Rank(1), Rank(0), socket, &small_links()).unwrap();
    ipc_rank(dev, 1, link);
}

#[test]
fn ranks_in_two_processes_share_the_gpu_through_ipc() {
    if std::env::var("CHORUS_CUDA_IPC_SOCKET").is_ok() {
        return;
    }
    let Some(devices) = devices(1) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("chorus-ipc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("link.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ipc_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
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
    let dev = devices[0].clone();
    let link = DeviceLink::connect(&dev, Rank(0), Rank(1), socket, &small_links()).unwrap();
    // The child is killed if it has not exited by the deadline, whatever happens here.
    let here = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ipc_rank(dev, 0, link)));
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(p) = here {
        std::panic::resume_unwind(p);
    }
    let status = status.expect("the child did not exit");
    assert!(status.success(), "child failed: {status}");
}

/// Rank `me` of `n` processes: links to every other rank over Unix sockets in `dir` (rank r
/// listens on `r.sock`; the higher rank of a pair connects and names itself in one byte),
/// made in the order of the pairs `(low, high)`, the same order on every rank, so no two
/// ranks wait on each other's handshakes.
fn process_links(dir: &std::path::Path, dev: &CudaDevice, me: u32, n: u32) -> Vec<Arc<DeviceLink>> {
    use std::io::{Read, Write};
    let listener = UnixListener::bind(dir.join(format!("{me}.sock"))).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut accepted: Vec<(u32, UnixStream)> = Vec::new();
    let deadline = Instant::now() + LIMIT;
    let mut links = Vec::new();
    for peer in (0..n).filter(|&p| p != me) {
        let socket = if peer < me {
            let path = dir.join(format!("{peer}.sock"));
            let mut s = loop {
                match UnixStream::connect(&path) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("rank {me} cannot reach rank {peer}: {e}"),
                }
            };
            s.write_all(&[me as u8]).unwrap();
            s
        } else {
            loop {
                if let Some(at) = accepted.iter().position(|(r, _)| *r == peer) {
                    break accepted.remove(at).1;
                }
                let mut s = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(e) => panic!("rank {me}: rank {peer} never connected: {e}"),
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(LIMIT)).unwrap();
                let mut who = [0u8; 1];
                s.read_exact(&mut who).unwrap();
                accepted.push((u32::from(who[0]), s));
            }
        };
        let link = DeviceLink::connect(dev, Rank(me), Rank(peer), socket, &small_links()).unwrap();
        links.push(Arc::new(link));
    }
    links
}

/// Rank `me` of `n` processes runs the matrix: every collective x dtype x reduction under
/// every forced algorithm, then the large cases, each configuration a new engine on the same
/// links. A watchdog aborts and cancels if the world has not finished in time.
fn process_rank(dir: &std::path::Path, me: u32, n: u32) {
    let dev = CudaDevice::new(0).unwrap();
    let links = process_links(dir, &dev, me, n);
    let dev = Arc::new(dev);
    let root = Context::root();
    let (done, finished) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (root, links) = (&root, &links);
        s.spawn(move || {
            if finished.recv_timeout(LIMIT * 4).is_err() {
                root.abort(AbortReason::requested("process matrix watchdog"));
                for l in links {
                    l.cancel(CancelReason::new(
                        CloseCode::ABORTED,
                        "process matrix watchdog",
                    ));
                }
            }
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let cases = every_case(n);
            let mut configs = matrix_configs();
            configs.push(EngineConfig::default());
            for (i, config) in configs.into_iter().enumerate() {
                let engine: GpuEngine = Engine::new(
                    Rank(me),
                    n,
                    links.iter().cloned(),
                    dev.clone(),
                    root,
                    config,
                )
                .unwrap();
                let last = i == matrix_configs().len();
                let cases = if last { large_cases(n) } else { cases.clone() };
                if let Err(e) = sweep(&OnGpu, &engine, &cases) {
                    panic!("rank {me} of {n} processes, configuration {i}: {e}");
                }
            }
        }));
        let _ = done.send(());
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    });
    dev.synchronize(T).unwrap();
}

/// Rank 0 runs here and starts ranks 1.. as this same test in child processes, which find
/// their rank in the environment.
#[test]
fn every_collective_dtype_and_reduction_at_2_and_4_ranks_in_processes() {
    if let (Ok(dir), Ok(me), Ok(n)) = (
        std::env::var("CHORUS_CUDA_MATRIX_DIR"),
        std::env::var("CHORUS_CUDA_MATRIX_RANK"),
        std::env::var("CHORUS_CUDA_MATRIX_WORLD"),
    ) {
        return process_rank(
            std::path::Path::new(&dir),
            me.parse().unwrap(),
            n.parse().unwrap(),
        );
    }
    if devices(1).is_none() {
        return;
    }
    for n in [2u32, 4] {
        let started = Instant::now();
        let dir = std::env::temp_dir().join(format!("chorus-matrix-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut children: Vec<_> = (1..n)
            .map(|r| {
                Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "every_collective_dtype_and_reduction_at_2_and_4_ranks_in_processes",
                        "--nocapture",
                    ])
                    .env("CHORUS_CUDA_MATRIX_DIR", &dir)
                    .env("CHORUS_CUDA_MATRIX_RANK", r.to_string())
                    .env("CHORUS_CUDA_MATRIX_WORLD", n.to_string())
                    .stdout(Stdio::inherit())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let here = std::panic::catch_unwind(|| process_rank(&dir, 0, n));
        // Every child is killed if it has not exited by the deadline, whatever happened here.
        let deadline = Instant::now() + LIMIT;
        let mut failed = Vec::new();
        for (i, child) in children.iter_mut().enumerate() {
            let status = loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if !status.is_some_and(|s| s.success()) {
                failed.push(format!("rank {}: {status:?}", i + 1));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(p) = here {
            std::panic::resume_unwind(p);
        }
        assert!(failed.is_empty(), "at {n} processes: {}", failed.join(", "));
        eprintln!(
            "the matrix at {n} ranks in {n} processes took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn the_inputs_are_what_the_matrix_says() {
    // Runs everywhere: the GPU tests above lean on these.
    assert_eq!(input(1, 0, 0, 4, DType::F32, Reduction::Sum).len(), 16);
    let a = input(1, 0, 0, 64, DType::F8E5M2, Reduction::Prod);
    assert!(
        a.iter()
            .all(|&b| [-1.0f32, 1.0, 2.0].contains(&reference::e5m2_to_f32(b)))
    );
}
