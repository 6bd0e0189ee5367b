//! shm: data links between ranks on one host through shared memory.
//!
//! Set-up mirrors TCP's: a listener on an abstract Unix socket authenticates whoever
//! connects with the protocol's handshake (the job secret's proof, the same `Connector` /
//! `Acceptor`); then the connector creates the pair's segment (a sealed memfd, `segment.rs`)
//! and passes it with `SCM_RIGHTS`, and the acceptor checks and maps it. The socket is
//! closed after that: the frames that follow the handshake travel in the segment's two
//! rings (`ring.rs`), and the link's end is a departure frame plus a one-way closed word in
//! the segment. Payloads of at most 1 KiB (a small all-reduce's, a barrier's token, a
//! credit) skip the frames: they go through the segment's mailboxes (`mailbox.rs`); up to
//! 32 bytes travel as one cache line. A SIGKILLed peer is seen through a pidfd on the
//! process the socket's `SO_PEERCRED` named, a frozen one by the runtime's heartbeat
//! deadline.
//!
//! Large frames go through the ring too, pipelined in pieces, rather than by a single copy
//! from the peer's memory (`process_vm_readv`, Open MPI's CMA path). Threads side by side
//! (`cargo bench -p chorus-benches --bench shm_copy`, figures in that file) do not settle it
//! on this project's VM: the ring's times move by up to 10× between runs minutes apart, and
//! the winner with them. A real job does: Open MPI's 4-rank all-reduce of 2–4 MiB on the
//! 2-core machine gets ahead of this ring with its CMA path and not without it, since a
//! single copy halves the CPU work per byte when ranks outnumber cores. It is not built: a
//! send of one would complete only on the receiver's acknowledgement (the sender's buffer
//! must stay put until read), and an abort would have to withdraw the buffer in a way the
//! receiver checks after its copy (a copy that raced the withdrawal is discarded, never
//! delivered).

mod futex;
mod link;
mod mailbox;
mod patience;
mod process;
mod pump;
mod raw;
mod reader;
pub mod ring;
mod segment;
mod shared;
mod unix;
mod writer;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_protocol::message::Role;
use chorus_protocol::{
    AcceptorConfig, CommId, ConnectorConfig, Decoder, Encoder, Envelope, Epoch, JobSecret, Rank,
};
use tokio::io::AsyncWriteExt as _;
use tokio::net::UnixStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

pub use link::ShmLink;
pub use raw::{RawShm, RawSlot};

use crate::admission::Admission;
use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::fresh;
use crate::handshake::{self, Greeted};
use crate::outbound::Outbound;
use crate::progress_thread::ProgressThread;
use crate::{GIVEN_UP, GIVEN_UP_DETAIL, Route};
use process::PeerProcess;
use ring::Side;
use segment::Segment;
use shared::Shared;

/// The handshake's errors name a socket address; a Unix socket has none to give (the
/// abstract name is in the transport's log lines instead).
const NO_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// Handshakes a listener runs at once; more wait in the backlog.
const MAX_PENDING_HANDSHAKES: usize = 256;

/// The shm transport of one process: a progress thread for connection set-up. Each link
/// then runs on its own pump thread.
#[derive(Clone, Debug)]
pub struct ShmTransport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: TransportConfig,
    secret: JobSecret,
    progress: ProgressThread,
}

impl ShmTransport {
    /// Fails if this kernel or sandbox refuses a sealed memfd: better now, where the
    /// runtime's default (`auto`) can keep TCP, than at every connect.
    pub fn new(cfg: TransportConfig, secret: JobSecret) -> Result<Self, TransportError> {
        drop(Segment::create(ring::MIN_CAPACITY as usize).map_err(segment_error)?);
        let progress = ProgressThread::start("chorus-shm")?;
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                secret,
                progress,
            }),
        })
    }

    pub fn config(&self) -> &TransportConfig {
        &self.inner.cfg
    }

    /// Listens on a fresh abstract Unix address (read it back with `name`); `admission`
    /// says which rank we are for the communicator a `Hello` names.
    pub async fn listen(&self, admission: Admission) -> Result<ShmListener, TransportError> {
        self.listen_at(unix::fresh_name(), admission).await
    }

    /// Like [`ShmTransport::listen`], on the abstract address `name` (one a peer can derive
    /// from what it already knows of us, such as our certificate's fingerprint). Fails if
    /// the name is taken in this network namespace.
    pub async fn listen_at(
        &self,
        name: String,
        admission: Admission,
    ) -> Result<ShmListener, TransportError> {
        let inner = self.inner.clone();
        self.inner
            .progress
            .run(async move {
                let addr = unix::address(&name).map_err(TransportError::io("shm address"))?;
                let std = std::os::unix::net::UnixListener::bind_addr(&addr)
                    .map_err(TransportError::io("bind shm listener"))?;
                std.set_nonblocking(true)
                    .map_err(TransportError::io("set nonblocking"))?;
                let listener = tokio::net::UnixListener::from_std(std)
                    .map_err(TransportError::io("register shm listener"))?;
                let (tx, rx) = mpsc::channel(64);
                let task = tokio::spawn(accept_loop(listener, inner.clone(), admission, tx));
                Ok(ShmListener {
                    name,
                    rx,
                    task,
                    transport: ShmTransport { inner },
                })
            })
            .await?
    }

    /// Connects to the listener `name` and runs the connector handshake as `me` in `role`,
    /// expecting `peer`; then creates the pair's segment and hands it over. Refused connects
    /// (the listener not up yet) retry with backoff within `connect_timeout`.
    pub async fn connect(
        &self,
        name: &str,
        role: Role,
        me: Route,
        peer: Rank,
    ) -> Result<ShmConnection, TransportError> {
        let inner = self.inner.clone();
        let name = name.to_owned();
        self.inner
            .progress
            .run(async move {
                let mut stream = connect_unix(&name, &inner.cfg).await?;
                let deadline = Instant::now() + inner.cfg.handshake_timeout;
                let mut config =
                    ConnectorConfig::new(inner.secret.clone(), me, role, fresh::nonce(), deadline);
                config.peer = Some(peer);
                config.limits = inner.cfg.limits();
                let (mut r, mut w) = stream.split();
                let greeted = handshake::connect(&mut r, &mut w, NO_ADDR, config).await?;
                let seg = Segment::create(inner.cfg.shm_ring).map_err(segment_error)?;
                // A connection from here on: given up (a failed handover), it departs in
                // its ring, which the acceptor may have mapped and made a link already.
                let conn = ShmConnection {
                    pid: unix::peer_pid(&stream),
                    greeted,
                    seg: Some(seg),
                    side: Side::Connector,
                    cfg: inner.cfg.clone(),
                };
                let handover = async {
                    let seg = conn.seg.as_ref().ok_or(TransportError::Shutdown)?;
                    unix::send_fd(&stream, unix::SEGMENT, seg.fd())
                        .await
                        .map_err(TransportError::io("send shm segment"))?;
                    match unix::recv_fd(&stream).await {
                        Ok((unix::MAPPED, None)) => Ok(()),
                        Ok(_) => Err(closed("unexpected answer to the segment")),
                        Err(e) => Err(TransportError::io("shm segment answer")(e)),
                    }
                };
                within(deadline, handover).await?;
                Ok(conn)
            })
            .await?
    }
}

/// Accepts connections and authenticates them; dropping it stops accepting (and frees the
/// abstract address).
#[derive(Debug)]
pub struct ShmListener {
    name: String,
    rx: mpsc::Receiver<ShmConnection>,
    task: JoinHandle<()>,
    transport: ShmTransport,
}

impl ShmListener {
    /// The abstract address to give connectors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next authenticated connection, waiting at most `timeout`.
    pub async fn accept(&mut self, timeout: Duration) -> Result<ShmConnection, TransportError> {
        let _keep = &self.transport;
        crate::accept::next_within(&mut self.rx, timeout, "shm accept").await
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An authenticated connection with its segment mapped, not yet a link. Dropping it unused
/// sets our closed word, so the peer's link ends at once (principle 1).
#[derive(Debug)]
pub struct ShmConnection {
    greeted: Greeted,
    /// `None` only once moved into a link or handed out raw.
    seg: Option<Segment>,
    side: Side,
    pid: i32,
    cfg: TransportConfig,
}

impl ShmConnection {
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
    /// The peer's process id, as the kernel named it.
    pub fn peer_pid(&self) -> i32 {
        self.pid
    }

    /// The segment and the stream's framing state, for callers that speak the ring
    /// themselves (see [`RawShm`]).
    pub fn into_raw(mut self) -> Result<RawShm, TransportError> {
        let seg = self.seg.take().ok_or(TransportError::Shutdown)?;
        let (me, encoder, decoder) = self.take_framing();
        Ok(RawShm::new(seg, self.side, me, encoder, decoder))
    }

    /// Turns a `Role::Data` connection into the data link to its peer, with its pump.
    pub fn into_link(mut self) -> Result<ShmLink, TransportError> {
        let role = self.role();
        if role != Role::Data {
            return Err(TransportError::WrongRole {
                expected: Role::Data,
                found: role,
            });
        }
        let peer = self.greeted.peer();
        let seg = self.seg.take().ok_or(TransportError::Shutdown)?;
        let (me, encoder, decoder) = self.take_framing();
        let shared = Arc::new(Shared::new(
            seg,
            self.side,
            peer,
            decoder,
            Outbound::new(encoder, me),
            PeerProcess::watch(self.pid),
            &self.cfg,
        ));
        let pumped = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("chorus-shm-{}", peer.sender.0))
            .spawn(move || pump::run(pumped));
        if let Err(e) = spawned {
            // No pump to carry a departure: the closed word alone ends the peer's link at
            // once (a lost stream), rather than leaving it waiting on a segment nobody
            // serves.
            shared.set_closed();
            return Err(TransportError::io("spawn shm pump")(e));
        }
        Ok(ShmLink {
            shared,
            spin: crate::spin::SpinBudget::new(self.cfg.recv_spin),
            near: self.cfg.recv_spin.saturating_mul(2),
        })
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
/// took): the peer, which may have made its end a link already, reads a departure with
/// [`GIVEN_UP`] in the ring before the closed word, so it ends at once and takes this side
/// for a live one that refused (SPEC 6), not for a lost one. A role other than `Data` gets
/// no frame: on a control stream any `Depart` means the sender left (SPEC 9.2).
impl Drop for ShmConnection {
    fn drop(&mut self) {
        let data = self.role() == Role::Data;
        let Some(seg) = self.seg.take() else { return };
        let (me, encoder, decoder) = self.take_framing();
        let mut raw = RawShm::new(seg, self.side, me, encoder, decoder);
        if data {
            raw.depart_now(GIVEN_UP, GIVEN_UP_DETAIL);
        }
        raw.close();
    }
}

async fn connect_unix(name: &str, cfg: &TransportConfig) -> Result<UnixStream, TransportError> {
    let addr = unix::address(name).map_err(TransportError::io("shm address"))?;
    let start = Instant::now();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let err = match std::os::unix::net::UnixStream::connect_addr(&addr) {
            Ok(s) => {
                s.set_nonblocking(true)
                    .map_err(TransportError::io("set nonblocking"))?;
                return UnixStream::from_std(s).map_err(TransportError::io("register shm socket"));
            }
            Err(e) => e,
        };
        let delay = cfg.backoff.delay(attempt - 1);
        if attempt >= cfg.backoff.attempts || start.elapsed() + delay > cfg.connect_timeout {
            return Err(TransportError::ConnectTimeout {
                addr: NO_ADDR,
                attempts: attempt,
                elapsed: start.elapsed(),
                last: format!("shm listener {name}: {err}"),
            });
        }
        tokio::time::sleep(delay).await;
    }
}

async fn accept_loop(
    listener: tokio::net::UnixListener,
    inner: Arc<Inner>,
    admission: Admission,
    tx: mpsc::Sender<ShmConnection>,
) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(permit) = pending.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("shm accept: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let inner = inner.clone();
        let admission = admission.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match accept_one(stream, &inner, &admission).await {
                Ok(conn) => {
                    let _ = tx.send(conn).await;
                }
                Err(e) => tracing::info!(code = %e.code(), "refused shm connection: {e}"),
            }
        });
    }
}

/// The acceptor's side of one connection: the handshake, then the segment.
async fn accept_one(
    mut stream: UnixStream,
    inner: &Inner,
    admission: &Admission,
) -> Result<ShmConnection, TransportError> {
    let deadline = Instant::now() + inner.cfg.handshake_timeout;
    let mut config = AcceptorConfig::new(inner.secret.clone(), fresh::nonce(), deadline);
    config.limits = inner.cfg.limits();
    let (mut r, mut w) = stream.split();
    let greeted = handshake::accept(&mut r, &mut w, NO_ADDR, config, admission).await?;
    if greeted.decoder.buffered() != 0 {
        return Err(closed("bytes after the handshake on the shm socket"));
    }
    let take = async {
        let (byte, fd) = unix::recv_fd(&stream)
            .await
            .map_err(TransportError::io("receive shm segment"))?;
        let (unix::SEGMENT, Some(fd)) = (byte, fd) else {
            return Err(closed("no segment after the handshake"));
        };
        let seg = Segment::accept(fd, inner.cfg.shm_ring).map_err(segment_error)?;
        stream
            .write_all(&[unix::MAPPED])
            .await
            .map_err(TransportError::io("answer shm segment"))?;
        Ok(seg)
    };
    let seg = within(deadline, take).await?;
    Ok(ShmConnection {
        pid: unix::peer_pid(&stream),
        greeted,
        seg: Some(seg),
        side: Side::Acceptor,
        cfg: inner.cfg.clone(),
    })
}

async fn within<T>(
    deadline: Instant,
    f: impl std::future::Future<Output = Result<T, TransportError>>,
) -> Result<T, TransportError> {
    match tokio::time::timeout_at(deadline.into(), f).await {
        Ok(result) => result,
        Err(_) => Err(TransportError::HandshakeTimeout {
            addr: NO_ADDR,
            timeout: deadline.saturating_duration_since(Instant::now()),
        }),
    }
}

fn closed(detail: &str) -> TransportError {
    TransportError::Closed {
        addr: NO_ADDR,
        detail: detail.into(),
    }
}

fn segment_error(e: segment::SegmentError) -> TransportError {
    TransportError::Closed {
        addr: NO_ADDR,
        detail: format!("shm segment: {e}"),
    }
}
