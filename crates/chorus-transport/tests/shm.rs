//! The shm transport: set-up and authentication, the `Link` contract (the shared suite's
//! cancel body included), departure versus crash, a forked holder, hostile bytes and
//! indices in the ring, bounded memory, and cleanup after a killed peer. The engine's
//! correctness matrix over shm links is `shm_matrix.rs`.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_engine::link::{CancelReason, Link, LinkError};
use chorus_protocol::message::{ChunkHeader, Depart, Message, Role};
use chorus_protocol::{CloseCode, DType, JobSecret, OpSeq, Rank};
use chorus_transport::shm::ring::SLOT_BYTES;
use chorus_transport::{
    RawShm, RawSlot, ShmLink, ShmListener, ShmTransport, TransportConfig, admit_all, fresh,
};
use common::*;

const WAIT: Duration = Duration::from_secs(10);

/// Every test of this binary shares the process's descriptor table: the cleanup test
/// counts it alone (write), the others run side by side (read).
static FDS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared_fds() -> std::sync::RwLockReadGuard<'static, ()> {
    FDS.read().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` beside the other tests, on a runtime made after taking the lock (a runtime
/// has descriptors of its own).
fn shared<F: std::future::Future>(f: F) -> F::Output {
    let _fds = shared_fds();
    runtime().block_on(f)
}

/// Runs `f` with no other test running, so that it may count the process's descriptors.
fn alone<F: std::future::Future>(f: F) -> F::Output {
    let _alone = FDS.write().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(f)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config() -> TransportConfig {
    TransportConfig {
        handshake_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(5),
        ..TransportConfig::default()
    }
}

fn transport(cfg: Option<TransportConfig>) -> (ShmTransport, JobSecret) {
    let secret = fresh::job_secret();
    let t = ShmTransport::new(cfg.unwrap_or_else(config), secret.clone()).unwrap();
    (t, secret)
}

async fn listener(t: &ShmTransport, rank: u32) -> ShmListener {
    t.listen(admit_all(Rank(rank))).await.unwrap()
}

/// Two linked ends: (rank 1's link to rank 0, rank 0's link to rank 1).
async fn pair(t: &ShmTransport, l: &mut ShmListener) -> (ShmLink, ShmLink) {
    let name = l.name().to_owned();
    let (c, a) = tokio::join!(
        t.connect(&name, Role::Data, route(1), Rank(0)),
        l.accept(WAIT)
    );
    (
        c.unwrap().into_link().unwrap(),
        a.unwrap().into_link().unwrap(),
    )
}

/// Rank 0's link to rank 1, and rank 1's end of the segment, raw.
async fn link_and_raw(t: &ShmTransport, l: &mut ShmListener) -> (ShmLink, RawShm) {
    let name = l.name().to_owned();
    let (c, a) = tokio::join!(
        t.connect(&name, Role::Data, route(1), Rank(0)),
        l.accept(WAIT)
    );
    (
        a.unwrap().into_link().unwrap(),
        c.unwrap().into_raw().unwrap(),
    )
}

/// A link with a 64 KiB ring and a 256 KiB send window to a raw peer that reads only when
/// asked (so a large send fills the ring and queues the rest, holding the window), with
/// the transport and listener it needs kept alive.
async fn windowed_link_and_raw() -> (ShmTransport, ShmListener, ShmLink, RawShm) {
    let cfg = TransportConfig {
        shm_ring: 64 << 10,
        send_window: 256 << 10,
        ..config()
    };
    let (t, _) = transport(Some(cfg));
    let mut l = listener(&t, 0).await;
    let (link, raw) = link_and_raw(&t, &mut l).await;
    (t, l, link, raw)
}

/// `send_bytes_now` of `data`, retried until the link takes it (the window has reopened).
async fn send_once_the_window_reopens(link: &ShmLink, tag: chorus_engine::link::Tag, data: &[u8]) {
    let deadline = Instant::now() + WAIT;
    let sent = loop {
        if let Some(done) = link.send_bytes_now(tag, data) {
            break done;
        }
        assert!(Instant::now() < deadline, "the window never reopened");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    sent.unwrap();
}

/// A small payload that still goes through the ring: longer than a mailbox slot takes.
const SMALL: &[u8] = &[b's'; SLOT_BYTES + 1];
const LATER: &[u8] = &[b'l'; SLOT_BYTES + 100];

/// The sequence number and payload of a chunk the raw peer read.
fn chunk(m: Option<Message>) -> (OpSeq, Bytes) {
    match m {
        Some(Message::Chunk(c)) => (c.header.op, c.payload),
        other => panic!("expected a chunk, got {other:?}"),
    }
}

async fn transfer(a: &ShmLink, b: &ShmLink, op: u64, len: usize) {
    let payload = pattern(len, op as u8);
    let (s, r) = tokio::join!(a.send(tag(op, 0), payload.clone()), b.recv(tag(op, 0)));
    s.unwrap();
    assert!(r.unwrap() == payload, "payload of {len} bytes corrupted");
}

/// The next message the raw end decodes from what the link wrote, within `within`.
fn next_message(raw: &mut RawShm, within: Duration) -> Option<Message> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(frame) = raw.decoder.next().unwrap() {
            return Some(frame.message);
        }
        if Instant::now() >= deadline {
            return None;
        }
        let bytes = raw.read(Duration::from_millis(20));
        raw.decoder.push(&bytes);
    }
}

fn chunk_prefix(raw: &mut RawShm, op: u64, len: usize) -> BytesMut {
    let header = ChunkHeader::new(
        chorus_protocol::Collective::AllReduce,
        DType::U8,
        OpSeq(op),
        0,
        0,
    );
    let mut frame = BytesMut::new();
    let me = raw.me;
    raw.encoder
        .encode_chunk_prefix(&me, &header, len, &mut frame)
        .unwrap();
    frame
}

fn protocol_violation(r: &Result<Bytes, LinkError>) -> bool {
    matches!(
        r,
        Err(LinkError::Protocol {
            code: CloseCode::PROTOCOL_VIOLATION,
            ..
        })
    )
}

#[test]
fn round_trip_every_size_both_ways_and_early_arrivals_are_held() {
    shared(async {
        let cfg = TransportConfig {
            // A small ring: large payloads stream through it many times over.
            shm_ring: 64 << 10,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        // The runtime picks shared-memory crossovers from this.
        assert!(a.shares_memory() && b.shares_memory());
        for (i, len) in [0, 1, 100, 65_536 - 64, 65_536, 300_000, 4 << 20, 16 << 20]
            .into_iter()
            .enumerate()
        {
            transfer(&a, &b, i as u64, len).await;
            transfer(&b, &a, 100 + i as u64, len).await;
        }
        for step in 0..10 {
            a.send(tag(500, step), pattern(1000, step as u8))
                .await
                .unwrap();
        }
        for step in (0..10).rev() {
            assert_eq!(
                b.recv(tag(500, step)).await.unwrap(),
                pattern(1000, step as u8)
            );
        }
        // Borrowed bytes: what the ring did not take is copied before the send resolves.
        let mut data = pattern(1 << 20, 9).to_vec();
        a.send_bytes(tag(600, 0), &data).unwrap().await.unwrap();
        data.iter_mut().for_each(|x| *x = !*x);
        assert!(b.recv(tag(600, 0)).await.unwrap() == pattern(1 << 20, 9));
    });
}

/// `send_bytes_now` writes what needs no wait, and with the send window used up by a frame
/// still queued it answers `None` having numbered nothing: the raw peer's decoder, which
/// checks every frame's sequence number, reads the stream in order.
#[test]
fn send_bytes_now_refuses_without_credit_and_numbers_nothing() {
    shared(async {
        let (_t, _l, link, mut raw) = windowed_link_and_raw().await;
        link.send_bytes_now(tag(1, 0), SMALL).unwrap().unwrap();
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(1), Bytes::from_static(SMALL))
        );
        // The raw end reads nothing: the ring fills, the rest is queued holding the window.
        link.send(tag(2, 0), pattern(1 << 20, 2)).await.unwrap();
        assert!(link.send_bytes_now(tag(3, 0), LATER).is_none());
        let (op, payload) = chunk(next_message(&mut raw, WAIT));
        assert!(op == OpSeq(2) && payload == pattern(1 << 20, 2));
        // The credit comes back once the pump has written the frame.
        send_once_the_window_reopens(&link, tag(3, 0), LATER).await;
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(3), Bytes::from_static(LATER))
        );
        link.cancel(CancelReason::new(CloseCode::NORMAL, "done"));
        assert!(matches!(
            link.send_bytes_now(tag(4, 0), b"x"),
            Some(Err(LinkError::Cancelled(_)))
        ));
    });
}

/// A small send that takes no window credit (written whole into an idle ring) never
/// overtakes a send still waiting for that credit: the peer gets them in the order sent.
#[test]
fn a_send_waiting_for_the_window_is_not_overtaken() {
    shared(async {
        let (_t, _l, link, mut raw) = windowed_link_and_raw().await;
        // The raw end reads nothing yet: the ring fills, the rest is queued holding the
        // whole window, so the next send waits for credit.
        link.send(tag(1, 0), pattern(1 << 20, 1)).await.unwrap();
        let mut waiting = link.send(tag(2, 0), pattern(100 << 10, 2));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        // Once the first frame is out, the stream is idle and the ring empty, but the
        // waiting send has not run since the window reopened.
        assert_eq!(chunk(next_message(&mut raw, WAIT)).0, OpSeq(1));
        let deadline = Instant::now() + WAIT;
        while !link.is_flushed() {
            assert!(Instant::now() < deadline, "the first frame never left");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            link.send_bytes_now(tag(3, 0), SMALL).is_none(),
            "a send still waits for the window"
        );
        waiting.await.unwrap();
        send_once_the_window_reopens(&link, tag(3, 0), SMALL).await;
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(2), pattern(100 << 10, 2))
        );
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(3), Bytes::from_static(SMALL))
        );
    });
}

/// `recv_into` lands every size in the destination, whether the spin places it straight
/// from the ring or the frame was held first; another length is reported, never copied.
#[test]
fn recv_into_lands_every_size_and_reports_another_length() {
    shared(async {
        let cfg = TransportConfig {
            shm_ring: 64 << 10,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        for (i, len) in [1, 4095, 4096, 65_536, 300_000, 4 << 20]
            .into_iter()
            .enumerate()
        {
            let op = i as u64;
            let payload = pattern(len, op as u8);
            let mut dst = vec![0u8; len];
            let (s, r) = tokio::join!(
                a.send(tag(op, 0), payload.clone()),
                b.recv_into(tag(op, 0), &mut dst).unwrap()
            );
            s.unwrap();
            assert_eq!(r.unwrap(), len);
            assert!(dst == payload, "{len} bytes placed wrong");
            // Sent before the receive is posted (small ones read and held by the pump
            // meanwhile): copied from the frame.
            a.send(tag(op, 1), payload.clone()).await.unwrap();
            let mut held = vec![0u8; len];
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(b.recv_into(tag(op, 1), &mut held).unwrap().await, Ok(len));
            assert!(held == payload, "{len} held bytes landed wrong");
        }
        // Another length: the peer's length comes back and the destination is untouched.
        a.send(tag(50, 0), pattern(8192, 1)).await.unwrap();
        let mut short = vec![7u8; 4096];
        assert_eq!(b.recv_into(tag(50, 0), &mut short).unwrap().await, Ok(8192));
        assert!(short.iter().all(|&x| x == 7));
        // The stream goes on in order after placed payloads.
        transfer(&a, &b, 51, 100_000).await;
        let mut other = tag(52, 0);
        other.collective = chorus_protocol::Collective::Broadcast;
        a.send(other, pattern(8192, 2)).await.unwrap();
        let mut dst = vec![0u8; 8192];
        let err = b
            .recv_into(tag(52, 0), &mut dst)
            .unwrap()
            .await
            .unwrap_err();
        assert_eq!(
            err,
            LinkError::TagMismatch {
                expected: tag(52, 0),
                got: other
            }
        );
    });
}

/// A payload that stalls halfway past the spin window is handed back to the decoder and
/// finished by the pump: the destination still gets every byte, in order; a lying head
/// met while placing is a protocol violation.
#[test]
fn recv_into_survives_a_stalled_payload_and_refuses_a_bad_head() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let len = 64 << 10;
        let payload = pattern(len, 3);
        let mut frame = chunk_prefix(&mut raw, 1, len);
        frame.extend_from_slice(&payload);
        let writer = std::thread::spawn(move || {
            let cut = chorus_protocol::HEADER_LEN + ChunkHeader::LEN + len / 3;
            raw.write(&frame[..cut], WAIT);
            std::thread::sleep(Duration::from_millis(50));
            raw.write(&frame[cut..], WAIT);
            raw
        });
        let mut dst = vec![0u8; len];
        let got = tokio::time::timeout(WAIT, link.recv_into(tag(1, 0), &mut dst).unwrap())
            .await
            .unwrap();
        assert_eq!(got, Ok(len));
        assert!(dst == payload, "a stalled payload landed wrong");
        let mut raw = writer.join().unwrap();

        // A chunk whose payload length is no multiple of its dtype's size.
        let mut frame = chunk_prefix(&mut raw, 2, 4096 + 2);
        frame[chorus_protocol::HEADER_LEN + 1] = DType::F32.code();
        frame.extend_from_slice(&[0u8; 4096 + 2]);
        raw.write(&frame, WAIT);
        let mut dst = vec![0u8; 4096];
        let r = tokio::time::timeout(WAIT, link.recv_into(tag(2, 0), &mut dst).unwrap())
            .await
            .unwrap();
        assert!(
            matches!(r, Err(LinkError::Protocol { .. })),
            "misaligned chunk: {r:?}"
        );
    });
}

/// A tag for `i32` elements.
fn tag32(op: u64, step: u32) -> chorus_engine::link::Tag {
    let mut t = tag(op, step);
    t.dtype = DType::I32;
    t
}

/// `i32` values of a payload of `len` bytes (a whole number of them).
fn ints(len: usize, seed: i32) -> Vec<i32> {
    (0..len / 4)
        .map(|i| (i as i32).wrapping_mul(7919).wrapping_add(seed))
        .collect()
}

fn int_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A reducer for `i32` sums that checks what the link hands it: equal lengths, whole
/// elements, and (counted in `seen`) every byte of the destination exactly once. It reads
/// bytes, so it also proves nothing needs the source aligned.
struct SumI32 {
    seen: std::sync::atomic::AtomicUsize,
}

impl SumI32 {
    fn new() -> Self {
        Self {
            seen: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn reduce(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "reducer given unequal slices");
        assert_eq!(src.len() % 4, 0, "reducer given a split element");
        self.seen
            .fetch_add(src.len(), std::sync::atomic::Ordering::Relaxed);
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            let v = i32::from_le_bytes(d.try_into().unwrap())
                .wrapping_add(i32::from_le_bytes(s.try_into().unwrap()));
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// `recv_reduce_into` reduces every size into the destination, whether the spin reduces it
/// from the ring (through the bounce, payloads at odd ring offsets and split by the wrap
/// included) or the frame was held first; another length is reported, the destination
/// untouched.
#[test]
fn recv_reduce_into_sums_every_size_at_any_ring_offset() {
    shared(async {
        let cfg = TransportConfig {
            shm_ring: 64 << 10,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        for (i, len) in [4, 4092, 4096, 16_388, 65_536, 300_000, 4 << 20]
            .into_iter()
            .enumerate()
        {
            let op = i as u64;
            // Three bytes first: the payload after them starts at an odd ring offset.
            a.send(tag(1000 + op, 0), pattern(3, 1)).await.unwrap();
            assert!(b.recv(tag(1000 + op, 0)).await.unwrap() == pattern(3, 1));
            let (x, y) = (ints(len, op as i32), ints(len, 77));
            let want: Vec<i32> = x.iter().zip(&y).map(|(p, q)| p.wrapping_add(*q)).collect();
            let mut dst = int_bytes(&y);
            let sum = SumI32::new();
            let reduce = |d: &mut [u8], s: &[u8]| sum.reduce(d, s);
            let (s, r) = tokio::join!(
                a.send(tag32(op, 0), Bytes::from(int_bytes(&x))),
                b.recv_reduce_into(tag32(op, 0), &mut dst, &reduce).unwrap()
            );
            s.unwrap();
            assert_eq!(r.unwrap(), len);
            assert!(dst == int_bytes(&want), "{len} bytes reduced wrong");
            assert_eq!(sum.seen.into_inner(), len, "{len}: bytes reduced");
            // Sent before the receive is posted: reduced from the held frame.
            a.send(tag32(op, 1), Bytes::from(int_bytes(&x)))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            let mut held = int_bytes(&y);
            let sum = SumI32::new();
            let reduce = |d: &mut [u8], s: &[u8]| sum.reduce(d, s);
            let got = b
                .recv_reduce_into(tag32(op, 1), &mut held, &reduce)
                .unwrap()
                .await;
            assert_eq!(got, Ok(len));
            assert!(held == int_bytes(&want), "{len} held bytes reduced wrong");
        }
        // Another length: the peer's length comes back and the destination is untouched.
        a.send(tag32(50, 0), pattern(8192, 1)).await.unwrap();
        let mut short = vec![7u8; 4096];
        let reduce = |_: &mut [u8], _: &[u8]| panic!("a payload of another length reduced");
        let got = b
            .recv_reduce_into(tag32(50, 0), &mut short, &reduce)
            .unwrap();
        assert_eq!(got.await, Ok(8192));
        assert!(short.iter().all(|&x| x == 7));
        // The stream goes on in order afterwards.
        transfer(&a, &b, 51, 100_000).await;
    });
}

/// A payload that stalls past the spin window, mid-element, while it is reduced from the
/// ring is finished by the pump: every element is reduced exactly once. A lying head met
/// while reducing is a protocol violation, never a read past the ring.
#[test]
fn recv_reduce_into_survives_a_stalled_payload_and_refuses_a_bad_head() {
    shared(async {
        let cfg = TransportConfig {
            recv_spin: Duration::from_millis(30),
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let len = 64 << 10;
        let (x, y) = (ints(len, 5), ints(len, -9));
        let want: Vec<i32> = x.iter().zip(&y).map(|(p, q)| p.wrapping_add(*q)).collect();
        let mut frame = chunk_prefix(&mut raw, 1, len);
        frame[chorus_protocol::HEADER_LEN + 1] = DType::I32.code();
        frame.extend_from_slice(&int_bytes(&x));
        // Cut mid-element, written while the receive spins (its window is long here): it
        // reduces whole elements only, then gives up when the rest stalls past the window.
        let writer = std::thread::spawn(move || {
            let cut = chorus_protocol::HEADER_LEN + ChunkHeader::LEN + len / 3 + 1;
            std::thread::sleep(Duration::from_millis(2));
            raw.write(&frame[..cut], WAIT);
            std::thread::sleep(Duration::from_millis(150));
            raw.write(&frame[cut..], WAIT);
            raw
        });
        let mut dst = int_bytes(&y);
        let sum = SumI32::new();
        let reduce = |d: &mut [u8], s: &[u8]| sum.reduce(d, s);
        let got = tokio::time::timeout(
            WAIT,
            link.recv_reduce_into(tag32(1, 0), &mut dst, &reduce)
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(got, Ok(len));
        assert!(dst == int_bytes(&want), "a stalled payload reduced wrong");
        assert_eq!(sum.seen.into_inner(), len, "bytes reduced");
        let mut raw = writer.join().unwrap();

        // A chunk whose payload length is no multiple of its dtype's size.
        let mut frame = chunk_prefix(&mut raw, 2, 4096 + 2);
        frame[chorus_protocol::HEADER_LEN + 1] = DType::I32.code();
        frame.extend_from_slice(&[0u8; 4096 + 2]);
        raw.write(&frame, WAIT);
        let mut dst = vec![0u8; 4096];
        let reduce = |_: &mut [u8], _: &[u8]| panic!("a bad chunk reduced");
        let r = tokio::time::timeout(
            WAIT,
            link.recv_reduce_into(tag32(2, 0), &mut dst, &reduce)
                .unwrap(),
        )
        .await
        .unwrap();
        assert!(
            matches!(r, Err(LinkError::Protocol { .. })),
            "misaligned chunk: {r:?}"
        );

        // A head that claims more than any frame may hold.
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let mut frame = chunk_prefix(&mut raw, 1, 8192);
        frame[chorus_protocol::HEADER_LEN + 1] = DType::I32.code();
        frame[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        raw.write(&frame, WAIT);
        let mut dst = vec![0u8; 8192];
        let r = tokio::time::timeout(
            WAIT,
            link.recv_reduce_into(tag32(1, 0), &mut dst, &reduce)
                .unwrap(),
        )
        .await
        .unwrap();
        assert!(
            matches!(
                r,
                Err(LinkError::Protocol {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    ..
                })
            ),
            "lying length: {r:?}"
        );
        assert!(dst.iter().all(|&x| x == 0));
    });
}

#[test]
fn mismatched_collective_is_named() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        let mut other = tag(1, 0);
        other.collective = chorus_protocol::Collective::Broadcast;
        a.send(other, Bytes::from_static(b"x")).await.unwrap();
        let err = b.recv(tag(1, 0)).await.unwrap_err();
        assert_eq!(
            err,
            LinkError::TagMismatch {
                expected: tag(1, 0),
                got: other
            }
        );
    });
}

#[test]
fn cancel_is_local_immediate_and_the_peer_sees_the_code() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        cancel_is_local_and_immediate(&a, &b, "test abort", WAIT).await;
    });
}

/// A parked receive (no spin) is woken by the peer's data through the futex, and by the
/// peer's abort word at once.
#[test]
fn a_parked_receive_wakes_for_data_and_at_once_for_the_peers_abort() {
    shared(async {
        let cfg = TransportConfig {
            recv_spin: Duration::ZERO,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        let b = Arc::new(b);
        for op in 0..3 {
            let pending = tokio::spawn({
                let b = b.clone();
                async move { b.recv(tag(op, 0)).await }
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            a.send(tag(op, 0), pattern(100, op as u8)).await.unwrap();
            let got = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
            assert_eq!(got.unwrap(), pattern(100, op as u8));
        }
        let pending = tokio::spawn({
            let b = b.clone();
            async move { b.recv(tag(9, 0)).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        a.cancel(CancelReason::new(CloseCode::ABORTED, "abort word"));
        let got = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
        let woke = t0.elapsed();
        assert_eq!(
            got,
            Err(LinkError::PeerDeparted {
                code: CloseCode::ABORTED,
                detail: "abort word".into()
            })
        );
        // At once: well inside the pump's idle wait, far inside 250 ms on a loaded machine.
        assert!(woke < Duration::from_millis(250), "woke after {woke:?}");
    });
}

/// Seed 000 on shm: a forked child maps the segment and holds every descriptor; the
/// departure still reaches the peer at once, because nothing waits for the last
/// descriptor to close.
#[test]
fn a_departure_reaches_the_peer_despite_a_forked_holder() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        transfer(&a, &b, 1, 1000).await;
        let holder = fork_holder();
        let pending = b.recv(tag(2, 0));
        let t0 = Instant::now();
        a.cancel(CancelReason::new(CloseCode::ABORTED, "seed 000"));
        let r = tokio::time::timeout(WAIT, pending).await.unwrap();
        let seen = t0.elapsed();
        assert!(
            holder.alive(),
            "the forked holder must still hold the segment"
        );
        assert_eq!(
            r,
            Err(LinkError::PeerDeparted {
                code: CloseCode::ABORTED,
                detail: "seed 000".into()
            })
        );
        assert!(
            seen < Duration::from_millis(250),
            "peer saw it after {seen:?}"
        );
        drop(holder);
    });
}

/// The raw end sees exactly the spec's frames: the chunk, then the departure, then the
/// closed word.
#[test]
fn the_ring_carries_the_specs_frames_then_the_closed_word() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (a, mut raw) = link_and_raw(&t, &mut l).await;
        a.send(tag(1, 0), pattern(5000, 1)).await.unwrap();
        a.cancel(CancelReason::new(CloseCode::LEFT, "bye"));
        let observer = tokio::task::spawn_blocking(move || {
            let chunk = next_message(&mut raw, WAIT);
            let depart = next_message(&mut raw, WAIT);
            let deadline = Instant::now() + WAIT;
            while !raw.peer_closed() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            (chunk, depart, raw.peer_closed())
        });
        let (chunk, depart, closed) = observer.await.unwrap();
        match chunk {
            Some(Message::Chunk(c)) => assert!(c.payload == pattern(5000, 1)),
            other => panic!("expected the chunk, got {other:?}"),
        }
        assert_eq!(
            depart,
            Some(Message::Depart(Depart::new(CloseCode::LEFT, "bye")))
        );
        assert!(closed, "the closed word follows the departure");
    });
}

/// Departure versus crash: a peer that closes its side without a departure is a lost
/// connection; with one, a departure with its code.
#[test]
fn a_closed_word_without_a_departure_is_a_lost_connection() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let pending = link.recv(tag(1, 0));
        raw.close();
        let r = tokio::time::timeout(WAIT, pending).await.unwrap();
        assert!(matches!(r, Err(LinkError::ConnectionLost { .. })), "{r:?}");
    });
}

/// A connection dropped without making a link — by the acceptor (refused by its runtime,
/// say), or by the connector (its caller stopped waiting: a build of an epoch's links that
/// failed meanwhile) — ends the peer's link at once, not at some heartbeat deadline, and
/// with a departure coded `deadline` (SPEC 6): a live peer's refusal. A bare closed word
/// would read as a lost peer, and the peer's runtime would count this live member out.
#[test]
fn a_connection_dropped_unused_departs_with_deadline() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let name = l.name().to_owned();
        for connector_drops in [false, true] {
            let (c, a) = tokio::join!(
                t.connect(&name, Role::Data, route(1), Rank(0)),
                l.accept(WAIT)
            );
            let (kept, dropped) = if connector_drops {
                (a.unwrap(), c.unwrap())
            } else {
                (c.unwrap(), a.unwrap())
            };
            let link = kept.into_link().unwrap();
            let what = format!("connector drops: {connector_drops}");
            a_dropped_end_departs_with_deadline(&link, dropped, Duration::from_secs(2), &what)
                .await;
        }
    });
}

/// Hostile input: a chunk claiming 4 GiB, a tail more than a ring ahead, a garbage
/// header. Each closes the link with a protocol violation and a departure; none reads
/// outside the segment or allocates what the frame claims.
#[test]
fn bad_bytes_and_bad_indices_are_violations_never_reads_out_of_bounds() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;

        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let pending = link.recv(tag(1, 0));
        let mut frame = chunk_prefix(&mut raw, 1, 0);
        frame[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        raw.write(&frame, WAIT);
        let r = tokio::time::timeout(WAIT, pending).await.unwrap();
        assert!(protocol_violation(&r), "lying length: {r:?}");
        let seen = tokio::task::spawn_blocking(move || next_message(&mut raw, WAIT))
            .await
            .unwrap();
        assert!(
            matches!(
                seen,
                Some(Message::Depart(Depart {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    ..
                }))
            ),
            "{seen:?}"
        );

        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let pending = link.recv(tag(1, 0));
        let past = raw.tail() + (t.config().shm_ring as u64) * 4 + 1;
        raw.set_tail(past);
        let r = tokio::time::timeout(WAIT, pending).await.unwrap();
        assert!(protocol_violation(&r), "tail past the ring: {r:?}");
        let _ = raw;

        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let pending = link.recv(tag(1, 0));
        raw.write(&[0xee; 64], WAIT);
        let r = tokio::time::timeout(WAIT, pending).await.unwrap();
        assert!(
            matches!(r, Err(LinkError::Protocol { .. })),
            "garbage header: {r:?}"
        );
    });
}

/// Bounded memory whatever the peer sends: payloads nobody asked for past the held limit
/// fail the link with `Overflow`, and the sender sees the violation's departure.
#[test]
fn unclaimed_data_past_the_bound_overflows() {
    shared(async {
        let cfg = TransportConfig {
            held_limit: 1 << 20,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (a, b) = pair(&t, &mut l).await;
        for step in 0..3 {
            let _ = a.send(tag(1, step), pattern(600_000, 0)).await;
        }
        let r = tokio::time::timeout(WAIT, b.recv(tag(2, 0))).await.unwrap();
        assert!(
            matches!(
                r,
                Err(LinkError::Overflow {
                    limit: 1_048_576,
                    ..
                })
            ),
            "{r:?}"
        );
        let r = tokio::time::timeout(WAIT, a.recv(tag(3, 0))).await.unwrap();
        assert!(
            matches!(
                r,
                Err(LinkError::PeerDeparted {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    ..
                })
            ),
            "{r:?}"
        );
    });
}

/// A stranger without the job secret is refused in the handshake and never gets a
/// segment; the listener goes on serving good peers.
#[test]
fn a_stranger_is_refused_and_good_peers_still_link() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (stranger, _) = transport(None);
        let r = stranger
            .connect(l.name(), Role::Data, route(1), Rank(0))
            .await;
        assert!(r.is_err(), "a wrong secret must not link");
        let (a, b) = pair(&t, &mut l).await;
        transfer(&a, &b, 1, 10).await;
    });
}

/// A SIGKILLed peer process is seen through its pidfd: a pending receive fails with a
/// lost connection, and after the job nothing is left behind: no file in /dev/shm, no
/// descriptor in this process beyond those it had before.
#[test]
fn a_killed_peer_fails_pending_ops_and_leaves_nothing_behind() {
    alone(async {
        let shm_before = dev_shm();
        let fds_before = open_fds();
        {
            let (t, secret) = transport(None);
            let mut l = listener(&t, 0).await;
            let mut child = spawn_peer(l.name(), &secret);
            let link = l.accept(WAIT).await.unwrap().into_link().unwrap();
            transfer_from_child(&link).await;
            let pending = link.recv(tag(2, 0));
            let t0 = Instant::now();
            // SAFETY: killing our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let r = tokio::time::timeout(WAIT, pending)
                .await
                .expect("pending recv never failed");
            assert!(matches!(r, Err(LinkError::ConnectionLost { .. })), "{r:?}");
            // The pump looks at the pidfd every 20 ms; the margin is for a loaded machine.
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            reap(&mut child);
            drop(link);
            drop(l);
            drop(t);
        }
        // The pump threads let go of their segments within their idle wait.
        let deadline = Instant::now() + WAIT;
        while open_fds() > fds_before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            open_fds() <= fds_before,
            "descriptors leaked: {} before, {} after: {:?}",
            fds_before,
            open_fds(),
            fd_targets()
        );
        assert_eq!(dev_shm(), shm_before, "a file appeared in /dev/shm");
    });
}

async fn transfer_from_child(link: &ShmLink) {
    let got = tokio::time::timeout(WAIT, link.recv(tag(1, 0)))
        .await
        .unwrap()
        .unwrap();
    assert!(got == pattern(3000, 7));
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What each open descriptor is, for a failure message.
fn fd_targets() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        .collect()
}

fn dev_shm() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Starts this test binary again as a peer process that links to `name`, sends one
/// payload and sleeps.
fn spawn_peer(name: &str, secret: &JobSecret) -> std::process::Child {
    let hex: String = secret
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::process::Command::new(std::env::current_exe().unwrap())
        .env("CHORUS_TEST_SECRET", hex)
        .env("CHORUS_TEST_SHM_PEER", name)
        .args([
            "--exact",
            "peer_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The peer process of `a_killed_peer_*` (a no-op in a normal test run).
#[test]
fn peer_process_entry() {
    let Ok(name) = std::env::var("CHORUS_TEST_SHM_PEER") else {
        return;
    };
    let hex = std::env::var("CHORUS_TEST_SECRET").unwrap_or_default();
    let mut secret = [0u8; 32];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    }
    let t = ShmTransport::new(config(), JobSecret::new(secret)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = t
            .connect(&name, Role::Data, route(1), Rank(0))
            .await
            .unwrap();
        let link = conn.into_link().unwrap();
        link.send(tag(1, 0), pattern(3000, 7)).await.unwrap();
        // Hold the link until SIGKILLed (bounded, in case the parent died first).
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(link);
    });
}

// ---------------------------------------------------------------------------------------
// The mailboxes (SPEC.md, "Mailboxes"): small payloads beside the ring.

/// A slot's fields for `tag` and `payload`, as a well-behaved writer puts them.
fn slot_for(t: chorus_engine::link::Tag, payload: &[u8]) -> RawSlot {
    RawSlot {
        len: payload.len() as u32,
        op: t.op.0,
        step: t.step,
        codes: u32::from(t.collective.code()) | u32::from(t.dtype.code()) << 8,
        offset: t.offset,
        payload: payload.to_vec(),
    }
}

/// A payload of at most a slot (bytes or a token) goes into the slot its tag picks, written
/// as the spec's golden line, and not into the ring; the raw end takes it and the slot is
/// free again.
#[test]
fn a_small_payload_travels_in_the_mailbox_as_the_spec_writes_it() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let t5 = chorus_engine::link::Tag {
            collective: chorus_protocol::Collective::AllReduce,
            op: OpSeq(5),
            step: 0,
            offset: 0,
            dtype: DType::F64,
        };
        let value = 1.5f64.to_le_bytes().to_vec();
        link.send_bytes_now(t5, &value).unwrap().unwrap();
        assert_eq!(
            &raw.peer_slot_line(5)[..],
            &vector("shm-slot")[..],
            "update SPEC.md"
        );
        assert!(
            raw.read(Duration::from_millis(20)).is_empty(),
            "nothing in the ring"
        );
        assert_eq!(raw.take_slot(5), Some(slot_for(t5, &value)));
        assert_eq!(raw.take_slot(5), None, "taken once");
        // The slot is free again: the next payload through it is in the mailbox too.
        link.send_bytes_now(tag(13, 0), b"again").unwrap().unwrap();
        assert_eq!(raw.take_slot(5), Some(slot_for(tag(13, 0), b"again")));
        // As long as a slot takes (past the first line): the mailbox, every byte.
        let full = pattern(SLOT_BYTES, 3);
        link.send_bytes_now(tag(14, 0), &full).unwrap().unwrap();
        assert_eq!(raw.take_slot(6), Some(slot_for(tag(14, 0), &full)));
        // Longer than a slot: the ring.
        link.send_bytes_now(tag(6, 0), SMALL).unwrap().unwrap();
        assert_eq!(raw.take_slot(6), None);
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(6), Bytes::from_static(SMALL))
        );
        // A token handed over as a payload (a barrier's, a credit): the mailbox too.
        link.send(tag(7, 0), Bytes::new()).await.unwrap();
        assert_eq!(raw.take_slot(7), Some(slot_for(tag(7, 0), b"")));
        assert!(
            raw.read(Duration::from_millis(20)).is_empty(),
            "nothing in the ring"
        );
    });
}

/// A slot the peer has not emptied yet is never overwritten: the payload goes through the
/// ring, and both arrive.
#[test]
fn a_full_slot_sends_through_the_ring() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        link.send_bytes_now(tag(1, 0), b"first").unwrap().unwrap();
        // Op 9 picks slot 1 too, still full.
        link.send_bytes_now(tag(9, 0), b"second").unwrap().unwrap();
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(9), Bytes::from_static(b"second"))
        );
        assert_eq!(raw.take_slot(1), Some(slot_for(tag(1, 0), b"first")));
        // Reading the peer's counts for one slot refreshes them all, each as it stands:
        // slot 2, still full, goes on sending through the ring; slot 1, taken, is free.
        link.send_bytes_now(tag(2, 0), b"third").unwrap().unwrap();
        link.send_bytes_now(tag(17, 0), b"fourth").unwrap().unwrap();
        assert_eq!(raw.take_slot(1), Some(slot_for(tag(17, 0), b"fourth")));
        link.send_bytes_now(tag(10, 0), b"fifth").unwrap().unwrap();
        assert_eq!(
            chunk(next_message(&mut raw, WAIT)),
            (OpSeq(10), Bytes::from_static(b"fifth"))
        );
        assert_eq!(raw.take_slot(2), Some(slot_for(tag(2, 0), b"third")));
    });
}

/// The link takes a mailbox payload whether its receive spins, is parked (the pump, woken
/// through the bell, delivers it), or comes later (held); `recv_into` and
/// `recv_reduce_into` take it too, and the raw end sees every slot emptied.
#[test]
fn the_link_receives_from_the_mailbox() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        // Held: written before anyone receives.
        raw.write_slot(1, &slot_for(tag(1, 0), b"held"), 1);
        // Parked: the receive is pending long past any spin before the payload comes.
        let parked = link.recv(tag(2, 0));
        let writer = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(50));
            raw.write_slot(2, &slot_for(tag(2, 0), b"parked"), 1);
            raw
        });
        let got = tokio::time::timeout(WAIT, parked).await.unwrap().unwrap();
        assert_eq!(&got[..], b"parked");
        let mut raw = writer.await.unwrap();
        assert_eq!(&link.recv(tag(1, 0)).await.unwrap()[..], b"held");
        // Into a destination, and reduced into one (a whole slot's worth).
        raw.write_slot(3, &slot_for(tag32(3, 0), &int_bytes(&[5, 6])), 1);
        let mut dst = [0u8; 8];
        let n = link
            .recv_into(tag32(3, 0), &mut dst)
            .unwrap()
            .await
            .unwrap();
        assert_eq!((n, &dst[..]), (8, &int_bytes(&[5, 6])[..]));
        let (mine, theirs) = (ints(SLOT_BYTES, 1), ints(SLOT_BYTES, 10));
        raw.write_slot(4, &slot_for(tag32(4, 0), &int_bytes(&theirs)), 1);
        let mut acc = int_bytes(&mine);
        let add = |d: &mut [u8], s: &[u8]| {
            for (d, s) in d.chunks_exact_mut(4).zip(s.chunks_exact(4)) {
                let v = i32::from_le_bytes(d.try_into().unwrap())
                    .wrapping_add(i32::from_le_bytes(s.try_into().unwrap()));
                d.copy_from_slice(&v.to_le_bytes());
            }
        };
        let n = link
            .recv_reduce_into(tag32(4, 0), &mut acc, &add)
            .unwrap()
            .await
            .unwrap();
        let sum: Vec<i32> = mine
            .iter()
            .zip(&theirs)
            .map(|(a, b)| a.wrapping_add(*b))
            .collect();
        assert_eq!((n, acc), (SLOT_BYTES, int_bytes(&sum)));
        for k in 1..=4 {
            assert_eq!(raw.peer_took(k), 1, "slot {k} taken");
        }
    });
}

/// Order where it matters: a payload posted before a departure is delivered, and only
/// the receives after it fail with the departure.
#[test]
fn a_payload_posted_before_a_departure_is_delivered() {
    shared(async {
        let (t, _) = transport(None);
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        raw.write_slot(4, &slot_for(tag(4, 0), b"last words"), 1);
        let mut frame = BytesMut::new();
        let me = raw.me;
        raw.encoder
            .encode(
                &me,
                &Message::Depart(Depart::new(CloseCode::LEFT, "done")),
                &mut frame,
            )
            .unwrap();
        assert_eq!(raw.write(&frame, WAIT), frame.len());
        raw.close();
        // Let the pump read the departure before anyone receives.
        let deadline = Instant::now() + WAIT;
        while link.failure().is_none() {
            assert!(Instant::now() < deadline, "the departure went unread");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(&link.recv(tag(4, 0)).await.unwrap()[..], b"last words");
        let after = link.recv(tag(5, 0)).await;
        assert!(
            matches!(
                after,
                Err(LinkError::PeerDeparted {
                    code: CloseCode::LEFT,
                    ..
                })
            ),
            "{after:?}"
        );
    });
}

/// Hostile slots: a length past the slot, codes nobody knows. Each is a protocol violation
/// that fails the link and closes it with a departure; nothing outside the slot is read.
#[test]
fn a_bad_slot_is_a_protocol_violation() {
    shared(async {
        for (what, slot) in [
            (
                "long",
                RawSlot {
                    len: SLOT_BYTES as u32 + 1,
                    ..slot_for(tag(1, 0), &[7; SLOT_BYTES])
                },
            ),
            (
                "huge",
                RawSlot {
                    len: u32::MAX,
                    ..slot_for(tag(1, 0), b"x")
                },
            ),
            (
                "collective",
                RawSlot {
                    codes: 0xff | 4 << 8,
                    ..slot_for(tag(1, 0), b"x")
                },
            ),
            (
                "dtype",
                RawSlot {
                    codes: 1 | 0xee << 8,
                    ..slot_for(tag(1, 0), b"x")
                },
            ),
            (
                "high bits",
                RawSlot {
                    codes: 1 << 24 | 1,
                    ..slot_for(tag(1, 0), b"x")
                },
            ),
        ] {
            let (t, _) = transport(None);
            let mut l = listener(&t, 0).await;
            let (link, mut raw) = link_and_raw(&t, &mut l).await;
            raw.write_slot(1, &slot, 1);
            let r = tokio::time::timeout(WAIT, link.recv(tag(1, 0)))
                .await
                .unwrap();
            match &r {
                Err(LinkError::Protocol { code, detail }) => {
                    assert_eq!(*code, CloseCode::PROTOCOL_VIOLATION, "{what}");
                    assert!(detail.contains("mailbox"), "{what}: {detail}");
                }
                other => panic!("{what}: expected a protocol violation, got {other:?}"),
            }
            let depart = tokio::task::spawn_blocking(move || next_message(&mut raw, WAIT))
                .await
                .unwrap();
            assert!(
                matches!(depart, Some(Message::Depart(ref d)) if d.code == CloseCode::PROTOCOL_VIOLATION),
                "{what}: {depart:?}"
            );
        }
    });
}

/// A peer that bumps a slot's count without end makes the link hold what it delivers,
/// within the held limit: past it the link fails with `Overflow`, memory bounded.
#[test]
fn a_slot_bumped_forever_is_bounded_by_the_held_limit() {
    shared(async {
        let cfg = TransportConfig {
            held_limit: 4096,
            ..config()
        };
        let (t, _) = transport(Some(cfg));
        let mut l = listener(&t, 0).await;
        let (link, mut raw) = link_and_raw(&t, &mut l).await;
        let deadline = Instant::now() + WAIT;
        let mut put = 0u32;
        while link.failure().is_none() {
            assert!(
                Instant::now() < deadline,
                "{put} bumps and the link still holds them"
            );
            put += 1;
            raw.write_slot(0, &slot_for(tag(1000 + u64::from(put), 0), &[9; 32]), put);
            // The next bump once the pump took this one.
            while raw.peer_took(0) != put && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        assert!(
            matches!(
                link.failure(),
                Some(LinkError::Overflow { limit: 4096, .. })
            ),
            "{:?}",
            link.failure()
        );
        assert!(put < 100, "{put} payloads held under a 4 KiB limit");
    });
}
