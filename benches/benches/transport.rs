//! Loopback throughput (1 MiB … 256 MiB messages) and small-message round trip for
//! tcp-uring, tcp-epoll and quic, beside a plain blocking-socket baseline measured in the
//! same run; then the io_uring zero-copy crossover (SEND_ZC always vs never, per size).
//!
//! `cargo bench -p chorus-benches --bench transport` (add `-- quick` for a short run, or
//! `-- rtt` for the round trips alone). A custom harness: criterion's per-iteration model
//! fits a multi-second 256 MiB transfer and a paired baseline badly.
//!
//! Round trips are measured in interleaved rounds (every transport, then again), and the
//! median of all per-message samples is reported beside the mean, so a load spike on a
//! shared machine lands on every transport alike instead of on whichever ran then.
//! `tokio-tcp` is the same ping-pong over plain tokio sockets between two tasks of the
//! bench's runtime: the floor for anything whose callers are tokio tasks (one thread
//! wake-up per message, where a link's progress thread adds a second). `tcp-uring+spin` is
//! tcp-uring with the progress thread busy-polling for 50 µs before it sleeps
//! (`TransportConfig::busy_poll`; off by default).

// The report is the output of this program.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::link::{Link, Tag};
use chorus_protocol::message::Role;
use chorus_protocol::{Collective, CommId, DType, Epoch, OpSeq, Rank};
use chorus_transport::{
    Backend, Identity, Liveness, QuicEndpoint, Route, TcpTransport, TransportConfig, admit_all,
    fresh,
};

const MIB: usize = 1 << 20;
/// Round trips per transport per round.
const RTT_BATCH: usize = 500;

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let rtt_only = std::env::args().any(|a| a == "rtt");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let sizes: &[usize] = match (rtt_only, quick) {
        (true, _) => &[],
        (false, true) => &[MIB, 16 * MIB],
        (false, false) => &[MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB],
    };
    let rounds = if quick { 4 } else { 12 };

    let kinds = [
        "baseline",
        "tokio-tcp",
        "tcp-uring",
        "tcp-epoll",
        "quic",
        "tcp-uring+spin",
    ];
    let mut pairs = Vec::new();
    for kind in kinds {
        // One message per transfer, up to 256 MiB: above the protocol's default chunk bound
        // (the runtime pipelines chunks instead), so both ends raise it alike.
        let mut cfg = TransportConfig {
            max_chunk: 256 << 20,
            ..TransportConfig::default()
        };
        if kind == "tcp-uring+spin" {
            cfg.busy_poll = Duration::from_micros(50);
        }
        let pair = rt.block_on(make_pair(kind, cfg));
        if !matches!(kind, "baseline" | "tokio-tcp") && pair.is_none() {
            eprintln!("{kind}: unavailable here, skipped");
            continue;
        }
        pairs.push((kind, pair));
    }

    let mut table: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    for (kind, pair) in &pairs {
        let mut row = Vec::new();
        for &size in sizes {
            let total = (512 * MIB).max(2 * size);
            let count = total / size;
            let gbps = match pair {
                None if *kind == "tokio-tcp" => f64::NAN,
                None => baseline_throughput(size, count),
                Some((a, b)) => rt.block_on(link_throughput(a.clone(), b.clone(), size, count)),
            };
            row.push(gbps);
        }
        eprintln!("{kind}: throughput done");
        table.push((kind, row, Vec::new()));
    }
    for round in 0..rounds {
        for ((kind, pair), (_, _, samples)) in pairs.iter().zip(table.iter_mut()) {
            let op0 = (round * (RTT_BATCH + 100) * 2) as u64;
            samples.extend(match pair {
                None if *kind == "tokio-tcp" => rt.block_on(tokio_rtt(RTT_BATCH)),
                None => baseline_rtt(RTT_BATCH),
                Some((a, b)) => rt.block_on(link_rtt(a.clone(), b.clone(), RTT_BATCH, op0)),
            });
        }
    }

    println!(
        "\nloopback throughput, GB/s (one direction, 512 MiB or 2 messages per size); \
         8-byte round trip, µs ({} samples each, interleaved)",
        rounds * RTT_BATCH
    );
    print!("{:<15}", "transport");
    for s in sizes {
        print!("{:>10}", format!("{} MiB", s / MIB));
    }
    println!("{:>10}{:>10}", "RTT p50", "RTT mean");
    let stats: Vec<(f64, f64)> = table.iter().map(|(_, _, s)| (median(s), mean(s))).collect();
    for ((kind, row, _), (p50, avg)) in table.iter().zip(&stats) {
        print!("{kind:<15}");
        for v in row {
            print!("{:>10}", cell(*v));
        }
        println!("{p50:>10.1}{avg:>10.1}");
    }
    println!("\nratio to the blocking-socket baseline (throughput: higher is better; RTT: lower)");
    for ((kind, row, _), (p50, avg)) in table.iter().zip(&stats).skip(1) {
        print!("{kind:<15}");
        for (v, b) in row.iter().zip(&table[0].1) {
            print!("{:>10}", cell(v / b));
        }
        println!("{:>10.2}{:>10.2}", p50 / stats[0].0, avg / stats[0].1);
    }

    if !quick && !rtt_only && chorus_transport::tcp::uring_available() {
        println!("\nio_uring SEND_ZC crossover, GB/s (copy = never zero-copy, zc = always)");
        let zc_sizes: &[usize] = &[16 << 10, 64 << 10, 256 << 10, MIB, 4 * MIB];
        println!("{:>10}{:>10}{:>10}", "size", "copy", "zc");
        for &size in zc_sizes {
            let count = ((256 * MIB) / size).max(8);
            let mut line = Vec::new();
            for threshold in [usize::MAX, 0] {
                let cfg = TransportConfig {
                    zero_copy_threshold: chorus_transport::ZeroCopy::always_from(threshold),
                    ..TransportConfig::default()
                };
                let (a, b) = rt
                    .block_on(make_pair("tcp-uring", cfg))
                    .expect("uring pair");
                line.push(rt.block_on(link_throughput(a, b, size, count)));
            }
            println!(
                "{:>10}{:>10.2}{:>10.2}",
                format!("{} KiB", size >> 10),
                line[0],
                line[1]
            );
        }
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len().max(1) as f64
}

type Pair = (Arc<dyn Link<Bytes>>, Arc<dyn Link<Bytes>>);

fn route(rank: u32) -> Route {
    Route {
        comm: CommId(1),
        epoch: Epoch(0),
        sender: Rank(rank),
    }
}

fn tag(op: u64) -> Tag {
    Tag {
        collective: Collective::SendRecv,
        op: OpSeq(op),
        step: 0,
        offset: 0,
        dtype: DType::U8,
    }
}

async fn make_pair(kind: &str, cfg: TransportConfig) -> Option<Pair> {
    let secret = fresh::job_secret();
    let wait = Duration::from_secs(10);
    match kind {
        "tcp-uring" | "tcp-uring+spin" | "tcp-epoll" => {
            let backend = if kind == "tcp-epoll" {
                Backend::Epoll
            } else {
                Backend::Uring
            };
            let t = TcpTransport::new(TransportConfig { backend, ..cfg }, secret).ok()?;
            let mut l = t
                .listen("127.0.0.1:0".parse().ok()?, admit_all(Rank(0)))
                .await
                .ok()?;
            let addr = l.local_addr();
            let (c, s) = tokio::join!(
                t.connect(addr, Role::Data, route(1), Rank(0)),
                l.accept(wait)
            );
            let a: Arc<dyn Link<Bytes>> = Arc::new(c.ok()?.into_link().ok()?);
            let b: Arc<dyn Link<Bytes>> = Arc::new(s.ok()?.into_link().ok()?);
            // The transport's threads stay alive as long as links hold it.
            std::mem::forget(t);
            Some((a, b))
        }
        "quic" => {
            let ids = (Identity::generate().ok()?, Identity::generate().ok()?);
            let bind = |id: &Identity, rank| {
                QuicEndpoint::bind(
                    "127.0.0.1:0".parse().expect("addr"),
                    id,
                    secret.clone(),
                    cfg.clone(),
                    Liveness::default(),
                    admit_all(Rank(rank)),
                )
            };
            let (ea, eb) = (bind(&ids.0, 1).ok()?, bind(&ids.1, 0).ok()?);
            let addr = eb.local_addr().ok()?;
            let (c, s) = tokio::join!(
                ea.connect(addr, ids.1.fingerprint(), Role::Data, route(1), Rank(0)),
                eb.accept(wait)
            );
            let pair: Pair = (
                Arc::new(c.ok()?.into_link().ok()?),
                Arc::new(s.ok()?.into_link().ok()?),
            );
            std::mem::forget((ea, eb));
            Some(pair)
        }
        _ => None,
    }
}

async fn link_throughput(
    a: Arc<dyn Link<Bytes>>,
    b: Arc<dyn Link<Bytes>>,
    size: usize,
    count: usize,
) -> f64 {
    let payload = Bytes::from(vec![7u8; size]);
    // Warm-up message (connection windows, page faults of the receive buffers).
    let (s, r) = tokio::join!(
        a.send(tag(u64::MAX - 1), payload.clone()),
        b.recv(tag(u64::MAX - 1))
    );
    s.expect("send");
    r.expect("recv");
    let t0 = Instant::now();
    let sender = tokio::spawn({
        let a = a.clone();
        let payload = payload.clone();
        async move {
            for i in 0..count {
                a.send(tag(i as u64), payload.clone()).await.expect("send");
            }
        }
    });
    for i in 0..count {
        let got = b.recv(tag(i as u64)).await.expect("recv");
        assert_eq!(got.len(), size);
    }
    sender.await.expect("sender");
    (size * count) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// Per-message round trips (µs) of `iters` 8-byte ping-pongs, after 100 warm-up ones;
/// tags start at `op0` so successive rounds on one pair never collide.
async fn link_rtt(
    a: Arc<dyn Link<Bytes>>,
    b: Arc<dyn Link<Bytes>>,
    iters: usize,
    op0: u64,
) -> Vec<f64> {
    let echo = tokio::spawn({
        let b = b.clone();
        async move {
            for i in 0..iters + 100 {
                let t = op0 + 2 * i as u64;
                let m = b.recv(tag(t)).await.expect("recv");
                b.send(tag(t + 1), m).await.expect("send");
            }
        }
    });
    let msg = Bytes::from_static(&[1u8; 8]);
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let t = op0 + 2 * i as u64;
        let t0 = Instant::now();
        a.send(tag(t), msg.clone()).await.expect("send");
        a.recv(tag(t + 1)).await.expect("recv");
        if i >= 100 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.await.expect("echo");
    samples
}

fn baseline_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (s, _) = l.accept().expect("accept");
    c.set_nodelay(true).expect("nodelay");
    s.set_nodelay(true).expect("nodelay");
    (c, s)
}

fn baseline_throughput(size: usize, count: usize) -> f64 {
    let (mut c, mut s) = baseline_pair();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; size];
        for _ in 0..count + 1 {
            s.read_exact(&mut buf).expect("read");
        }
    });
    let payload = vec![7u8; size];
    c.write_all(&payload).expect("warm-up");
    let t0 = Instant::now();
    for _ in 0..count {
        c.write_all(&payload).expect("write");
    }
    reader.join().expect("reader");
    (size * count) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// The same ping-pong over plain tokio sockets on the bench's runtime: the floor for any
/// transport whose callers are tokio tasks.
async fn tokio_rtt(iters: usize) -> Vec<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let (c, s) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
    let (mut c, (mut s, _)) = (c.expect("connect"), s.expect("accept"));
    c.set_nodelay(true).expect("nodelay");
    s.set_nodelay(true).expect("nodelay");
    let echo = tokio::spawn(async move {
        let mut buf = [0u8; 8];
        for _ in 0..iters + 100 {
            s.read_exact(&mut buf).await.expect("read");
            s.write_all(&buf).await.expect("write");
        }
    });
    let mut buf = [1u8; 8];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let t0 = Instant::now();
        c.write_all(&buf).await.expect("write");
        c.read_exact(&mut buf).await.expect("read");
        if i >= 100 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.await.expect("echo");
    samples
}

fn baseline_rtt(iters: usize) -> Vec<f64> {
    let (mut c, mut s) = baseline_pair();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        for _ in 0..iters + 100 {
            s.read_exact(&mut buf).expect("read");
            s.write_all(&buf).expect("write");
        }
    });
    let mut buf = [1u8; 8];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let t0 = Instant::now();
        c.write_all(&buf).expect("write");
        c.read_exact(&mut buf).expect("read");
        if i >= 100 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join().expect("echo");
    samples
}

/// A table cell: two decimals, or a dash for what was not measured (`tokio-tcp` has round
/// trips only).
fn cell(v: f64) -> String {
    if v.is_nan() {
        "-".to_owned()
    } else {
        format!("{v:.2}")
    }
}
