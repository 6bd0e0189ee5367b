//! The lineage's policy: every decision a lineage makes, as a sans-IO state machine in the
//! manner of the `chorus_control::Node` it owns.
//!
//! The lineage's task feeds it what happened (`handle` for the node's inputs, the other
//! methods for the application's requests and the runtime's observations), always with
//! `now` from the runtime's `Clock`, and then carries out what it decided: the node's
//! frames and connection intents (`poll_transmit`, `poll_intent`) and the lineage's own
//! [`Action`]s (`poll_action`): aborts, errors to record, answers to shrink and grow,
//! welcomes. Nothing here reads a clock, spawns a task or touches a socket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use chorus_control::{
    Agreed, AgreementFailure, Command, ConnectionIntent, Event, Input, Instant, Node, Status,
    Transmit, Witness,
};
use chorus_engine::context::AbortReason;
use chorus_protocol::message::{
    Evidence, Join, Message, PeerInfo, PeerState, PeerStatus, RevokeCause, Verdict, Welcome,
};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use super::aborts::{self, Scope};
use super::action::Action;
use super::channels::Route;
use super::departure::Departure;
use super::joiners::Joiners;
use super::waiters::{PendingAgreement, PendingAgreements, Reply};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::runtime::mailbox::NextEpoch;

/// The status reported for a process whose exit was seen but whose exit status was not
/// (a pidfd on a process that is not our child); `Evidence` displays it as unknown.
const STATUS_UNKNOWN: i32 = i32::MIN;

/// This process as peer tables list it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Me {
    pub(super) fingerprint: [u8; 32],
    pub(super) incarnation: u64,
}

/// The timing the policy applies (from the communicator's configuration).
#[derive(Clone, Copy, Debug)]
pub(super) struct PolicyTiming {
    /// How long a shrink or grow waits for its agreement.
    pub(super) agree: Duration,
    /// How long a departure waits for streams still being opened.
    pub(super) depart: Duration,
}

impl PolicyTiming {
    pub(super) fn of(config: &Config) -> PolicyTiming {
        PolicyTiming {
            agree: config.agree_timeout,
            depart: config.teardown_budget / 2,
        }
    }
}

/// The lineage's decisions; see the module docs.
pub(super) struct Policy {
    node: Node,
    me: Me,
    timing: PolicyTiming,
    /// Peer tables by epoch.
    tables: HashMap<Epoch, Vec<PeerInfo>>,
    /// Communicator id at each epoch.
    comms: HashMap<Epoch, CommId>,
    /// The newest agreement, which answers late shrink and grow calls.
    agreed: Option<NextEpoch>,
    waiters: PendingAgreements,
    joiners: Joiners,
    /// Peers that left gracefully at each epoch.
    departed: HashSet<(Epoch, Rank)>,
    /// Leaving: the departure is on its way to the streams that exist, and to those still
    /// being opened (a member that leaves right after init has some of each).
    departure: Option<Departure>,
    actions: VecDeque<Action>,
}

impl Policy {
    /// The policy of `welcome`'s communicator as `rank`, starting at `now`.
    pub(super) fn new(
        config: &Config,
        welcome: &Welcome,
        rank: Rank,
        me: Me,
        now: Instant,
    ) -> Result<Policy, Error> {
        let view = chorus_control::View::from_welcome(welcome, rank)
            .map_err(|e| Error::new(ErrorKind::Bootstrap, format!("bad peer table: {e}")))?;
        let node = Node::new(control_config(config), view, now)
            .map_err(|e| Error::new(ErrorKind::Config, format!("control plane: {e}")))?;
        Ok(Policy {
            node,
            me,
            timing: PolicyTiming::of(config),
            tables: HashMap::from([(welcome.epoch, welcome.members.clone())]),
            comms: HashMap::from([(welcome.epoch, welcome.comm)]),
            agreed: None,
            waiters: PendingAgreements::default(),
            joiners: Joiners::default(),
            departed: HashSet::new(),
            departure: None,
            actions: VecDeque::new(),
        })
    }

    // -----------------------------------------------------------------------------------
    // The node's side

    /// Hands `input` to the node.
    pub(super) fn handle(&mut self, now: Instant, input: Input) {
        if let Err(e) = self.node.handle(now, input) {
            tracing::debug!(error = %e, "control input refused");
        }
    }

    pub(super) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.node.poll_transmit()
    }

    pub(super) fn poll_intent(&mut self) -> Option<ConnectionIntent> {
        self.node.poll_intent()
    }

    /// When the node next wants `handle(now, Input::Timeout)`.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.node.poll_timeout()
    }

    /// The next thing to carry out, turning the node's events into actions as it goes.
    /// `departed_on_links(epoch)` is the lowest rank whose data link at `epoch` carries a
    /// graceful departure (the task's links are the only place that is known).
    pub(super) fn poll_action(
        &mut self,
        departed_on_links: impl Fn(Epoch) -> Option<Rank>,
    ) -> Option<Action> {
        loop {
            if let Some(action) = self.actions.pop_front() {
                return Some(action);
            }
            let event = self.node.poll_event()?;
            self.on_event(event, &departed_on_links);
        }
    }

    /// The node, for what it reports (rank, epoch, world, status).
    pub(super) fn node(&self) -> &Node {
        &self.node
    }

    /// The peer table at `epoch`.
    pub(super) fn table(&self, epoch: Epoch) -> Option<&[PeerInfo]> {
        self.tables.get(&epoch).map(Vec::as_slice)
    }

    /// This member's view of every member at `now`: the health the application reads.
    pub(super) fn health(&self, now: Instant) -> Vec<PeerStatus> {
        self.node.peers(now)
    }

    /// Where a control stream to `peer` at `epoch` goes, if this member knows the epoch.
    pub(super) fn route(&self, epoch: Epoch, peer: Rank) -> Option<Route> {
        let (table, comm) = (self.tables.get(&epoch)?, self.comms.get(&epoch)?);
        let info = table.get(peer.index()).cloned()?;
        let me = self.my_rank(epoch)?;
        Some(Route {
            comm: *comm,
            me,
            peer: info,
        })
    }

    fn my_rank(&self, epoch: Epoch) -> Option<Rank> {
        if epoch == self.node.epoch() {
            return Some(self.node.rank());
        }
        self.tables
            .get(&epoch)?
            .iter()
            .find(|p| p.fingerprint == self.me.fingerprint && p.incarnation == self.me.incarnation)
            .map(|p| p.rank)
    }

    /// Why the current epoch cannot run operations at `now`, if so (see
    /// [`aborts::absence`]).
    pub(super) fn absence(&self, now: Instant, any_leave: bool) -> Option<AbortReason> {
        aborts::absence(self.node.peers(now), any_leave)
    }

    // -----------------------------------------------------------------------------------
    // What the runtime observed

    /// A control frame from a member.
    pub(super) fn member_frame(
        &mut self,
        now: Instant,
        peer: Rank,
        epoch: Epoch,
        message: Message,
    ) {
        let comm = self.comms.get(&epoch).copied().unwrap_or(self.node.comm());
        self.handle(
            now,
            Input::Frame(chorus_control::Received {
                from: peer,
                comm,
                epoch,
                message,
            }),
        );
    }

    /// A frame from the launcher: its witness of a rank's exit.
    pub(super) fn launcher_frame(&mut self, now: Instant, epoch: Epoch, message: Message) {
        if let Message::Notice(n) = message
            && n.verdict == Verdict::Dead
            && let Evidence::LauncherWitness { status } = n.evidence
        {
            self.handle(
                now,
                Input::PeerExited {
                    peer: n.subject,
                    epoch,
                    status,
                    witness: Witness::Launcher,
                },
            );
        }
    }

    /// A process asks to join on stream `chan`.
    pub(super) fn join(&mut self, now: Instant, join: Join, chan: u64) {
        self.joiners.asked(join.peer, chan);
        self.maybe_admit(now);
    }

    /// A same-host peer's exit, settled: `Some(code)` if its data link carried its
    /// departure first, `None` if it died.
    pub(super) fn exited_as(
        &mut self,
        now: Instant,
        peer: Rank,
        epoch: Epoch,
        end: Option<CloseCode>,
    ) {
        let input = match end {
            Some(code) => Input::ConnectionClosed { peer, epoch, code },
            None => Input::PeerExited {
                peer,
                epoch,
                status: STATUS_UNKNOWN,
                witness: Witness::Pidfd,
            },
        };
        self.handle(now, input);
    }

    /// An operation lost its data link to `peer` without a departure: conclusive (the
    /// peer's sockets closed), unless the peer is known to have left.
    pub(super) fn data_lost(&mut self, now: Instant, peer: Rank, epoch: Epoch) {
        if !self.departed.contains(&(epoch, peer)) {
            self.handle(
                now,
                Input::ConnectionLost {
                    peer,
                    epoch,
                    code: CloseCode::INTERNAL,
                },
            );
        }
    }

    /// An operation failed on a data link's departure. `evicted` is conclusive (the peer
    /// removed this member) and `aborted` too (the peer aborted its communicator): the
    /// node learns it like a control stream's close. `normal` and `left` only say the peer
    /// is done with this epoch's streams — it left the communicator, or abandoned an epoch
    /// whose links could not be built and is about to agree on the next one (SPEC.md 11.2
    /// closes old streams with `normal`) — so the control plane is not told the peer is
    /// gone; but the members waiting on this one are stranded all the same, so the epoch
    /// is revoked: every member's operations end at once, naming the departure (see
    /// `aborts::revoke`), instead of at their operation deadline. Other codes go to the
    /// node like a control stream's close, which takes `deadline` (a connection the peer
    /// gave up before use, SPEC 6) for a live peer's refusal, not evidence.
    pub(super) fn data_departed(
        &mut self,
        now: Instant,
        peer: Rank,
        epoch: Epoch,
        code: CloseCode,
    ) {
        if !code.is_graceful() {
            self.handle(now, Input::ConnectionClosed { peer, epoch, code });
        } else if epoch == self.node.epoch() {
            self.departed.insert((epoch, peer));
            // The revoke names the departure, so that every member reports it even where
            // the revoke arrives before the leaver's own word.
            let cause = RevokeCause {
                subject: peer,
                evidence: Evidence::Departed { code },
            };
            self.handle(now, Input::Command(Command::Revoke { cause: Some(cause) }));
        }
    }

    // -----------------------------------------------------------------------------------
    // The application's requests

    /// A member that was evicted (or left) takes part in no agreement: the error that says
    /// so at once rather than at the agreement deadline.
    fn inert(&self) -> Option<Error> {
        match self.node.status() {
            Status::Member => None,
            Status::Evicted => Some(Error::new(
                ErrorKind::Evicted,
                "this member was removed from the communicator; it cannot change it",
            )),
            Status::Departed { code } => Some(Error::new(
                ErrorKind::Destroyed,
                format!("this member left the communicator ({code})"),
            )),
        }
    }

    /// Shrink past `after`, answered by `deadline`: the agreement past `after` is the
    /// answer, unless its epoch (the current one) lost a member since: then the survivors
    /// agree again, past it. A member whose view cannot reach a quorum is answered at once
    /// (the node says so, see `on_event`).
    pub(super) fn shrink(&mut self, now: Instant, after: Epoch, deadline: Instant, reply: Reply) {
        if let Some(error) = self.inert() {
            return self.answer(reply, Err(error));
        }
        let mut after = after;
        if let Some(next) = self.agreed.as_ref().filter(|n| n.agreed.previous >= after) {
            let broken =
                next.agreed.epoch() == self.node.epoch() && self.absence(now, true).is_some();
            if !broken {
                let next = next.clone();
                return self.answer(reply, Ok(next));
            }
            after = self.node.epoch();
        }
        self.waiters.push(PendingAgreement {
            after,
            grow: false,
            deadline,
            reply,
        });
        self.handle(now, Input::Command(Command::Shrink));
    }

    /// Grow past `after` by `joiners`, answered by `deadline`: by an agreement past `after`
    /// that admitted joiners; rank 0 coordinates (it proposes once the joiners have asked).
    pub(super) fn grow(
        &mut self,
        now: Instant,
        after: Epoch,
        joiners: u32,
        deadline: Instant,
        reply: Reply,
    ) {
        if let Some(error) = self.inert() {
            return self.answer(reply, Err(error));
        }
        if let Some(next) = self
            .agreed
            .as_ref()
            .filter(|n| n.agreed.previous >= after && !n.agreed.joiners.is_empty())
        {
            let next = next.clone();
            return self.answer(reply, Ok(next));
        }
        self.waiters.push(PendingAgreement {
            after,
            grow: true,
            deadline,
            reply,
        });
        if self.node.rank() == Rank(0) {
            self.joiners.want(joiners);
            self.maybe_admit(now);
        }
    }

    /// Revoke the current epoch everywhere.
    pub(super) fn revoke(&mut self, now: Instant) {
        self.handle(now, Input::Command(Command::Revoke { cause: None }));
    }

    /// Leave with `code`: the node queues its departures (the task then closes the
    /// streams and calls [`Policy::departing`]). `false` if already leaving.
    pub(super) fn depart(&mut self, now: Instant, code: CloseCode, detail: &str) -> bool {
        if self.departure.is_some() {
            return false;
        }
        let command = if code == CloseCode::ABORTED {
            Command::Abort
        } else {
            Command::Depart {
                code,
                detail: detail.to_owned(),
            }
        };
        self.handle(now, Input::Command(command));
        true
    }

    /// The departure is on its way (`delivered`: on at least one open stream); from now
    /// on it waits for the streams to present members still being opened.
    pub(super) fn departing(
        &mut self,
        now: Instant,
        code: CloseCode,
        detail: String,
        delivered: bool,
    ) {
        let epoch = self.node.epoch();
        let absent = self
            .node
            .peers(now)
            .into_iter()
            .filter(|p| matches!(p.state, PeerState::Dead | PeerState::Departed))
            .map(|p| (epoch, p.rank))
            .collect();
        self.departure = Some(Departure {
            code,
            detail,
            until: now + self.timing.depart,
            absent,
            delivered,
        });
    }

    /// The departure in progress, if any.
    pub(super) fn departure(&self) -> Option<&Departure> {
        self.departure.as_ref()
    }

    /// The departure went out on a stream that just opened.
    pub(super) fn delivered(&mut self) {
        if let Some(d) = &mut self.departure {
            d.delivered = true;
        }
    }

    /// Ends the departure in progress once nothing is left to wait for at `now` (see
    /// `Departure::settled`); `true` when it ended.
    pub(super) fn departed<'a>(
        &mut self,
        now: Instant,
        connecting: impl Iterator<Item = &'a (Epoch, Rank)>,
    ) -> bool {
        let epoch = self.node.epoch();
        match &self.departure {
            Some(d) if d.settled(now, epoch, connecting) => {
                self.departure = None;
                true
            }
            _ => false,
        }
    }

    /// Fails the shrinks and grows whose agreement did not come by their deadline.
    pub(super) fn expire(&mut self, now: Instant) {
        for w in self.waiters.expired(now) {
            let error = Error::new(
                ErrorKind::Timeout,
                format!(
                    "{} agreement did not finish within {:?}",
                    w.what(),
                    self.timing.agree
                ),
            );
            self.answer(w.reply, Err(error));
        }
    }

    // -----------------------------------------------------------------------------------
    // Decisions

    fn answer(&mut self, reply: Reply, result: Result<NextEpoch, Error>) {
        self.actions.push_back(Action::Answer { reply, result });
    }

    fn abort(&mut self, scope: Scope, reason: AbortReason) {
        self.actions.push_back(Action::Abort { scope, reason });
    }

    /// The grow coordinator proposes once the wanted number of joiners has arrived.
    fn maybe_admit(&mut self, now: Instant) {
        if let Some(peers) = self.joiners.proposal() {
            self.handle(now, Input::Command(Command::Admit(peers)));
        }
    }

    fn on_event(&mut self, event: Event, departed_on_links: &impl Fn(Epoch) -> Option<Rank>) {
        tracing::debug!(?event, "control event");
        match event {
            Event::PeerDead {
                epoch,
                rank,
                evidence,
                ..
            } => {
                let (reason, error) = aborts::failure(rank, evidence);
                self.actions.push_back(Action::Record(error));
                self.abort(Scope::Epoch(epoch), reason);
                // `evicted`: the receiver was declared absent (SPEC.md, "Codes"). A frozen
                // peer reads it from its data links when it resumes, and stops.
                self.actions.push_back(Action::CancelLinks {
                    epoch,
                    peer: rank,
                    code: CloseCode::EVICTED,
                });
            }
            Event::PeerDeparted {
                epoch, rank, code, ..
            } => {
                if code.is_graceful() {
                    // A graceful leave: operations already in flight finish or fail on the
                    // link itself (its departure arrives after its data, in order), so they
                    // are not cut short here; later operations fail on the departed link.
                    // Links still being built to it never will be.
                    self.departed.insert((epoch, rank));
                    self.abort(
                        Scope::Building(epoch),
                        AbortReason::PeerDeparted { rank, code },
                    );
                } else {
                    let (reason, error) = aborts::departure(rank, code);
                    self.actions.push_back(Action::Record(error));
                    self.abort(Scope::Epoch(epoch), reason);
                }
            }
            Event::Revoked {
                epoch,
                origin,
                cause,
            } => {
                let departed = &self.departed;
                let (reason, error) = aborts::revoke(origin, cause, || {
                    departed
                        .iter()
                        .filter(|(e, _)| *e == epoch)
                        .map(|(_, r)| *r)
                        .min()
                        .or_else(|| departed_on_links(epoch))
                });
                self.actions.push_back(Action::Record(error));
                self.abort(Scope::Epoch(epoch), reason);
            }
            Event::Evicted { epoch, cause } => {
                self.actions.push_back(Action::Record(Error::new(
                    ErrorKind::Evicted,
                    format!("this member was removed from the communicator at {epoch}: {cause:?}"),
                )));
                self.abort(Scope::All, AbortReason::Evicted);
                for w in self.waiters.all() {
                    let error = Error::new(ErrorKind::Evicted, "evicted during agreement");
                    self.answer(w.reply, Err(error));
                }
            }
            Event::MembershipAgreed(agreed) => self.on_agreed(agreed),
            Event::AgreementFailed { epoch, failure } => {
                let error = match failure {
                    AgreementFailure::NoQuorum(verdict) => Error::new(
                        ErrorKind::NoQuorum,
                        format!("shrink cannot reach a quorum: {verdict}"),
                    ),
                    AgreementFailure::Timeout { waited } => Error::new(
                        ErrorKind::Timeout,
                        format!("shrink agreement did not finish within {waited:?}"),
                    ),
                };
                tracing::warn!(%epoch, %error, "shrink given up");
                for w in self.waiters.given_up(epoch) {
                    self.answer(w.reply, Err(error.clone()));
                }
            }
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
        if !agreed.plan.removed().is_empty() {
            self.actions.push_back(Action::Fence {
                comm: self
                    .comms
                    .get(&agreed.previous)
                    .copied()
                    .unwrap_or(agreed.comm),
                epoch: agreed.previous,
                removed: agreed.plan.removed().to_vec(),
            });
        }
        self.actions.push_back(Action::Serve {
            comm: agreed.comm,
            epoch,
            rank: agreed.rank,
        });
        self.tables.insert(epoch, table.clone());
        self.comms.insert(epoch, agreed.comm);
        // Welcome the joiners this member coordinated.
        if !agreed.joiners.is_empty() {
            let welcome = Welcome {
                comm: agreed.comm,
                epoch,
                members: table.clone(),
            };
            for chan in self.joiners.admitted(&agreed.joiners) {
                self.actions.push_back(Action::Welcome {
                    chan,
                    welcome: welcome.clone(),
                });
            }
        }
        let next = NextEpoch { agreed, table };
        for w in self.waiters.answered(&next) {
            self.answer(w.reply, Ok(next.clone()));
        }
        self.agreed = Some(next);
        self.actions.push_back(Action::Watch(epoch));
    }
}

/// The control plane's configuration from the communicator's.
fn control_config(config: &Config) -> chorus_control::Config {
    let mut c =
        chorus_control::Config::from_timing(config.heartbeat_interval, config.heartbeat_deadline);
    c.observers = config.observers;
    c.quorum = config.quorum;
    // The node's own bound on a shrink request: the caller's, so the answer comes from
    // whichever notices first, never later.
    c.request_timeout = config.agree_timeout;
    c
}
