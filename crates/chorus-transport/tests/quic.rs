//! QUIC: the data link, the control channel, seed 000, a killed peer, and bad peers.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_engine::link::{CancelReason, Link, LinkError};
use chorus_protocol::message::{Heartbeat, Message, Notice, Reject, Role};
use chorus_protocol::{
    ChannelBinding, CloseCode, Connector, ConnectorConfig, Decoder, Frame, HEADER_LEN, Limits,
    Rank, Side,
};
use chorus_transport::{
    Identity, JobSecret, Liveness, QuicEndpoint, QuicLink, TransportConfig, TransportError,
    admit_all, fresh,
};
use common::*;

const WAIT: Duration = Duration::from_secs(10);

fn liveness() -> Liveness {
    Liveness {
        heartbeat_interval: Duration::from_millis(100),
        deadline: Duration::from_millis(400),
    }
}

fn config() -> TransportConfig {
    TransportConfig {
        handshake_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(5),
        ..TransportConfig::default()
    }
}

struct Member {
    ep: QuicEndpoint,
    id: Identity,
}

fn member(rank: u32, secret: &JobSecret) -> Member {
    member_with(rank, secret, liveness())
}

fn member_with(rank: u32, secret: &JobSecret, liveness: Liveness) -> Member {
    let id = Identity::generate().unwrap();
    let ep = QuicEndpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        &id,
        secret.clone(),
        config(),
        liveness,
        admit_all(Rank(rank)),
    )
    .unwrap();
    Member { ep, id }
}

/// (rank 1's link to rank 0, rank 0's link to rank 1)
async fn pair(a: &Member, b: &Member) -> (QuicLink, QuicLink) {
    let addr = b.ep.local_addr().unwrap();
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Data, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    (
        c.unwrap().into_link().unwrap(),
        s.unwrap().into_link().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_round_trips_intact_over_a_pinned_connection() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let (x, y) = pair(&a, &b).await;
    for (i, len) in [0usize, 1, 1000, 1 << 20, 16 << 20].into_iter().enumerate() {
        let p = pattern(len, i as u8);
        let (s, r) = tokio::join!(
            x.send(tag(i as u64, 0), p.clone()),
            y.recv(tag(i as u64, 0))
        );
        s.unwrap();
        assert!(r.unwrap() == p);
        let (s, r) = tokio::join!(
            y.send(tag(50 + i as u64, 0), p.clone()),
            x.recv(tag(50 + i as u64, 0))
        );
        s.unwrap();
        assert!(r.unwrap() == p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_fingerprint_or_secret_is_refused_and_good_peers_still_connect() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let addr = b.ep.local_addr().unwrap();
    let stranger = Identity::generate().unwrap();
    let err =
        a.ep.connect(addr, stranger.fingerprint(), Role::Data, route(1), Rank(0))
            .await
            .unwrap_err();
    assert!(matches!(err, TransportError::Quic(_)), "{err}");
    let impostor = member(1, &fresh::job_secret());
    let err = impostor
        .ep
        .connect(addr, b.id.fingerprint(), Role::Data, route(1), Rank(0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), CloseCode::AUTH_FAILED, "{err}");
    let (x, y) = pair(&a, &b).await;
    let p = pattern(1 << 20, 9);
    x.send(tag(1, 0), p.clone()).await.unwrap();
    assert!(y.recv(tag(1, 0)).await.unwrap() == p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_with_deadline_at_the_handshake_deadline() {
    let secret = fresh::job_secret();
    let b = member(0, &secret);
    let addr = b.ep.local_addr().unwrap();
    let conn = silent_client(addr).await;
    let t0 = Instant::now();
    let reason = tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
    let waited = t0.elapsed();
    match reason {
        quinn::ConnectionError::ApplicationClosed(ac) => {
            assert_eq!(ac.error_code.into_inner(), u64::from(CloseCode::DEADLINE.0))
        }
        other => panic!("expected an application close, got {other}"),
    }
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // The endpoint still serves legitimate members.
    let a = member(1, &secret);
    let (x, y) = pair(&a, &b).await;
    x.send(tag(1, 0), pattern(1000, 1)).await.unwrap();
    assert!(y.recv(tag(1, 0)).await.unwrap() == pattern(1000, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_channel_carries_messages_and_closes_with_codes() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let addr = b.ep.local_addr().unwrap();
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Member, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    let (x, y) = (c.unwrap().into_control(), s.unwrap());
    assert_eq!(y.role(), Role::Member);
    let y = y.into_control();
    for seq in 0..100 {
        x.send(Message::Heartbeat(Heartbeat { seq, digest: 0 }))
            .await
            .unwrap();
    }
    for seq in 0..100 {
        let f = y.recv().await.unwrap();
        assert_eq!(f.message, Message::Heartbeat(Heartbeat { seq, digest: 0 }));
        assert_eq!(f.header.sender, Rank(1));
    }
    y.send(Message::Heartbeat(Heartbeat { seq: 7, digest: 0 }))
        .await
        .unwrap();
    assert_eq!(
        x.recv().await.unwrap().message,
        Message::Heartbeat(Heartbeat { seq: 7, digest: 0 })
    );
    x.depart(CloseCode::LEFT, "sigterm").await;
    let r = tokio::time::timeout(WAIT, y.recv()).await.unwrap();
    assert_eq!(
        r,
        Err(LinkError::PeerDeparted {
            code: CloseCode::LEFT,
            detail: "sigterm".into()
        })
    );
    // A bare close carries the code as the QUIC application code.
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Member, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    let (x, y) = (c.unwrap().into_control(), s.unwrap().into_control());
    x.close(CloseCode::EVICTED, "declared dead");
    let r = tokio::time::timeout(WAIT, y.recv()).await.unwrap();
    assert_eq!(
        r,
        Err(LinkError::PeerDeparted {
            code: CloseCode::EVICTED,
            detail: "declared dead".into()
        })
    );
}

/// A connection dropped without a close — a connect whose caller gave up (the connect
/// completes on the progress thread anyway), a control channel let go — must not read as
/// a departure on the peer, which may have admitted it already: quinn's implicit close
/// carries code 0, chorus's `normal`. It ends with `deadline`, a live peer's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_unclosed_is_not_a_departure() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let addr = b.ep.local_addr().unwrap();
    let gone = |r: &Result<Frame, LinkError>| matches!(r, Err(LinkError::PeerDeparted { code, .. }) if code.is_departure());
    // Dropped before it became a channel.
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Member, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    drop(c.unwrap());
    let y = s.unwrap().into_control();
    let r = tokio::time::timeout(WAIT, y.recv()).await.unwrap();
    assert!(
        !gone(&r),
        "an unused connection's drop read as a departure: {r:?}"
    );
    assert!(
        matches!(&r, Err(LinkError::PeerDeparted { code, .. }) if *code == CloseCode::DEADLINE),
        "{r:?}"
    );
    // Dropped as a channel, without a close.
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Member, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    let (x, y) = (c.unwrap().into_control(), s.unwrap().into_control());
    drop(x);
    let r = tokio::time::timeout(WAIT, y.recv()).await.unwrap();
    assert!(!gone(&r), "a dropped channel read as a departure: {r:?}");
}

/// A connect whose caller stops waiting ends there: it does not go on resending its
/// handshake into a black hole until `connect_timeout`, and a caller may start a fresh one
/// (what a control stream opener does when a cut may have backed the old one off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_given_up_stops_sending() {
    // An idle timeout (deadline + interval) long past the resends counted below.
    let liveness = Liveness {
        heartbeat_interval: Duration::from_millis(100),
        deadline: Duration::from_secs(3),
    };
    let ep = QuicEndpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        &Identity::generate().unwrap(),
        fresh::job_secret(),
        config(),
        liveness,
        admit_all(Rank(1)),
    )
    .unwrap();
    let hole = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = hole.local_addr().unwrap();
    let nobody = Identity::generate().unwrap().fingerprint();
    let attempt = ep.connect(addr, nobody, Role::Member, route(1), Rank(0));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), attempt)
            .await
            .is_err(),
        "nobody answers a black hole"
    );
    // What the handshake sent, and its close, arrive first.
    let before = datagrams(&hole, Duration::from_millis(150)).await;
    assert!(before >= 1, "the handshake started");
    // Left running, it would resend at every probe timeout: three times the initial RTT
    // (a quarter of the 100 ms interval), doubling, so about 0.5 s and 1.1 s in.
    let after = datagrams(&hole, Duration::from_millis(1200)).await;
    assert_eq!(after, 0, "a given-up connect kept sending");
}

/// A connect opened into a cut is heard soon after the heal: every heartbeat interval it
/// starts a fresh handshake, whose first resend comes after the short initial timeout,
/// instead of waiting out the backed-off resends of the first one. One connection comes
/// of it, whichever attempt won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_into_a_cut_is_answered_soon_after_the_heal() {
    // An idle timeout (deadline + interval) long past the cut, so no attempt expires.
    let liveness = Liveness {
        heartbeat_interval: Duration::from_millis(100),
        deadline: Duration::from_secs(4),
    };
    let secret = fresh::job_secret();
    let (a, b) = (
        member_with(1, &secret, liveness),
        member_with(0, &secret, liveness),
    );
    let relay = Relay::start(b.ep.local_addr().unwrap()).await;
    let started = Instant::now();
    let connect = a.ep.connect(
        relay.addr,
        b.id.fingerprint(),
        Role::Data,
        route(1),
        Rank(0),
    );
    let accept = b.ep.accept(WAIT);
    const CUT: Duration = Duration::from_millis(1500);
    let heal = async {
        tokio::time::sleep(CUT).await;
        let sent = relay.dropped();
        relay.heal();
        (Instant::now(), sent)
    };
    let (c, s, (healed, dropped)) = tokio::join!(connect, accept, heal);
    let answered = healed.elapsed();
    let (x, y) = (
        c.unwrap().into_link().unwrap(),
        s.unwrap().into_link().unwrap(),
    );
    // One handshake alone resends at 3 × the initial RTT (25 ms), doubling: 75, 225, 525,
    // 1125 and 2325 ms in, so its answer would come 825 ms after this heal.
    assert!(
        answered < Duration::from_millis(500),
        "answered {answered:?} after the heal ({:?} after the connect began)",
        started.elapsed()
    );
    // About one fresh attempt per interval during the cut (a lone one sends five).
    assert!(
        dropped >= 10,
        "only {dropped} datagrams were sent into the cut"
    );
    // The link works, and no second connection reached the acceptor.
    let p = pattern(1000, 7);
    let (sent, got) = tokio::join!(x.send(tag(1, 0), p.clone()), y.recv(tag(1, 0)));
    sent.unwrap();
    assert!(got.unwrap() == p);
    assert!(b.ep.accept(Duration::from_millis(300)).await.is_err());
}

/// A UDP relay in front of one endpoint that drops everything, both ways, until healed.
struct Relay {
    addr: SocketAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let back = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(true));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (c, d) = (cut.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
            let mut client = None;
            loop {
                tokio::select! {
                    r = front.recv_from(&mut a) => {
                        let Ok((n, from)) = r else { return };
                        client = Some(from);
                        if c.load(Ordering::SeqCst) {
                            d.fetch_add(1, Ordering::SeqCst);
                        } else {
                            let _ = back.send_to(&a[..n], to).await;
                        }
                    }
                    r = back.recv_from(&mut b) => {
                        let Ok((n, _)) = r else { return };
                        if let (false, Some(client)) = (c.load(Ordering::SeqCst), client) {
                            let _ = front.send_to(&b[..n], client).await;
                        }
                    }
                }
            }
        });
        Relay {
            addr,
            cut,
            dropped,
            task,
        }
    }

    fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Datagrams from the client dropped so far.
    fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many datagrams reach `socket` within `within`.
async fn datagrams(socket: &tokio::net::UdpSocket, within: Duration) -> usize {
    let until = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while let Ok(Ok(_)) = tokio::time::timeout_at(until, socket.recv_from(&mut buf)).await {
        n += 1;
    }
    n
}

/// Seed 000 over QUIC: a forked child holds the UDP socket; the cancel's CONNECTION_CLOSE
/// reaches the peer anyway (UDP has no "last close" to wait for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_000_departure_reaches_the_peer_despite_a_forked_holder() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let (x, y) = pair(&a, &b).await;
    x.send(tag(1, 0), pattern(1000, 1)).await.unwrap();
    assert!(y.recv(tag(1, 0)).await.unwrap() == pattern(1000, 1));
    let pending = tokio::spawn(async move {
        let r = y.recv(tag(2, 0)).await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let holder = fork_holder();
    let t0 = Instant::now();
    x.cancel(CancelReason::new(CloseCode::ABORTED, "seed 000"));
    let (r, at) = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    let observed = at.duration_since(t0);
    assert!(holder.alive());
    assert_eq!(
        r,
        Err(LinkError::PeerDeparted {
            code: CloseCode::ABORTED,
            detail: "seed 000".into()
        })
    );
    assert!(
        // The feature's bound is 50 ms; 5x that absorbs a loaded CI machine.
        observed < Duration::from_millis(250),
        "peer saw the departure after {observed:?}"
    );
    drop(holder);
}

/// A SIGKILLed peer sends nothing (a vanished process is the QUIC analogue of the plain
/// close: no CONNECTION_CLOSE), so the pending op fails only at the idle timeout derived
/// from liveness — with a connection-lost error, not a departure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_peer_fails_pending_ops_with_connection_lost_at_the_idle_timeout() {
    let secret = fresh::job_secret();
    let b = member(0, &secret);
    let addr = b.ep.local_addr().unwrap();
    let mut child = spawn_peer(addr, &secret, &b.id);
    let link = b.ep.accept(WAIT).await.unwrap().into_link().unwrap();
    let pending = link.recv(tag(1, 0));
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let t0 = Instant::now();
    let r = tokio::time::timeout(WAIT, pending)
        .await
        .expect("pending recv never failed");
    let waited = t0.elapsed();
    assert!(matches!(r, Err(LinkError::ConnectionLost { .. })), "{r:?}");
    let idle = liveness().idle_timeout();
    assert!(
        waited >= idle / 2,
        "failed after {waited:?}: before the idle timeout {idle:?}?"
    );
    assert!(waited < idle + Duration::from_secs(3), "{waited:?}");
    reap(&mut child);
}

fn spawn_peer(addr: SocketAddr, secret: &JobSecret, server: &Identity) -> std::process::Child {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CHORUS_TEST_PEER", addr.to_string())
        .env("CHORUS_TEST_SECRET", hex(&secret.to_bytes()))
        .env("CHORUS_TEST_PIN", hex(&server.fingerprint().0))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn unhex<const N: usize>(var: &str) -> [u8; N] {
    let hex = std::env::var(var).unwrap_or_default();
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    }
    out
}

/// The peer process of the SIGKILL test (a no-op in a normal run).
#[test]
fn peer_process_entry() {
    let Ok(addr) = std::env::var("CHORUS_TEST_PEER") else {
        return;
    };
    let secret = JobSecret::new(unhex("CHORUS_TEST_SECRET"));
    let pin = chorus_transport::Fingerprint(unhex("CHORUS_TEST_PIN"));
    let me = member(1, &secret);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = me
            .ep
            .connect(addr.parse().unwrap(), pin, Role::Data, route(1), Rank(0))
            .await
            .unwrap();
        let link = conn.into_link().unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(link);
    });
}

/// A QUIC client that completes TLS (trusting anything) and then never speaks.
async fn silent_client(addr: SocketAddr) -> quinn::Connection {
    #[derive(Debug)]
    struct TrustAll(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for TrustAll {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(TrustAll(provider)))
        .with_no_client_auth();
    crypto.alpn_protocols = vec![b"chorus/1".to_vec()];
    let client = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client);
    ep.connect(addr, "chorus").unwrap().await.unwrap()
}

/// The TLS exporter label of the handshake's channel binding (SPEC.md, "Handshake").
const BINDING_LABEL: &[u8] = b"EXPORTER-chorus-hello";

fn tls_binding(conn: &quinn::Connection) -> ChannelBinding {
    let mut b = [0u8; 32];
    conn.export_keying_material(&mut b, BINDING_LABEL, b"")
        .unwrap();
    ChannelBinding::Tls(b)
}

/// A connector's `Hello` bytes for `secret` and `binding`, and the connector to check the
/// answer with.
fn hello(secret: &JobSecret, role: Role, binding: ChannelBinding) -> (Vec<u8>, Connector) {
    let mut config = ConnectorConfig::new(
        secret.clone(),
        route(1),
        role,
        fresh::nonce(),
        Instant::now() + WAIT,
    );
    config.binding = binding;
    config.peer = Some(Rank(0));
    let mut out = BytesMut::new();
    let connector = Connector::new(config, &mut out).unwrap();
    (out.to_vec(), connector)
}

/// Reads frames off a raw QUIC stream with a plain protocol decoder.
async fn next_frame(recv: &mut quinn::RecvStream, decoder: &mut Decoder) -> Option<Frame> {
    loop {
        if let Some(f) = decoder.next().unwrap() {
            return Some(f);
        }
        match tokio::time::timeout(WAIT, recv.read_chunk(1 << 16, true)).await {
            Ok(Ok(Some(c))) => decoder.push(&c.bytes),
            _ => return None,
        }
    }
}

/// The application code a closed connection carries.
async fn close_code(conn: &quinn::Connection) -> u64 {
    match tokio::time::timeout(WAIT, conn.closed()).await.unwrap() {
        quinn::ConnectionError::ApplicationClosed(ac) => ac.error_code.into_inner(),
        other => panic!("expected an application close, got {other}"),
    }
}

/// Each bad first stream gets a `Reject` with the spec's code, then `CONNECTION_CLOSE`
/// with the same code; meanwhile a legitimate pair transfers intact. Among them: a `Hello`
/// with the right secret but no channel binding, and a `Hello` recorded on another TLS
/// session and replayed (its binding is that session's), both `AUTH_FAILED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_first_streams_are_refused_with_their_code_while_good_peers_transfer() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let addr = b.ep.local_addr().unwrap();

    // A valid, bound handshake on one session: the binding both ends derive agrees.
    let recorded = {
        let conn = silent_client(addr).await;
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let (bytes, mut connector) = hello(&secret, Role::Data, tls_binding(&conn));
        send.write_all(&bytes).await.unwrap();
        let mut d = Decoder::new(Side::Connector, Limits::DEFAULT);
        let ack = next_frame(&mut recv, &mut d).await.unwrap();
        connector.handle(&ack).unwrap();
        let accepted = b.ep.accept(WAIT).await.unwrap();
        assert_eq!(accepted.role(), Role::Data);
        bytes
    };

    let (good, _) = hello(&secret, Role::Data, ChannelBinding::None);
    let mut bad_magic = good.clone();
    bad_magic[..4].copy_from_slice(b"QUIC");
    let mut bad_version = good.clone();
    bad_version[4] = 9;
    let mut oversize = good.clone();
    oversize[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut garbage_body = good.clone();
    for byte in &mut garbage_body[HEADER_LEN..] {
        *byte = 0x5a;
    }
    let cases: Vec<(&str, Vec<u8>, CloseCode)> = vec![
        ("wrong magic", bad_magic, CloseCode::PROTOCOL_VIOLATION),
        ("wrong version", bad_version, CloseCode::VERSION_MISMATCH),
        ("oversize length", oversize, CloseCode::PROTOCOL_VIOLATION),
        ("garbage body", garbage_body, CloseCode::PROTOCOL_VIOLATION),
        (
            "heartbeat first",
            vector("heartbeat"),
            CloseCode::PROTOCOL_VIOLATION,
        ),
        (
            "wrong secret",
            hello(&fresh::job_secret(), Role::Data, ChannelBinding::None).0,
            CloseCode::AUTH_FAILED,
        ),
        ("unbound hello", good, CloseCode::AUTH_FAILED),
        ("replayed hello", recorded, CloseCode::AUTH_FAILED),
    ];
    let bad = tokio::spawn(async move {
        for (name, bytes, code) in cases {
            let conn = silent_client(addr).await;
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(&bytes).await.unwrap();
            let mut d = Decoder::new(Side::Connector, Limits::DEFAULT);
            match next_frame(&mut recv, &mut d).await.map(|f| f.message) {
                Some(Message::Reject(Reject { code: got, .. })) => assert_eq!(got, code, "{name}"),
                other => panic!("{name}: expected a reject, got {other:?}"),
            }
            assert_eq!(close_code(&conn).await, u64::from(code.0), "{name}");
        }
    });
    let (x, y) = pair(&a, &b).await;
    for op in 0..8 {
        let p = pattern(1 << 20, op as u8);
        let (s, r) = tokio::join!(x.send(tag(op, 0), p.clone()), y.recv(tag(op, 0)));
        s.unwrap();
        assert!(r.unwrap() == p, "transfer {op} corrupted");
    }
    bad.await.unwrap();
}

/// A frame the stream's role does not allow closes the channel with protocol-violation;
/// the sending side refuses to send one at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_the_role_forbids_closes_the_control_channel() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let addr = b.ep.local_addr().unwrap();
    // Our own channel will not send what a status client may not send.
    let (c, s) = tokio::join!(
        a.ep.connect(addr, b.id.fingerprint(), Role::Status, route(1), Rank(0)),
        b.ep.accept(WAIT)
    );
    let (client, _server) = (c.unwrap().into_control(), s.unwrap().into_control());
    let notice = Message::Heartbeat(Heartbeat { seq: 1, digest: 0 });
    let r = client.send(notice.clone()).await;
    assert!(
        matches!(
            r,
            Err(LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                ..
            })
        ),
        "{r:?}"
    );
    // A raw status client that sends one anyway is closed by the receiving gate.
    let conn = silent_client(addr).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let (bytes, mut connector) = hello(&secret, Role::Status, tls_binding(&conn));
    send.write_all(&bytes).await.unwrap();
    let mut d = Decoder::new(Side::Connector, Limits::DEFAULT);
    let ack = next_frame(&mut recv, &mut d).await.unwrap();
    connector.handle(&ack).unwrap();
    let server = b.ep.accept(WAIT).await.unwrap().into_control();
    let mut out = BytesMut::new();
    let mut encoder = connector.into_encoder();
    let forbidden = Message::Notice(Notice {
        origin: Rank(1),
        subject: Rank(2),
        verdict: chorus_protocol::message::Verdict::Dead,
        evidence: chorus_protocol::message::Evidence::ProcessExited { status: 9 },
        hops: 0,
    });
    encoder.encode(&route(1), &forbidden, &mut out).unwrap();
    send.write_all(&out).await.unwrap();
    let r = tokio::time::timeout(WAIT, server.recv()).await.unwrap();
    assert!(
        matches!(
            r,
            Err(LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        close_code(&conn).await,
        u64::from(CloseCode::PROTOCOL_VIOLATION.0)
    );
}

/// `cancel` fails pending operations synchronously, before any executor round trip or
/// peer involvement, and the peer sees the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_is_local_immediate_and_the_peer_sees_the_code() {
    let secret = fresh::job_secret();
    let (a, b) = (member(1, &secret), member(0, &secret));
    let (x, y) = pair(&a, &b).await;
    cancel_is_local_and_immediate(&x, &y, "quic abort", WAIT).await;
}
