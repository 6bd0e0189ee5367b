//! Host reduction throughput per dtype, beside `memcpy` measured in the same run.
//!
//! `cargo bench -p chorus-benches --bench reduce`. Throughput is bytes of the destination
//! per second: a reduction reads two buffers and writes one (3 bytes of traffic per byte),
//! `memcpy` reads one and writes one (2 per byte), so at DRAM sizes a memory-bound
//! reduction tops out near 2/3 of memcpy; at cache-resident sizes both are compute-bound.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use chorus_engine::host_reduce;
use chorus_protocol::{DType, ReduceOp};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// A cache-resident chunk (the engine's default chunk size) and a DRAM-sized buffer.
const SIZES: [(usize, &str); 2] = [(256 << 10, "256KiB"), (64 << 20, "64MiB")];

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
        for op in [ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            for dtype in [DType::F32, DType::BF16, DType::I32] {
                g.bench_function(format!("{}/{}", op.name(), dtype.name()), |b| {
                    b.iter(|| host_reduce(&mut dst, black_box(&src), dtype, op).unwrap())
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
