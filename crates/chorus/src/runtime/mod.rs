//! The runtime: the control thread that drives `chorus-control` over real transports.
//!
//! A [`Session`] is one control thread (a tokio current-thread runtime nothing else runs on:
//! not user code, not the data plane, not an embedding interpreter's GIL — principle 2), one
//! QUIC endpoint for control streams, and one data-plane listener. Every communicator a
//! process builds from one `init` (and its split, shrunk and grown descendants) shares the
//! session; each communicator lineage has a control driver task on that thread
//! ([`lineage`]).
//!
//! User-facing calls never block on the control thread's runtime: they send a request and
//! await a reply the control thread always gives by a deadline (or drops, which is also an
//! answer), so every wait of `init`, `shrink`, `grow` and `destroy` is bounded by the
//! control thread's clock.

pub(crate) mod bootstrap;
pub(crate) mod carrier;
pub(crate) mod clock;
pub(crate) mod epoch;
pub(crate) mod host_identity;
pub(crate) mod lineage;
pub(crate) mod links;
pub(crate) mod mailbox;
pub(crate) mod process_watch;
pub(crate) mod registry;
pub(crate) mod root;
pub(crate) mod root_link;
pub(crate) mod same_host;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use chorus_protocol::message::{PeerInfo, Role, WireAddr};
use chorus_protocol::{CloseCode, JobSecret, Rank};
use chorus_transport::{
    Backend, Identity, Liveness, QuicEndpoint, ShmListener, ShmTransport, TcpListener,
    TcpTransport, TransportConfig, TransportError,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::config::{Config, TransportChoice};
use crate::error::{Error, ErrorKind};
pub(crate) use clock::Clock;
use registry::Registry;

/// The longest `destroy` waits for the control endpoint's remaining closes to leave the
/// process (the member streams' closes are awaited one by one before this, see
/// `lineage::channels`; this covers the rest: data connections over QUIC, strays).
const QUIC_DRAIN_MAX: Duration = Duration::from_millis(20);

/// One control thread and the endpoints it serves.
pub(crate) struct Session {
    pub(crate) config: Config,
    pub(crate) secret: JobSecret,
    pub(crate) identity: Identity,
    /// This host's identity string (`host_identity::identity`).
    pub(crate) host: String,
    pub(crate) clock: Clock,
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) quic: QuicEndpoint,
    pub(crate) control_addr: SocketAddr,
    /// The TCP transport for data links (`None` when data goes over QUIC).
    pub(crate) tcp: Option<TcpTransport>,
    pub(crate) data_addr: SocketAddr,
    /// The shm transport for same-host data links (`CHORUS_TRANSPORT` `auto` or `shm`).
    pub(crate) shm: Option<ShmTransport>,
    /// Its listener, until the accept loops start.
    shm_listener: Mutex<Option<ShmListener>>,
    pub(crate) registry: Arc<Registry>,
    /// Distinguishes this process's incarnation in peer tables.
    pub(crate) incarnation: u64,
    /// Communicators alive on this session: the last one to be destroyed stops it.
    live: std::sync::atomic::AtomicUsize,
    /// Stops the control thread; with a deadline, it first lets the endpoint's closes out.
    stop: Mutex<Option<oneshot::Sender<Option<Instant>>>>,
    exited: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("control", &self.control_addr)
            .field("data", &self.data_addr)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Starts a control thread with its endpoints bound on `config.bind`; resolves once they
    /// listen (or with the reason they cannot).
    pub(crate) async fn start(config: Config, secret: JobSecret) -> Result<Arc<Session>, Error> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = std::sync::mpsc::channel();
        let spawned = thread::Builder::new()
            .name("chorus-control".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::new(
                            ErrorKind::Internal,
                            format!("cannot build the control thread's runtime: {e}"),
                        )));
                        return;
                    }
                };
                rt.block_on(async move {
                    let (stop_tx, stop_rx) = oneshot::channel();
                    match Session::bind(config, secret, stop_tx).await {
                        Ok((session, listener)) => {
                            session.spawn_accept_loops(listener);
                            let quic = session.quic.clone();
                            let _ = ready_tx.send(Ok(session.clone()));
                            drop(session);
                            // Serve until the last communicator lets the session go.
                            if let Ok(Some(deadline)) = stop_rx.await {
                                // Departure is a message: the closes must leave before
                                // the process may (principle 1), within the budget.
                                quic.close(CloseCode::NORMAL, "session closed");
                                let _ = tokio::time::timeout_at(
                                    tokio_instant(deadline),
                                    quic.wait_idle(),
                                )
                                .await;
                            }
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
                // Dropping the runtime cancels every task still on it; their connections close.
                drop(rt);
                let _ = exited_tx.send(());
            });
        if let Err(e) = spawned {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("cannot start the control thread: {e}"),
            ));
        }
        let session = ready_rx.await.map_err(|_| {
            Error::new(
                ErrorKind::Internal,
                "the control thread ended while starting",
            )
        })??;
        *session.exited.lock() = Some(exited_rx);
        Ok(session)
    }

    async fn bind(
        config: Config,
        secret: JobSecret,
        stop: oneshot::Sender<Option<Instant>>,
    ) -> Result<(Arc<Session>, Option<TcpListener>), Error> {
        let transport_error = |what: &str, e: TransportError| {
            Error::new(ErrorKind::Transport, format!("{what}: {e}"))
        };
        let identity =
            Identity::generate().map_err(|e| transport_error("cannot make a certificate", e))?;
        let registry = Arc::new(Registry::default());
        // Each endpoint admits only the roles it serves (SPEC.md 5.2: anything else is a
        // protocol violation): the QUIC endpoint control streams, and data streams only
        // when data goes over QUIC; the TCP listener data streams only.
        let data_over_quic = config.transport == TransportChoice::Quic;
        let admission: chorus_transport::Admission = {
            let registry = registry.clone();
            Arc::new(move |comm, epoch, sender, role| match role {
                Role::Data if !data_over_quic => Err((
                    CloseCode::PROTOCOL_VIOLATION,
                    "data streams go to the data listener".into(),
                )),
                role => registry.admit(comm, epoch, sender, role),
            })
        };
        let data_admission: chorus_transport::Admission = {
            let registry = registry.clone();
            Arc::new(move |comm, epoch, sender, role| match role {
                Role::Data => registry.admit(comm, epoch, sender, role),
                _ => Err((
                    CloseCode::PROTOCOL_VIOLATION,
                    "the data listener serves data streams only".into(),
                )),
            })
        };
        let tcfg = transport_config(&config);
        let liveness = Liveness {
            heartbeat_interval: config.heartbeat_interval,
            deadline: config.heartbeat_deadline,
        };
        let quic = QuicEndpoint::bind(
            SocketAddr::new(config.bind, 0),
            &identity,
            secret.clone(),
            tcfg.clone(),
            liveness,
            admission.clone(),
        )
        .map_err(|e| transport_error("cannot bind the control endpoint", e))?;
        let control_addr = quic
            .local_addr()
            .map_err(|e| transport_error("control endpoint address", e))?;
        let (tcp, listener, data_addr) = match config.transport {
            TransportChoice::Quic => (None, None, control_addr),
            _ => {
                let tcp = TcpTransport::new(tcfg.clone(), secret.clone())
                    .map_err(|e| transport_error("cannot start the TCP transport", e))?;
                let listener = tcp
                    .listen(SocketAddr::new(config.bind, 0), data_admission.clone())
                    .await
                    .map_err(|e| transport_error("cannot listen for data links", e))?;
                let addr = listener.local_addr();
                (Some(tcp), Some(listener), addr)
            }
        };
        let (shm, shm_listener) = match config.transport {
            TransportChoice::Auto | TransportChoice::Shm => {
                let fingerprint = identity.fingerprint().0;
                match same_host::listen(&tcfg, &secret, &fingerprint, data_admission).await {
                    Ok((t, l)) => (Some(t), Some(l)),
                    // Shared memory is an optimisation under `auto`: without it, same-host
                    // peers are reached over TCP like any other (they see no `caps::SHM`).
                    Err(e) if config.transport == TransportChoice::Auto => {
                        tracing::warn!(error = %e, "no shm listener; same-host peers use tcp");
                        (None, None)
                    }
                    Err(e) => return Err(transport_error("cannot listen for shm data links", e)),
                }
            }
            _ => (None, None),
        };
        tracing::debug!(%control_addr, %data_addr, "session bound");
        let session = Arc::new(Session {
            host: host_identity::identity(),
            clock: Clock::new(),
            handle: tokio::runtime::Handle::current(),
            incarnation: rand::random(),
            config,
            secret,
            identity,
            quic,
            control_addr,
            tcp,
            data_addr,
            shm,
            shm_listener: Mutex::new(shm_listener),
            registry,
            live: std::sync::atomic::AtomicUsize::new(0),
            stop: Mutex::new(Some(stop)),
            exited: Mutex::new(None),
        });
        Ok((session, listener))
    }

    /// A communicator now runs on this session.
    pub(crate) fn enter(&self) {
        self.live.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A communicator on this session is gone.
    pub(crate) fn leave(&self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// How many communicators run on this session.
    pub(crate) fn live(&self) -> usize {
        self.live.load(std::sync::atomic::Ordering::Acquire)
    }

    /// This member's entry in a peer table.
    pub(crate) fn peer_info(&self, rank: Rank) -> PeerInfo {
        let mut caps = chorus_protocol::caps::QUIC;
        if self.tcp.is_some() {
            caps |= chorus_protocol::caps::TCP;
        }
        if self.shm.is_some() {
            caps |= chorus_protocol::caps::SHM;
        }
        PeerInfo {
            rank,
            host: self.host.clone(),
            pid: std::process::id(),
            control: wire_addr(self.control_addr),
            data: wire_addr(self.data_addr),
            fingerprint: self.identity.fingerprint().0,
            caps,
            incarnation: self.incarnation,
        }
    }

    /// Runs `fut` on the control thread and returns its output, without ever blocking the
    /// caller's executor (the reply arrives through a channel the control thread answers).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        // A oneshot receiver needs no runtime to be awaited, and it fails (rather than
        // hangs) if the control thread drops the task.
        rx.await
            .map_err(|_| Error::new(ErrorKind::Internal, "the control thread went away"))
    }

    fn spawn_accept_loops(self: &Arc<Self>, listener: Option<TcpListener>) {
        let shm = self.shm_listener.lock().take();
        if let Some(shm) = shm {
            same_host::spawn_accept_loop(self, shm);
        }
        let weak = Arc::downgrade(self);
        let quic = self.quic.clone();
        self.handle.spawn(async move {
            loop {
                match quic.accept(Duration::from_secs(3600)).await {
                    Ok(conn) => {
                        let Some(session) = weak.upgrade() else { break };
                        session.route_quic(conn);
                    }
                    Err(TransportError::Shutdown) => break,
                    Err(e) => {
                        if weak.strong_count() == 0 {
                            break;
                        }
                        tracing::trace!(error = %e, "control accept");
                    }
                }
            }
        });
        if let Some(mut listener) = listener {
            let weak = Arc::downgrade(self);
            self.handle.spawn(async move {
                loop {
                    match listener.accept(Duration::from_secs(3600)).await {
                        Ok(conn) => {
                            let Some(session) = weak.upgrade() else { break };
                            let (comm, epoch, peer) = (conn.comm(), conn.epoch(), conn.peer_rank());
                            // Refused before a link reads it, so the departure always goes
                            // out (a link's close departs only if nothing failed it first).
                            if let Some(detail) = session.registry.refusal(comm, epoch, peer) {
                                // Its own task: the flush takes up to the depart budget.
                                tokio::spawn(conn.refuse(CloseCode::DUPLICATE_RANK, detail));
                                continue;
                            }
                            match conn.into_link() {
                                Ok(link) => {
                                    session.registry.deliver(comm, epoch, peer, Arc::new(link))
                                }
                                Err(e) => tracing::debug!(error = %e, "refused a data connection"),
                            }
                        }
                        Err(TransportError::Shutdown) => break,
                        Err(e) => {
                            if weak.strong_count() == 0 {
                                break;
                            }
                            tracing::trace!(error = %e, "data accept");
                        }
                    }
                }
            });
        }
    }

    fn route_quic(self: &Arc<Self>, conn: chorus_transport::QuicConnection) {
        let (comm, epoch, peer, role) = (conn.comm(), conn.epoch(), conn.peer_rank(), conn.role());
        match role {
            Role::Data => match conn.into_link() {
                Ok(link) => self.registry.deliver(comm, epoch, peer, Arc::new(link)),
                Err(e) => tracing::debug!(error = %e, "refused a QUIC data connection"),
            },
            Role::Member | Role::Launcher | Role::Joiner | Role::Status => {
                let Some(lineage) = self.registry.lineage(comm) else {
                    let channel = conn.into_control();
                    channel.close(CloseCode::UNKNOWN_COMM, "communicator gone");
                    return;
                };
                let channel = Arc::new(conn.into_control());
                let _ = lineage.send(mailbox::LineageMsg::Channel {
                    peer,
                    epoch,
                    role,
                    channel,
                });
            }
            Role::Bootstrap => {
                conn.into_control()
                    .close(CloseCode::UNKNOWN_COMM, "not a bootstrap root");
            }
        }
    }

    /// Stops the control thread, waiting for it at most `budget`; a thread that does not
    /// stop in time is left behind with a warning rather than waited on (principle 3).
    pub(crate) fn shutdown(&self, budget: Duration) {
        // The control thread closes the endpoint and waits (bounded) for the closes to
        // leave: they go out at the endpoint's next turn, but nothing says when they did,
        // short of the connections' whole drain period (three probe timeouts, long after a
        // peer stalled), so the wait is capped. A little of the budget is kept for the
        // thread itself to end.
        let drain = Instant::now() + budget.saturating_sub(budget / 8).min(QUIC_DRAIN_MAX);
        if let Some(stop) = self.stop.lock().take()
            && stop.send(Some(drain)).is_err()
        {
            self.quic.close(CloseCode::NORMAL, "session closed");
        }
        let exited = self.exited.lock().take();
        if let Some(exited) = exited
            && exited.recv_timeout(budget).is_err()
        {
            tracing::warn!("control thread did not stop within {budget:?}; leaving it");
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().take() {
            let _ = stop.send(None);
        }
    }
}

/// The transport knobs derived from the communicator's configuration.
fn transport_config(config: &Config) -> TransportConfig {
    TransportConfig {
        backend: match config.transport {
            TransportChoice::TcpUring => Backend::Uring,
            TransportChoice::TcpEpoll => Backend::Epoll,
            TransportChoice::Auto
            | TransportChoice::Tcp
            | TransportChoice::Quic
            | TransportChoice::Shm => Backend::Auto,
        },
        connect_timeout: config.init_timeout,
        // A departure's close gets half the teardown budget, as the lineage's departures.
        depart_timeout: config.teardown_budget / 2,
        ..TransportConfig::default()
    }
}

/// A socket address as the protocol carries it (IPv4 as IPv4-mapped IPv6).
pub(crate) fn wire_addr(addr: SocketAddr) -> WireAddr {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    WireAddr {
        ip: ip.octets(),
        port: addr.port(),
    }
}

/// The socket address a peer table entry names.
pub(crate) fn socket_addr(addr: &WireAddr) -> SocketAddr {
    let ip = std::net::Ipv6Addr::from(addr.ip);
    let ip = ip
        .to_ipv4_mapped()
        .map(IpAddr::V4)
        .unwrap_or(IpAddr::V6(ip));
    SocketAddr::new(ip, addr.port)
}

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `deadline` as a tokio instant.
pub(crate) fn tokio_instant(deadline: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(deadline)
}
