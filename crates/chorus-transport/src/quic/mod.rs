//! QUIC over quinn + rustls (ring): the control plane's transport and a data `Link`.
//!
//! Each member serves with its own self-signed certificate; a connecting member pins the
//! fingerprint the peer table carries (no CA). The TLS client does not authenticate; the
//! connector proves the job secret in `Hello` on the connection's first stream, exactly as
//! over TCP, and the acceptor proves it back in `HelloAck`. Idle timeout and keep-alive
//! are derived from the liveness configuration; every close carries the spec's code as
//! the QUIC application error code.

mod control;
mod link;
mod pin;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chorus_engine::link::LinkError;
use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    ConnectionError, Endpoint, IdleTimeout, ReadError, RecvStream, SendStream, VarInt, WriteError,
};
use tokio::sync::{Mutex as AsyncMutex, Semaphore, mpsc};

pub use control::ControlChannel;
pub use link::QuicLink;

use crate::config::{Liveness, TransportConfig};
use crate::error::TransportError;
use crate::greeting::{self, Admission, Greeted};
use crate::identity::{Fingerprint, Identity, SERVER_NAME};
use crate::matcher::Matcher;
use crate::progress::Progress;
use crate::secret::JobSecret;
use crate::wire::{Limits, Route};

/// ALPN of chorus over QUIC.
const ALPN: &[u8] = b"chorus/1";
/// Handshakes an endpoint runs at once.
const MAX_PENDING_HANDSHAKES: usize = 256;

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
    progress: Progress,
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
        let progress = Progress::start("chorus-quic")?;
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
        self.inner
            .progress
            .run(async move {
                let client = inner.client_config(fingerprint)?;
                let connecting = inner
                    .endpoint
                    .connect_with(client, addr, SERVER_NAME)
                    .map_err(|e| TransportError::Quic(e.to_string()))?;
                let conn = match tokio::time::timeout(inner.cfg.connect_timeout, connecting).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Err(TransportError::Quic(format!("connect {addr}: {e}"))),
                    Err(_) => {
                        return Err(TransportError::ConnectTimeout {
                            addr,
                            attempts: 1,
                            elapsed: inner.cfg.connect_timeout,
                            last: "quic handshake timed out".into(),
                        });
                    }
                };
                let timeout = inner.cfg.handshake_timeout;
                let hs = async {
                    let (mut send, mut recv) = conn
                        .open_bi()
                        .await
                        .map_err(|e| TransportError::Quic(e.to_string()))?;
                    let greeted = greeting::connect(
                        &mut recv,
                        &mut send,
                        addr,
                        &inner.secret,
                        role,
                        me,
                        peer,
                    )
                    .await?;
                    Ok::<_, TransportError>((send, recv, greeted))
                };
                match tokio::time::timeout(timeout, hs).await {
                    Ok(Ok((send, recv, greeted))) => Ok(QuicConnection {
                        conn,
                        send,
                        recv,
                        greeted,
                        endpoint: QuicEndpoint { inner },
                    }),
                    Ok(Err(e)) => {
                        conn.close(VarInt::from_u32(e.code().0.into()), b"handshake failed");
                        Err(e)
                    }
                    Err(_) => {
                        conn.close(
                            VarInt::from_u32(CloseCode::DEADLINE.0.into()),
                            b"handshake deadline",
                        );
                        Err(TransportError::HandshakeTimeout { addr, timeout })
                    }
                }
            })
            .await?
    }

    /// The next authenticated incoming connection, waiting at most `timeout`.
    pub async fn accept(&self, timeout: Duration) -> Result<QuicConnection, TransportError> {
        let mut rx = self.inner.incoming.lock().await;
        match tokio::time::timeout(timeout, rx.recv()).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(TransportError::Shutdown),
            Err(_) => Err(TransportError::Io {
                what: "quic accept",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no authenticated connection within {timeout:?}"),
                ),
            }),
        }
    }

    /// Closes every connection with `code` and stops serving.
    pub fn close(&self, code: CloseCode, detail: &str) {
        self.inner
            .endpoint
            .close(VarInt::from_u32(code.0.into()), detail.as_bytes());
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
            let timeout = strong.cfg.handshake_timeout;
            let deadline = tokio::time::Instant::now() + timeout;
            let conn = match tokio::time::timeout_at(deadline, incoming).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return tracing::info!(%addr, "quic handshake failed: {e}"),
                Err(_) => return tracing::info!(%addr, "tls handshake deadline passed"),
            };
            let hello = async {
                let (mut send, mut recv) = conn
                    .accept_bi()
                    .await
                    .map_err(|e| TransportError::Quic(e.to_string()))?;
                let greeted =
                    greeting::accept(&mut recv, &mut send, addr, &strong.secret, &admission)
                        .await?;
                Ok::<_, TransportError>((send, recv, greeted))
            };
            match tokio::time::timeout_at(deadline, hello).await {
                Ok(Ok((send, recv, greeted))) => {
                    let c = QuicConnection {
                        conn,
                        send,
                        recv,
                        greeted,
                        endpoint: QuicEndpoint { inner: strong },
                    };
                    let _ = tx.send(c).await;
                }
                Ok(Err(e)) => {
                    tracing::info!(%addr, code = %e.code(), "refused quic connection: {e}");
                    // Give the Reject a moment to leave before the close discards it.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    conn.close(
                        VarInt::from_u32(e.code().0.into()),
                        e.to_string().as_bytes(),
                    );
                }
                Err(_) => {
                    tracing::info!(%addr, "no hello within the {timeout:?} handshake deadline");
                    let reason = format!("no hello within {timeout:?}");
                    conn.close(
                        VarInt::from_u32(CloseCode::DEADLINE.0.into()),
                        reason.as_bytes(),
                    );
                }
            }
        });
    }
}

/// An authenticated QUIC connection with its first stream, tagged with what the
/// handshake established.
#[derive(Debug)]
pub struct QuicConnection {
    conn: quinn::Connection,
    send: SendStream,
    recv: RecvStream,
    greeted: Greeted,
    endpoint: QuicEndpoint,
}

impl QuicConnection {
    pub fn role(&self) -> Role {
        self.greeted.role
    }
    pub fn comm(&self) -> CommId {
        self.greeted.peer.comm
    }
    pub fn epoch(&self) -> Epoch {
        self.greeted.peer.epoch
    }
    pub fn peer_rank(&self) -> Rank {
        self.greeted.peer.sender
    }
    pub fn local_rank(&self) -> Rank {
        self.greeted.me.sender
    }
    pub fn remote_addr(&self) -> SocketAddr {
        self.conn.remote_address()
    }

    /// The data link over this connection's stream.
    pub fn into_link(self) -> QuicLink {
        let cfg = &self.endpoint.inner.cfg;
        let Greeted {
            me,
            peer,
            mut decoder,
            ..
        } = self.greeted;
        decoder.set_limits(Limits::data(cfg.max_chunk));
        let matcher = Arc::new(Matcher::new(peer.sender, cfg.held_limit, cfg.send_window));
        link::start(
            self.endpoint.inner.progress.handle(),
            self.conn,
            self.send,
            self.recv,
            decoder,
            matcher,
            me,
            peer,
            cfg.depart_timeout,
            cfg.max_chunk,
        )
    }

    /// The control-plane message channel over this connection's stream.
    pub fn into_control(self) -> ControlChannel {
        let Greeted {
            me, peer, decoder, ..
        } = self.greeted;
        let mut decoder = decoder;
        decoder.set_limits(Limits::data(0));
        control::ControlChannel::new(
            self.endpoint.inner.clone(),
            self.conn,
            self.send,
            self.recv,
            decoder,
            me,
            peer,
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

fn read_error(e: ReadError) -> LinkError {
    match e {
        ReadError::ConnectionLost(c) => connection_error(&c),
        other => lost(&format!("read: {other}")),
    }
}

fn write_error(e: WriteError) -> LinkError {
    match e {
        WriteError::ConnectionLost(c) => connection_error(&c),
        other => lost(&format!("write: {other}")),
    }
}
