//! The device check's benchmark (run by `kernels/check.sh`): reduce-kernel bandwidth beside
//! a device-to-device copy, all-reduce bus bandwidth through the engine
//! (`Engine<CudaDevice, DeviceLink>`) for 2 and 4 ranks sharing one GPU, and how fast an
//! abort retires a kernel blocked on an absent peer. Prints a table and writes JSON lines to
//! `--out FILE`.
//!
//! Usage: gpu_bench [--out FILE] [--max-mib N] [--budget-s S]

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::type_complexity
)]

use std::io::Write;
use std::time::{Duration, Instant};

use chorus_cuda::testing::{Stall, World, block_on};
use chorus_cuda::{CudaDevice, Gpu, LinkConfig};
use chorus_engine::device::Device;
use chorus_engine::link::{CancelReason, Link};
use chorus_engine::{AbortReason, Buffer, Context, EngineConfig, Reduction};
use chorus_protocol::{CloseCode, DType, Rank, ReduceOp};
use cudarc::driver::{result, sys};

const T: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let max_mib: usize = arg("--max-mib")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let budget = Duration::from_secs(
        arg("--budget-s")
            .and_then(|v| v.parse().ok())
            .unwrap_or(150),
    );
    let mut out: Box<dyn Write> = match arg("--out") {
        Some(p) => Box::new(std::fs::File::create(p).unwrap()),
        None => Box::new(std::io::sink()),
    };
    let started = Instant::now();
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "# {} (sm_{}{}, {} SMs), NVRTC {}.{}",
        gpu.name(),
        gpu.capability().0,
        gpu.capability().1,
        gpu.sm_count(),
        gpu.nvrtc_version().0,
        gpu.nvrtc_version().1
    );
    writeln!(
        out,
        "{{\"kind\":\"gpu\",\"name\":\"{}\",\"sm\":\"{}.{}\"}}",
        gpu.name(),
        gpu.capability().0,
        gpu.capability().1
    )
    .unwrap();

    // 1. Kernels beside cuMemcpyDtoD, same buffers, same run.
    let dev = CudaDevice::on(gpu.clone()).unwrap();
    let bytes = 1usize << 30;
    let a = dev.buffer(bytes).unwrap();
    let b = dev.buffer(bytes).unwrap();
    println!(
        "\n# bandwidth over {} MiB buffers (bytes read + written per second)",
        bytes >> 20
    );
    let cases: Vec<(&str, u64, Box<dyn Fn()>)> = vec![
        (
            "cuMemcpyDtoD",
            2,
            Box::new(|| {
                unsafe {
                    result::memcpy_dtod_async(
                        b.ptr(),
                        a.ptr(),
                        bytes,
                        dev.main_stream().cu_stream(),
                    )
                }
                .unwrap()
            }),
        ),
        (
            "chorus_copy",
            2,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.copy(&mut bb, 0, &a, 0, bytes).unwrap()
            }),
        ),
        (
            "reduce sum f32",
            3,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.reduce(&mut bb, 0, &a, 0, bytes, DType::F32, ReduceOp::Sum)
                    .unwrap()
            }),
        ),
        (
            "reduce sum bf16",
            3,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.reduce(&mut bb, 0, &a, 0, bytes, DType::BF16, ReduceOp::Sum)
                    .unwrap()
            }),
        ),
        (
            "reduce max f16",
            3,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.reduce(&mut bb, 0, &a, 0, bytes, DType::F16, ReduceOp::Max)
                    .unwrap()
            }),
        ),
        (
            "reduce sum f8e4m3",
            3,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.reduce(&mut bb, 0, &a, 0, bytes, DType::F8E4M3, ReduceOp::Sum)
                    .unwrap()
            }),
        ),
        (
            "divide i32",
            2,
            Box::new(|| {
                let mut bb = unsafe { chorus_cuda::GpuMem::from_raw(b.ptr(), bytes) };
                dev.divide(&mut bb, 0, bytes, DType::I32, 3).unwrap()
            }),
        ),
    ];
    for (name, passes, f) in &cases {
        let gbs = time_stream(&dev, 3, 10, f).map(|s| (*passes as f64 * bytes as f64) / s / 1e9);
        let gbs = gbs.unwrap_or(f64::NAN);
        println!("{name:<20} {gbs:>9.1} GB/s");
        writeln!(
            out,
            "{{\"kind\":\"bandwidth\",\"what\":\"{name}\",\"bytes\":{bytes},\"gbps\":{gbs:.2}}}"
        )
        .unwrap();
    }
    drop(cases);
    drop((a, b));
    dev.synchronize(T).unwrap();

    // 2. All-reduce bus bandwidth through the engine, ranks as threads on this GPU. The
    // time is the operation's, settle included: its result is in memory when it returns.
    println!(
        "\n# all-reduce (f32 sum) through Engine<CudaDevice, DeviceLink>, ranks sharing one GPU:"
    );
    println!("# busbw = size * 2(n-1)/n / time; best of the timed iterations");
    println!(
        "{:>6} {:>9} {:>10} {:>12} {:>10}",
        "ranks", "chunk", "size", "time_us", "busbw"
    );
    let root = Context::root();
    // Large chunks (fewer launches per byte) at both world sizes first, then the engine's
    // default chunk, so a spent budget costs the least telling rows.
    'sweep: for chunk in [4usize << 20, 256 << 10] {
        for world in [2usize, 4] {
            let devices: Vec<CudaDevice> = (0..world)
                .map(|_| CudaDevice::on(gpu.clone()).unwrap())
                .collect();
            let config = EngineConfig {
                chunk_bytes: chunk,
                ..EngineConfig::default()
            };
            let w = World::new(&devices, &LinkConfig::default(), &config, &root).unwrap();
            let mut size = 1usize << 20;
            while size <= max_mib << 20 {
                if started.elapsed() > budget {
                    println!("(stopping early: the time budget of {budget:?} is spent)");
                    break 'sweep;
                }
                let iters = if size >= 256 << 20 { 3 } else { 10 };
                let times = w
                    .run(T, |e| {
                        let mut buf = e.device().buffer(size).map_err(|e| e.to_string())?;
                        let mut best = f64::MAX;
                        for it in 0..iters + 1 {
                            // The engine's barrier (not a thread barrier): a failed rank
                            // aborts it instead of leaving the others waiting.
                            block_on(e.barrier()).map_err(|e| e.to_string())?;
                            let t0 = Instant::now();
                            block_on(e.all_reduce(
                                Buffer::InPlace(&mut buf),
                                size / 4,
                                DType::F32,
                                Reduction::Sum,
                            ))
                            .map_err(|e| e.to_string())?;
                            if it > 0 {
                                best = best.min(t0.elapsed().as_secs_f64());
                            }
                        }
                        Ok(best)
                    })
                    .unwrap_or_else(|e| panic!("all-reduce of {size} bytes at {world} ranks: {e}"));
                // The slowest rank's best: the collective is done when every rank is.
                let t = times.iter().copied().fold(0.0, f64::max);
                let busbw = size as f64 * 2.0 * (world - 1) as f64 / world as f64 / t / 1e9;
                println!(
                    "{world:>6} {:>8}K {:>9}M {:>12.1} {busbw:>9.1} GB/s",
                    chunk >> 10,
                    size >> 20,
                    t * 1e6
                );
                writeln!(out, "{{\"kind\":\"allreduce\",\"impl\":\"chorus\",\"ranks\":{world},\"chunk\":{chunk},\"bytes\":{size},\"us\":{:.1},\"busbw_gbps\":{busbw:.2}}}", t * 1e6).unwrap();
                size *= 4;
            }
            drop(w);
            for d in &devices {
                d.synchronize(T).unwrap();
            }
        }
    }

    // 3. Abort-retire latency: an engine operation whose kernels wait for a peer that
    // stopped receiving; after the abort, cancelling the links (the runtime's part) retires
    // the waiting kernel.
    println!("\n# abort retiring a kernel blocked on an absent peer");
    let (mut lat, mut drain) = (Vec::new(), Vec::new());
    let devices: Vec<CudaDevice> = (0..2)
        .map(|_| CudaDevice::on(gpu.clone()).unwrap())
        .collect();
    let cfg = LinkConfig {
        slot_bytes: 64 << 10,
        slots: 2,
        ..LinkConfig::default()
    };
    for _ in 0..20 {
        let w = World::new(&devices, &cfg, &EngineConfig::default(), &root).unwrap();
        // Rank 1 grants credit but its take-outs never run: rank 0's next messages wait on
        // the device for slots that are never freed.
        let stall = Stall::on(devices[1].gpu(), w.link(1, 0).receive_stream_for_test()).unwrap();
        let (e0, l0) = (&w.engines[0], w.link(0, 1));
        let count = 1 << 20;
        let mut buf = devices[0].buffer(count).unwrap();
        let blocked = std::thread::scope(|s| {
            let op = s.spawn(|| {
                block_on(e0.broadcast(Buffer::InPlace(&mut buf), count, DType::U8, Rank(0)))
            });
            let t = Instant::now();
            while l0.flush(Duration::from_micros(1)).is_ok() && t.elapsed() < T {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let the wait kernel settle into its spin.
            std::thread::sleep(Duration::from_millis(20));
            let blocked = l0.flush(Duration::from_micros(1)).is_err();
            e0.context().abort(AbortReason::requested("bench"));
            let _ = op.join();
            blocked
        });
        if !blocked {
            println!("(a run whose kernel never blocked; not counted)");
            w.cancel_links("bench");
            drop(stall);
            continue;
        }
        // The waiting kernel records its retirement as it returns; then the work queued
        // behind it drains.
        let t0 = Instant::now();
        l0.cancel(CancelReason::new(CloseCode::ABORTED, "bench"));
        while l0.retired().0 == 0 && t0.elapsed() < Duration::from_secs(2) {
            std::hint::spin_loop();
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
        let _ = l0.flush(Duration::from_secs(2));
        drain.push(t0.elapsed().as_secs_f64() * 1e6);
        w.cancel_links("bench");
        drop(stall);
        drop(buf);
        drop(w);
        for d in &devices {
            let _ = d.synchronize(T);
        }
    }
    if lat.is_empty() {
        println!("abort-retire latency: no run blocked");
        return;
    }
    lat.sort_by(f64::total_cmp);
    drain.sort_by(f64::total_cmp);
    let (min, med, max) = (lat[0], lat[lat.len() / 2], lat[lat.len() - 1]);
    let drain_med = drain[drain.len() / 2];
    println!(
        "abort-retire latency: min {min:.1} us, median {med:.1} us, max {max:.1} us over {} runs; the stream then drained in {drain_med:.1} us (median)",
        lat.len()
    );
    writeln!(out, "{{\"kind\":\"abort_retire\",\"min_us\":{min:.1},\"median_us\":{med:.1},\"max_us\":{max:.1},\"drain_median_us\":{drain_med:.1},\"runs\":{}}}", lat.len()).unwrap();
    println!(
        "\n# gpu_bench done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Seconds per call of `f` (queued on the main stream), timed with CUDA events; best of
/// `reps` after `warm` warm-ups.
fn time_stream(dev: &CudaDevice, warm: usize, reps: usize, f: &dyn Fn()) -> Option<f64> {
    let s = dev.main_stream();
    for _ in 0..warm {
        f();
    }
    dev.synchronize(T).ok()?;
    let mut best = f64::MAX;
    for _ in 0..reps {
        let start = s
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        f();
        let end = s
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        dev.synchronize(T).ok()?;
        best = best.min(start.elapsed_ms(&end).ok()? as f64 / 1e3);
    }
    Some(best)
}
