//! One rank: a `TcpTransport`, a full mesh of data links built with the real handshake, an
//! `Engine<HostDevice, _>` over them, and the sweep, timed the way `mpi_allreduce.c` times
//! Open MPI's so that both land in the same `chorus_bench` document.
//!
//! Rendezvous with the launcher over stdin/stdout: the rank prints `listening PORT`, then
//! reads `peers PORT0 PORT1 …` (every rank's port, by rank); it connects to every lower
//! rank and accepts every higher one. Rank 0 then prints the document.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_benches::peer::bench_doc::{BenchDoc, Measure, Row};
use chorus_benches::peer::sweep::{Bytes as Size, Sweep};
use chorus_engine::{
    Buffer, Context, Engine, EngineConfig, HostBuffer, HostDevice, Link, Reduction,
};
use chorus_protocol::message::Role;
use chorus_protocol::{CommId, DType, Epoch, JobSecret, Rank};
use chorus_transport::{
    Backend, BackendKind, Route, TcpLink, TcpTransport, TransportConfig, admit_all,
};

use crate::{LinkKind, SECRET_ENV};

/// Set (to anything) to have rank 0 print each size's per-call percentiles on stderr.
const SAMPLES_ENV: &str = "CHORUS_DATAPLANE_SAMPLES";

/// Overrides `TransportConfig::recv_spin`, in µs (tuning runs).
const SPIN_ENV: &str = "CHORUS_DATAPLANE_SPIN_US";

/// How long building the mesh may take (every connect and handshake).
const MESH_DEADLINE: Duration = Duration::from_secs(30);

/// What one rank runs.
pub(crate) struct RankPlan {
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) backend: Backend,
    pub(crate) link: LinkKind,
    pub(crate) sweep: Sweep,
    pub(crate) engine: EngineConfig,
}

pub(crate) fn run(plan: &RankPlan) -> Result<(), String> {
    let secret = secret_from_env()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut cfg = TransportConfig {
        backend: plan.backend,
        ..TransportConfig::default()
    };
    if let Some(us) = std::env::var(SPIN_ENV).ok().and_then(|v| v.parse().ok()) {
        cfg.recv_spin = Duration::from_micros(us);
    }
    let transport = TcpTransport::new(cfg, secret).map_err(|e| format!("transport: {e}"))?;
    let want = match plan.backend {
        Backend::Uring => Some(BackendKind::Uring),
        Backend::Epoll => Some(BackendKind::Epoll),
        Backend::Auto => None,
    };
    if want.is_some_and(|w| w != transport.backend()) {
        return Err(format!(
            "asked for {:?}, got {:?}",
            plan.backend,
            transport.backend()
        ));
    }
    let links = rt.block_on(mesh(&transport, plan.rank, plan.world))?;
    let device = Arc::new(HostDevice);
    let root = Context::root();
    let doc = match plan.link {
        LinkKind::Concrete => {
            let links = links.into_iter().map(Arc::new);
            let e = Engine::new(
                Rank(plan.rank),
                plan.world,
                links,
                device,
                &root,
                plan.engine.clone(),
            )
            .map_err(|e| format!("engine: {e}"))?;
            sweep(&e, plan)?
        }
        LinkKind::Dyn => {
            let links = links
                .into_iter()
                .map(|l| Arc::new(l) as Arc<dyn Link<Bytes>>);
            let e: Engine<HostDevice, dyn Link<Bytes>> = Engine::new(
                Rank(plan.rank),
                plan.world,
                links,
                device,
                &root,
                plan.engine.clone(),
            )
            .map_err(|e| format!("engine: {e}"))?;
            sweep(&e, plan)?
        }
    };
    if let Some(doc) = doc {
        let text = serde_json::to_string(&doc).map_err(|e| format!("json: {e}"))?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{text}").map_err(|e| format!("stdout: {e}"))?;
        out.flush().map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}

fn secret_from_env() -> Result<JobSecret, String> {
    let hex = std::env::var(SECRET_ENV).map_err(|_| format!("{SECRET_ENV} is not set"))?;
    let mut bytes = [0u8; 32];
    if hex.len() != 64 {
        return Err(format!("{SECRET_ENV} must be 64 hex digits"));
    }
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{SECRET_ENV} must be 64 hex digits"))?;
    }
    Ok(JobSecret::new(bytes))
}

/// Every rank's data link to every other, over loopback with the transport's handshake.
async fn mesh(transport: &TcpTransport, rank: u32, world: u32) -> Result<Vec<TcpLink>, String> {
    let mut listener = transport
        .listen(SocketAddr::from(([127, 0, 0, 1], 0)), admit_all(Rank(rank)))
        .await
        .map_err(|e| format!("listen: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {}", listener.local_addr().port())
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))?;
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    let ports: Vec<u16> = line
        .strip_prefix("peers ")
        .ok_or_else(|| format!("expected `peers …` from the launcher, got {line:?}"))?
        .split_whitespace()
        .map(|p| p.parse().map_err(|_| format!("bad port {p:?}")))
        .collect::<Result<_, _>>()?;
    if ports.len() != world as usize {
        return Err(format!("{} ports for {world} ranks", ports.len()));
    }
    let me = Route {
        comm: CommId(1),
        epoch: Epoch(0),
        sender: Rank(rank),
    };
    let connects = futures::future::join_all((0..rank).map(|j| {
        let addr = SocketAddr::from(([127, 0, 0, 1], ports[j as usize]));
        transport.connect(addr, Role::Data, me, Rank(j))
    }));
    let accepts = async {
        let mut conns = Vec::new();
        for _ in rank + 1..world {
            conns.push(listener.accept(MESH_DEADLINE).await);
        }
        conns
    };
    let (connected, accepted) =
        tokio::time::timeout(MESH_DEADLINE, async { futures::join!(connects, accepts) })
            .await
            .map_err(|_| format!("mesh not built within {MESH_DEADLINE:?}"))?;
    let mut links = Vec::new();
    for conn in connected.into_iter().chain(accepted) {
        let conn = conn.map_err(|e| format!("connection: {e}"))?;
        links.push(conn.into_link().map_err(|e| format!("link: {e}"))?);
    }
    Ok(links)
}

/// The whole sweep; the document on rank 0, `None` elsewhere.
fn sweep<L>(e: &Engine<HostDevice, L>, plan: &RankPlan) -> Result<Option<BenchDoc>, String>
where
    L: Link<Bytes> + ?Sized,
{
    let max = usize::try_from(plan.sweep.max().0).map_err(|_| "size too large".to_owned())?;
    let mut send = HostBuffer::zeroed(max).map_err(|e| e.to_string())?;
    let mut recv = HostBuffer::zeroed(max).map_err(|e| e.to_string())?;
    // Fault every page in before timing anything (zeroed allocations are lazily mapped).
    send.fill(1);
    recv.fill(1);
    recv.fill(0);
    // A first warm-up, so the first size does not pay for the links' first use.
    for _ in 0..plan.sweep.warmup().max(1) {
        all_reduce(e, None, &mut recv[..4], 1)?;
    }
    let n = plan.world;
    let mut rows = Vec::new();
    let mut busbw = Vec::new();
    for size in plan.sweep.sizes() {
        let count = (size.0 / 4) as usize;
        let oop = measure(e, &mut send, &mut recv, count, false, plan)?;
        let ip = measure(e, &mut send, &mut recv, count, true, plan)?;
        busbw.extend([oop.busbw_gbs, ip.busbw_gbs]);
        rows.push(Row {
            size: Size(count as u64 * 4),
            count: count as u64,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: Some(oop),
            in_place: Some(ip),
        });
    }
    if plan.rank != 0 {
        return Ok(None);
    }
    let backend = match plan.backend {
        Backend::Uring => "io_uring",
        Backend::Epoll => "epoll",
        Backend::Auto => "auto",
    };
    Ok(Some(BenchDoc {
        chorus_bench: 1,
        collective: "all-reduce".into(),
        ranks: n,
        transport: "tcp".into(),
        dtype: "float".into(),
        op: "sum".into(),
        warmup: plan.sweep.warmup(),
        iters: plan.sweep.iters(),
        library: Some(format!(
            "chorus engine over TcpLink ({backend}, {} links)",
            plan.link.name()
        )),
        rows,
        avg_busbw_gbs: busbw.iter().sum::<f64>() / busbw.len().max(1) as f64,
    }))
}

/// One mode at one size, as `mpi_allreduce.c`'s `run_mode`: barrier, warm-up, barrier,
/// timed calls; the ranks' mean time per call; then one checked call on a fresh pattern.
fn measure<L>(
    e: &Engine<HostDevice, L>,
    send: &mut HostBuffer,
    recv: &mut HostBuffer,
    count: usize,
    in_place: bool,
    plan: &RankPlan,
) -> Result<Measure, String>
where
    L: Link<Bytes> + ?Sized,
{
    let bytes = count * 4;
    let (rank, n) = (plan.rank, plan.world);
    let send = &mut send[..bytes];
    let recv = &mut recv[..bytes];
    if in_place {
        recv.fill(0);
    } else {
        fill_pattern(send, rank);
    }
    fn src(send: &[u8], in_place: bool) -> Option<&[u8]> {
        (!in_place).then_some(send)
    }
    barrier(e)?;
    for _ in 0..plan.sweep.warmup() {
        all_reduce(e, src(send, in_place), recv, count)?;
    }
    barrier(e)?;
    let samples = std::env::var_os(SAMPLES_ENV).is_some();
    let mut each = Vec::new();
    let start = Instant::now();
    for _ in 0..plan.sweep.iters() {
        let t = samples.then(Instant::now);
        all_reduce(e, src(send, in_place), recv, count)?;
        if let Some(t) = t {
            each.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let per_call = start.elapsed().as_secs_f64() / f64::from(plan.sweep.iters());
    if samples && rank == 0 {
        each.sort_by(f64::total_cmp);
        let at = |q: f64| each[((each.len() - 1) as f64 * q) as usize];
        eprintln!(
            "rank 0 {bytes:>10} B {}: min {:.1} p10 {:.1} p50 {:.1} p90 {:.1} mean {:.1} µs",
            if in_place { "in-place" } else { "out-of-place" },
            at(0.0),
            at(0.1),
            at(0.5),
            at(0.9),
            per_call * 1e6
        );
    }
    let mean = sum_f64(e, per_call)? / f64::from(n);

    if in_place {
        fill_pattern(recv, rank);
    } else {
        recv.fill(0);
    }
    all_reduce(e, src(send, in_place), recv, count)?;
    let wrong = sum_u64(e, count_wrong(recv, n))?;
    let algbw = bytes as f64 / mean / 1e9;
    Ok(Measure {
        time_us: mean * 1e6,
        algbw_gbs: algbw,
        busbw_gbs: algbw * 2.0 * f64::from(n - 1) / f64::from(n),
        wrong,
    })
}

fn all_reduce<L>(
    e: &Engine<HostDevice, L>,
    send: Option<&[u8]>,
    recv: &mut [u8],
    count: usize,
) -> Result<(), String>
where
    L: Link<Bytes> + ?Sized,
{
    let buf = match send {
        Some(send) => Buffer::separate(send, recv),
        None => Buffer::in_place(recv),
    };
    futures::executor::block_on(e.all_reduce(buf, count, DType::F32, Reduction::Sum))
        .map_err(|e| e.to_string())
}

fn barrier<L>(e: &Engine<HostDevice, L>) -> Result<(), String>
where
    L: Link<Bytes> + ?Sized,
{
    futures::executor::block_on(e.barrier()).map_err(|e| e.to_string())
}

fn sum_f64<L>(e: &Engine<HostDevice, L>, v: f64) -> Result<f64, String>
where
    L: Link<Bytes> + ?Sized,
{
    let mut b = v.to_ne_bytes();
    futures::executor::block_on(e.all_reduce(
        Buffer::in_place(&mut b[..]),
        1,
        DType::F64,
        Reduction::Sum,
    ))
    .map_err(|e| e.to_string())?;
    Ok(f64::from_ne_bytes(b))
}

fn sum_u64<L>(e: &Engine<HostDevice, L>, v: u64) -> Result<u64, String>
where
    L: Link<Bytes> + ?Sized,
{
    let mut b = v.to_ne_bytes();
    futures::executor::block_on(e.all_reduce(
        Buffer::in_place(&mut b[..]),
        1,
        DType::U64,
        Reduction::Sum,
    ))
    .map_err(|e| e.to_string())?;
    Ok(u64::from_ne_bytes(b))
}

/// The check pattern of `mpi_allreduce.c` and `gloo_allreduce.py`: `(7i + 3·rank) mod 64`,
/// exact in float32, different per rank.
const PERIOD: usize = 64;

fn pattern(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 3) % PERIOD) as f32
}

fn fill_pattern(buf: &mut [u8], rank: u32) {
    for (i, x) in buf.chunks_exact_mut(4).enumerate() {
        x.copy_from_slice(&pattern(rank, i).to_ne_bytes());
    }
}

fn count_wrong(buf: &[u8], n: u32) -> u64 {
    let expected: Vec<f32> = (0..PERIOD)
        .map(|i| (0..n).map(|r| pattern(r, i)).sum())
        .collect();
    buf.chunks_exact(4)
        .enumerate()
        .filter(|(i, x)| f32::from_ne_bytes([x[0], x[1], x[2], x[3]]) != expected[i % PERIOD])
        .count() as u64
}
