//! The control driver of one communicator lineage (a communicator and the ones shrunk or
//! grown from it): it owns the `chorus_control::Node`, feeds it every input — control
//! frames, stream events, process exits seen on this host, the launcher's witness, data
//! links lost under an operation, the application's requests, timers — and carries out what
//! it decides: frames to peers, streams to open and close, and events turned into aborts of
//! the right operation contexts (principle 4) and into the health the application reads.
//!
//! It runs as one task on the session's control thread and owns all its state; the
//! application talks to it through [`LineageMsg`]s and reads [`Shared`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use chorus_control::{Agreed, Command, Event, Input, Node, Witness};
use chorus_engine::LinkError;
use chorus_engine::context::AbortReason;
use chorus_protocol::message::{
    Evidence, Message, PeerInfo, PeerState, PeerStatus, RevokeCause, Role, StatusReply, Verdict,
    Welcome,
};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use chorus_transport::{ControlChannel, Fingerprint};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::links::not_yet;
use super::{Session, socket_addr, tokio_instant};
use crate::error::{Error, ErrorKind, kind_of_close};
use crate::recorder::Recorder;
use crate::watch::ProcessWatch;

/// The status reported for a process whose exit was seen but whose exit status was not
/// (a pidfd on a process that is not our child); `Evidence` displays it as unknown.
pub(crate) const STATUS_UNKNOWN: i32 = i32::MIN;

/// How often the driver checks running operations against their deadline.
const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// How long a same-host peer's exit waits for its data link to say whether it departed
/// first (see `Driver::on_exited`); a crash settles the link sooner (the kernel closes a
/// dead process's sockets), so this bounds only the case of no link news at all.
const EXIT_GRACE: Duration = Duration::from_millis(20);

/// Messages to a lineage's driver.
pub(crate) enum LineageMsg {
    /// A control stream, accepted by the endpoint or opened by this driver.
    Channel {
        peer: Rank,
        epoch: Epoch,
        role: Role,
        channel: Arc<ControlChannel>,
    },
    /// A frame read from a stream.
    Frame {
        id: u64,
        peer: Rank,
        epoch: Epoch,
        role: Role,
        message: Message,
    },
    /// A stream ended.
    ChannelDown { id: u64, error: LinkError },
    /// An attempt to open a stream gave up.
    ConnectFailed { peer: Rank, epoch: Epoch },
    /// A peer's process on this host exited.
    Exited { peer: Rank, epoch: Epoch },
    /// How that exit ended the peer: `Some(code)` if its data link carried its departure
    /// first, `None` if it died (see `on_exited`).
    ExitedAs {
        peer: Rank,
        epoch: Epoch,
        end: Option<CloseCode>,
    },
    /// An operation saw its data link to `peer` lost without a departure.
    DataLost { peer: Rank, epoch: Epoch },
    /// An operation saw `peer` depart on its data link with `code` (after everything `peer`
    /// sent on it: the link delivers in order).
    DataDeparted {
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    },
    /// A request from the application.
    Request(Request),
}

/// What the application asks of the driver.
pub(crate) enum Request {
    /// Agree with the survivors on the next epoch; the reply is the agreement and its table.
    Shrink {
        after: Epoch,
        reply: oneshot::Sender<Result<NextEpoch, Error>>,
    },
    /// Admit `joiners` new processes (this member coordinates when it is rank 0), or wait
    /// for the agreement that admits them.
    Grow {
        after: Epoch,
        joiners: u32,
        reply: oneshot::Sender<Result<NextEpoch, Error>>,
    },
    /// Revoke the communicator at the current epoch everywhere.
    Revoke { reply: oneshot::Sender<()> },
    /// Leave with `code`: departures sent and streams closed before the reply.
    Depart {
        code: CloseCode,
        detail: String,
        reply: oneshot::Sender<()>,
    },
    /// Attach a new epoch's data-plane state, so failures abort its operations.
    Attach(Weak<EpochHooks>),
}

/// An agreed next epoch with its peer table.
#[derive(Clone, Debug)]
pub(crate) struct NextEpoch {
    pub(crate) agreed: Agreed,
    pub(crate) table: Vec<PeerInfo>,
}

/// What the driver needs of an epoch's data plane: the context to abort and the links to
/// cancel when the control plane declares someone gone.
pub(crate) struct EpochHooks {
    pub(crate) epoch: Epoch,
    /// Aborted by failures at this epoch; parent of the engine's context.
    pub(crate) ctx: chorus_engine::Context,
    pub(crate) links: Vec<super::registry::DataLink>,
    pub(crate) recorder: Arc<Recorder>,
    /// The epoch's links are still being built: any member leaving (even gracefully)
    /// makes the build impossible, so it aborts.
    pub(crate) building: bool,
}

/// What the application reads without asking the driver.
#[derive(Default)]
pub(crate) struct Shared {
    health: Mutex<Vec<PeerStatus>>,
    /// The first failure recorded (one-way: set once, never cleared).
    async_error: OnceLock<Error>,
    /// Peers that left gracefully at each epoch.
    departed: Mutex<HashSet<(Epoch, Rank)>>,
    /// The newest epoch a communicator of this lineage was built for.
    newest: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        // Writers store whole values; a poisoned lock still holds a consistent one.
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn health(&self) -> Vec<PeerStatus> {
        Self::lock(&self.health).clone()
    }

    pub(crate) fn async_error(&self) -> Option<Error> {
        self.async_error.get().cloned()
    }

    pub(crate) fn record_error(&self, error: Error) {
        let _ = self.async_error.set(error);
    }

    /// The newest epoch a communicator of this lineage was built for.
    pub(crate) fn newest_epoch(&self) -> Epoch {
        Epoch(self.newest.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Records that a communicator for `epoch` exists (epochs only grow).
    pub(crate) fn built(&self, epoch: Epoch) {
        self.newest
            .fetch_max(epoch.get(), std::sync::atomic::Ordering::AcqRel);
    }

    /// True when `peer` left the epoch gracefully (destroy), so failing on it is expected.
    pub(crate) fn departed(&self, epoch: Epoch, peer: Rank) -> bool {
        Self::lock(&self.departed).contains(&(epoch, peer))
    }
}

/// The application's handle on a running driver.
pub(crate) struct Handle {
    pub(crate) tx: mpsc::UnboundedSender<LineageMsg>,
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    /// Sends a request; `false` if the driver has ended.
    pub(crate) fn request(&self, request: Request) -> bool {
        self.tx.send(LineageMsg::Request(request)).is_ok()
    }
}

/// One open control stream.
struct Chan {
    peer: Rank,
    epoch: Epoch,
    role: Role,
    channel: Arc<ControlChannel>,
    out: mpsc::UnboundedSender<Out>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
}

/// What a stream's writer task does next, in order.
enum Out {
    Send(Message),
    /// Close the stream with this code once everything queued before it is written.
    Close(CloseCode, String),
}

impl Chan {
    fn send(&self, message: Message) {
        let _ = self.out.send(Out::Send(message));
    }

    /// Closes after flushing what is queued, giving up and closing at once after `budget`
    /// (a frozen peer's flow control cannot hold the close back). Resolves when closed.
    fn close(mut self, code: CloseCode, detail: &str, budget: Duration) -> JoinHandle<()> {
        let _ = self.out.send(Out::Close(code, detail.to_owned()));
        let writer = self.writer.take();
        let channel = self.channel.clone();
        let detail = detail.to_owned();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + budget;
            if let Some(writer) = writer {
                let abort = writer.abort_handle();
                if tokio::time::timeout_at(until, writer).await.is_err() {
                    abort.abort();
                }
            }
            // Idempotent when the writer already closed it.
            channel.close(code, &detail);
            // The close is the departure (principle 1): resolve once it left this process
            // (the endpoint sends it at its next turn), so a process that exits right
            // after its teardown does not take it along.
            while !channel.close_sent() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    }
}

impl Drop for Chan {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(w) = &self.writer {
            w.abort();
        }
    }
}

/// A request waiting for an agreement.
struct Waiter {
    after: Epoch,
    grow: bool,
    deadline: Instant,
    reply: oneshot::Sender<Result<NextEpoch, Error>>,
}

/// The driver's state; see the module docs.
pub(crate) struct Driver {
    session: Arc<Session>,
    node: Node,
    inbox: mpsc::UnboundedReceiver<LineageMsg>,
    me: mpsc::UnboundedSender<LineageMsg>,
    shared: Arc<Shared>,
    /// Peer tables by epoch.
    tables: HashMap<Epoch, Vec<PeerInfo>>,
    /// Communicator id at each epoch.
    comms: HashMap<Epoch, CommId>,
    chans: HashMap<u64, Chan>,
    next_chan: u64,
    connecting: HashSet<(Epoch, Rank)>,
    pending: HashMap<(Epoch, Rank), VecDeque<Message>>,
    epochs: Vec<Weak<EpochHooks>>,
    watches: Vec<JoinHandle<()>>,
    agreed: Option<NextEpoch>,
    waiters: Vec<Waiter>,
    /// Processes asking to join (grow), with the stream their `Welcome` goes to.
    joiners: Vec<(PeerInfo, u64)>,
    wanted_joiners: Option<u32>,
    admitted: bool,
    /// Leaving: the departure is on its way to the streams that exist, and to those still
    /// being opened (a member that leaves right after init has some of each).
    departing: Option<Departing>,
    finished: bool,
}

/// A departure in progress (see `Request::Depart`).
struct Departing {
    code: CloseCode,
    detail: String,
    /// Streams closing after their departure frames, resolving once the close left.
    closing: Vec<JoinHandle<()>>,
    /// When to stop waiting for streams still being opened.
    until: Instant,
    /// Peers known absent when the departure began: nobody waits to tell them.
    absent: HashSet<(Epoch, Rank)>,
    /// The departure went out on at least one stream: the members that got it spread it
    /// (a notice), so streams still being opened are not waited for any more.
    delivered: bool,
    reply: oneshot::Sender<()>,
}

impl Driver {
    /// A driver for `welcome`'s communicator as `rank`. `inbox` may already hold messages
    /// that arrived while bootstrap finished.
    pub(crate) fn new(
        session: Arc<Session>,
        welcome: &Welcome,
        rank: Rank,
        inbox: mpsc::UnboundedReceiver<LineageMsg>,
        me: mpsc::UnboundedSender<LineageMsg>,
        shared: Arc<Shared>,
    ) -> Result<Driver, Error> {
        let view = chorus_control::View::from_welcome(welcome, rank)
            .map_err(|e| Error::new(ErrorKind::Bootstrap, format!("bad peer table: {e}")))?;
        let cfg = control_config(&session.config);
        let node = Node::new(cfg, view, session.clock.now())
            .map_err(|e| Error::new(ErrorKind::Config, format!("control plane: {e}")))?;
        let mut driver = Driver {
            session,
            node,
            inbox,
            me,
            shared,
            tables: HashMap::from([(welcome.epoch, welcome.members.clone())]),
            comms: HashMap::from([(welcome.epoch, welcome.comm)]),
            chans: HashMap::new(),
            next_chan: 0,
            connecting: HashSet::new(),
            pending: HashMap::new(),
            epochs: Vec::new(),
            watches: Vec::new(),
            agreed: None,
            waiters: Vec::new(),
            joiners: Vec::new(),
            wanted_joiners: None,
            admitted: false,
            departing: None,
            finished: false,
        };
        driver.watch_processes(welcome.epoch);
        driver.publish_health();
        Ok(driver)
    }

    /// Runs until the lineage is stopped or every handle on it is gone.
    pub(crate) async fn run(mut self) {
        let mut tick = tokio::time::interval(WATCHDOG_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.drain();
        while !self.finished {
            let timer = self.node.poll_timeout().map(|t| self.session.clock.std(t));
            let sleep = async {
                match timer {
                    Some(t) => tokio::time::sleep_until(tokio_instant(t)).await,
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
        drop(self.close_all(CloseCode::NORMAL, "lineage stopped"));
        for w in self.watches.drain(..) {
            w.abort();
        }
    }

    fn input(&mut self, input: Input) {
        let now = self.session.clock.now();
        if let Err(e) = self.node.handle(now, input) {
            tracing::debug!(error = %e, "control input refused");
        }
    }

    fn on_msg(&mut self, msg: LineageMsg) {
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
            LineageMsg::ConnectFailed { peer, epoch } => {
                self.connecting.remove(&(epoch, peer));
                self.pending.remove(&(epoch, peer));
            }
            LineageMsg::Exited { peer, epoch } => self.on_exited(peer, epoch),
            LineageMsg::ExitedAs { peer, epoch, end } => match end {
                Some(code) => self.input(Input::ConnectionClosed { peer, epoch, code }),
                None => self.input(Input::PeerExited {
                    peer,
                    epoch,
                    status: STATUS_UNKNOWN,
                    witness: Witness::Pidfd,
                }),
            },
            LineageMsg::DataLost { peer, epoch } => {
                if !self.shared.departed(epoch, peer) {
                    self.input(Input::ConnectionLost {
                        peer,
                        epoch,
                        code: CloseCode::INTERNAL,
                    });
                }
            }
            LineageMsg::DataDeparted { peer, epoch, code } => {
                self.on_data_departed(peer, epoch, code)
            }
            LineageMsg::Request(r) => self.on_request(r),
        }
    }

    /// A same-host peer's process exited. A member that left sent its departure on its
    /// data links before it exited, but the control stream's may still be in flight (or
    /// only relayed), so its link says how it ended: a departure, or a crash (the kernel
    /// closed the sockets without one). The link settles within the time the receiving
    /// thread takes to read what already arrived; past `EXIT_GRACE` the exit is a death.
    fn on_exited(&mut self, peer: Rank, epoch: Epoch) {
        let link = self
            .live_epochs()
            .into_iter()
            .filter(|h| h.epoch == epoch)
            .find_map(|h| h.links.iter().find(|l| l.peer() == peer).cloned());
        let tx = self.me.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + EXIT_GRACE;
            let end = loop {
                let seen = link.as_ref().and_then(|l| l.failure());
                match seen {
                    Some(LinkError::PeerDeparted { code, .. }) => break Some(code),
                    Some(_) => break None,
                    None if link.is_none() || tokio::time::Instant::now() >= until => {
                        break None;
                    }
                    None => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            };
            let _ = tx.send(LineageMsg::ExitedAs { peer, epoch, end });
        });
    }

    /// An operation failed on a data link's departure. `evicted` is conclusive (the peer
    /// removed this member) and `aborted` too (the peer aborted its communicator): the
    /// node learns it like a control stream's close. `normal` and `left` only say the peer
    /// is done with this epoch's streams — it left the communicator, or abandoned an epoch
    /// whose links could not be built and is about to agree on the next one (SPEC.md 11.2
    /// closes old streams with `normal`) — so the control plane is not told the peer is
    /// gone; but the members waiting on this one are stranded all the same, so the epoch
    /// is revoked: every member's operations end at once, naming the departure (see
    /// `on_event`), instead of at their operation deadline.
    fn on_data_departed(&mut self, peer: Rank, epoch: Epoch, code: CloseCode) {
        if !code.is_graceful() {
            self.input(Input::ConnectionClosed { peer, epoch, code });
        } else if epoch == self.node.epoch() {
            Shared::lock(&self.shared.departed).insert((epoch, peer));
            // The revoke names the departure, so that every member reports it even where
            // the revoke arrives before the leaver's own word.
            let cause = RevokeCause {
                subject: peer,
                evidence: Evidence::Departed { code },
            };
            self.input(Input::Command(Command::Revoke { cause: Some(cause) }));
        }
    }

    fn on_request(&mut self, request: Request) {
        // A member that was evicted (or left) takes part in no agreement: say so at once
        // rather than at the agreement deadline.
        let inert = match self.node.status() {
            chorus_control::Status::Member => None,
            chorus_control::Status::Evicted => Some(Error::new(
                ErrorKind::Evicted,
                "this member was removed from the communicator; it cannot change it",
            )),
            chorus_control::Status::Departed { code } => Some(Error::new(
                ErrorKind::Destroyed,
                format!("this member left the communicator ({code})"),
            )),
        };
        let request = match (request, inert) {
            (Request::Shrink { reply, .. } | Request::Grow { reply, .. }, Some(e)) => {
                let _ = reply.send(Err(e));
                return;
            }
            (request, _) => request,
        };
        match request {
            Request::Shrink { after, reply } => {
                // The agreement past `after` is the answer, unless its epoch (the current
                // one) lost a member since: then the survivors agree again, past it.
                let mut after = after;
                if let Some(next) = self.agreed.as_ref().filter(|n| n.agreed.previous >= after) {
                    let broken =
                        next.agreed.epoch() == self.node.epoch() && self.absence(true).is_some();
                    if !broken {
                        let _ = reply.send(Ok(next.clone()));
                        return;
                    }
                    after = self.node.epoch();
                }
                self.waiters.push(Waiter {
                    after,
                    grow: false,
                    deadline: self.agree_deadline(),
                    reply,
                });
                self.input(Input::Command(Command::Shrink));
            }
            Request::Grow {
                after,
                joiners,
                reply,
            } => {
                if let Some(next) = self
                    .agreed
                    .as_ref()
                    .filter(|n| n.agreed.previous >= after && !n.agreed.joiners.is_empty())
                {
                    let _ = reply.send(Ok(next.clone()));
                    return;
                }
                self.waiters.push(Waiter {
                    after,
                    grow: true,
                    deadline: self.agree_deadline(),
                    reply,
                });
                if self.node.rank() == Rank(0) {
                    self.wanted_joiners = Some(joiners);
                    self.admitted = false;
                    self.maybe_admit();
                }
            }
            Request::Revoke { reply } => {
                self.input(Input::Command(Command::Revoke { cause: None }));
                let _ = reply.send(());
            }
            Request::Depart {
                code,
                detail,
                reply,
            } => {
                let command = if code == CloseCode::ABORTED {
                    Command::Abort
                } else {
                    Command::Depart {
                        code,
                        detail: detail.clone(),
                    }
                };
                if self.departing.is_some() {
                    // Already leaving: this caller waits for nothing more.
                    let _ = reply.send(());
                    return;
                }
                self.input(Input::Command(command));
                self.drain();
                // The node queued its departures on the streams: each stream closes with
                // the code once they are written (the close carries the code even where
                // the frame is cut short), bounded by the teardown budget. Departures for
                // peers whose streams are still being opened wait for them (same bound):
                // a member that leaves right after init must still be seen leaving.
                let closing = self.close_all(code, &detail);
                let delivered = !closing.is_empty();
                let epoch = self.node.epoch();
                let absent = self
                    .node
                    .peers(self.session.clock.now())
                    .into_iter()
                    .filter(|p| matches!(p.state, PeerState::Dead | PeerState::Departed))
                    .map(|p| (epoch, p.rank))
                    .collect();
                self.departing = Some(Departing {
                    code,
                    detail,
                    closing,
                    until: Instant::now() + self.session.config.teardown_budget / 2,
                    absent,
                    delivered,
                    reply,
                });
                self.maybe_departed();
            }
            Request::Attach(hooks) => {
                self.epochs.retain(|w| w.strong_count() > 0);
                // An epoch that already lost a member is born aborted, like the operations
                // of an aborted context.
                if let Some(h) = hooks.upgrade()
                    && h.epoch == self.node.epoch()
                    && let Some(reason) = self.absence(h.building)
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
        let Some(d) = &self.departing else { return };
        // Only this epoch's members need the departure (older epochs' streams are moot).
        let epoch = self.node.epoch();
        let waiting = !d.delivered
            && self
                .connecting
                .iter()
                .any(|k| k.0 == epoch && !d.absent.contains(k));
        if waiting && Instant::now() < d.until {
            return;
        }
        let Some(d) = self.departing.take() else {
            return;
        };
        self.finished = true;
        tokio::spawn(async move {
            for c in d.closing {
                let _ = c.await;
            }
            let _ = d.reply.send(());
        });
    }

    /// Why the current epoch cannot run operations (a member declared dead, or one that
    /// left with a failure code; with `any_leave`, also one that left gracefully), if so.
    fn absence(&self, any_leave: bool) -> Option<AbortReason> {
        self.node
            .peers(self.session.clock.now())
            .into_iter()
            .find_map(|p| match (p.state, p.evidence) {
                (PeerState::Dead, Some(evidence)) => Some(AbortReason::PeerFailed {
                    rank: p.rank,
                    evidence,
                }),
                (PeerState::Departed, Some(Evidence::Departed { code }))
                    if any_leave || !code.is_graceful() =>
                {
                    Some(AbortReason::PeerDeparted { rank: p.rank, code })
                }
                _ => None,
            })
    }

    fn agree_deadline(&self) -> Instant {
        Instant::now() + self.session.config.agree_timeout
    }

    fn on_frame(&mut self, id: u64, peer: Rank, epoch: Epoch, role: Role, message: Message) {
        match role {
            Role::Member => {
                let comm = self.comms.get(&epoch).copied().unwrap_or(self.node.comm());
                self.input(Input::Frame(chorus_control::Received {
                    from: peer,
                    comm,
                    epoch,
                    message,
                }));
            }
            Role::Launcher => {
                if let Message::Notice(n) = message
                    && n.verdict == Verdict::Dead
                    && let Evidence::LauncherWitness { status } = n.evidence
                {
                    self.input(Input::PeerExited {
                        peer: n.subject,
                        epoch,
                        status,
                        witness: Witness::Launcher,
                    });
                }
            }
            Role::Status => {
                if let Message::StatusRequest(req) = message {
                    let reply = self.status_reply(req.max_ops as usize, req.with_members);
                    if let Some(c) = self.chans.get(&id) {
                        c.send(Message::StatusReply(reply));
                    }
                }
            }
            Role::Joiner => {
                if let Message::Join(join) = message {
                    self.joiners
                        .retain(|(p, _)| p.incarnation != join.peer.incarnation);
                    self.joiners.push((join.peer, id));
                    self.maybe_admit();
                }
            }
            // The endpoint never routes these roles to a lineage.
            Role::Data | Role::Bootstrap => {}
        }
    }

    /// The grow coordinator proposes once the wanted number of joiners has arrived.
    fn maybe_admit(&mut self) {
        let Some(wanted) = self.wanted_joiners else {
            return;
        };
        if self.admitted || (self.joiners.len() as u32) < wanted {
            return;
        }
        self.admitted = true;
        let peers: Vec<PeerInfo> = self
            .joiners
            .iter()
            .take(wanted as usize)
            .map(|(p, _)| p.clone())
            .collect();
        self.input(Input::Command(Command::Admit(peers)));
    }

    fn status_reply(&self, max_ops: usize, with_members: bool) -> StatusReply {
        let now = Instant::now();
        let ops = self
            .live_epochs()
            .last()
            .map(|h| h.recorder.records(max_ops.min(4096), now))
            .unwrap_or_default();
        StatusReply {
            rank: self.node.rank(),
            epoch: self.node.epoch(),
            world: self.node.world(),
            peers: self.node.peers(self.session.clock.now()),
            ops,
            async_error: self.shared.async_error().map(|e| e.to_string()),
            members: if with_members {
                self.tables
                    .get(&self.node.epoch())
                    .cloned()
                    .unwrap_or_default()
            } else {
                Vec::new()
            },
        }
    }

    fn add_channel(&mut self, peer: Rank, epoch: Epoch, role: Role, channel: Arc<ControlChannel>) {
        if self.finished {
            channel.close(CloseCode::NORMAL, "member left");
            return;
        }
        if let Some(d) = &self.departing {
            // A stream this member opened before it left: carry the departure queued for
            // it, then close. A stream a peer opens now is closed with the code at once.
            let (code, detail) = (d.code, d.detail.clone());
            let queued = if role == Role::Member {
                self.connecting.remove(&(epoch, peer));
                self.pending.remove(&(epoch, peer)).unwrap_or_default()
            } else {
                VecDeque::new()
            };
            let closing = self.departing_close(channel, queued, code, &detail);
            if let Some(d) = &mut self.departing {
                d.closing.push(closing);
                d.delivered |= role == Role::Member;
            }
            return;
        }
        let id = self.next_chan;
        self.next_chan += 1;
        let (out, mut rx) = mpsc::unbounded_channel::<Out>();
        let writer = {
            let channel = channel.clone();
            tokio::spawn(async move {
                while let Some(next) = rx.recv().await {
                    match next {
                        Out::Send(m) => {
                            if channel.send(m).await.is_err() {
                                break;
                            }
                        }
                        Out::Close(code, detail) => {
                            channel.close(code, &detail);
                            break;
                        }
                    }
                }
            })
        };
        let reader = {
            let channel = channel.clone();
            let me = self.me.clone();
            tokio::spawn(async move {
                loop {
                    match channel.recv().await {
                        Ok(frame) => {
                            let msg = LineageMsg::Frame {
                                id,
                                peer: frame.header.sender,
                                epoch: frame.header.epoch,
                                role,
                                message: frame.message,
                            };
                            if me.send(msg).is_err() {
                                break;
                            }
                        }
                        Err(error) => {
                            let _ = me.send(LineageMsg::ChannelDown { id, error });
                            break;
                        }
                    }
                }
            })
        };
        if role == Role::Member {
            self.connecting.remove(&(epoch, peer));
            if let Some(queued) = self.pending.remove(&(epoch, peer)) {
                for m in queued {
                    let _ = out.send(Out::Send(m));
                }
            }
        }
        self.chans.insert(
            id,
            Chan {
                peer,
                epoch,
                role,
                channel,
                out,
                reader,
                writer: Some(writer),
            },
        );
        if role == Role::Member {
            self.input(Input::ConnectionOpened { peer, epoch });
        }
    }

    fn on_channel_down(&mut self, id: u64, error: LinkError) {
        let Some(chan) = self.chans.remove(&id) else {
            return;
        };
        if chan.role != Role::Member {
            return;
        }
        let (peer, epoch) = (chan.peer, chan.epoch);
        let others = self
            .chans
            .values()
            .any(|c| c.role == Role::Member && c.peer == peer && c.epoch == epoch);
        if others {
            return;
        }
        let input = match error {
            LinkError::PeerDeparted { code, .. } => Input::ConnectionClosed { peer, epoch, code },
            LinkError::Cancelled(_) => return,
            LinkError::Protocol { code, .. } => Input::ConnectionLost { peer, epoch, code },
            error => {
                // A QUIC connection ends without a close only by silence: its idle timeout,
                // which is longer than the heartbeat deadline (the detector has judged the
                // peer already), or this process's own freeze, after which every timer
                // expires at once on resume and would condemn every peer of a member that
                // was itself frozen (and is about to learn it was evicted). Silence is the
                // detector's to weigh; the stream is reopened when next needed.
                tracing::debug!(%peer, %epoch, %error, "control stream lost");
                return;
            }
        };
        self.input(input);
    }

    /// Carries out everything the node decided.
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(t) = self.node.poll_transmit() {
                progressed = true;
                self.send(t.to, t.epoch, t.message);
            }
            while let Some(intent) = self.node.poll_intent() {
                progressed = true;
                match intent {
                    chorus_control::ConnectionIntent::Open { peer, epoch } => {
                        self.ensure_channel(peer, epoch)
                    }
                    chorus_control::ConnectionIntent::Close { peer, epoch, code } => {
                        self.close_peer(peer, epoch, code)
                    }
                }
            }
            while let Some(event) = self.node.poll_event() {
                progressed = true;
                self.on_event(event);
            }
            if !progressed {
                break;
            }
        }
        self.expire_waiters();
        self.publish_health();
    }

    fn send(&mut self, to: Rank, epoch: Epoch, message: Message) {
        let chan = self
            .chans
            .values()
            .find(|c| c.role == Role::Member && c.peer == to && c.epoch == epoch);
        match chan {
            Some(c) => c.send(message),
            None => {
                let queue = self.pending.entry((epoch, to)).or_default();
                // Bounded: a peer we cannot reach does not grow our memory.
                if queue.len() >= 1024 {
                    queue.pop_front();
                }
                queue.push_back(message);
                self.ensure_channel(to, epoch);
            }
        }
    }

    /// Opens a control stream to `peer` at `epoch` unless one is open or opening.
    fn ensure_channel(&mut self, peer: Rank, epoch: Epoch) {
        if self.finished
            || self.connecting.contains(&(epoch, peer))
            || self
                .chans
                .values()
                .any(|c| c.role == Role::Member && c.peer == peer && c.epoch == epoch)
        {
            return;
        }
        let (Some(table), Some(comm)) = (self.tables.get(&epoch), self.comms.get(&epoch)) else {
            return;
        };
        let Some(info) = table.get(peer.index()).cloned() else {
            return;
        };
        let Some(me) = self.my_rank(epoch) else {
            return;
        };
        self.connecting.insert((epoch, peer));
        let (quic, tx, comm) = (self.session.quic.clone(), self.me.clone(), *comm);
        // Give up after a deadline's worth of trying: by then the detector has decided.
        let give_up = Instant::now() + self.session.config.heartbeat_deadline;
        tokio::spawn(async move {
            let route = chorus_protocol::Envelope::new(comm, epoch, me);
            let addr = socket_addr(&info.control);
            let mut pause = Duration::from_millis(5);
            loop {
                let attempt = quic.connect(
                    addr,
                    Fingerprint(info.fingerprint),
                    Role::Member,
                    route,
                    peer,
                );
                match tokio::time::timeout_at(tokio_instant(give_up), attempt).await {
                    Ok(Ok(conn)) => {
                        let channel = Arc::new(conn.into_control());
                        let _ = tx.send(LineageMsg::Channel {
                            peer,
                            epoch,
                            role: Role::Member,
                            channel,
                        });
                        return;
                    }
                    Ok(Err(e)) if not_yet(&e) && Instant::now() + pause < give_up => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, %epoch, error = %e, "control stream not opened");
                        break;
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(LineageMsg::ConnectFailed { peer, epoch });
        });
    }

    fn my_rank(&self, epoch: Epoch) -> Option<Rank> {
        if epoch == self.node.epoch() {
            return Some(self.node.rank());
        }
        let table = self.tables.get(&epoch)?;
        let fp = self.session.identity.fingerprint().0;
        table
            .iter()
            .find(|p| p.fingerprint == fp && p.incarnation == self.session.incarnation)
            .map(|p| p.rank)
    }

    fn close_peer(&mut self, peer: Rank, epoch: Epoch, code: CloseCode) {
        let ids: Vec<u64> = self
            .chans
            .iter()
            .filter(|(_, c)| c.role == Role::Member && c.peer == peer && c.epoch == epoch)
            .map(|(id, _)| *id)
            .collect();
        let budget = self.session.config.teardown_budget / 2;
        for id in ids {
            if let Some(c) = self.chans.remove(&id) {
                drop(c.close(code, code.name(), budget));
            }
        }
    }

    /// Writes `queued` on a fresh stream, then closes it with `code` (bounded like
    /// `Chan::close`); resolves once the close left.
    fn departing_close(
        &self,
        channel: Arc<ControlChannel>,
        queued: VecDeque<Message>,
        code: CloseCode,
        detail: &str,
    ) -> JoinHandle<()> {
        let budget = self.session.config.teardown_budget / 2;
        let detail = detail.to_owned();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + budget;
            let write = async {
                for m in queued {
                    if channel.send(m).await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout_at(until, write).await;
            channel.close(code, &detail);
            while !channel.close_sent() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    }

    /// Closes every stream after flushing it (bounded); the handles resolve when closed.
    fn close_all(&mut self, code: CloseCode, detail: &str) -> Vec<JoinHandle<()>> {
        let budget = self.session.config.teardown_budget / 2;
        self.chans
            .drain()
            .map(|(_, c)| c.close(code, detail, budget))
            .collect()
    }

    fn live_epochs(&self) -> Vec<Arc<EpochHooks>> {
        self.epochs.iter().filter_map(Weak::upgrade).collect()
    }

    fn abort_epoch(&self, epoch: Epoch, reason: AbortReason) {
        for hooks in self.live_epochs().into_iter().filter(|h| h.epoch == epoch) {
            hooks.ctx.abort(reason.clone());
        }
    }

    fn on_event(&mut self, event: Event) {
        tracing::debug!(?event, "control event");
        match event {
            Event::PeerDead {
                epoch,
                rank,
                evidence,
                ..
            } => {
                let (reason, error) = failure(rank, evidence);
                self.shared.record_error(error);
                self.abort_epoch(epoch, reason);
                // `evicted`: the receiver was declared absent (SPEC.md, "Codes"). A frozen
                // peer reads it from its data links when it resumes, and stops.
                self.cancel_link(epoch, rank, CloseCode::EVICTED);
            }
            Event::PeerDeparted {
                epoch, rank, code, ..
            } => {
                if code.is_graceful() {
                    // A graceful leave: operations already in flight finish or fail on the
                    // link itself (its departure arrives after its data, in order), so they
                    // are not cut short here; later operations fail on the departed link.
                    // Links still being built to it never will be.
                    Shared::lock(&self.shared.departed).insert((epoch, rank));
                    for hooks in self.live_epochs() {
                        if hooks.epoch == epoch && hooks.building {
                            hooks.ctx.abort(AbortReason::PeerDeparted { rank, code });
                        }
                    }
                } else {
                    let (reason, error) = departure(rank, code);
                    self.shared.record_error(error);
                    self.abort_epoch(epoch, reason);
                }
            }
            Event::Revoked {
                epoch,
                origin,
                cause,
            } => {
                // A revoke that answers a departure or failure under running operations
                // (see `on_data_departed`) names it: that is what happened. The origin says
                // so in the revoke; failing that (an origin that revoked on the
                // application's word), this member may know it from the control plane or
                // from its own link to the one that left.
                let departed_here = || {
                    let on_links = self
                        .live_epochs()
                        .into_iter()
                        .filter(|h| h.epoch == epoch)
                        .flat_map(|h| {
                            h.links
                                .iter()
                                .filter(|l| {
                                    matches!(
                                        l.failure(),
                                        Some(LinkError::PeerDeparted { code, .. })
                                            if code.is_graceful()
                                    )
                                })
                                .map(|l| l.peer())
                                .collect::<Vec<_>>()
                        })
                        .min();
                    Shared::lock(&self.shared.departed)
                        .iter()
                        .filter(|(e, _)| *e == epoch)
                        .map(|(_, r)| *r)
                        .min()
                        .or(on_links)
                };
                let (reason, error) = match cause {
                    Some(RevokeCause {
                        subject,
                        evidence: Evidence::Departed { code },
                    }) => departure(subject, code),
                    Some(RevokeCause { subject, evidence }) => failure(subject, evidence),
                    None => match departed_here() {
                        Some(rank) => departure(rank, CloseCode::NORMAL),
                        None => {
                            let reason = AbortReason::Revoked {
                                origin: Some(origin),
                            };
                            let error = Error::new(ErrorKind::Revoked, reason.to_string());
                            (reason, error)
                        }
                    },
                };
                self.shared.record_error(error);
                self.abort_epoch(epoch, reason);
            }
            Event::Evicted { epoch, cause } => {
                self.shared.record_error(Error::new(
                    ErrorKind::Evicted,
                    format!("this member was removed from the communicator at {epoch}: {cause:?}"),
                ));
                for hooks in self.live_epochs() {
                    hooks.ctx.abort(AbortReason::Evicted);
                }
                for w in self.waiters.drain(..) {
                    let _ = w.reply.send(Err(Error::new(
                        ErrorKind::Evicted,
                        "evicted during agreement",
                    )));
                }
            }
            Event::MembershipAgreed(agreed) => self.on_agreed(agreed),
            Event::AgreementStalled {
                epoch,
                votes,
                needed,
                ..
            } => {
                tracing::warn!(%epoch, votes, needed, "agreement stalled");
            }
            Event::PeerSuspect { .. } | Event::PeerRecovered { .. } => {}
        }
    }

    fn cancel_link(&self, epoch: Epoch, peer: Rank, code: CloseCode) {
        for hooks in self.live_epochs().into_iter().filter(|h| h.epoch == epoch) {
            for link in hooks.links.iter().filter(|l| l.peer() == peer) {
                link.cancel(chorus_engine::CancelReason::new(code, "peer declared gone"));
            }
        }
    }

    fn on_agreed(&mut self, agreed: Agreed) {
        let Some(old) = self.tables.get(&agreed.previous) else {
            tracing::error!(epoch = %agreed.previous, "agreement on an epoch this member never had");
            return;
        };
        let table = match agreed.plan.apply(old, &agreed.joiners) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "agreed plan does not fit the table");
                return;
            }
        };
        let epoch = agreed.epoch();
        self.session
            .registry
            .serve(agreed.comm, epoch, agreed.rank, self.me.clone());
        self.tables.insert(epoch, table.clone());
        self.comms.insert(epoch, agreed.comm);
        // Welcome the joiners this member coordinated.
        if !agreed.joiners.is_empty() {
            let welcome = Welcome {
                comm: agreed.comm,
                epoch,
                members: table.clone(),
            };
            for (peer, id) in &self.joiners {
                if agreed
                    .joiners
                    .iter()
                    .any(|j| j.incarnation == peer.incarnation)
                    && let Some(c) = self.chans.get(id)
                {
                    c.send(Message::Welcome(welcome.clone()));
                }
            }
            self.joiners.clear();
            self.wanted_joiners = None;
        }
        let next = NextEpoch { agreed, table };
        let grew = !next.agreed.joiners.is_empty();
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if next.agreed.previous >= w.after && (!w.grow || grew) {
                let _ = w.reply.send(Ok(next.clone()));
            } else {
                self.waiters.push(w);
            }
        }
        self.agreed = Some(next);
        self.watch_processes(epoch);
    }

    fn expire_waiters(&mut self) {
        let now = Instant::now();
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if now >= w.deadline {
                let what = if w.grow { "grow" } else { "shrink" };
                let _ = w.reply.send(Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{what} agreement did not finish within {:?}",
                        self.session.config.agree_timeout
                    ),
                )));
            } else {
                self.waiters.push(w);
            }
        }
    }

    fn watchdog(&mut self) {
        let now = Instant::now();
        for hooks in self.live_epochs() {
            hooks
                .recorder
                .abort_overdue(now, self.session.config.op_timeout);
        }
    }

    fn publish_health(&self) {
        *Shared::lock(&self.shared.health) = self.node.peers(self.session.clock.now());
    }

    /// Watches every same-host peer of `epoch`'s table by process id (the fastest death
    /// evidence), replacing the watches of earlier epochs.
    fn watch_processes(&mut self, epoch: Epoch) {
        for w in self.watches.drain(..) {
            w.abort();
        }
        if !self.session.config.same_host_evidence {
            return;
        }
        let Some(table) = self.tables.get(&epoch) else {
            return;
        };
        let me = std::process::id();
        for peer in table
            .iter()
            .filter(|p| p.pid != me && crate::host::is_local(&self.session.host, &p.host))
        {
            let (rank, pid, tx) = (peer.rank, peer.pid, self.me.clone());
            // On the session's runtime: the first epoch's watches are set up by
            // `Driver::new`, on the application's thread, which has no runtime.
            self.watches.push(self.session.handle.spawn(async move {
                match ProcessWatch::open(pid) {
                    Ok(watch) => {
                        if watch.exited().await.is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::debug!(pid, error = %e, "cannot watch a same-host peer");
                        return;
                    }
                }
                let _ = tx.send(LineageMsg::Exited { peer: rank, epoch });
            }));
        }
    }
}

/// The control plane's configuration from the communicator's.
pub(crate) fn control_config(config: &crate::Config) -> chorus_control::Config {
    let mut c =
        chorus_control::Config::from_timing(config.heartbeat_interval, config.heartbeat_deadline);
    c.observers = config.observers;
    c.quorum = config.quorum;
    c
}

/// The abort reason and error for `rank` declared dead on `evidence`.
fn failure(rank: Rank, evidence: Evidence) -> (AbortReason, Error) {
    let reason = AbortReason::PeerFailed { rank, evidence };
    let error = Error::new(ErrorKind::PeerFailed, reason.to_string())
        .with_peer(rank)
        .with_evidence(evidence);
    (reason, error)
}

/// The abort reason and error for `rank`'s departure with `code`.
fn departure(rank: Rank, code: CloseCode) -> (AbortReason, Error) {
    let reason = AbortReason::PeerDeparted { rank, code };
    let error = Error::new(kind_of_close(code), reason.to_string())
        .with_peer(rank)
        .with_evidence(Evidence::Departed { code });
    (reason, error)
}
