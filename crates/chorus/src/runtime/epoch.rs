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
use super::{Session, links};
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
    let engine_config = for_links(engine_config(&session.config)?, &links, world);
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

/// `config` adjusted to the paths `links` take in a world of `world` ranks: a world whose
/// links all share memory takes shared memory's crossovers, a pair whose link crosses a
/// network smaller chunks ([`EngineConfig::network`], which says why only pairs); any other
/// world keeps the defaults.
fn for_links(config: EngineConfig, links: &[DataLink], world: u32) -> EngineConfig {
    if links.is_empty() {
        config
    } else if links.iter().all(|l| l.shares_memory()) {
        EngineConfig {
            thresholds: config.thresholds.clone().shared_memory(),
            ..config
        }
    } else if world == 2 && links.iter().all(|l| l.crosses_network()) {
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

    /// A link that only says which path it takes.
    struct Path {
        shm: bool,
        net: bool,
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
        fn crosses_network(&self) -> bool {
            self.net
        }
    }

    fn links(paths: &[(bool, bool)]) -> Vec<DataLink> {
        paths
            .iter()
            .map(|&(shm, net)| Arc::new(Path { shm, net }) as DataLink)
            .collect()
    }

    #[test]
    fn the_engine_is_tuned_to_the_paths_its_links_take() {
        let base = EngineConfig::default();
        let shm = Thresholds::default().shared_memory();
        let of =
            |paths: &[(bool, bool)]| for_links(base.clone(), &links(paths), paths.len() as u32 + 1);

        let all_shm = of(&[(true, false), (true, false)]);
        assert_eq!(all_shm.thresholds, shm);
        assert_eq!(all_shm.chunk_bytes, base.chunk_bytes);

        let pair = of(&[(false, true)]);
        assert_eq!(pair.chunk_bytes, NETWORK_CHUNK_BYTES);
        assert!(NETWORK_CHUNK_BYTES < base.chunk_bytes);
        assert_eq!(pair.thresholds, base.thresholds);

        // Larger worlds across a network, mixed worlds, loopback TCP and a world of one keep
        // the defaults.
        for paths in [
            &[(false, true), (false, true)][..],
            &[(true, false), (false, true)],
            &[(false, false)],
            &[],
        ] {
            assert_eq!(of(paths), base, "{paths:?}");
        }
    }
}
