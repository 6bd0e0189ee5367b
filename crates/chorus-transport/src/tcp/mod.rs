//! TCP: a transport (progress threads), a listener that authenticates whoever connects,
//! `connect` with deadlines and backoff, and the data `Link` over a connection.

mod epoll;
mod frame;
mod link;
pub(crate) mod socket;
mod uring;

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

pub use link::TcpLink;

use crate::config::{Backend, TransportConfig};
use crate::error::TransportError;
use crate::greeting::{self, Admission, Greeted};
use crate::matcher::Matcher;
use crate::progress::Progress;
use crate::secret::JobSecret;
use crate::wire::{self, Limits, Route};

/// The backend a transport actually runs (what `Backend::Auto` resolved to).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum BackendKind {
    Uring,
    Epoll,
}

/// Handshakes an accepting listener runs at once; more wait in the kernel's backlog.
const MAX_PENDING_HANDSHAKES: usize = 256;

/// The TCP transport of one process: a tokio progress thread (connection set-up, and the
/// epoll backend's links) and, with io_uring, a ring on its own progress thread.
#[derive(Clone, Debug)]
pub struct TcpTransport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: TransportConfig,
    secret: JobSecret,
    // Field order is drop order: links' rings stop before the runtime that set them up.
    ring: Option<uring::Ring>,
    progress: Progress,
}

impl TcpTransport {
    /// Starts the progress threads. With `Backend::Auto`, a refused `io_uring_setup`
    /// (seccomp, `kernel.io_uring_disabled`, an old kernel) falls back to epoll; with
    /// `Backend::Uring` it is an error.
    pub fn new(cfg: TransportConfig, secret: JobSecret) -> Result<Self, TransportError> {
        let ring = match cfg.backend {
            Backend::Epoll => None,
            Backend::Uring => {
                Some(uring::Ring::new(&cfg).map_err(TransportError::UringUnavailable)?)
            }
            Backend::Auto => match uring::Ring::new(&cfg) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::info!("io_uring unavailable ({e}); TCP links use epoll");
                    None
                }
            },
        };
        let progress = Progress::start("chorus-tcp")?;
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                secret,
                ring,
                progress,
            }),
        })
    }

    /// The backend links of this transport run on.
    pub fn backend(&self) -> BackendKind {
        if self.inner.ring.is_some() {
            BackendKind::Uring
        } else {
            BackendKind::Epoll
        }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.inner.cfg
    }

    /// Listens on `addr` (port 0 picks a free port; read it back with `local_addr`).
    /// Every accepted connection must finish the handshake within the handshake deadline;
    /// `admission` says which rank we are for the communicator a `Hello` names.
    pub async fn listen(
        &self,
        addr: SocketAddr,
        admission: Admission,
    ) -> Result<TcpListener, TransportError> {
        let inner = self.inner.clone();
        self.inner
            .progress
            .run(async move {
                let sock = socket::new_socket(addr, &inner.cfg)
                    .map_err(TransportError::io("tcp socket"))?;
                sock.set_reuseaddr(true)
                    .map_err(TransportError::io("SO_REUSEADDR"))?;
                sock.bind(addr).map_err(TransportError::io("bind"))?;
                let listener = sock.listen(1024).map_err(TransportError::io("listen"))?;
                let local = listener
                    .local_addr()
                    .map_err(TransportError::io("local address"))?;
                let (tx, rx) = mpsc::channel(64);
                let task = tokio::spawn(accept_loop(listener, inner.clone(), admission, tx));
                Ok(TcpListener {
                    local,
                    rx,
                    task,
                    transport: TcpTransport { inner },
                })
            })
            .await?
    }

    /// Connects to `addr` and runs the connector handshake as `me` (our comm, epoch and
    /// rank) in `role`, expecting `peer` to answer. Connect attempts retry with backoff
    /// within `connect_timeout`; the handshake has `handshake_timeout`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        role: Role,
        me: Route,
        peer: Rank,
    ) -> Result<TcpConnection, TransportError> {
        let inner = self.inner.clone();
        self.inner
            .progress
            .run(async move {
                let mut stream = socket::connect(addr, &inner.cfg).await?;
                let timeout = inner.cfg.handshake_timeout;
                let (mut r, mut w) = stream.split();
                let hs = greeting::connect(&mut r, &mut w, addr, &inner.secret, role, me, peer);
                let result = tokio::time::timeout(timeout, hs).await;
                match result {
                    Ok(Ok(greeted)) => Ok(TcpConnection {
                        stream,
                        greeted,
                        addr,
                        transport: TcpTransport { inner },
                    }),
                    Ok(Err(e)) => {
                        socket::shutdown_of(&stream);
                        Err(e)
                    }
                    Err(_) => {
                        socket::shutdown_of(&stream);
                        Err(TransportError::HandshakeTimeout { addr, timeout })
                    }
                }
            })
            .await?
    }
}

/// Accepts connections and authenticates them; dropping it stops accepting.
#[derive(Debug)]
pub struct TcpListener {
    local: SocketAddr,
    rx: mpsc::Receiver<TcpConnection>,
    task: JoinHandle<()>,
    transport: TcpTransport,
}

impl TcpListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next authenticated connection, waiting at most `timeout`.
    pub async fn accept(&mut self, timeout: Duration) -> Result<TcpConnection, TransportError> {
        let _keep = &self.transport;
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(conn)) => Ok(conn),
            Ok(None) => Err(TransportError::Shutdown),
            Err(_) => Err(TransportError::Io {
                what: "accept",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no authenticated connection within {timeout:?}"),
                ),
            }),
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An authenticated connection, tagged with what the handshake established.
#[derive(Debug)]
pub struct TcpConnection {
    stream: TcpStream,
    greeted: Greeted,
    addr: SocketAddr,
    transport: TcpTransport,
}

impl TcpConnection {
    pub fn role(&self) -> Role {
        self.greeted.role
    }
    pub fn comm(&self) -> CommId {
        self.greeted.peer.comm
    }
    pub fn epoch(&self) -> Epoch {
        self.greeted.peer.epoch
    }
    /// The peer's rank in `comm` at `epoch`.
    pub fn peer_rank(&self) -> Rank {
        self.greeted.peer.sender
    }
    /// Our rank, as the handshake established it.
    pub fn local_rank(&self) -> Rank {
        self.greeted.me.sender
    }
    pub fn version(&self) -> u16 {
        self.greeted.version
    }
    pub fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The raw socket and any bytes read past the handshake, for callers that speak the
    /// wire themselves (tests, tools). The caller owns the close (`shutdown` first).
    pub fn into_stream(self) -> Result<(std::net::TcpStream, bytes::BytesMut), TransportError> {
        let TcpConnection {
            stream,
            mut greeted,
            ..
        } = self;
        let std = stream
            .into_std()
            .map_err(TransportError::io("detach socket from tokio"))?;
        std.set_nonblocking(false)
            .map_err(TransportError::io("set blocking"))?;
        Ok((std, greeted.decoder.buffer().split()))
    }

    /// Turns the connection into the data link to its peer, on the transport's backend.
    pub fn into_link(self) -> Result<TcpLink, TransportError> {
        let TcpConnection {
            stream,
            greeted,
            transport,
            addr,
        } = self;
        let inner = &transport.inner;
        let cfg = &inner.cfg;
        let Greeted {
            me,
            peer,
            mut decoder,
            ..
        } = greeted;
        decoder.set_limits(Limits::data(cfg.max_chunk));
        let matcher = Arc::new(Matcher::new(peer.sender, cfg.held_limit, cfg.send_window));
        let io = match &inner.ring {
            Some(ring) => {
                let std = stream
                    .into_std()
                    .map_err(TransportError::io("detach socket from tokio"))?;
                let fd = OwnedFd::from(std);
                let zc = cfg.zero_copy_threshold.effective(addr.ip().is_loopback());
                link::Io::Uring(ring.attach(fd, decoder, matcher.clone(), peer, me, zc))
            }
            None => {
                let _guard = inner.progress.handle().enter();
                link::Io::Epoll(epoll::EpollConn::start(
                    inner.progress.handle(),
                    stream,
                    decoder,
                    matcher.clone(),
                    peer,
                    me,
                    cfg.depart_timeout,
                ))
            }
        };
        Ok(TcpLink {
            matcher,
            me,
            peer,
            io,
            max_chunk: cfg.max_chunk,
        })
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    inner: Arc<Inner>,
    admission: Admission,
    tx: mpsc::Sender<TcpConnection>,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(permit) = pending.clone().acquire_owned().await else {
            return;
        };
        let (stream, addr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: keep serving once descriptors free up.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let inner = inner.clone();
        let admission = admission.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(conn) = handshake_one(stream, addr, inner, &admission).await {
                // A listener nobody accepts from any more drops the connection (closed).
                let _ = tx.send(conn).await;
            }
        });
    }
}

async fn handshake_one(
    mut stream: TcpStream,
    addr: SocketAddr,
    inner: Arc<Inner>,
    admission: &Admission,
) -> Option<TcpConnection> {
    let timeout = inner.cfg.handshake_timeout;
    let (mut r, mut w) = stream.split();
    let hs = greeting::accept(&mut r, &mut w, addr, &inner.secret, admission);
    match tokio::time::timeout(timeout, hs).await {
        Ok(Ok(greeted)) => Some(TcpConnection {
            stream,
            greeted,
            addr,
            transport: TcpTransport { inner },
        }),
        Ok(Err(e)) => {
            tracing::info!(%addr, code = %e.code(), "refused connection: {e}");
            socket::shutdown_of(&stream);
            None
        }
        Err(_) => {
            tracing::info!(%addr, "handshake deadline ({timeout:?}) passed; closing");
            let msg = chorus_protocol::message::Message::Reject(chorus_protocol::message::Reject {
                code: CloseCode::DEADLINE,
                detail: format!("no hello within {timeout:?}"),
            });
            if let Ok(bytes) = wire::encode(Route::UNKNOWN, 0, &msg) {
                let _ =
                    tokio::time::timeout(Duration::from_millis(50), stream.write_all(&bytes)).await;
            }
            socket::shutdown_of(&stream);
            None
        }
    }
}

/// Whether this kernel lets us set up an io_uring (tests use it to skip, saying so).
pub fn uring_available() -> bool {
    uring::available()
}
