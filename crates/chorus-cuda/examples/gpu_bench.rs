//! The device check's benchmark (run by `kernels/check.sh`): reduce-kernel bandwidth beside
//! a device-to-device copy, all-reduce bus bandwidth for 2 and 4 ranks sharing one GPU, and
//! how fast an abort retires a kernel blocked on an absent peer. Prints a table and writes
//! JSON lines to `--out FILE`.
//!
//! Usage: gpu_bench [--out FILE] [--max-mib N] [--budget-s S]

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::type_complexity
)]

use std::io::Write;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use chorus_cuda::local::connect_all;
use chorus_cuda::testing::{Rank as R, block_on};
use chorus_cuda::{CudaDevice, Gpu, LinkConfig};
use chorus_engine::device::Device;
use chorus_engine::link::{CancelReason, Link, Tag};
use chorus_protocol::{CloseCode, Collective, DType, OpSeq, ReduceOp};
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

    // 2. All-reduce bus bandwidth, ranks as threads on this GPU.
    println!("\n# all-reduce (f32 sum), ranks sharing one GPU: busbw = size * 2(n-1)/n / time");
    println!(
        "{:>6} {:>10} {:>12} {:>10}",
        "ranks", "size", "time_us", "busbw"
    );
    for world in [2usize, 4] {
        let devices: Vec<CudaDevice> = (0..world)
            .map(|_| CudaDevice::on(gpu.clone()).unwrap())
            .collect();
        let links = connect_all(&devices, &LinkConfig::default()).unwrap();
        let mut size = 1usize << 20;
        while size <= max_mib << 20 {
            if started.elapsed() > budget {
                println!("(stopping early: the time budget of {budget:?} is spent)");
                break;
            }
            let iters = if size >= 256 << 20 { 3 } else { 10 };
            let barrier = Barrier::new(world);
            let times: Vec<f64> = std::thread::scope(|s| {
                let hs: Vec<_> = devices
                    .iter()
                    .zip(&links)
                    .enumerate()
                    .map(|(me, (dev, row))| {
                        let barrier = &barrier;
                        s.spawn(move || {
                            let rank = R {
                                device: dev,
                                links: row,
                                me,
                                world,
                            };
                            let mut buf = dev.buffer(size).unwrap();
                            let mut seq = 0;
                            let mut best = f64::MAX;
                            for it in 0..iters + 1 {
                                barrier.wait();
                                let t0 = Instant::now();
                                seq += 1;
                                rank.all_reduce(
                                    &mut buf,
                                    size,
                                    DType::F32,
                                    ReduceOp::Sum,
                                    1.0,
                                    seq,
                                )
                                .unwrap();
                                dev.synchronize(T).unwrap();
                                barrier.wait();
                                if it > 0 {
                                    best = best.min(t0.elapsed().as_secs_f64());
                                }
                            }
                            best
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let t = times.iter().cloned().fold(0.0, f64::max);
            let busbw = size as f64 * 2.0 * (world - 1) as f64 / world as f64 / t / 1e9;
            println!(
                "{world:>6} {:>9}M {:>12.1} {busbw:>9.1} GB/s",
                size >> 20,
                t * 1e6
            );
            writeln!(out, "{{\"kind\":\"allreduce\",\"impl\":\"chorus\",\"ranks\":{world},\"bytes\":{size},\"us\":{:.1},\"busbw_gbps\":{busbw:.2}}}", t * 1e6).unwrap();
            size *= 4;
        }
        drop(links);
    }

    // 3. Abort-retire latency: a kernel waiting on a peer that stopped receiving.
    println!("\n# abort retiring a kernel blocked on an absent peer");
    let mut lat = Vec::new();
    let devices: Vec<CudaDevice> = (0..2)
        .map(|_| CudaDevice::on(gpu.clone()).unwrap())
        .collect();
    for _ in 0..20 {
        let cfg = LinkConfig {
            slot_bytes: 64 << 10,
            slots: 2,
            ..LinkConfig::default()
        };
        let links = connect_all(&devices, &cfg).unwrap();
        links[1][0].freeze_for_test();
        let src = devices[0].buffer(64 << 10).unwrap();
        for step in 0..3 {
            let p = devices[0].pack(&src, 0, 64 << 10).unwrap();
            block_on(links[0][0].send(
                Tag {
                    collective: Collective::SendRecv,
                    op: OpSeq(1),
                    step,
                    offset: 0,
                    dtype: DType::U8,
                },
                p,
            ))
            .unwrap();
        }
        // Let the wait kernel start spinning.
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            links[0][0].flush(Duration::from_micros(1)).is_err(),
            "the kernel should be blocked"
        );
        let t0 = Instant::now();
        links[0][0].cancel(CancelReason::new(CloseCode::ABORTED, "bench"));
        while links[0][0].flush(Duration::from_micros(20)).is_err() {
            if t0.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
        links[1][0].cancel(CancelReason::new(CloseCode::ABORTED, "bench"));
        drop(links);
        let _ = devices[0].synchronize(T);
    }
    lat.sort_by(f64::total_cmp);
    let (min, med, max) = (lat[0], lat[lat.len() / 2], lat[lat.len() - 1]);
    println!(
        "abort-retire latency: min {min:.1} us, median {med:.1} us, max {max:.1} us over {} runs",
        lat.len()
    );
    writeln!(out, "{{\"kind\":\"abort_retire\",\"min_us\":{min:.1},\"median_us\":{med:.1},\"max_us\":{max:.1},\"runs\":{}}}", lat.len()).unwrap();
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
