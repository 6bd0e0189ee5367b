//! Bootstrap as the runtime carries it out: where the root is (a token, or the launch
//! environment, hosting the root on rank 0 when only an address is shared), joining it for
//! the first epoch's peer table, or asking a running communicator to admit this process;
//! then the lineage's task and its first epoch, all by the caller's deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use chorus_engine::Context;
use chorus_protocol::message::{Join, Message, Role, Welcome};
use chorus_protocol::{Envelope, Epoch, Rank};
use chorus_transport::{ControlChannel, Fingerprint};

use super::epoch::{EpochState, Inbox, start_lineage};
use super::lineage::LineageHandle;
use super::root::RootHost;
use super::{Session, millis, tokio_instant};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::launch::{self, RootSpec, SecretSource};
use crate::unique_id::{UniqueId, derived_comm};

/// A lineage's first epoch, ready to run operations: what a communicator is made of.
pub(crate) struct Founded {
    pub(crate) session: Arc<Session>,
    pub(crate) lineage: Arc<LineageHandle>,
    pub(crate) epoch: Arc<EpochState>,
    /// The root of everything the communicator and its descendants run.
    pub(crate) life: Context,
}

/// Where this process joins, as the launch environment says.
pub(crate) struct Joining {
    pub(crate) id: UniqueId,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    /// The bootstrap root this process hosts for the job (rank 0, when only an address
    /// is shared).
    pub(crate) root: Option<RootHost>,
}

/// Reads the launch environment (`CHORUS_*`, torchrun, Slurm, Open MPI; see
/// [`crate::launch`]). Without a token, rank 0 hosts the bootstrap root at the named
/// address.
pub(crate) async fn from_env(config: &Config) -> Result<Joining> {
    let launch = launch::detect().map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    let (rank, world) = (launch.rank.get(), launch.world);
    match launch.root {
        RootSpec::Token(id) => Ok(Joining {
            id,
            rank,
            world,
            root: None,
        }),
        RootSpec::Address {
            addr,
            bind,
            secret,
            secret_from,
            ..
        } => {
            if secret_from == SecretSource::DerivedInsecure {
                tracing::warn!(
                    %bind,
                    "CHORUS_INSECURE_DERIVED_SECRET=1: the job secret is derived from the \
                     launch environment while the root is reachable beyond this host; anyone \
                     who can reach it can join the job"
                );
            }
            let comm = derived_comm(&secret);
            let root = if launch.rank == Rank(0) {
                let root = RootHost::start_with(bind, world, config, secret.clone(), comm, false)
                    .await
                    .map_err(|e| match e.kind() {
                        // The told address may not be this host's (a NAT, a service name).
                        ErrorKind::Transport => Error::new(
                            ErrorKind::Transport,
                            format!(
                                "root at {bind}: {e} (set CHORUS_ROOT_BIND to an address of \
                                 this host, or 0.0.0.0 for every interface)"
                            ),
                        ),
                        _ => e,
                    })?;
                Some(root)
            } else {
                None
            };
            let id = UniqueId {
                comm,
                root: addr,
                fingerprint: Fingerprint::ANY.0,
                secret,
            };
            Ok(Joining {
                id,
                rank,
                world,
                root,
            })
        }
    }
}

/// Joins the communicator `id` names as `rank` of `world`: once every member has joined
/// and every data link is up, or fails by `config.init_timeout`.
pub(crate) async fn init(id: &UniqueId, rank: u32, world: u32, config: Config) -> Result<Founded> {
    config
        .check()
        .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    if world == 0 || rank >= world {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("rank {rank} outside a world of {world}"),
        ));
    }
    let started = Instant::now();
    let deadline = started + config.init_timeout;
    let rank = Rank(rank);
    let session = Session::start(config.clone(), id.secret.clone()).await?;
    let inbox = Inbox::serve(&session, id.comm, Epoch(0), rank);
    let welcome = {
        let (session, id) = (session.clone(), id.clone());
        session
            .clone()
            .run(join_root(session, id, rank, world, deadline))
            .await??
    };
    let life = Context::root();
    let (lineage, epoch) = start_lineage(&session, welcome, rank, inbox, &life, deadline).await?;
    tracing::info!(comm = %epoch.comm, rank = %rank, world, ms = millis(started.elapsed()), "communicator ready");
    Ok(Founded {
        session,
        lineage,
        epoch,
        life,
    })
}

/// Joins a running communicator as a new member, by `config.agree_timeout` (its members
/// admit this process with a grow).
pub(crate) async fn join(token: &UniqueId, config: Config) -> Result<Founded> {
    config
        .check()
        .map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
    let started = Instant::now();
    let deadline = started + config.agree_timeout;
    let session = Session::start(config.clone(), token.secret.clone()).await?;
    let welcome = {
        let (s, t) = (session.clone(), token.clone());
        session.clone().run(ask_to_join(s, t, deadline)).await??
    };
    let fingerprint = session.identity.fingerprint().0;
    let me = welcome
        .members
        .iter()
        .find(|p| p.fingerprint == fingerprint && p.incarnation == session.incarnation)
        .map(|p| p.rank)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Bootstrap,
                "the welcome does not list this process",
            )
        })?;
    let inbox = Inbox::serve(&session, welcome.comm, welcome.epoch, me);
    let life = Context::root();
    let (lineage, epoch) = start_lineage(&session, welcome, me, inbox, &life, deadline).await?;
    tracing::info!(rank = %me, ms = millis(started.elapsed()), "joined");
    Ok(Founded {
        session,
        lineage,
        epoch,
        life,
    })
}

/// Opens a control stream to `addr` as `role` by `deadline`; `unreachable` says what the
/// error names when the connection fails, `late` when the deadline passes.
#[allow(clippy::too_many_arguments)]
async fn open(
    session: &Session,
    addr: SocketAddr,
    fingerprint: [u8; 32],
    role: Role,
    route: Envelope,
    peer: Rank,
    deadline: Instant,
    unreachable: &str,
    late: &str,
) -> Result<ControlChannel> {
    let connect = session
        .quic
        .connect(addr, Fingerprint(fingerprint), role, route, peer);
    match tokio::time::timeout_at(tokio_instant(deadline), connect).await {
        Ok(Ok(c)) => Ok(c.into_control()),
        Ok(Err(e)) => Err(Error::new(
            ErrorKind::Bootstrap,
            format!("{unreachable}: {e}"),
        )),
        Err(_) => Err(Error::new(ErrorKind::Timeout, late.to_owned())),
    }
}

/// Joins the bootstrap root and returns the first epoch's peer table.
async fn join_root(
    session: Arc<Session>,
    id: UniqueId,
    rank: Rank,
    world: u32,
    deadline: Instant,
) -> Result<Welcome> {
    let channel = open(
        &session,
        id.root,
        id.fingerprint,
        Role::Bootstrap,
        Envelope::new(id.comm, Epoch(0), rank),
        Rank::NONE,
        deadline,
        &format!("cannot reach the root at {}", id.root),
        &format!("the root at {} did not answer in time", id.root),
    )
    .await?;
    let join = Join {
        world,
        peer: session.peer_info(rank),
    };
    let exchange = async {
        channel
            .send(Message::Join(join))
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
        channel
            .recv()
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))
    };
    let frame = match tokio::time::timeout_at(tokio_instant(deadline), exchange).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                "not every rank joined before the init deadline",
            ));
        }
    };
    let welcome = match frame.message {
        Message::Welcome(w) => w,
        Message::Reject(r) => {
            return Err(Error::new(
                ErrorKind::Bootstrap,
                format!("the root refused: {} ({})", r.detail, r.code),
            ));
        }
        other => {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("the root answered with {}", other.kind()),
            ));
        }
    };
    let mine = welcome.members.get(rank.index());
    if welcome.comm != id.comm
        || welcome.members.len() != world as usize
        || mine.is_none_or(|p| p.fingerprint != session.identity.fingerprint().0)
    {
        return Err(Error::new(
            ErrorKind::Bootstrap,
            "the root's peer table does not match this join",
        ));
    }
    Ok(welcome)
}

/// Asks a running communicator's coordinator to admit this process; returns its welcome.
async fn ask_to_join(session: Arc<Session>, token: UniqueId, deadline: Instant) -> Result<Welcome> {
    let channel = open(
        &session,
        token.root,
        token.fingerprint,
        Role::Joiner,
        Envelope::new(token.comm, Epoch(0), Rank::NONE),
        Rank(0),
        deadline,
        &format!("cannot reach {}", token.root),
        "the coordinator did not answer in time",
    )
    .await?;
    let join = Join {
        world: 0,
        peer: session.peer_info(Rank::NONE),
    };
    let exchange = async {
        channel
            .send(Message::Join(join))
            .await
            .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
        loop {
            let frame = channel
                .recv()
                .await
                .map_err(|e| Error::new(ErrorKind::Bootstrap, e.to_string()))?;
            match frame.message {
                Message::Welcome(w) => return Ok(w),
                Message::Reject(r) => {
                    return Err(Error::new(
                        ErrorKind::Bootstrap,
                        format!("refused: {} ({})", r.detail, r.code),
                    ));
                }
                _ => {}
            }
        }
    };
    match tokio::time::timeout_at(tokio_instant(deadline), exchange).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            "not admitted before the deadline (did the members call grow?)",
        )),
    }
}
