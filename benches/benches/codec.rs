//! Codec micro-benchmarks (chorus-protocol): the per-frame cost of encoding and decoding a
//! heartbeat and a data-chunk header, and a 1 MiB chunk passing through the decoder.
//!
//! `cargo bench -p chorus-benches --bench codec`
//!
//! - `heartbeat/encode`, `heartbeat/decode`: ns per 48-byte frame. Decoding includes
//!   copying the frames into the decoder (what a socket read does) and every check.
//! - `chunk-header/encode-prefix`: the 64 bytes written ahead of a zero-copy payload.
//! - `chunk-header/decode`: a chunk frame with a 64-byte payload.
//! - `chunk-1MiB/decode-in-place`: the frame already read into the decoder's lent buffer;
//!   the payload comes out as `Bytes` split from it, so GB/s is far above memory bandwidth
//!   (nothing is copied). `chunk-1MiB/push-then-decode` adds the one copy of `push` for
//!   comparison, and `chunk-1MiB/memcpy` is that copy alone, measured in the same run.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use chorus_protocol::message::{Chunk, ChunkHeader};
use chorus_protocol::{
    Collective, CommId, DType, Decoder, Encoder, Envelope, Epoch, Gate, Limits, Message, OpSeq,
    Rank, samples,
};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

/// Frames per decode batch: enough to amortise the decoder's construction.
const BATCH: u64 = 1024;

fn envelope() -> Envelope {
    Envelope::new(CommId(1), Epoch(1), Rank(1))
}

fn open() -> Decoder {
    Decoder::with_gate(Gate::Open, Limits::DEFAULT)
}

/// `n` frames of `message`, sequence numbers 0.., as one stream.
fn stream(message: &Message, n: u64) -> Bytes {
    let mut enc = Encoder::default();
    let mut out = BytesMut::new();
    for _ in 0..n {
        enc.encode(&envelope(), message, &mut out)
            .expect("sample encodes");
    }
    out.freeze()
}

fn decode_all(bytes: &[u8]) -> u64 {
    let mut d = open();
    d.recv_buf().extend_from_slice(bytes);
    let mut n = 0;
    while let Ok(Some(frame)) = d.next() {
        black_box(&frame);
        n += 1;
    }
    n
}

fn heartbeat(c: &mut Criterion) {
    let hb = samples::heartbeat().message;
    let mut g = c.benchmark_group("heartbeat");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode", |b| {
        let mut enc = Encoder::default();
        let mut out = BytesMut::with_capacity(4096);
        b.iter(|| {
            out.clear();
            enc.encode(&envelope(), black_box(&hb), &mut out)
                .expect("encodes");
            black_box(&out);
        })
    });
    let frames = stream(&hb, BATCH);
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("decode", |b| {
        b.iter(|| assert_eq!(decode_all(black_box(&frames)), BATCH))
    });
    g.finish();
}

fn chunk_header(c: &mut Criterion) {
    let header = ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(7), 3, 4096);
    let mut g = c.benchmark_group("chunk-header");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode-prefix", |b| {
        let mut enc = Encoder::default();
        let mut out = BytesMut::with_capacity(4096);
        b.iter(|| {
            out.clear();
            enc.encode_chunk_prefix(&envelope(), black_box(&header), 1 << 20, &mut out)
                .expect("encodes");
            black_box(&out);
        })
    });
    let small = Message::Chunk(Chunk {
        header,
        payload: Bytes::from(vec![1u8; 64]),
    });
    let frames = stream(&small, BATCH);
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("decode", |b| {
        b.iter(|| assert_eq!(decode_all(black_box(&frames)), BATCH))
    });
    g.finish();
}

fn chunk_1mib(c: &mut Criterion) {
    const LEN: usize = 1 << 20;
    let big = Message::Chunk(Chunk {
        header: ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(7), 3, 0),
        payload: Bytes::from(vec![3u8; LEN]),
    });
    let frame = stream(&big, 1);
    let mut g = c.benchmark_group("chunk-1MiB");
    g.throughput(Throughput::Bytes(LEN as u64));
    g.bench_function("decode-in-place", |b| {
        b.iter_batched(
            || {
                // What a transport's socket read does: fill the lent buffer.
                let mut d = open();
                d.recv_buf().extend_from_slice(&frame);
                d
            },
            |mut d| d.next().expect("decodes").expect("complete"),
            BatchSize::NumIterations(16),
        )
    });
    g.bench_function("push-then-decode", |b| {
        // Steady state of one stream: each frame is copied in, decoded and dropped, so the
        // decoder reuses its allocation. The sequence number is patched per frame.
        let mut d = open();
        let mut bytes = frame.to_vec();
        let mut seq = 0u64;
        b.iter(|| {
            bytes[32..40].copy_from_slice(&seq.to_le_bytes());
            seq += 1;
            d.push(black_box(&bytes));
            d.next().expect("decodes").expect("complete")
        })
    });
    g.bench_function("memcpy", |b| {
        let src = vec![5u8; LEN];
        let mut dst = vec![0u8; LEN];
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.finish();
}

criterion_group!(benches, heartbeat, chunk_header, chunk_1mib);
criterion_main!(benches);
