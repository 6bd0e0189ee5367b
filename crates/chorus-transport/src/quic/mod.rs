//! QUIC over quinn + rustls (ring): the control plane's transport and a data `Link`.
//!
//! Each member serves with its own self-signed certificate; a connecting member pins the
//! fingerprint the peer table carries (no CA). The TLS client does not authenticate; the
//! connector proves the job secret in `Hello` on the connection's first stream, exactly as
//! over TCP, and the acceptor proves it back in `HelloAck`. Both proofs are bound to the
//! TLS session (`ChannelBinding::Tls`, keying material exported under
//! `EXPORTER-chorus-hello`), so a `Hello` recorded on one connection fails on any other.
//! Idle timeout and keep-alive are derived from the liveness configuration; every close
//! carries the spec's code as the QUIC application error code.

mod control;
mod hedge;
mod link;
mod pin;
mod unclaimed;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_engine::link::LinkError;
use chorus_protocol::message::Role;
use chorus_protocol::{
    AcceptorConfig, ChannelBinding, CloseCode, CommId, ConnectorConfig, Epoch, JobSecret, Rank,
};
use parking_lot::Mutex;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    ConnectionError, Endpoint, IdleTimeout, ReadError, RecvStream, SendStream, VarInt, WriteError,
};
use tokio::sync::{Mutex as AsyncMutex, Semaphore, mpsc};

pub use control::ControlChannel;
pub use link::QuicLink;

use crate::Route;
use crate::admission::Admission;
use crate::config::{Liveness, TransportConfig};
use crate::error::TransportError;
use crate::fresh;
use crate::handshake::{self, Greeted};
use crate::identity::{Fingerprint, Identity, SERVER_NAME};
use crate::matcher::Matcher;
use crate::outbound::Outbound;
use crate::progress_thread::ProgressThread;
use unclaimed::Unclaimed;

/// ALPN of chorus over QUIC.
const ALPN: &[u8] = b"chorus/1";
/// Handshakes an endpoint runs at once.
const MAX_PENDING_HANDSHAKES: usize = 256;
/// The TLS exporter label both ends derive the handshake's channel binding with.
const BINDING_LABEL: &[u8] = b"EXPORTER-chorus-hello";
/// How long a refused stream's `Reject` may take to be acknowledged before the close.
const REFUSAL_BUDGET: Duration = Duration::from_millis(50);

/// One process's QUIC endpoint: serves peers and connects to them.
#[derive(Clone, Debug)]
pub struct QuicEndpoint {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    cfg: TransportConfig,
    liveness: Liveness,
    secret: JobSecret,
    provider: Arc<rustls::crypto::CryptoProvider>,
    incoming: AsyncMutex<mpsc::Receiver<QuicConnection>>,
    progress: ProgressThread,
}

impl QuicEndpoint {
    /// Binds `addr` (port 0 picks one; see `local_addr`) and starts serving: every
    /// incoming connection must complete TLS and the `Hello` exchange within the
    /// handshake deadline, and `admission` must know the communicator it names.
    pub fn bind(
        addr: SocketAddr,
        identity: &Identity,
        secret: JobSecret,
        cfg: TransportConfig,
        liveness: Liveness,
        admission: Admission,
    ) -> Result<Self, TransportError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server_crypto = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_no_client_auth()
            .with_single_cert(vec![identity.cert()], identity.key())
            .map_err(tls)?;
        server_crypto.alpn_protocols = vec![ALPN.to_vec()];
        let server_crypto = QuicServerConfig::try_from(server_crypto).map_err(tls)?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        server.transport_config(Arc::new(transport_config(&liveness)?));
        let progress = ProgressThread::start("chorus-quic")?;
        let endpoint = {
            let _guard = progress.handle().enter();
            Endpoint::server(server, addr).map_err(TransportError::io("quic bind"))?
        };
        let (tx, rx) = mpsc::channel(64);
        let inner = Arc::new(Inner {
            endpoint,
            cfg,
            liveness,
            secret,
            provider,
            incoming: AsyncMutex::new(rx),
            progress,
        });
        inner
            .progress
            .handle()
            .spawn(accept_loop(Arc::downgrade(&inner), admission, tx));
        Ok(Self { inner })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.inner
            .endpoint
            .local_addr()
            .map_err(TransportError::io("quic local address"))
    }

    /// Connects to the member at `addr` whose certificate has `fingerprint`, and runs the
    /// connector handshake as `me` in `role`, expecting `peer` to answer.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        fingerprint: Fingerprint,
        role: Role,
        me: Route,
        peer: Rank,
    ) -> Result<QuicConnection, TransportError> {
        let inner = self.inner.clone();
        // The handshake runs on the progress thread; a caller that stops waiting (an
        // opener replaced by a fresher attempt, or past its deadline) ends it there too,
        // rather than leaving it to retransmit on its own until `connect_timeout`.
        let task = Cancel(self.inner.progress.handle().spawn(async move {
            let client = inner.client_config(fingerprint)?;
            // A fresh handshake every heartbeat interval while none has answered, so a
            // connect opened into a cut is not left to its backed-off resends (hedge.rs).
            let connecting = hedge::race(inner.liveness.hedge_every(), hedge::KEEP, || {
                let attempt = inner
                    .endpoint
                    .connect_with(client.clone(), addr, SERVER_NAME)
                    .map_err(|e| TransportError::Quic(e.to_string()))?;
                Ok(async move {
                    attempt
                        .await
                        .map_err(|e| TransportError::Quic(format!("connect {addr}: {e}")))
                })
            });
            let conn = match tokio::time::timeout(inner.cfg.connect_timeout, connecting).await {
                // Unclaimed from here: cancelled during the `Hello` exchange, it closes
                // with `deadline` (a refusal), never quinn's implicit `normal`.
                Ok(Ok(c)) => Unclaimed::new(c),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(TransportError::ConnectTimeout {
                        addr,
                        attempts: 1,
                        elapsed: inner.cfg.connect_timeout,
                        last: "quic handshake timed out".into(),
                    });
                }
            };
            let deadline = Instant::now() + inner.cfg.handshake_timeout;
            let hs = async {
                let mut config =
                    ConnectorConfig::new(inner.secret.clone(), me, role, fresh::nonce(), deadline);
                config.peer = Some(peer);
                config.limits = inner.cfg.limits();
                config.binding = binding(conn.get())?;
                let (mut send, mut recv) = conn
                    .get()
                    .open_bi()
                    .await
                    .map_err(|e| TransportError::Quic(e.to_string()))?;
                let greeted = handshake::connect(&mut recv, &mut send, addr, config).await?;
                Ok::<_, TransportError>((send, recv, greeted))
            };
            // `handshake::connect` bounds itself by the deadline; this bounds opening
            // the stream too.
            let timeout = inner.cfg.handshake_timeout;
            let result = match tokio::time::timeout_at(deadline.into(), hs).await {
                Ok(r) => r,
                Err(_) => Err(TransportError::HandshakeTimeout { addr, timeout }),
            };
            match result {
                Ok((send, recv, greeted)) => Ok(QuicConnection {
                    conn,
                    send,
                    recv,
                    greeted,
                    endpoint: QuicEndpoint { inner },
                }),
                Err(e) => {
                    conn.get()
                        .close(code_of(e.code()), e.to_string().as_bytes());
                    Err(e)
                }
            }
        }));
        task.await
    }

    /// The next authenticated incoming connection, waiting at most `timeout`.
    pub async fn accept(&self, timeout: Duration) -> Result<QuicConnection, TransportError> {
        let mut rx = self.inner.incoming.lock().await;
        crate::accept::next_within(&mut rx, timeout, "quic accept").await
    }

    /// Closes every connection with `code` and stops serving.
    pub fn close(&self, code: CloseCode, detail: &str) {
        self.inner
            .endpoint
            .close(VarInt::from_u32(code.0.into()), detail.as_bytes());
    }

    /// Resolves once every connection has finished closing, so its `CONNECTION_CLOSE`
    /// left this process: a process that exits right after `close` may otherwise take
    /// the departure with it. It waits out the closing connections' drain period (three
    /// probe timeouts), so callers bound it with their teardown budget.
    pub async fn wait_idle(&self) {
        self.inner.endpoint.wait_idle().await;
    }
}

impl Inner {
    fn client_config(
        &self,
        fingerprint: Fingerprint,
    ) -> Result<quinn::ClientConfig, TransportError> {
        let mut crypto = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(pin::Pinned {
                fingerprint,
                provider: self.provider.clone(),
            }))
            .with_no_client_auth();
        crypto.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = QuicClientConfig::try_from(crypto).map_err(tls)?;
        let mut client = quinn::ClientConfig::new(Arc::new(crypto));
        client.transport_config(Arc::new(transport_config(&self.liveness)?));
        Ok(client)
    }
}

fn transport_config(liveness: &Liveness) -> Result<quinn::TransportConfig, TransportError> {
    let mut t = quinn::TransportConfig::default();
    let idle = IdleTimeout::try_from(liveness.idle_timeout())
        .map_err(|e| TransportError::Quic(format!("idle timeout: {e}")))?;
    t.max_idle_timeout(Some(idle));
    t.keep_alive_interval(Some(liveness.keep_alive()));
    t.initial_rtt(liveness.initial_rtt());
    // Windows sized for bulk transfer on fast links (the defaults cap a stream near
    // 1.25 MiB in flight).
    t.stream_receive_window(VarInt::from_u32(32 << 20));
    t.receive_window(VarInt::from_u32(64 << 20));
    t.send_window(64 << 20);
    Ok(t)
}

fn tls(e: impl std::fmt::Display) -> TransportError {
    TransportError::Identity(e.to_string())
}

async fn accept_loop(
    inner: std::sync::Weak<Inner>,
    admission: Admission,
    tx: mpsc::Sender<QuicConnection>,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(permit) = pending.clone().acquire_owned().await else {
            return;
        };
        let incoming = {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let endpoint = strong.endpoint.clone();
            drop(strong);
            match endpoint.accept().await {
                Some(i) => i,
                None => return,
            }
        };
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let admission = admission.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let addr = incoming.remote_address();
            let deadline = Instant::now() + strong.cfg.handshake_timeout;
            let conn = match tokio::time::timeout_at(deadline.into(), incoming).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return tracing::info!(%addr, "quic handshake failed: {e}"),
                Err(_) => return tracing::info!(%addr, "tls handshake deadline passed"),
            };
            if let Some(c) = greet(strong, conn, addr, deadline, &admission).await {
                // An endpoint nobody accepts from any more drops the connection (closed).
                let _ = tx.send(c).await;
            }
        });
    }
}

/// The acceptor's half on a TLS connection: the first stream, the `Hello` by `deadline`,
/// the answer; on refusal the `Reject` is given a moment to arrive, then the connection
/// closes with its code.
async fn greet(
    inner: Arc<Inner>,
    conn: quinn::Connection,
    addr: SocketAddr,
    deadline: Instant,
    admission: &Admission,
) -> Option<QuicConnection> {
    let timeout = inner.cfg.handshake_timeout;
    let binding = match binding(&conn) {
        Ok(b) => b,
        Err(e) => {
            conn.close(code_of(CloseCode::INTERNAL), e.to_string().as_bytes());
            return None;
        }
    };
    let stream = match tokio::time::timeout_at(deadline.into(), conn.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%addr, "quic connection ended before its first stream: {e}");
            return None;
        }
        Err(_) => {
            tracing::info!(%addr, "no stream within the {timeout:?} handshake deadline");
            let reason = format!("no hello within {timeout:?}");
            conn.close(code_of(CloseCode::DEADLINE), reason.as_bytes());
            return None;
        }
    };
    let (mut send, mut recv) = stream;
    let mut config = AcceptorConfig::new(inner.secret.clone(), fresh::nonce(), deadline);
    config.binding = binding;
    config.limits = inner.cfg.limits();
    match handshake::accept(&mut recv, &mut send, addr, config, admission).await {
        Ok(greeted) => Some(QuicConnection {
            conn: Unclaimed::new(conn),
            send,
            recv,
            greeted,
            endpoint: QuicEndpoint { inner },
        }),
        Err(e) => {
            tracing::info!(%addr, code = %e.code(), "refused quic connection: {e}");
            // Let the `Reject` reach the peer before the close discards what is unsent.
            if send.finish().is_ok() {
                let _ = tokio::time::timeout(REFUSAL_BUDGET, send.stopped()).await;
            }
            conn.close(code_of(e.code()), e.to_string().as_bytes());
            None
        }
    }
}

/// The handshake's channel binding: keying material exported from this TLS session,
/// identical on both ends and on no other session.
fn binding(conn: &quinn::Connection) -> Result<ChannelBinding, TransportError> {
    let mut b = [0u8; 32];
    conn.export_keying_material(&mut b, BINDING_LABEL, b"")
        .map_err(|_| TransportError::Quic("cannot export tls keying material".into()))?;
    Ok(ChannelBinding::Tls(b))
}

/// A close code as a QUIC application error code.
fn code_of(code: CloseCode) -> VarInt {
    VarInt::from_u32(code.0.into())
}

/// An authenticated QUIC connection with its first stream, tagged with what the
/// handshake established.
#[derive(Debug)]
pub struct QuicConnection {
    /// Closed with `deadline`, not quinn's implicit `normal`, if dropped unused.
    conn: Unclaimed,
    send: SendStream,
    recv: RecvStream,
    greeted: Greeted,
    endpoint: QuicEndpoint,
}

impl QuicConnection {
    pub fn role(&self) -> Role {
        self.greeted.role()
    }
    pub fn comm(&self) -> CommId {
        self.greeted.established.comm
    }
    /// The peer's epoch, as its handshake frame stated it.
    pub fn epoch(&self) -> Epoch {
        self.greeted.established.peer_epoch
    }
    pub fn peer_rank(&self) -> Rank {
        self.greeted.established.peer
    }
    pub fn local_rank(&self) -> Rank {
        self.greeted.me.sender
    }
    pub fn remote_addr(&self) -> SocketAddr {
        self.conn.get().remote_address()
    }

    /// The data link over a `Role::Data` connection's stream.
    pub fn into_link(self) -> Result<QuicLink, TransportError> {
        let role = self.role();
        if role != Role::Data {
            self.conn.get().close(
                code_of(CloseCode::INTERNAL),
                b"connection opened for another role",
            );
            return Err(TransportError::WrongRole {
                expected: Role::Data,
                found: role,
            });
        }
        let cfg = &self.endpoint.inner.cfg;
        let peer = self.greeted.peer();
        let Greeted {
            me,
            encoder,
            decoder,
            ..
        } = self.greeted;
        let matcher = Arc::new(Matcher::new(peer.sender, cfg.held_limit, cfg.send_window));
        let outbound = Arc::new(Mutex::new(Outbound::new(encoder, me)));
        Ok(link::start(
            self.endpoint.inner.progress.handle(),
            self.conn.claim(),
            self.send,
            self.recv,
            decoder,
            matcher,
            outbound,
            peer,
            cfg.depart_timeout,
        ))
    }

    /// The control-plane message channel over this connection's stream (member,
    /// bootstrap, joiner, status and launcher roles; the role's gate decides which kinds
    /// each side may send).
    pub fn into_control(self) -> ControlChannel {
        let peer = self.greeted.peer();
        let (role, local) = (self.greeted.role(), self.greeted.established.local);
        let Greeted {
            me,
            encoder,
            decoder,
            ..
        } = self.greeted;
        control::ControlChannel::new(
            self.endpoint.inner.clone(),
            self.conn.claim(),
            self.send,
            self.recv,
            encoder,
            decoder,
            me,
            peer,
            role,
            local,
        )
    }
}

fn lost(detail: &str) -> LinkError {
    LinkError::ConnectionLost {
        detail: detail.into(),
    }
}

/// Maps a connection's end to the link error: an application close is a departure with
/// the peer's code; anything else is a lost connection.
fn connection_error(e: &ConnectionError) -> LinkError {
    match e {
        ConnectionError::ApplicationClosed(ac) => LinkError::PeerDeparted {
            code: CloseCode(u16::try_from(ac.error_code.into_inner()).unwrap_or(u16::MAX)),
            detail: String::from_utf8_lossy(&ac.reason).into_owned(),
        },
        other => LinkError::ConnectionLost {
            detail: other.to_string(),
        },
    }
}

fn read_error(e: &ReadError) -> LinkError {
    match e {
        ReadError::ConnectionLost(c) => connection_error(c),
        other => lost(&format!("read: {other}")),
    }
}

/// A stream read through `AsyncRead` fails with an `io::Error` wrapping quinn's error;
/// unwrap it so an application close still reads as the peer's departure with its code.
fn io_read_error(e: &std::io::Error) -> LinkError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ReadError>())
    {
        Some(re) => read_error(re),
        None => lost(&format!("read: {e}")),
    }
}

fn write_error(e: WriteError) -> LinkError {
    match e {
        WriteError::ConnectionLost(c) => connection_error(&c),
        other => lost(&format!("write: {other}")),
    }
}

/// A task on the progress thread that is aborted when whoever waits on it stops waiting.
struct Cancel<T>(tokio::task::JoinHandle<T>);

impl<T> std::future::Future for Cancel<Result<T, TransportError>> {
    type Output = Result<T, TransportError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|joined| joined.unwrap_or(Err(TransportError::Shutdown)))
    }
}

impl<T> Drop for Cancel<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
