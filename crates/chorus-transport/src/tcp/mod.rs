//! TCP: a transport (progress threads), a listener that authenticates whoever connects,
//! `connect` with deadlines and backoff, and the data `Link` over a connection.
//!
//! One connection per peer carries everything. Several per peer for large messages would
//! only pay where one stream cannot keep the cores busy: across a veth pair on 2 cores, one
//! direction alone ran at 3.3–3.5 GB/s over one connection and 4.3–4.8 GB/s over two, but an
//! exchange (both directions at once, as every all-reduce step is) ran at 2.4–2.5 GB/s
//! each way over one connection and 2.2 over two (plain sockets, 2 GiB per direction,
//! 2026-12-05). Measure it again on a machine with more cores and a real NIC.

mod epoll;
mod link;
mod reader;
pub(crate) mod socket;
mod teardown;
mod uring;

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_protocol::message::{Depart, Message, Role};
use chorus_protocol::{
    AcceptorConfig, CloseCode, CommId, ConnectorConfig, Decoder, Encoder, Envelope, Epoch,
    JobSecret, Rank,
};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

pub use link::TcpLink;

use crate::admission::Admission;
use crate::config::{Backend, TransportConfig};
use crate::error::TransportError;
use crate::fresh;
use crate::handshake::{self, Greeted};
use crate::matcher::Matcher;
use crate::outbound::Outbound;
use crate::progress_thread::ProgressThread;
use crate::{GIVEN_UP, GIVEN_UP_DETAIL, Route};
use reader::Reader;

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
    progress: ProgressThread,
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
        let progress = ProgressThread::start("chorus-tcp")?;
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
                let deadline = Instant::now() + inner.cfg.handshake_timeout;
                let mut config =
                    ConnectorConfig::new(inner.secret.clone(), me, role, fresh::nonce(), deadline);
                config.peer = Some(peer);
                config.limits = inner.cfg.limits();
                let (mut r, mut w) = stream.split();
                match handshake::connect(&mut r, &mut w, addr, config).await {
                    Ok(greeted) => Ok(TcpConnection {
                        stream: Some(stream),
                        greeted,
                        addr,
                        transport: TcpTransport { inner },
                    }),
                    Err(e) => {
                        socket::shutdown_of(&stream);
                        Err(e)
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
        crate::accept::next_within(&mut self.rx, timeout, "accept").await
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An authenticated connection, tagged with what the handshake established. Dropping it
/// unused shuts the socket down (principle 1).
#[derive(Debug)]
pub struct TcpConnection {
    /// `None` only once moved into a link or handed out raw.
    stream: Option<TcpStream>,
    greeted: Greeted,
    addr: SocketAddr,
    transport: TcpTransport,
}

/// A connection handed out raw, for callers that speak the wire themselves (tests, tools):
/// the blocking socket and the stream's framing state right after the handshake. The caller
/// owns the close (`shutdown` first).
#[derive(Debug)]
pub struct RawConnection {
    pub stream: std::net::TcpStream,
    /// Our envelope on the stream.
    pub me: Envelope,
    /// Continues the sequence after our handshake frame.
    pub encoder: Encoder,
    /// Past the handshake, in the established role; holds any bytes read beyond it.
    pub decoder: Decoder,
}

impl TcpConnection {
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
    /// The peer's rank in `comm` at `epoch`.
    pub fn peer_rank(&self) -> Rank {
        self.greeted.established.peer
    }
    /// Our rank, as the handshake established it.
    pub fn local_rank(&self) -> Rank {
        self.greeted.me.sender
    }
    /// The protocol version the handshake negotiated.
    pub fn version(&self) -> u16 {
        u16::from(self.greeted.established.version)
    }
    pub fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The raw socket and the stream's framing state (see [`RawConnection`]).
    pub fn into_stream(mut self) -> Result<RawConnection, TransportError> {
        let stream = self.take_stream()?;
        let std = stream
            .into_std()
            .map_err(TransportError::io("detach socket from tokio"))?;
        std.set_nonblocking(false)
            .map_err(TransportError::io("set blocking"))?;
        let (me, encoder, decoder) = self.take_framing();
        Ok(RawConnection {
            stream: std,
            me,
            encoder,
            decoder,
        })
    }

    /// Refuses an admitted connection before any link reads it: sends a departure with
    /// `code`, half-closes, waits (within the transport's depart budget) until the peer has
    /// acknowledged it, then shuts the socket. Use it when whoever owns the connection
    /// already knows it will refuse (a second link for a live rank): a link's close departs
    /// only if it is the link's first failure, and a link reads at once, so a peer that
    /// half-closed right after its `Hello` would win that race and get a bare end of stream.
    pub async fn refuse(mut self, code: CloseCode, detail: impl Into<String>) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        let (me, encoder, _) = self.take_framing();
        let budget = self.transport.inner.cfg.depart_timeout;
        depart_and_close(stream, me, encoder, budget, code, detail.into()).await;
    }

    /// Turns a `Role::Data` connection into the data link to its peer, on the transport's
    /// backend.
    pub fn into_link(mut self) -> Result<TcpLink, TransportError> {
        let role = self.role();
        if role != Role::Data {
            return Err(TransportError::WrongRole {
                expected: Role::Data,
                found: role,
            });
        }
        let stream = self.take_stream()?;
        let peer = self.greeted.peer();
        let addr = self.addr;
        let transport = self.transport.clone();
        let (me, encoder, decoder) = self.take_framing();
        let inner = &transport.inner;
        let cfg = &inner.cfg;
        let matcher = Arc::new(Matcher::new(peer.sender, cfg.held_limit, cfg.send_window));
        let outbound = Arc::new(Mutex::new(Outbound::new(encoder, me)));
        // An IPv4 peer reached through a dual-stack socket has a mapped address.
        let loopback = addr.ip().to_canonical().is_loopback();
        let (io, reader) = match &inner.ring {
            Some(ring) => {
                let std = stream
                    .into_std()
                    .map_err(TransportError::io("detach socket from tokio"))?;
                let fd = Arc::new(OwnedFd::from(std));
                let reader = Arc::new(Reader::new(fd.clone(), decoder, matcher.clone(), peer));
                let zc = cfg.zero_copy_threshold.effective(loopback);
                let conn = ring.attach(fd, reader.clone(), outbound.clone(), zc);
                (link::Io::Uring(conn), reader)
            }
            None => {
                let _guard = inner.progress.handle().enter();
                let std = stream
                    .into_std()
                    .map_err(TransportError::io("detach socket from tokio"))?;
                let fd = Arc::new(OwnedFd::from(std));
                let reader = Arc::new(Reader::new(fd.clone(), decoder, matcher.clone(), peer));
                let conn = epoll::EpollConn::start(
                    inner.progress.handle(),
                    fd,
                    reader.clone(),
                    outbound.clone(),
                    cfg.depart_timeout,
                )
                .map_err(TransportError::io("register socket with epoll"))?;
                (link::Io::Epoll(conn), reader)
            }
        };
        Ok(TcpLink {
            matcher,
            reader,
            outbound,
            peer,
            io,
            spin: crate::spin::SpinBudget::new(cfg.recv_spin),
        })
    }

    fn take_stream(&mut self) -> Result<TcpStream, TransportError> {
        self.stream.take().ok_or(TransportError::Shutdown)
    }

    /// The framing state, leaving a spent placeholder behind (the connection is consumed).
    fn take_framing(&mut self) -> (Envelope, Encoder, Decoder) {
        let limits = *self.greeted.decoder.limits();
        let encoder = std::mem::take(&mut self.greeted.encoder);
        let decoder = std::mem::replace(
            &mut self.greeted.decoder,
            Decoder::new(chorus_protocol::Side::Acceptor, limits),
        );
        (self.greeted.me, encoder, decoder)
    }
}

/// Dropped unused (a connect whose caller stopped waiting, an accepted connection nobody
/// took): a data stream's peer, which may have made its end a link already, reads a
/// departure with [`GIVEN_UP`] (SPEC 6) and takes this side for a live one that refused,
/// not for a lost one. The close runs on the progress thread, bounded by the depart budget
/// like [`TcpConnection::refuse`]'s. A role other than `Data` is shut at once: on a control
/// stream any `Depart` means the sender left (SPEC 9.2).
impl Drop for TcpConnection {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        if self.role() != Role::Data {
            socket::shutdown_of(&stream);
            return;
        }
        let (me, encoder, _) = self.take_framing();
        let budget = self.transport.inner.cfg.depart_timeout;
        let close = depart_and_close(
            stream,
            me,
            encoder,
            budget,
            GIVEN_UP,
            GIVEN_UP_DETAIL.to_owned(),
        );
        // A runtime shutting down drops the task, and with it the socket.
        drop(self.transport.inner.progress.handle().spawn(close));
    }
}

/// The close sequence the links carry out (`teardown.rs`) on a stream that is on a frame
/// boundary with a departure to send: `Depart` with `code`, half-close, wait (within
/// `budget`) until the peer has acknowledged it, then shut the socket.
async fn depart_and_close(
    mut stream: TcpStream,
    me: Envelope,
    mut encoder: Encoder,
    budget: Duration,
    code: CloseCode,
    detail: String,
) {
    use teardown::{Action, Event, Teardown};
    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;

    let mut close = Teardown::new(Instant::now(), budget);
    let mut action = close.handle(Instant::now(), Event::Boundary { departure: true });
    let mut detail = Some(detail);
    loop {
        let event = match action {
            Action::Depart => {
                let depart = Message::Depart(Depart::new(code, detail.take().unwrap_or_default()));
                let mut bytes = bytes::BytesMut::new();
                let until = close.deadline().unwrap_or_else(Instant::now);
                match encoder.encode(&me, &depart, &mut bytes) {
                    Err(_) => Event::WriteFailed,
                    Ok(_) => match tokio::time::timeout_at(until, stream.write_all(&bytes)).await {
                        Ok(Ok(())) => Event::Departed,
                        Ok(Err(_)) => Event::WriteFailed,
                        Err(_) => Event::Tick,
                    },
                }
            }
            Action::HalfClose => {
                socket::shutdown_write(stream.as_fd());
                Event::Unacked(socket::unacknowledged(stream.as_fd()))
            }
            Action::Continue => {
                if let Some(at) = close.deadline() {
                    tokio::time::sleep_until(at).await;
                }
                if close.is_flushing() {
                    Event::Unacked(socket::unacknowledged(stream.as_fd()))
                } else {
                    Event::Tick
                }
            }
            Action::Shut => {
                socket::shutdown_of(&stream);
                return;
            }
            Action::Done => return,
        };
        action = close.handle(Instant::now(), event);
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
    let deadline = Instant::now() + inner.cfg.handshake_timeout;
    let mut config = AcceptorConfig::new(inner.secret.clone(), fresh::nonce(), deadline);
    config.limits = inner.cfg.limits();
    let (mut r, mut w) = stream.split();
    match handshake::accept(&mut r, &mut w, addr, config, admission).await {
        Ok(greeted) => Some(TcpConnection {
            stream: Some(stream),
            greeted,
            addr,
            transport: TcpTransport { inner },
        }),
        Err(e) => {
            // The `Reject` with the code is already on its way; now the close.
            tracing::info!(%addr, code = %e.code(), "refused connection: {e}");
            socket::shutdown_of(&stream);
            None
        }
    }
}

/// Whether this kernel lets us set up an io_uring (tests use it to skip, saying so).
pub fn uring_available() -> bool {
    uring::available()
}
