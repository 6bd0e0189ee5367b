//! Membership: revoke, shrink and grow (agreed with the other members by the lineage),
//! join, split, and leaving — abort, destroy, a dropped communicator, a caught signal.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use chorus_engine::CancelReason;
use chorus_engine::context::AbortReason;
use chorus_protocol::message::{PeerInfo, Welcome};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::sync::oneshot;

use super::{Comm, Inner};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::bootstrap;
use crate::runtime::epoch::{self, Inbox, start_lineage};
use crate::runtime::mailbox::{NextEpoch, Request};
use crate::runtime::{millis, socket_addr, tokio_instant};
use crate::signal;
use crate::unique_id::UniqueId;

impl Comm {
    /// Aborts this communicator now: every operation in flight on it, and on every
    /// communicator split or shrunk from it, returns `Err(Aborted)`; the other members see
    /// this member depart (code `aborted`). Local, immediate, idempotent, one-way: it never
    /// waits on a peer.
    pub fn abort(&self, reason: &str) {
        self.inner.abort(reason);
    }

    /// Revokes the communicator on every member: their operations at this epoch fail with
    /// `Revoked` (even past failed ranks); shrink to continue.
    pub async fn revoke(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        if !self.inner.lineage.request(Request::Revoke { reply }) {
            return Err(self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")));
        }
        rx.await
            .map_err(|_| self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")))
    }

    /// Survivors agree on who is gone and continue in a new communicator: ranks compacted
    /// in their old order, the next epoch, fresh links. Every survivor calls it.
    pub async fn shrink(&self) -> Result<Comm> {
        let (reply, rx) = oneshot::channel();
        let after = self.inner.epoch.epoch;
        self.agree(Request::Shrink { after, reply }, rx).await
    }

    /// Admits `joiners` new processes (which call [`Comm::join`] with
    /// [`Comm::grow_token`]) at the next epoch; every member calls it.
    pub async fn grow(&self, joiners: u32) -> Result<Comm> {
        let (reply, rx) = oneshot::channel();
        let after = self.inner.epoch.epoch;
        self.agree(
            Request::Grow {
                after,
                joiners,
                reply,
            },
            rx,
        )
        .await
    }

    async fn agree(
        &self,
        request: Request,
        rx: oneshot::Receiver<Result<NextEpoch>>,
    ) -> Result<Comm> {
        let started = Instant::now();
        if !self.inner.lineage.request(request) {
            return Err(self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")));
        }
        let next = rx
            .await
            .map_err(|_| self.stamp(Error::new(ErrorKind::Destroyed, "control driver gone")))?
            .map_err(|e| self.stamp(e))?;
        let session = self.inner.session.clone();
        let deadline = Instant::now() + session.config.agree_timeout;
        let life = self.inner.life.child();
        let epoch = epoch::build_next(&session, &self.inner.lineage, &life, next, deadline).await?;
        tracing::info!(epoch = %epoch.epoch, world = epoch.world, rank = %epoch.rank,
            ms = millis(started.elapsed()), "new epoch ready");
        Ok(Comm::from_parts(
            session,
            self.inner.lineage.clone(),
            epoch,
            life,
            None,
        ))
    }

    /// The token a new process passes to [`Comm::join`] to be admitted by [`Comm::grow`]:
    /// rank 0's control endpoint, its certificate, the job secret and this communicator.
    pub fn grow_token(&self) -> UniqueId {
        let e = &self.inner.epoch;
        let coordinator = &e.members[0];
        UniqueId {
            comm: e.comm,
            root: socket_addr(&coordinator.control),
            fingerprint: coordinator.fingerprint,
            secret: self.inner.session.secret.clone(),
        }
    }

    /// Joins a running communicator as a new member (the members call [`Comm::grow`]).
    pub async fn join(token: &UniqueId, config: Config) -> Result<Comm> {
        let founded = bootstrap::join(token, config).await?;
        Ok(Comm::founded(founded, None))
    }

    /// Splits into sub-communicators: members with the same `color` form one, ranked by
    /// `key` (ties by old rank); `None` opts out. Aborting this communicator aborts the
    /// children too. Every member calls it.
    pub async fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Comm>> {
        let world = self.size() as usize;
        let mine = [color.map_or(u32::MAX, |c| c), key];
        let mut all = vec![0u32; 2 * world];
        self.all_gather(&mine, &mut all).await?;
        let Some(color) = color else { return Ok(None) };
        let mut group: Vec<(u32, u32)> = (0..world)
            .filter(|&r| all[2 * r] == color)
            .map(|r| (all[2 * r + 1], r as u32))
            .collect();
        group.sort();
        let old = &self.inner.epoch;
        let members: Vec<PeerInfo> = group
            .iter()
            .enumerate()
            .map(|(new, (_, oldr))| PeerInfo {
                rank: Rank(new as u32),
                ..old.members[*oldr as usize].clone()
            })
            .collect();
        let me = Rank(
            group
                .iter()
                .position(|(_, r)| *r == old.rank.get())
                .unwrap_or(0) as u32,
        );
        let comm = split_id(old.comm, old.epoch, self.next_split(), color);
        let welcome = Welcome {
            comm,
            epoch: Epoch(0),
            members,
        };
        let session = self.inner.session.clone();
        let inbox = Inbox::serve(&session, comm, Epoch(0), me);
        let life = self.inner.life.child();
        let deadline = Instant::now() + session.config.init_timeout;
        let (lineage, epoch) = start_lineage(&session, welcome, me, inbox, &life, deadline).await?;
        let child = Comm::from_parts(session, lineage, epoch, life, None);
        let mut children = self.inner.children.lock();
        children.retain(|w| w.strong_count() > 0);
        children.push(Arc::downgrade(&child.inner));
        drop(children);
        Ok(Some(child))
    }

    fn next_split(&self) -> u64 {
        self.inner.epoch.engine.next_seq().get()
    }

    /// Leaves gracefully: departures to every peer, links closed at the connection level,
    /// the control thread stopped — all within the teardown budget, whatever the peers do
    /// (a frozen peer included; seed 002).
    pub async fn destroy(self) -> Result<()> {
        let budget = self.inner.session.config.teardown_budget;
        let started = Instant::now();
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            // Aborted before: the links are cancelled and the departures on their way;
            // what is left is to let them leave the process, with the session.
            let departing = self.inner.departing.lock().take();
            if let Some(rx) = departing {
                let deadline = tokio_instant(started + budget / 2);
                let _ = self
                    .inner
                    .session
                    .run(async move { tokio::time::timeout_at(deadline, rx).await })
                    .await;
            }
            self.shut_session(started, budget);
            return Ok(());
        }
        let deadline = started + budget;
        let links = self.inner.epoch.hooks.links.clone();
        // A peer may still be finishing the last operation with this member: it gets
        // everything this member's operations handed to the links before they close
        // (at most half the budget: a frozen peer takes nothing).
        {
            let links = links.clone();
            let until = started + budget / 2;
            let _ = self.inner.session.run(epoch::flush(links, until)).await;
        }
        // The data links depart first: a peer blocked on this member's data fails at once
        // on its link (which delivers the departure after the data), and a peer that sees
        // this process exit can read from its link that it left rather than died.
        for link in &links {
            link.cancel(CancelReason::new(
                CloseCode::NORMAL,
                "communicator destroyed",
            ));
        }
        // Only the lineage's newest communicator speaks for this member: destroying an
        // older one (after a shrink or grow) must not take the member out of the new one.
        let newest = self.inner.lineage.shared().newest_epoch() <= self.inner.epoch.epoch;
        if newest {
            let (reply, rx) = oneshot::channel();
            let requested = self.inner.lineage.request(Request::Depart {
                code: CloseCode::NORMAL,
                detail: "destroyed".into(),
                reply,
            });
            let depart = async move {
                if requested {
                    let _ = rx.await;
                }
            };
            // The wait for the departures is on the control thread's clock, so it is
            // bounded even on an executor without timers.
            let _ = self
                .inner
                .session
                .run(async move { tokio::time::timeout_at(tokio_instant(deadline), depart).await })
                .await;
        }
        self.inner.epoch.hooks.ctx.abort(AbortReason::Shutdown);
        self.shut_session(started, budget);
        tracing::debug!(ms = millis(started.elapsed()), newest, "destroyed");
        Ok(())
    }

    /// Stops the control thread if this was the last communicator on it, within what is
    /// left of `budget`.
    fn shut_session(&self, started: Instant, budget: std::time::Duration) {
        let left = budget.saturating_sub(started.elapsed());
        if self.inner.session.live() == 1 {
            self.inner.session.shutdown(left);
        }
    }
}

impl Inner {
    fn abort(&self, reason: &str) {
        if self.life.abort(AbortReason::requested(reason.to_owned())) {
            tracing::warn!(comm = %self.epoch.comm, rank = %self.epoch.rank, reason, "communicator aborted");
        }
        self.closed.store(true, Ordering::Release);
        for link in &self.epoch.hooks.links {
            link.cancel(CancelReason::new(CloseCode::ABORTED, reason.to_owned()));
        }
        let (reply, rx) = oneshot::channel();
        if self.lineage.request(Request::Depart {
            code: CloseCode::ABORTED,
            detail: reason.to_owned(),
            reply,
        }) {
            self.departing.lock().get_or_insert(rx);
        }
        let children: Vec<Arc<Inner>> = self
            .children
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for child in children {
            child.abort(reason);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A communicator dropped without destroy still leaves with a message (principle 1).
        if !self.closed.swap(true, Ordering::AcqRel) {
            for link in &self.epoch.hooks.links {
                link.cancel(CancelReason::new(CloseCode::NORMAL, "communicator dropped"));
            }
        }
        self.session
            .registry
            .retire(self.epoch.comm, self.epoch.epoch);
        self.session.leave();
    }
}

impl Comm {
    /// Departs on SIGTERM/SIGINT before the default action, if the configuration asks for
    /// it (see [`crate::signal`]).
    pub(super) fn install_signal_departure(&self) {
        if !self.inner.session.config.depart_on_signal {
            return;
        }
        if let Err(e) = signal::install(self.inner.session.config.teardown_budget) {
            tracing::warn!("departure on signals unavailable: {e}");
            return;
        }
        let departer: Arc<dyn signal::Departer> =
            Arc::new(SignalDeparter(Arc::downgrade(&self.inner)));
        let registration = signal::register(&departer);
        // The registry holds it weakly; keep it alive as long as this communicator.
        std::mem::forget(departer);
        *self.inner._signal.lock() = Some(registration);
    }
}

/// Departs on a caught signal, through the communicator's driver.
struct SignalDeparter(Weak<Inner>);

impl signal::Departer for SignalDeparter {
    fn depart_now(&self, reason: &str, deadline: Instant) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let (reply, rx) = oneshot::channel();
        if inner.lineage.request(Request::Depart {
            code: CloseCode::LEFT,
            detail: reason.to_owned(),
            reply,
        }) {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = async move {
                let _ = tokio::time::timeout(left, rx).await;
            };
            let _ = futures::executor::block_on(inner.session.run(wait));
        }
        for link in &inner.epoch.hooks.links {
            link.cancel(CancelReason::new(CloseCode::LEFT, reason.to_owned()));
        }
    }
}

/// A child communicator's id: every member derives the same from the parent, the epoch, the
/// split's sequence and the color.
fn split_id(parent: CommId, epoch: Epoch, seq: u64, color: u32) -> CommId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"chorus split\0")
        .chain_update(parent.get().to_le_bytes())
        .chain_update(epoch.get().to_le_bytes())
        .chain_update(seq.to_le_bytes())
        .chain_update(color.to_le_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    CommId(u64::from_le_bytes(id))
}
