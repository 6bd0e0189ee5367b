//! The bootstrap root: it collects one `Join` per rank and answers each with the same
//! `Welcome` (chorus-control's `Rendezvous` decides; this drives it over QUIC).
//!
//! It runs in whichever process made the `UniqueId` — the launcher (`chorus run`), a rank
//! that called [`RootHost::start`] and handed the token out, or rank 0 of a launch that
//! only names an address (torchrun's `MASTER_ADDR:MASTER_PORT`) — on its own thread, so it
//! answers whatever that process is doing. After bootstrap it keeps the peer table, which
//! is what lets a launcher tell the job that a rank's process exited (`witness_exit`), and
//! what it hands a status client (`chorus status`, SPEC section 13) that knows only the
//! token: a `StatusRequest` on a `Status` stream is answered with the table, so the client
//! can then ask every member.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use chorus_control::Rendezvous;
use chorus_protocol::message::{
    Evidence, Message, Notice, PeerInfo, Role, StatusReply, Verdict, Welcome,
};
use chorus_protocol::{CloseCode, CommId, Envelope, Epoch, JobSecret, Rank};
use chorus_transport::{
    Admission, ControlChannel, Fingerprint, Identity, Liveness, QuicEndpoint, TransportError,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{Clock, socket_addr, tokio_instant};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::introspection::Member;
use crate::unique_id::{UniqueId, random_secret};

/// A running bootstrap root. Dropping it stops the root (bounded by the teardown budget).
pub struct RootHost {
    id: UniqueId,
    world: u32,
    quic: QuicEndpoint,
    members: Arc<Mutex<Option<Vec<PeerInfo>>>>,
    stop: Option<oneshot::Sender<()>>,
    /// Exits the launcher witnessed, for the serving task (`witness_exit`).
    exits: mpsc::UnboundedSender<(Rank, i32)>,
    exited: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    teardown: Duration,
}

impl std::fmt::Debug for RootHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootHost")
            .field("id", &self.id)
            .field("world", &self.world)
            .finish()
    }
}

impl RootHost {
    /// Starts a root for `world` ranks listening on `addr` (port 0 picks a free port) with a
    /// fresh job secret and communicator id; [`RootHost::unique_id`] is the token to hand
    /// to the ranks. The ranks must all join within `config.init_timeout`.
    pub fn start(addr: SocketAddr, world: u32, config: &Config) -> Result<RootHost, Error> {
        let secret = random_secret();
        let comm = CommId(rand::random());
        futures::executor::block_on(Self::start_with(addr, world, config, secret, comm, true))
    }

    /// Starts a root with a given secret and communicator id. With `pinned` false the token
    /// carries no fingerprint ([`Fingerprint::ANY`]): for launches that only share an
    /// address, where joiners cannot know the root's certificate in advance.
    pub(crate) async fn start_with(
        addr: SocketAddr,
        world: u32,
        config: &Config,
        secret: JobSecret,
        comm: CommId,
        pinned: bool,
    ) -> Result<RootHost, Error> {
        // The root adds `init_timeout` to the clock: a configuration built in code must meet
        // the bounds an environment's does before it gets there.
        config
            .check()
            .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
        if world == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a world has at least one rank",
            ));
        }
        let (ready_tx, ready_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = std::sync::mpsc::channel();
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let config = config.clone();
        let members = Arc::new(Mutex::new(None));
        let shared = members.clone();
        let spawned = thread::Builder::new()
            .name("chorus-root".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::new(ErrorKind::Internal, e.to_string())));
                        return;
                    }
                };
                rt.block_on(async move {
                    let bound = bind(addr, &config, secret.clone(), comm);
                    let (quic, identity) = match bound {
                        Ok(b) => b,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let local = match quic.local_addr() {
                        Ok(a) => a,
                        Err(e) => {
                            let _ =
                                ready_tx.send(Err(Error::new(ErrorKind::Transport, e.to_string())));
                            return;
                        }
                    };
                    let fingerprint = if pinned {
                        identity.fingerprint().0
                    } else {
                        Fingerprint::ANY.0
                    };
                    let id = UniqueId {
                        comm,
                        root: local,
                        fingerprint,
                        secret,
                    };
                    let (stop_tx, stop_rx) = oneshot::channel();
                    let _ = ready_tx.send(Ok((id, quic.clone(), stop_tx)));
                    serve(quic, comm, world, config, shared, stop_rx, exits_rx).await;
                });
                drop(rt);
                let _ = exited_tx.send(());
            });
        if let Err(e) = spawned {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("cannot start the root: {e}"),
            ));
        }
        let (id, quic, stop) = ready_rx.await.map_err(|_| {
            Error::new(ErrorKind::Internal, "the root thread ended while starting")
        })??;
        Ok(RootHost {
            id,
            world,
            quic,
            members,
            stop: Some(stop),
            exits: exits_tx,
            exited: Mutex::new(Some(exited_rx)),
            teardown: Duration::from_secs(2),
        })
    }

    /// The token the ranks need (`Comm::init`, or `CHORUS_UNIQUE_ID`).
    pub fn unique_id(&self) -> &UniqueId {
        &self.id
    }

    /// The world size this root bootstraps.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The peer table, once every rank has joined.
    pub fn members(&self) -> Option<Vec<Member>> {
        let members = self.members.lock();
        members
            .as_ref()
            .map(|m| m.iter().map(Member::from).collect())
    }

    /// Tells the job that `rank`'s process exited with `status` (negative: killed by that
    /// signal), as the launcher that witnessed it. Before every rank has joined, bootstrap
    /// ends at once with a `Reject` naming the rank (it will never join; nobody waits out
    /// the init deadline for it). After, a `Notice` with `LauncherWitness` evidence goes to
    /// up to three of its neighbours, which spread it. Best effort and bounded; it returns
    /// at once. Valid for the first epoch's numbering.
    pub fn witness_exit(&self, rank: u32, status: i32) {
        // The serving task decides which of the two applies, so an exit that races the
        // last join is still told to someone.
        let _ = self.exits.send((Rank(rank), status));
    }
}

/// Sends `rank`'s witnessed exit to up to three of its neighbours in `members` (also what
/// a node launcher without the root does, [`super::root_link`]).
pub(crate) async fn witness(
    quic: QuicEndpoint,
    comm: CommId,
    members: Vec<PeerInfo>,
    rank: Rank,
    status: i32,
) {
    let n = members.len();
    if rank.index() >= n || n < 2 {
        return;
    }
    let targets: Vec<PeerInfo> = [1, 2, n - 1]
        .iter()
        .map(|d| (rank.index() + d) % n)
        .filter(|&i| i != rank.index())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|i| members[i].clone())
        .collect();
    let notice = launcher_notice(rank, status);
    let sends = targets.into_iter().map(|peer| {
        send_witness(
            quic.clone(),
            comm,
            socket_addr(&peer.control),
            Fingerprint(peer.fingerprint),
            peer.rank,
            notice,
        )
    });
    futures::future::join_all(sends).await;
}

/// Tells the bootstrap root at `root` that `rank` exited with `status` before the job had
/// its peer table (a node launcher on another node; SPEC 8: the root then refuses every
/// joiner with `aborted` at once instead of waiting out its deadline).
pub(crate) async fn tell_root(
    quic: QuicEndpoint,
    comm: CommId,
    root: SocketAddr,
    fingerprint: Fingerprint,
    rank: Rank,
    status: i32,
) {
    let notice = launcher_notice(rank, status);
    send_witness(quic, comm, root, fingerprint, Rank::NONE, notice).await;
}

fn launcher_notice(rank: Rank, status: i32) -> Notice {
    Notice {
        origin: Rank::NONE,
        subject: rank,
        verdict: Verdict::Dead,
        evidence: Evidence::LauncherWitness { status },
        hops: 0,
    }
}

/// One witness `notice` on a `Launcher` stream to `addr` (best effort, bounded: 2 s to
/// connect, 1 s to send and see it arrive). A QUIC close discards stream data not yet
/// delivered, so the stream is closed only once the receiver closed it (the root does,
/// once it took the notice) or the second is up.
async fn send_witness(
    quic: QuicEndpoint,
    comm: CommId,
    addr: SocketAddr,
    fingerprint: Fingerprint,
    peer: Rank,
    notice: Notice,
) {
    let route = Envelope::new(comm, Epoch(0), Rank::NONE);
    let connect = quic.connect(addr, fingerprint, Role::Launcher, route, peer);
    let ch = tokio::time::timeout(Duration::from_secs(2), connect).await;
    if let Ok(Ok(conn)) = ch {
        let ch = conn.into_control();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            if ch.send(Message::Notice(notice)).await.is_ok() {
                // Returns when the receiver closes (or sends, which it never does).
                let _ = ch.recv().await;
            }
        })
        .await;
        ch.close(CloseCode::NORMAL, "witness delivered");
    }
}

impl Drop for RootHost {
    fn drop(&mut self) {
        self.quic.close(CloseCode::NORMAL, "root stopped");
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let exited = self.exited.lock().take();
        if let Some(exited) = exited
            && exited.recv_timeout(self.teardown).is_err()
        {
            tracing::warn!("bootstrap root did not stop within {:?}", self.teardown);
        }
    }
}

fn bind(
    addr: SocketAddr,
    config: &Config,
    secret: JobSecret,
    comm: CommId,
) -> Result<(QuicEndpoint, Identity), Error> {
    let transport =
        |what: &str, e: TransportError| Error::new(ErrorKind::Transport, format!("{what}: {e}"));
    let identity = Identity::generate().map_err(|e| transport("root certificate", e))?;
    // Only bootstrap and launcher streams of this communicator at epoch 0, and status
    // clients of it, are admitted. Another role is one this endpoint does not serve (SPEC 5.2:
    // `protocol-violation`); another communicator, or a later epoch, is not served here.
    let admission: Admission = Arc::new(move |c, epoch, _, role| match role {
        _ if c != comm => Err((
            CloseCode::UNKNOWN_COMM,
            format!("this root bootstraps {comm} only"),
        )),
        Role::Status => Ok(Rank::NONE),
        // A node launcher on another node witnessing one of its ranks (SPEC 8).
        Role::Bootstrap | Role::Launcher if epoch == Epoch(0) => Ok(Rank::NONE),
        Role::Bootstrap => Err((
            CloseCode::UNKNOWN_COMM,
            format!("this root bootstraps {comm} at epoch 0 only"),
        )),
        other => Err((
            CloseCode::PROTOCOL_VIOLATION,
            format!("a bootstrap root does not serve {other:?} streams"),
        )),
    });
    let liveness = Liveness {
        heartbeat_interval: config.heartbeat_interval,
        deadline: config.heartbeat_deadline,
    };
    let quic = QuicEndpoint::bind(
        addr,
        &identity,
        secret,
        chorus_transport::TransportConfig::default(),
        liveness,
        admission,
    )
    .map_err(|e| transport(&format!("cannot bind the bootstrap root on {addr}"), e))?;
    Ok((quic, identity))
}

enum RootEvent {
    Join(u64, chorus_protocol::message::Join),
    Closed(u64),
    /// A node launcher on another node witnessed one of its ranks exit.
    Exited(Rank, i32),
}

/// Serves bootstrap streams until stopped.
async fn serve(
    quic: QuicEndpoint,
    comm: CommId,
    world: u32,
    config: Config,
    members: Arc<Mutex<Option<Vec<PeerInfo>>>>,
    mut stop: oneshot::Receiver<()>,
    mut exits: mpsc::UnboundedReceiver<(Rank, i32)>,
) {
    let clock = Clock::new();
    let Ok(mut rendezvous) = Rendezvous::<u64>::new(comm, world, clock.now(), config.init_timeout)
    else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut streams: HashMap<u64, Arc<ControlChannel>> = HashMap::new();
    let mut next = 0u64;
    let mut done = false;
    loop {
        let timer = rendezvous.poll_timeout().map(|t| clock.std(t));
        let sleep = async {
            match timer {
                Some(t) => tokio::time::sleep_until(tokio_instant(t)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => break,
            accepted = quic.accept(Duration::from_secs(3600)) => match accepted {
                Ok(conn) if conn.role() == Role::Status => {
                    tokio::spawn(answer_status(conn.into_control(), world, members.clone()));
                }
                Ok(conn) if conn.role() == Role::Launcher => {
                    tokio::spawn(take_witness(conn.into_control(), world, tx.clone()));
                }
                Ok(conn) => {
                    let id = next;
                    next += 1;
                    let ch = Arc::new(conn.into_control());
                    streams.insert(id, ch.clone());
                    let tx = tx.clone();
                    let deadline = Instant::now() + config.init_timeout;
                    tokio::spawn(async move {
                        match tokio::time::timeout_at(tokio_instant(deadline), ch.recv()).await {
                            Ok(Ok(frame)) => {
                                if let Message::Join(join) = frame.message {
                                    let _ = tx.send(RootEvent::Join(id, join));
                                    // Stay readable to notice the joiner going away.
                                    let _ = ch.recv().await;
                                }
                                let _ = tx.send(RootEvent::Closed(id));
                            }
                            _ => {
                                let _ = tx.send(RootEvent::Closed(id));
                            }
                        }
                    });
                }
                Err(TransportError::Shutdown) => break,
                Err(_) => {}
            },
            Some(event) = rx.recv() => match event {
                RootEvent::Join(id, join) => {
                    let _ = rendezvous.handle_join(clock.now(), id, join);
                }
                RootEvent::Closed(id) => {
                    rendezvous.handle_closed(id);
                    streams.remove(&id);
                }
                RootEvent::Exited(rank, status) => {
                    exited(&mut rendezvous, &quic, comm, &members, rank, status);
                }
            },
            Some((rank, status)) = exits.recv() => {
                exited(&mut rendezvous, &quic, comm, &members, rank, status);
            }
            () = sleep => rendezvous.handle_timeout(clock.now()),
        }
        while let Some((id, message)) = rendezvous.poll_transmit() {
            if let Some(ch) = streams.get(&id).cloned() {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(5), ch.send(message)).await;
                });
            }
        }
        while let Some((id, code)) = rendezvous.poll_close() {
            if let Some(ch) = streams.remove(&id) {
                tokio::spawn(async move {
                    // Let the reject go out first.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    ch.close(code, code.name());
                });
            }
        }
        if !done && let Some(Ok(welcome)) = rendezvous.outcome() {
            done = true;
            store(&members, welcome);
        }
    }
}

/// A rank's process ended: before every rank joined, the rendezvous fails at once (that
/// rank will never join); after, the rank's neighbours are told.
fn exited(
    rendezvous: &mut Rendezvous<u64>,
    quic: &QuicEndpoint,
    comm: CommId,
    members: &Mutex<Option<Vec<PeerInfo>>>,
    rank: Rank,
    status: i32,
) {
    if rendezvous.outcome().is_none() {
        rendezvous.handle_exited(rank, status);
    } else if let Some(table) = members.lock().clone() {
        tokio::spawn(witness(quic.clone(), comm, table, rank, status));
    }
}

/// Reads a remote node launcher's witness (SPEC 4: one `Notice` with `origin` none and
/// `LauncherWitness` evidence, about a rank of this world, per stream), hands it to the
/// root and closes the stream, which tells the launcher it arrived; bounded by
/// [`STATUS_IDLE`] of silence.
async fn take_witness(ch: ControlChannel, world: u32, tx: mpsc::UnboundedSender<RootEvent>) {
    if let Ok(Ok(frame)) = tokio::time::timeout(STATUS_IDLE, ch.recv()).await
        && let Message::Notice(Notice {
            origin: Rank::NONE,
            subject,
            verdict: Verdict::Dead,
            evidence: Evidence::LauncherWitness { status },
            ..
        }) = frame.message
        && subject.get() < world
    {
        let _ = tx.send(RootEvent::Exited(subject, status));
    }
    ch.close(CloseCode::NORMAL, "witness taken");
}

/// How long a status stream may stay silent before the root closes it.
const STATUS_IDLE: Duration = Duration::from_secs(60);
/// How long one status reply may take to be written (a stuck client cannot hold the root).
const STATUS_SEND: Duration = Duration::from_secs(5);

/// Answers `StatusRequest`s on one status stream, in order, until the client closes it or
/// stays silent past [`STATUS_IDLE`]. The root is not a member: it has no ledger and no
/// flight recorder, only the world size and, once bootstrap finished, the peer table (an
/// empty table means the ranks have not all joined yet).
async fn answer_status(ch: ControlChannel, world: u32, members: Arc<Mutex<Option<Vec<PeerInfo>>>>) {
    loop {
        let frame = match tokio::time::timeout(STATUS_IDLE, ch.recv()).await {
            Ok(Ok(frame)) => frame,
            Ok(Err(_)) | Err(_) => break,
        };
        let Message::StatusRequest(request) = frame.message else {
            continue;
        };
        let table = if request.with_members {
            members.lock().clone().unwrap_or_default()
        } else {
            Vec::new()
        };
        let reply = Message::StatusReply(StatusReply {
            rank: Rank::NONE,
            epoch: Epoch(0),
            world,
            peers: Vec::new(),
            ops: Vec::new(),
            async_error: None,
            members: table,
        });
        match tokio::time::timeout(STATUS_SEND, ch.send(reply)).await {
            Ok(Ok(())) => {}
            _ => break,
        }
    }
    ch.close(CloseCode::NORMAL, "status stream idle");
}

fn store(members: &Mutex<Option<Vec<PeerInfo>>>, welcome: &Welcome) {
    *members.lock() = Some(welcome.members.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_refuses_a_timeout_past_any_clock() {
        let config = Config {
            init_timeout: Duration::MAX,
            ..Config::default()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let err = RootHost::start(addr, 2, &config).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("CHORUS_INIT_TIMEOUT"), "{err}");
    }
}
