//! The lineage's task: one task on the session's control thread that owns the lineage's
//! state, feeds its [`Policy`] every input — control frames, stream events, process exits
//! seen on this host, the launcher's witness, data links lost under an operation, the
//! application's requests, timers — and carries out what it decides: frames to peers,
//! streams to open and close, aborts of the attached epochs, errors and health for the
//! application to read.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chorus_control::{ConnectionIntent, Input};
use chorus_engine::LinkError;
use chorus_protocol::message::{Message, Role, StatusReply, Welcome};
use chorus_protocol::{CloseCode, Epoch, Rank};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::aborts::Scope;
use super::action::Action;
use super::channels::{Added, Channels};
use super::exits::{self, Watches};
use super::policy::{Me, Policy};
use super::published::Published;
use crate::error::Error;
use crate::runtime::Session;
use crate::runtime::mailbox::{EpochHooks, LineageMsg, Request};

/// How often the task checks running operations against their deadline.
const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// The most operations a status reply carries.
const MAX_STATUS_OPS: usize = 4096;

/// The lineage's task; see the module docs.
pub(crate) struct LineageTask {
    session: Arc<Session>,
    policy: Policy,
    inbox: mpsc::UnboundedReceiver<LineageMsg>,
    me: mpsc::UnboundedSender<LineageMsg>,
    published: Arc<Published>,
    channels: Channels,
    epochs: Vec<Weak<EpochHooks>>,
    watches: Watches,
    /// A departure's streams closing, resolving once their closes left, and its caller.
    closing: Vec<JoinHandle<()>>,
    departed: Option<oneshot::Sender<()>>,
}

impl LineageTask {
    /// A task for `welcome`'s communicator as `rank`. `inbox` may already hold messages
    /// that arrived while bootstrap finished.
    pub(crate) fn new(
        session: Arc<Session>,
        welcome: &Welcome,
        rank: Rank,
        inbox: mpsc::UnboundedReceiver<LineageMsg>,
        me: mpsc::UnboundedSender<LineageMsg>,
        published: Arc<Published>,
    ) -> Result<LineageTask, Error> {
        let myself = Me {
            fingerprint: session.identity.fingerprint().0,
            incarnation: session.incarnation,
        };
        let policy = Policy::new(&session.config, welcome, rank, myself, session.clock.now())?;
        let channels = Channels::new(
            session.clock,
            session.quic.clone(),
            me.clone(),
            session.config.teardown_budget / 2,
            session.config.heartbeat_deadline,
        );
        let mut task = LineageTask {
            session,
            policy,
            inbox,
            me,
            published,
            channels,
            epochs: Vec::new(),
            watches: Watches::default(),
            closing: Vec::new(),
            departed: None,
        };
        task.watch(welcome.epoch);
        task.publish_health();
        Ok(task)
    }

    /// Runs until the lineage is stopped or every handle on it is gone.
    pub(crate) async fn run(mut self) {
        let mut tick = tokio::time::interval(WATCHDOG_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.drain();
        while !self.channels.is_closed() {
            let clock = self.session.clock;
            let timer = self.policy.poll_timeout().map(|t| clock.tokio(t));
            let sleep = async {
                match timer {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = self.inbox.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => break,
                },
                () = sleep => self.input(Input::Timeout),
                _ = tick.tick() => self.watchdog(),
            }
            self.drain();
            self.maybe_departed();
        }
        drop(
            self.channels
                .close_all(CloseCode::NORMAL, "lineage stopped"),
        );
        self.watches.stop();
    }

    fn input(&mut self, input: Input) {
        let now = self.session.clock.now();
        self.policy.handle(now, input);
    }

    fn on_msg(&mut self, msg: LineageMsg) {
        let now = self.session.clock.now();
        match msg {
            LineageMsg::Channel {
                peer,
                epoch,
                role,
                channel,
            } => self.add_channel(peer, epoch, role, channel),
            LineageMsg::Frame {
                id,
                peer,
                epoch,
                role,
                message,
            } => self.on_frame(id, peer, epoch, role, message),
            LineageMsg::ChannelDown { id, error } => self.on_channel_down(id, error),
            LineageMsg::ConnectFailed {
                peer,
                epoch,
                refused,
            } => {
                self.channels.connect_failed(peer, epoch);
                if let Some(code) = refused {
                    self.input(Input::ConnectionClosed { peer, epoch, code });
                }
            }
            LineageMsg::Exited { peer, epoch } => {
                let link = self
                    .live_epochs()
                    .into_iter()
                    .filter(|h| h.epoch == epoch)
                    .find_map(|h| h.links.iter().find(|l| l.peer() == peer).cloned());
                exits::settle(self.session.clock, link, peer, epoch, self.me.clone());
            }
            LineageMsg::ExitedAs { peer, epoch, end } => {
                self.policy.exited_as(now, peer, epoch, end)
            }
            LineageMsg::DataLost { peer, epoch } => self.policy.data_lost(now, peer, epoch),
            LineageMsg::DataDeparted { peer, epoch, code } => {
                self.policy.data_departed(now, peer, epoch, code)
            }
            LineageMsg::Request(r) => self.on_request(r),
        }
    }

    fn on_request(&mut self, request: Request) {
        let now = self.session.clock.now();
        match request {
            Request::Shrink {
                after,
                deadline,
                reply,
            } => {
                let deadline = self.session.clock.control(deadline);
                self.policy.shrink(now, after, deadline, reply)
            }
            Request::Grow {
                after,
                joiners,
                deadline,
                reply,
            } => {
                let deadline = self.session.clock.control(deadline);
                self.policy.grow(now, after, joiners, deadline, reply)
            }
            Request::Revoke { reply } => {
                self.policy.revoke(now);
                let _ = reply.send(());
            }
            Request::Depart {
                code,
                detail,
                reply,
            } => {
                if !self.policy.depart(now, code, &detail) {
                    // Already leaving: this caller waits for nothing more.
                    let _ = reply.send(());
                    return;
                }
                self.drain();
                // The node queued its departures on the streams: each stream closes with
                // the code once they are written (the close carries the code even where
                // the frame is cut short), bounded by the teardown budget. Departures for
                // peers whose streams are still being opened wait for them (same bound):
                // a member that leaves right after init must still be seen leaving.
                self.closing = self.channels.close_all(code, &detail);
                let delivered = !self.closing.is_empty();
                let now = self.session.clock.now();
                self.policy.departing(now, code, detail, delivered);
                self.departed = Some(reply);
                self.maybe_departed();
            }
            Request::Attach(hooks) => {
                self.epochs.retain(|w| w.strong_count() > 0);
                // An epoch that already lost a member is born aborted, like the operations
                // of an aborted context.
                if let Some(h) = hooks.upgrade()
                    && h.epoch == self.policy.node().epoch()
                    && let Some(reason) = self.policy.absence(now, h.building)
                {
                    h.ctx.abort(reason);
                }
                self.epochs.push(hooks);
            }
        }
    }

    /// Ends a departure once no stream is still being opened (or its time is up): the
    /// reply goes out when every stream's close has left.
    fn maybe_departed(&mut self) {
        let now = self.session.clock.now();
        if !self.policy.departed(now, self.channels.connecting()) {
            return;
        }
        self.channels.close();
        let (closing, reply) = (std::mem::take(&mut self.closing), self.departed.take());
        tokio::spawn(async move {
            for c in closing {
                let _ = c.await;
            }
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
        });
    }

    fn on_frame(&mut self, id: u64, peer: Rank, epoch: Epoch, role: Role, message: Message) {
        let now = self.session.clock.now();
        match role {
            Role::Member => self.policy.member_frame(now, peer, epoch, message),
            Role::Launcher => self.policy.launcher_frame(now, epoch, message),
            Role::Status => {
                if let Message::StatusRequest(req) = message {
                    let reply = self.status_reply(req.max_ops as usize, req.with_members);
                    self.channels.send_on(id, Message::StatusReply(reply));
                }
            }
            Role::Joiner => {
                if let Message::Join(join) = message {
                    self.policy.join(now, join, id);
                }
            }
            // The endpoint never routes these roles to a lineage.
            Role::Data | Role::Bootstrap => {}
        }
    }

    fn status_reply(&self, max_ops: usize, with_members: bool) -> StatusReply {
        let clock = self.session.clock;
        let ops = self
            .live_epochs()
            .last()
            .map(|h| {
                h.recorder
                    .records(max_ops.min(MAX_STATUS_OPS), clock.process_now())
            })
            .unwrap_or_default();
        let node = self.policy.node();
        StatusReply {
            rank: node.rank(),
            epoch: node.epoch(),
            world: node.world(),
            peers: self.policy.health(clock.now()),
            ops,
            async_error: self.published.async_error().map(|e| e.to_string()),
            members: if with_members {
                self.policy
                    .table(node.epoch())
                    .map(<[_]>::to_vec)
                    .unwrap_or_default()
            } else {
                Vec::new()
            },
        }
    }

    fn add_channel(
        &mut self,
        peer: Rank,
        epoch: Epoch,
        role: Role,
        channel: Arc<chorus_transport::ControlChannel>,
    ) {
        let departing = self.policy.departure().map(|d| (d.code, d.detail.clone()));
        let departing = departing.as_ref().map(|(c, d)| (*c, d.as_str()));
        match self.channels.add(peer, epoch, role, channel, departing) {
            Added::Refused => {}
            Added::Departing(closing) => {
                self.closing.push(closing);
                if role == Role::Member {
                    self.policy.delivered();
                }
            }
            Added::Open => {
                if role == Role::Member {
                    self.input(Input::ConnectionOpened { peer, epoch });
                }
            }
        }
    }

    fn on_channel_down(&mut self, id: u64, error: LinkError) {
        if let Some(input) = self.channels.down(id, error) {
            self.input(input);
        }
    }

    /// Carries out everything the policy decided.
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.policy.poll_transmit() {
                progressed = true;
                let policy = &self.policy;
                self.channels
                    .send(t.to, t.epoch, t.message, || policy.route(t.epoch, t.to));
            }
            while let Some(intent) = self.policy.poll_intent() {
                progressed = true;
                match intent {
                    ConnectionIntent::Open { peer, epoch } => {
                        let policy = &self.policy;
                        self.channels
                            .ensure(peer, epoch, || policy.route(epoch, peer));
                    }
                    ConnectionIntent::Close { peer, epoch, code } => {
                        self.channels.close_peer(peer, epoch, code)
                    }
                }
            }
            progressed |= self.carry_out();
            if !progressed {
                break;
            }
        }
        self.policy.expire(self.session.clock.now());
        self.carry_out();
        self.publish_health();
    }

    /// Carries out the policy's actions; `true` if there were any.
    fn carry_out(&mut self) -> bool {
        let mut any = false;
        loop {
            let epochs = &self.epochs;
            let Some(action) = self
                .policy
                .poll_action(|epoch| departed_on_links(epochs, epoch))
            else {
                return any;
            };
            any = true;
            self.apply(action);
        }
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Record(error) => self.published.record_error(error),
            Action::Abort { scope, reason } => {
                for hooks in self.live_epochs() {
                    let aborted = match scope {
                        Scope::Epoch(e) => hooks.epoch == e,
                        Scope::Building(e) => hooks.epoch == e && hooks.building,
                        Scope::All => true,
                    };
                    if aborted {
                        hooks.ctx.abort(reason.clone());
                    }
                }
            }
            Action::CancelLinks { epoch, peer, code } => {
                for hooks in self.live_epochs().into_iter().filter(|h| h.epoch == epoch) {
                    for link in hooks.links.iter().filter(|l| l.peer() == peer) {
                        link.cancel(chorus_engine::CancelReason::new(code, "peer declared gone"));
                    }
                }
            }
            Action::Answer { reply, result } => {
                let _ = reply.send(result);
            }
            Action::Welcome { chan, welcome } => {
                self.channels.send_on(chan, Message::Welcome(welcome));
            }
            Action::Serve { comm, epoch, rank } => {
                self.session
                    .registry
                    .serve(comm, epoch, rank, self.me.clone());
            }
            Action::Fence {
                comm,
                epoch,
                removed,
            } => self.session.registry.fence(comm, epoch, &removed),
            Action::Watch(epoch) => self.watch(epoch),
        }
    }

    fn live_epochs(&self) -> Vec<Arc<EpochHooks>> {
        live(&self.epochs)
    }

    fn watchdog(&mut self) {
        let now = self.session.clock.process_now();
        for hooks in self.live_epochs() {
            hooks
                .recorder
                .abort_overdue(now, self.session.config.op_timeout);
        }
    }

    fn publish_health(&self) {
        self.published
            .set_health(self.policy.health(self.session.clock.now()));
        let lateness = self.policy.node().heartbeat_lateness();
        if lateness.count() != self.published.heartbeat_lateness().count {
            self.published.set_heartbeat_lateness(lateness.into());
        }
    }

    /// Watches every same-host peer of `epoch`'s table by process id (the fastest death
    /// evidence), replacing the watches of earlier epochs.
    fn watch(&mut self, epoch: Epoch) {
        self.watches.stop();
        if !self.session.config.same_host_evidence {
            return;
        }
        let Some(table) = self.policy.table(epoch) else {
            return;
        };
        let session = &self.session;
        self.watches
            .watch(&session.handle, &session.host, table, epoch, &self.me);
    }
}

fn live(epochs: &[Weak<EpochHooks>]) -> Vec<Arc<EpochHooks>> {
    epochs.iter().filter_map(Weak::upgrade).collect()
}

/// The lowest rank whose data link at `epoch` carries a graceful departure.
fn departed_on_links(epochs: &[Weak<EpochHooks>], epoch: Epoch) -> Option<Rank> {
    live(epochs)
        .into_iter()
        .filter(|h| h.epoch == epoch)
        .flat_map(|h| {
            h.links
                .iter()
                .filter(|l| {
                    matches!(
                        l.failure(),
                        Some(LinkError::PeerDeparted { code, .. }) if code.is_graceful()
                    )
                })
                .map(|l| l.peer())
                .collect::<Vec<_>>()
        })
        .min()
}
