//! Epochs as the runtime builds them: a lineage's task started on the control thread, and
//! each epoch's data plane (links to every member, the engine, the flight recorder, the
//! hooks the lineage aborts on failures), built within the caller's deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_engine::{Context, Engine, EngineConfig, HostDevice, Link};
use chorus_protocol::message::{PeerInfo, Welcome};
use chorus_protocol::{Collective, CommId, Epoch, Rank};
use tokio::sync::mpsc;

use super::lineage::{self, LineageHandle};
use super::mailbox::{DataLink, EpochHooks, LineageMsg, NextEpoch, Request};
use super::{Session, host_identity, links};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result, from_abort};
use crate::recorder::Recorder;

/// The engine a communicator runs its operations on.
pub(crate) type CommEngine = Engine<HostDevice, dyn Link<Bytes>>;

/// One epoch's data plane.
pub(crate) struct EpochState {
    pub(crate) comm: CommId,
    pub(crate) epoch: Epoch,
    pub(crate) rank: Rank,
    pub(crate) world: u32,
    pub(crate) members: Vec<PeerInfo>,
    pub(crate) hooks: Arc<EpochHooks>,
    pub(crate) engine: CommEngine,
    pub(crate) recorder: Arc<Recorder>,
}

/// A lineage task's inbox, registered with the session's registry before anyone can know
/// the communicator: peers that get the peer table first connect at once, and must be
/// admitted and routed to it.
pub(crate) struct Inbox {
    tx: mpsc::UnboundedSender<LineageMsg>,
    rx: mpsc::UnboundedReceiver<LineageMsg>,
}

impl Inbox {
    /// Serves `comm` at `epoch` as `me` from now on, into this inbox.
    pub(crate) fn serve(session: &Session, comm: CommId, epoch: Epoch, me: Rank) -> Inbox {
        let (tx, rx) = mpsc::unbounded_channel();
        session.registry.serve(comm, epoch, me, tx.clone());
        Inbox { tx, rx }
    }
}

/// Starts the lineage task of `welcome`'s communicator as `me` and builds its first epoch's
/// data plane under `life`, by `deadline`.
pub(crate) async fn start_lineage(
    session: &Arc<Session>,
    welcome: Welcome,
    me: Rank,
    inbox: Inbox,
    life: &Context,
    deadline: Instant,
) -> Result<(Arc<LineageHandle>, Arc<EpochState>)> {
    let Inbox { tx, rx } = inbox;
    let lineage = Arc::new(lineage::start(session, &welcome, me, tx, rx)?);
    let epoch = build_epoch(
        session,
        &lineage,
        life,
        welcome.comm,
        welcome.epoch,
        me,
        welcome.members,
        deadline,
    )
    .await?;
    Ok((lineage, epoch))
}

/// Builds the data plane of the epoch `next` agreed on, under `life`, by `deadline`.
pub(crate) async fn build_next(
    session: &Arc<Session>,
    lineage: &Arc<LineageHandle>,
    life: &Context,
    next: NextEpoch,
    deadline: Instant,
) -> Result<Arc<EpochState>> {
    let agreed = next.agreed;
    build_epoch(
        session,
        lineage,
        life,
        agreed.comm,
        agreed.epoch(),
        agreed.rank,
        next.table,
        deadline,
    )
    .await
}

/// Builds an epoch's data plane: links to every member, the engine, the hooks the lineage
/// aborts on failures.
#[allow(clippy::too_many_arguments)]
async fn build_epoch(
    session: &Arc<Session>,
    lineage: &Arc<LineageHandle>,
    life: &Context,
    comm: CommId,
    epoch: Epoch,
    rank: Rank,
    members: Vec<PeerInfo>,
    deadline: Instant,
) -> Result<Arc<EpochState>> {
    let world = members.len() as u32;
    let ctx = life.child();
    let recorder = Arc::new(Recorder::new(session.config.recorder_ops));
    // Attached before the links are built: a member declared absent at this epoch (now or
    // while they are built) aborts the build at once, naming it, instead of leaving it to
    // wait for that member's links until the deadline.
    let building = Arc::new(EpochHooks {
        epoch,
        ctx: ctx.clone(),
        links: Vec::new(),
        recorder: recorder.clone(),
        building: true,
    });
    lineage.request(Request::Attach(Arc::downgrade(&building)));
    let links: Vec<DataLink> = {
        let (s, m, aborted) = (session.clone(), members.clone(), ctx.aborted());
        session
            .run(async move {
                tokio::select! {
                    built = links::mesh(s, comm, epoch, rank, m, deadline) => built,
                    reason = aborted => Err(from_abort(&reason)),
                }
            })
            .await??
    };
    drop(building);
    let engine_config = for_paths(engine_config(&session.config)?, &links, &members);
    let engine = Engine::new(
        rank,
        world,
        links.clone(),
        Arc::new(HostDevice),
        &ctx,
        engine_config,
    )
    .map_err(|e| Error::new(ErrorKind::Internal, format!("engine: {e}")))?
    .with_observer(recorder.clone());
    let hooks = Arc::new(EpochHooks {
        epoch,
        ctx,
        links,
        recorder: recorder.clone(),
        building: false,
    });
    lineage.published().built(epoch);
    lineage.request(Request::Attach(Arc::downgrade(&hooks)));
    Ok(Arc::new(EpochState {
        comm,
        epoch,
        rank,
        world,
        members,
        hooks,
        engine,
        recorder,
    }))
}

/// `config` adjusted to the paths the epoch's data takes: a world whose `links` all share
/// memory takes shared memory's crossovers; a pair of `members` in two network namespaces
/// (two hosts, or a veth between them) smaller chunks ([`EngineConfig::network`], which says
/// why only pairs); any other world keeps the defaults.
///
/// Every member must choose alike, or their chunks' tags would not match: a shm link is one
/// on both ends, and the membership table is the same table everywhere, whereas each end's
/// view of the other's address need not be (a port forwarded from 127.0.0.1 arrives from a
/// bridge address).
fn for_paths(mut config: EngineConfig, links: &[DataLink], members: &[PeerInfo]) -> EngineConfig {
    if links.is_empty() {
        config
    } else if links.iter().all(|l| l.shares_memory()) {
        config.thresholds = config.thresholds.shared_memory();
        config
    } else if let [a, b] = members
        && !host_identity::one_network(&a.host, &b.host)
    {
        config.network()
    } else {
        config
    }
}

/// The engine's configuration from the communicator's (algorithm overrides checked here).
pub(crate) fn engine_config(config: &Config) -> Result<EngineConfig> {
    let mut ec = EngineConfig::default();
    for (collective, name) in &config.algorithms.0 {
        let algo = chorus_engine::Algorithm::from_name(name).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("CHORUS_ALGO: '{name}' is not an algorithm for {collective}"),
            )
        })?;
        let slot = match collective {
            Collective::AllReduce => &mut ec.overrides.all_reduce,
            Collective::Reduce => &mut ec.overrides.reduce,
            Collective::Broadcast => &mut ec.overrides.broadcast,
            Collective::AllGather => &mut ec.overrides.all_gather,
            Collective::ReduceScatter => &mut ec.overrides.reduce_scatter,
            other => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("CHORUS_ALGO: {other} has a single algorithm"),
                ));
            }
        };
        *slot = Some(algo);
    }
    Ok(ec)
}

/// Waits until every link has flushed what it accepted, or `until` (polled: this runs
/// once per destroy, on the control thread).
pub(crate) async fn flush(links: Vec<DataLink>, until: Instant) {
    while Instant::now() < until && !links.iter().all(|l| l.is_flushed()) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let unflushed: Vec<Rank> = links
        .iter()
        .filter(|l| !l.is_flushed())
        .map(|l| l.peer())
        .collect();
    if !unflushed.is_empty() {
        tracing::debug!(?unflushed, "data links not flushed within the budget");
    }
}

#[cfg(test)]
mod tests {
    use chorus_engine::link::{CancelReason, LinkFuture, Tag};
    use chorus_engine::{NETWORK_CHUNK_BYTES, Thresholds};

    use super::*;
    use crate::testkit;

    const HERE: &str = "node#0123456789ab/00000001";
    const OTHER_NETNS: &str = "node#0123456789ab/00000002";
    const OTHER_HOST: &str = "node2#ba9876543210/00000003";
    /// A container on this host that shares its network but not its pid namespace.
    const OTHER_PIDS: &str = "node#ffffffffffff/00000001";

    /// A link that only says whether it shares memory.
    struct Path {
        shm: bool,
    }

    impl Link<Bytes> for Path {
        fn peer(&self) -> Rank {
            Rank(1)
        }
        fn send(&self, _: Tag, _: Bytes) -> LinkFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
        fn recv(&self, _: Tag) -> LinkFuture<'_, Bytes> {
            Box::pin(std::future::pending())
        }
        fn cancel(&self, _: CancelReason) {}
        fn shares_memory(&self) -> bool {
            self.shm
        }
    }

    /// Rank 0 on `HERE` and one member per host in `others`, linked by shm or not.
    fn world(others: &[&str], shm: bool) -> (Vec<DataLink>, Vec<PeerInfo>) {
        let mut members = vec![testkit::peer_info(0)];
        members[0].host = HERE.to_owned();
        for (i, host) in others.iter().enumerate() {
            let mut p = testkit::peer_info(i as u32 + 1);
            p.host = (*host).to_owned();
            members.push(p);
        }
        let links = others
            .iter()
            .map(|_| Arc::new(Path { shm }) as DataLink)
            .collect();
        (links, members)
    }

    #[test]
    fn the_engine_is_tuned_to_the_paths_its_data_takes() {
        let base = EngineConfig::default();
        let of = |others: &[&str], shm: bool| {
            let (links, members) = world(others, shm);
            for_paths(base.clone(), &links, &members)
        };

        let all_shm = of(&[HERE, HERE], true);
        assert_eq!(all_shm.thresholds, Thresholds::default().shared_memory());
        assert_eq!(all_shm.chunk_bytes, base.chunk_bytes);

        for other in [OTHER_HOST, OTHER_NETNS] {
            let pair = of(&[other], false);
            assert_eq!(pair.chunk_bytes, NETWORK_CHUNK_BYTES, "{other}");
            assert_eq!(pair.thresholds, base.thresholds);
        }
        assert!(NETWORK_CHUNK_BYTES < base.chunk_bytes);

        // A pair on one network (loopback TCP, whatever the pid namespaces), larger worlds
        // across hosts, mixed worlds and a world of one keep the defaults.
        for (others, shm) in [
            (&[HERE][..], false),
            (&[OTHER_PIDS], false),
            (&[OTHER_HOST, OTHER_HOST], false),
            (&[HERE, OTHER_HOST], false),
            (&[], false),
        ] {
            assert_eq!(of(others, shm), base, "{others:?}");
        }
    }
}
