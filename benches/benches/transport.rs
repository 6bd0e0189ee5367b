//! Loopback throughput (1 MiB … 256 MiB messages) and small-message round trip for
//! tcp-uring, tcp-epoll and quic, beside a plain blocking-socket baseline measured in the
//! same run; then the io_uring zero-copy crossover (SEND_ZC always vs never, per size).
//!
//! `cargo bench -p chorus-benches --bench transport` (add `-- quick` for a short run).
//! A custom harness: criterion's per-iteration model fits a multi-second 256 MiB transfer
//! and a paired baseline badly.

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

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let sizes: &[usize] = if quick {
        &[MIB, 16 * MIB]
    } else {
        &[MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    };
    let rtt_iters = if quick { 500 } else { 3000 };

    let kinds = ["baseline", "tcp-uring", "tcp-epoll", "quic"];
    let mut table: Vec<(String, Vec<f64>, f64)> = Vec::new();
    for kind in kinds {
        let mut row = Vec::new();
        // One message per transfer, up to 256 MiB: above the protocol's default chunk bound
        // (the runtime pipelines chunks instead), so both ends raise it alike.
        let mut cfg = TransportConfig {
            max_chunk: 256 << 20,
            ..TransportConfig::default()
        };
        if let Some(us) = std::env::var("CHORUS_BENCH_BUSY_POLL_US")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            cfg.busy_poll = Duration::from_micros(us);
        }
        let pair = rt.block_on(make_pair(kind, cfg));
        for &size in sizes {
            let total = (512 * MIB).max(2 * size);
            let count = total / size;
            let gbps = match &pair {
                None => baseline_throughput(size, count),
                Some((a, b)) => rt.block_on(link_throughput(a.clone(), b.clone(), size, count)),
            };
            row.push(gbps);
        }
        let rtt = match &pair {
            None => baseline_rtt(rtt_iters),
            Some((a, b)) => rt.block_on(link_rtt(a.clone(), b.clone(), rtt_iters)),
        };
        eprintln!("{kind}: done");
        table.push((kind.to_string(), row, rtt));
    }

    println!("\nloopback throughput, GB/s (one direction, 512 MiB or 2 messages per size)");
    print!("{:<11}", "transport");
    for s in sizes {
        print!("{:>10}", format!("{} MiB", s / MIB));
    }
    println!("{:>14}", "8 B RTT µs");
    for (kind, row, rtt) in &table {
        print!("{kind:<11}");
        for v in row {
            print!("{v:>10.2}");
        }
        println!("{rtt:>14.1}");
    }
    let base = &table[0];
    println!("\nratio to the blocking-socket baseline (throughput: higher is better; RTT: lower)");
    for (kind, row, rtt) in &table[1..] {
        print!("{kind:<11}");
        for (v, b) in row.iter().zip(&base.1) {
            print!("{:>10.2}", v / b);
        }
        println!("{:>14.2}", rtt / base.2);
    }

    if chorus_transport::tcp::uring_available() {
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
        "tcp-uring" | "tcp-epoll" => {
            let backend = if kind == "tcp-uring" {
                Backend::Uring
            } else {
                Backend::Epoll
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

async fn link_rtt(a: Arc<dyn Link<Bytes>>, b: Arc<dyn Link<Bytes>>, iters: usize) -> f64 {
    let echo = tokio::spawn({
        let b = b.clone();
        async move {
            for i in 0..iters + 100 {
                let m = b.recv(tag(2 * i as u64)).await.expect("recv");
                b.send(tag(2 * i as u64 + 1), m).await.expect("send");
            }
        }
    });
    let msg = Bytes::from_static(&[1u8; 8]);
    let mut t0 = Instant::now();
    for i in 0..iters + 100 {
        if i == 100 {
            t0 = Instant::now();
        }
        a.send(tag(2 * i as u64), msg.clone()).await.expect("send");
        a.recv(tag(2 * i as u64 + 1)).await.expect("recv");
    }
    let rtt = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    echo.await.expect("echo");
    rtt
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

fn baseline_rtt(iters: usize) -> f64 {
    let (mut c, mut s) = baseline_pair();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        for _ in 0..iters + 100 {
            s.read_exact(&mut buf).expect("read");
            s.write_all(&buf).expect("write");
        }
    });
    let mut buf = [1u8; 8];
    let mut t0 = Instant::now();
    for i in 0..iters + 100 {
        if i == 100 {
            t0 = Instant::now();
        }
        c.write_all(&buf).expect("write");
        c.read_exact(&mut buf).expect("read");
    }
    echo.join().expect("echo");
    t0.elapsed().as_secs_f64() * 1e6 / iters as f64
}
