//! Host reduction throughput per dtype, beside `memcpy` measured in the same run.
//!
//! `cargo bench -p chorus-benches --bench reduce`. Throughput is bytes of the destination
//! per second: a reduction reads two buffers and writes one (3 bytes of traffic per byte),
//! `memcpy` reads one and writes one (2 per byte), so at DRAM sizes a memory-bound
//! reduction tops out near 2/3 of memcpy; at cache-resident sizes both are compute-bound.
//!
//! Groups, per size: `memcpy`; `sum/<dtype>` for every dtype; `prod`, `min` and `max` for
//! f32, i32 and the 16- and 8-bit floats; `portable-<op>/<dtype>`, the same reductions of
//! the 16- and 8-bit floats on the portable loops (`host_reduce_portable`: what every CPU
//! without AVX2 and F16C runs, and what x86 ran before the vectorised kernels, so each run
//! shows the speed-up); and `scale/<dtype>`, `divide/<dtype>`, the last step of `Avg` and
//! `PreMulSum`, through the host `Device`.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use chorus_engine::{Device, HostDevice, host_reduce, host_reduce_portable};
use chorus_protocol::{DType, ReduceOp};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// A cache-resident chunk (the engine's default chunk size) and a DRAM-sized buffer.
const SIZES: [(usize, &str); 2] = [(256 << 10, "256KiB"), (64 << 20, "64MiB")];

/// The types with a vectorised kernel of their own (the rest reduce natively everywhere).
const SMALL: [DType; 4] = [DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2];

fn fill(len: usize, seed: u8) -> Vec<u8> {
    // Small positive bytes: every dtype decodes them as ordinary finite numbers (no NaN or
    // infinity paths) and sums stay finite for the duration of a run.
    (0..len).map(|i| (i as u8 ^ seed) & 0x3b).collect()
}

fn bench(c: &mut Criterion) {
    for (len, label) in SIZES {
        let mut g = c.benchmark_group(format!("reduce/{label}"));
        g.throughput(Throughput::Bytes(len as u64));
        g.sample_size(20);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(2));
        let src = fill(len, 0x5a);
        let mut dst = fill(len, 0x17);
        g.bench_function("memcpy", |b| {
            b.iter(|| dst.copy_from_slice(black_box(&src)))
        });
        for dtype in DType::ALL {
            g.bench_function(format!("sum/{}", dtype.name()), |b| {
                b.iter(|| host_reduce(&mut dst, black_box(&src), dtype, ReduceOp::Sum).unwrap())
            });
        }
        let others = [DType::F32, DType::I32].into_iter().chain(SMALL);
        for dtype in others {
            for op in [ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                g.bench_function(format!("{}/{}", op.name(), dtype.name()), |b| {
                    b.iter(|| host_reduce(&mut dst, black_box(&src), dtype, op).unwrap())
                });
            }
        }
        for dtype in SMALL {
            for op in [ReduceOp::Sum, ReduceOp::Min] {
                g.bench_function(format!("portable-{}/{}", op.name(), dtype.name()), |b| {
                    b.iter(|| host_reduce_portable(&mut dst, black_box(&src), dtype, op).unwrap())
                });
            }
        }
        // By one: the same instructions as any factor, and the values stay where they are
        // (halving them run after run would end in subnormals, which some CPUs take a slow
        // path for, and then zeros).
        let host = HostDevice;
        for dtype in [DType::F32].into_iter().chain(SMALL) {
            g.bench_function(format!("scale/{}", dtype.name()), |b| {
                b.iter(|| host.scale(&mut dst, 0, len, dtype, black_box(1.0)).unwrap())
            });
            g.bench_function(format!("divide/{}", dtype.name()), |b| {
                b.iter(|| host.divide(&mut dst, 0, len, dtype, black_box(1)).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
