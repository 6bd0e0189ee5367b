//! The node: one member's control plane as a sans-IO state machine.
//!
//! The runtime (or the simulator) feeds it inputs with [`Node::handle`] and then drains
//! [`Node::poll_transmit`], [`Node::poll_intent`] and [`Node::poll_event`], and calls
//! `handle(now, Input::Timeout)` at [`Node::poll_timeout`]. Nothing here reads a clock,
//! spawns a thread, touches a socket or draws a random number.
//!
//! # The runtime's side of the contract
//!
//! - Call `handle` no later than `poll_timeout` (it is never more than one heartbeat
//!   interval away while the node is a member). A late call is measured: the node treats
//!   the lateness as its own stall and does not count it against the peers it watches.
//! - Frames: pass every control frame with its header (`from` is the sender's rank at the
//!   frame's epoch). Frames of an older epoch are refused ([`InputError::StaleEpoch`]);
//!   the node may answer the sender with the `Commit` it missed, addressed at that older
//!   epoch — so keep the previous epochs' peer tables for a few epochs.
//! - After `Event::MembershipAgreed`, the node is at the new epoch with a new rank; build
//!   the new table with `agreed.plan.apply(&old_table, &agreed.joiners)`; the member that
//!   ran `Command::Admit` welcomes the joiners (`Welcome` with the new table), and a joiner
//!   starts its own node with [`Node::new`] from that `Welcome`.
//! - After `Event::Evicted`, or after `Command::Depart`/`Abort`, the node is inert: it only
//!   still yields what it queued (the `Depart` frames and closes).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use chorus_protocol::message::{
    Commit, Depart, Evidence, Heartbeat, Kind, Message, Notice, PeerInfo, PeerState, PeerStatus,
    Revoke, Verdict,
};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use crate::agreement::{Agreement, Ctx};
use crate::broadcast::{Digest, Fingers};
use crate::config::{Config, ConfigError};
use crate::detector::{Detector, Expiry};
use crate::error::InputError;
use crate::event::{Agreed, Event, Eviction};
use crate::input::{Command, Input, Received, Witness};
use crate::knock::Knock;
use crate::lateness::Lateness;
use crate::ledger::Ledger;
use crate::outbox::Outbox;
use crate::overlay::Ring;
use crate::plan::Plan;
use crate::quorum::reach;
use crate::request::Request;
use crate::revoke::Revocation;
use crate::time::{Instant, millis};
use crate::transmit::{ConnectionIntent, Transmit};
use crate::view::View;

/// The origin of a launcher's witness notice (`Rank::NONE` in the protocol: no rank).
const LAUNCHER: Rank = Rank(u32::MAX);

/// Longest `Depart::detail` the protocol carries (SPEC 9.2).
const MAX_DETAIL: usize = 512;

/// How many past commits a node keeps to catch up members that missed one.
const HISTORY: usize = 8;

/// Bound on remembered rate-limit entries (reset past it; it only throttles replies).
const MAX_REPLY_MEMORY: usize = 4096;

/// Where a node stands.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Status {
    /// A member of its current epoch.
    Member,
    /// Left with this code (`Command::Depart` or `Command::Abort`).
    Departed { code: CloseCode },
    /// Removed or declared dead; must not act.
    Evicted,
}

/// Counters for tracing, `chorus status` and the simulator.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames handed in.
    pub frames: u64,
    /// Frames refused for an older epoch.
    pub stale: u64,
    /// Frames refused for a newer epoch.
    pub future: u64,
    /// Frames refused because their sender is absent.
    pub from_absent: u64,
    /// Frames refused as invalid or not for the control plane.
    pub invalid: u64,
    /// Times this node found itself woken later than asked (by more than the tolerance).
    pub stalls: u64,
    /// Heartbeats sent.
    pub heartbeats: u64,
    /// Notices sent (originated, forwarded or pushed by anti-entropy).
    pub notices: u64,
    /// Anti-entropy pushes made.
    pub repairs: u64,
    /// Commits sent to members that missed them.
    pub catch_ups: u64,
}

/// Reply kinds for rate limiting.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Reply {
    CatchUp,
    Accuse,
    Repair,
    Evict,
}

/// One member's control plane. See the module docs for how to drive it.
#[derive(Debug)]
pub struct Node {
    config: Config,
    view: View,
    status: Status,
    ledger: Ledger,
    detector: Detector,
    fingers: Fingers,
    revocation: Revocation,
    agreement: Agreement,
    /// The application's pending shrink and its one deadline.
    request: Request,
    history: VecDeque<(Commit, u32, Instant)>,
    links: BTreeSet<Rank>,
    next_wake: Option<Instant>,
    knowledge_at: Instant,
    /// Until when an accusation of death is explained by this member's own long stall.
    stalled_until: Option<Instant>,
    replies: BTreeMap<(Reply, u64, Rank), Instant>,
    /// Whom this member asks next whether it is there, while its view has no quorum.
    knock: Knock,
    out: Outbox,
    stats: Stats,
}

impl Node {
    /// A member at `view`, starting at `now`: it opens connections to its overlay
    /// neighbours and heartbeats at once.
    pub fn new(config: Config, view: View, now: Instant) -> Result<Node, ConfigError> {
        config.validate()?;
        let mut node = Node {
            detector: Detector::new(&config, now),
            ledger: Ledger::new(view.world()),
            config,
            view,
            status: Status::Member,
            fingers: Fingers::default(),
            revocation: Revocation::default(),
            agreement: Agreement::new(now, Vec::new()),
            request: Request::default(),
            history: VecDeque::new(),
            links: BTreeSet::new(),
            next_wake: None,
            knowledge_at: now,
            stalled_until: None,
            replies: BTreeMap::new(),
            knock: Knock::default(),
            out: Outbox::default(),
            stats: Stats::default(),
        };
        node.reset_overlay(now);
        node.next_wake = node.compute_next_wake(now);
        Ok(node)
    }

    /// Feeds one input. A refused frame changes no membership state (see [`InputError`]);
    /// any frame from a present member still counts as a sign of life.
    pub fn handle(&mut self, now: Instant, input: Input) -> Result<(), InputError> {
        if self.status != Status::Member {
            return match input {
                Input::Command(Command::Abort | Command::Depart { .. }) => Ok(()),
                _ => Err(InputError::Inactive),
            };
        }
        self.observe_wake(now);
        let result = match input {
            Input::Frame(frame) => self.on_frame(frame, now),
            Input::ConnectionOpened { peer, epoch } => self
                .check_epoch(epoch)
                .and_then(|()| self.on_opened(peer, now)),
            Input::ConnectionClosed { peer, epoch, code } => self
                .check_epoch(epoch)
                .and_then(|()| self.on_closed(peer, code, now)),
            Input::ConnectionLost { peer, epoch, code } => self.check_epoch(epoch).and_then(|()| {
                self.on_local_evidence(peer, Verdict::Dead, Evidence::ConnectionLost { code }, now)
            }),
            Input::PeerExited {
                peer,
                epoch,
                status,
                witness,
            } => self.check_epoch(epoch).and_then(|()| {
                let evidence = match witness {
                    Witness::Pidfd => Evidence::ProcessExited { status },
                    Witness::Launcher => Evidence::LauncherWitness { status },
                };
                self.on_local_evidence(peer, Verdict::Dead, evidence, now)
            }),
            Input::Timeout => Ok(()),
            Input::Command(command) => self.on_command(command, now),
        };
        if let Err(e) = &result {
            if e.close_code().is_some() {
                self.stats.invalid += 1;
            }
            tracing::trace!(rank = %self.view.rank(), epoch = %self.view.epoch(), error = %e, "input refused");
        }
        if self.status == Status::Member {
            self.tick(now);
        }
        self.next_wake = self.compute_next_wake(now);
        result
    }

    /// The next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.transmits.pop_front()
    }

    /// The next connection to open or close.
    pub fn poll_intent(&mut self) -> Option<ConnectionIntent> {
        self.out.intents.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// When to call `handle(now, Input::Timeout)` next; `None` once the node is inert.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_wake
    }

    pub fn view(&self) -> View {
        self.view
    }

    pub fn comm(&self) -> CommId {
        self.view.comm()
    }

    pub fn epoch(&self) -> Epoch {
        self.view.epoch()
    }

    pub fn rank(&self) -> Rank {
        self.view.rank()
    }

    pub fn world(&self) -> u32 {
        self.view.world()
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// How late the heartbeats of the peers this member watches arrived (past one
    /// interval after the previous one), over its life: what the deadline must absorb.
    pub fn heartbeat_lateness(&self) -> &Lateness {
        self.detector.lateness()
    }

    /// The ledger of the current epoch.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Whether the current epoch was revoked, and by whom.
    pub fn revoked_by(&self) -> Option<Rank> {
        self.revocation.origin()
    }

    /// Joiners admitted here that are not yet members.
    pub fn pending_joiners(&self) -> &[PeerInfo] {
        self.agreement.pending_joiners()
    }

    /// The ranks this member heartbeats to.
    pub fn observers(&self) -> &[Rank] {
        self.detector.observers()
    }

    /// The ranks this member watches.
    pub fn watched(&self) -> Vec<Rank> {
        self.detector.watched().collect()
    }

    /// One row per member (`StatusReply::peers`, `health()`), O(world); this member's own
    /// row is `Alive`, heard now.
    pub fn peers(&self, now: Instant) -> Vec<PeerStatus> {
        (0..self.view.world())
            .map(Rank)
            .map(|r| {
                if r == self.view.rank() {
                    PeerStatus {
                        rank: r,
                        state: PeerState::Alive,
                        last_heard_ms: 0,
                        evidence: None,
                    }
                } else {
                    self.ledger.status(r, now)
                }
            })
            .collect()
    }

    /// The digest of this member's knowledge at its epoch.
    pub fn digest(&self) -> Digest {
        self.ledger
            .digest()
            .with_revoked(self.revocation.is_revoked())
    }

    // -----------------------------------------------------------------------------------
    // Inputs

    fn on_frame(&mut self, frame: Received, now: Instant) -> Result<(), InputError> {
        self.stats.frames += 1;
        let kind = frame.message.kind();
        if frame.comm != self.view.comm() {
            return Err(InputError::UnknownComm {
                comm: frame.comm,
                expected: self.view.comm(),
            });
        }
        if !is_control(kind) {
            return Err(InputError::NotControl { kind });
        }
        let current = self.view.epoch();
        if frame.epoch < current {
            self.stats.stale += 1;
            self.life_across_epochs(&frame, now);
            self.on_stale(&frame, now);
            return Err(InputError::StaleEpoch {
                frame: frame.epoch,
                current,
            });
        }
        if frame.epoch > current {
            self.stats.future += 1;
            self.life_across_epochs(&frame, now);
            return Err(InputError::FutureEpoch {
                frame: frame.epoch,
                current,
            });
        }
        let from = frame.from;
        if from.get() >= self.view.world() {
            return Err(InputError::RankOutOfRange {
                rank: from,
                world: self.view.world(),
            });
        }
        if from == self.view.rank() {
            return Err(invalid(kind, "frame claims this member's own rank"));
        }
        if let Message::Depart(depart) = &frame.message
            && depart.code == CloseCode::EVICTED
        {
            // A member of a newer epoch that removed this one says so (SPEC 14), also
            // when this member holds it dead: that is how a healed minority learns.
            tracing::warn!(rank = %self.view.rank(), epoch = %current, peer = %from, detail = %depart.detail, "told it was removed");
            self.evict(current, Eviction::Closed { peer: from });
            return Ok(());
        }
        if self.ledger.is_absent(from) {
            self.stats.from_absent += 1;
            self.on_from_absent(from, now);
            return Err(InputError::FromAbsent { rank: from });
        }
        self.heard(from, now);
        match frame.message {
            Message::Heartbeat(hb) => {
                self.detector.heartbeat_from(from, now);
                self.on_heartbeat(from, hb, now);
                Ok(())
            }
            Message::Depart(depart) => {
                let notice = self.own_notice(
                    from,
                    Verdict::Departed,
                    Evidence::Departed { code: depart.code },
                );
                tracing::debug!(rank = %self.view.rank(), peer = %from, code = %depart.code, detail = %depart.detail, "peer departed");
                self.learn(notice, None, now);
                Ok(())
            }
            Message::Notice(notice) => self.on_notice(from, notice, now),
            Message::Revoke(revoke) => self.on_revoke(from, revoke, now),
            Message::Prepare(p) => {
                let (agreement, ctx, out) = self.agreement_parts(now);
                agreement.on_prepare(from, p, &ctx, out)
            }
            Message::Promise(p) => {
                let (agreement, ctx, out) = self.agreement_parts(now);
                let decided = agreement.on_promise(from, p, &ctx, out)?;
                self.decided(decided, now);
                Ok(())
            }
            Message::Propose(p) => {
                let (agreement, ctx, out) = self.agreement_parts(now);
                agreement.on_propose(from, p, &ctx, out)
            }
            Message::Accept(a) => {
                let (agreement, ctx, out) = self.agreement_parts(now);
                let decided = agreement.on_accept(from, a, &ctx, out)?;
                self.decided(decided, now);
                Ok(())
            }
            Message::Commit(c) => self.on_commit(from, c, now),
            // A grow request relayed by a member (SPEC 11.3): coordinate the admission here.
            Message::Join(join) if join.world == 0 => {
                let (agreement, ctx, out) = self.agreement_parts(now);
                let decided = agreement.admit(vec![join.peer], &ctx, out);
                self.decided(decided, now);
                Ok(())
            }
            Message::Join(_) | Message::Welcome(_) => Err(invalid(
                kind,
                "bootstrap joins go to the root; welcomes to joiners",
            )),
            other => Err(InputError::NotControl { kind: other.kind() }),
        }
    }

    fn on_opened(&mut self, peer: Rank, now: Instant) -> Result<(), InputError> {
        self.check_peer(peer)?;
        if !self.ledger.is_absent(peer) {
            self.heard(peer, now);
        }
        Ok(())
    }

    fn on_closed(&mut self, peer: Rank, code: CloseCode, now: Instant) -> Result<(), InputError> {
        self.check_peer(peer)?;
        if code == CloseCode::EVICTED {
            // Sent only by a member that installed an epoch without us.
            tracing::warn!(rank = %self.view.rank(), epoch = %self.view.epoch(), %peer, "evicted by a member's close");
            self.evict(self.view.epoch(), Eviction::Closed { peer });
            return Ok(());
        }
        if code.is_departure() {
            return self.on_local_evidence(
                peer,
                Verdict::Departed,
                Evidence::Departed { code },
                now,
            );
        }
        if code == CloseCode::INTERNAL {
            return self.on_local_evidence(
                peer,
                Verdict::Dead,
                Evidence::ConnectionLost { code },
                now,
            );
        }
        // Other codes (deadline, stale epoch, protocol violation, ...) come from a live peer
        // refusing this connection: not evidence that it is gone.
        tracing::debug!(rank = %self.view.rank(), %peer, %code, "connection closed by a live peer");
        Ok(())
    }

    fn on_local_evidence(
        &mut self,
        peer: Rank,
        verdict: Verdict,
        evidence: Evidence,
        now: Instant,
    ) -> Result<(), InputError> {
        self.check_peer(peer)?;
        let notice = self.own_notice(peer, verdict, evidence);
        self.learn(notice, None, now);
        Ok(())
    }

    fn on_command(&mut self, command: Command, now: Instant) -> Result<(), InputError> {
        match command {
            Command::Depart { code, detail } => self.depart(code, detail),
            Command::Abort => self.depart(CloseCode::ABORTED, "aborted".to_owned()),
            Command::Revoke { cause } => {
                let me = self.view.rank();
                self.revoke(
                    Revoke {
                        origin: me,
                        hops: 0,
                        cause,
                    },
                    None,
                    now,
                );
            }
            Command::Shrink => {
                self.request.ask(now, self.config.request_timeout);
                if self.no_quorum() {
                    return Ok(());
                }
                let (agreement, ctx, out) = self.agreement_parts(now);
                let decided = agreement.request(&ctx, out);
                self.decided(decided, now);
            }
            Command::Admit(joiners) => {
                if joiners.is_empty() {
                    return Ok(());
                }
                let (agreement, ctx, out) = self.agreement_parts(now);
                let decided = agreement.admit(joiners, &ctx, out);
                self.decided(decided, now);
            }
        }
        Ok(())
    }

    fn on_heartbeat(&mut self, from: Rank, hb: Heartbeat, now: Instant) {
        let mine = self.digest();
        if hb.digest == mine.get() {
            return;
        }
        // Only push from settled knowledge: during a flood digests differ for a moment.
        if now < self.knowledge_at + self.config.heartbeat_interval {
            return;
        }
        if !self.allow(Reply::Repair, from, now, self.config.heartbeat_interval) {
            return;
        }
        self.stats.repairs += 1;
        let epoch = self.view.epoch();
        let notices: Vec<Notice> = self.ledger.notices().collect();
        for notice in notices {
            self.stats.notices += 1;
            self.send(from, epoch, Message::Notice(notice));
        }
        if let Some(revoke) = self.revocation.message() {
            self.send(from, epoch, Message::Revoke(revoke));
        }
        // Our digest lets the sender push what it knows and we lack.
        let seq = self.detector.seq();
        self.send(
            from,
            epoch,
            Message::Heartbeat(Heartbeat {
                seq,
                digest: mine.get(),
            }),
        );
    }

    fn on_notice(&mut self, from: Rank, notice: Notice, now: Instant) -> Result<(), InputError> {
        let world = self.view.world();
        let launcher = notice.origin == LAUNCHER
            && matches!(notice.evidence, Evidence::LauncherWitness { .. })
            && notice.verdict == Verdict::Dead;
        for r in [notice.origin, notice.subject] {
            if r.get() >= world && !(launcher && r == LAUNCHER) {
                return Err(invalid(
                    Kind::Notice,
                    &format!("{r} outside the world of {world}"),
                ));
            }
        }
        if notice.verdict == Verdict::Suspect {
            // Suspicion is local; a peer's suspicion is not evidence here.
            return Ok(());
        }
        if notice.subject == self.view.rank() {
            self.accused(notice, now);
            return Ok(());
        }
        if self.ledger.is_absent(notice.subject) {
            return Ok(());
        }
        let notice = Notice {
            hops: notice.hops.saturating_add(1),
            ..notice
        };
        self.learn(notice, Some(from), now);
        Ok(())
    }

    fn on_revoke(&mut self, from: Rank, revoke: Revoke, now: Instant) -> Result<(), InputError> {
        if revoke.origin.get() >= self.view.world() {
            return Err(invalid(Kind::Revoke, "origin outside the world"));
        }
        if revoke
            .cause
            .is_some_and(|c| c.subject.get() >= self.view.world())
        {
            return Err(invalid(Kind::Revoke, "cause outside the world"));
        }
        self.revoke(
            Revoke {
                hops: revoke.hops.saturating_add(1),
                ..revoke
            },
            Some(from),
            now,
        );
        Ok(())
    }

    fn on_commit(&mut self, from: Rank, commit: Commit, now: Instant) -> Result<(), InputError> {
        if commit.proposal.comm != self.view.comm() {
            return Err(invalid(Kind::Commit, "commit for another communicator"));
        }
        let epoch = self.view.epoch();
        if commit.proposal.epoch <= epoch {
            return Ok(());
        }
        if commit.proposal.epoch > Epoch(epoch.get().saturating_add(1)) {
            return Err(InputError::FutureEpoch {
                frame: commit.proposal.epoch,
                current: epoch,
            });
        }
        let plan = Plan::from_proposal(self.view.world(), epoch, &commit.proposal)
            .map_err(|e| invalid(Kind::Commit, &e.to_string()))?;
        self.install(commit, plan, Some(from), now);
        Ok(())
    }

    /// A frame from an epoch this member left. If the commit that ended the sender's epoch
    /// removed it, tell it so (SPEC 14: `Depart{evicted}`, then a close with `evicted`): a
    /// member that was frozen, or cut off and now healed, learns it is out. Otherwise the
    /// sender missed that commit: answer with it, once the flood has had time to reach it.
    fn on_stale(&mut self, frame: &Received, now: Instant) {
        if matches!(frame.message, Message::Commit(_)) {
            return;
        }
        let Some(next) = frame.epoch.get().checked_add(1) else {
            return;
        };
        let Some((commit, old_world, at)) = self
            .history
            .iter()
            .find(|(c, _, _)| c.proposal.epoch.get() == next)
        else {
            return;
        };
        if frame.from.get() >= *old_world {
            return;
        }
        if commit.proposal.removed.contains(&frame.from) {
            let epoch = commit.proposal.epoch;
            if !self.allow(
                Reply::Evict,
                frame.from,
                now,
                self.config.heartbeat_interval,
            ) {
                return;
            }
            tracing::debug!(rank = %self.view.rank(), peer = %frame.from, old = %frame.epoch, %epoch, "a removed member spoke; telling it");
            let detail = format!("removed at {epoch}");
            self.send(
                frame.from,
                frame.epoch,
                Message::Depart(Depart {
                    code: CloseCode::EVICTED,
                    detail,
                }),
            );
            self.out.intents.push_back(ConnectionIntent::Close {
                peer: frame.from,
                epoch: frame.epoch,
                code: CloseCode::EVICTED,
            });
            return;
        }
        if now < *at + self.config.heartbeat_interval {
            return;
        }
        let commit = commit.clone();
        if !self.allow(Reply::CatchUp, frame.from, now, self.config.retransmit) {
            return;
        }
        self.stats.catch_ups += 1;
        self.send(frame.from, frame.epoch, Message::Commit(commit));
    }

    /// A frame of the epoch just before or just after this member's is refused, but it is
    /// a sign of life all the same: around a shrink, members install the new epoch one by
    /// one, and a member that installs late heartbeats at the old epoch meanwhile while the
    /// others heartbeat at the new one. Not counting those frames declared a live member
    /// dead when its commit came late (a false death). The sender is mapped to this
    /// epoch's numbering through the commit that installed it (a frame of the old epoch),
    /// or through the proposal this member accepted (a frame of the next epoch, whose
    /// commit has not arrived; a higher ballot re-proposes a chosen value, so it is that
    /// value unless none was chosen yet, and then the commit corrects the view).
    ///
    /// Only ranks with an identity in both epochs are mapped: a joiner slot of the new
    /// epoch has no old rank (`old_rank` is `None`), and a removed rank no new one
    /// (`new_rank` is `None`). And the frame only defers the detector's verdict: it moves
    /// the sender's watch baseline and nothing else. The ledger of this epoch (state,
    /// last heard, evidence) is left as it was, as for every refused frame: a peer this
    /// member has just started watching stays `Joining`, a suspect stays `Suspect`, until
    /// a frame of this epoch arrives (the `control_node` fuzz target found a stale
    /// `Prepare` turning a newly watched rank from `Joining` to `Alive`).
    fn life_across_epochs(&mut self, frame: &Received, now: Instant) {
        let current = self.view.epoch();
        let mapped = if frame.epoch.get().checked_add(1) == Some(current.get()) {
            self.history
                .iter()
                .find(|(c, _, _)| c.proposal.epoch == current)
                .and_then(|(c, old_world, _)| {
                    Plan::from_proposal(*old_world, frame.epoch, &c.proposal).ok()
                })
                .and_then(|plan| plan.new_rank(frame.from))
        } else if current.get().checked_add(1) == Some(frame.epoch.get()) {
            self.agreement
                .accepted()
                .filter(|p| p.epoch == frame.epoch)
                .and_then(|p| Plan::from_proposal(self.view.world(), current, p).ok())
                .and_then(|plan| plan.old_rank(frame.from))
        } else {
            None
        };
        let Some(rank) = mapped else { return };
        if rank == self.view.rank()
            || rank.get() >= self.view.world()
            || self.ledger.is_absent(rank)
        {
            return;
        }
        self.detector.heard(rank, now);
    }

    /// A frame from a member this one holds dead: tell it (it may have been frozen).
    fn on_from_absent(&mut self, from: Rank, now: Instant) {
        if self.ledger.state(from) != PeerState::Dead {
            return;
        }
        let Some(notice) = self.ledger.notice(from) else {
            return;
        };
        if !self.allow(Reply::Accuse, from, now, self.config.heartbeat_interval) {
            return;
        }
        self.stats.notices += 1;
        let epoch = self.view.epoch();
        self.send(from, epoch, Message::Notice(Notice { hops: 0, ..notice }));
    }

    /// A notice says this member is dead. If this member was stalled long enough for its
    /// observers to lose it, that is what happened: it is evicted. Otherwise the verdict
    /// comes from a view this member cannot confirm (a partition healing) and only an
    /// agreed epoch without it evicts it.
    fn accused(&mut self, notice: Notice, now: Instant) {
        if notice.verdict != Verdict::Dead {
            return;
        }
        if self.stalled_until.is_some_and(|until| now <= until) {
            tracing::warn!(rank = %self.view.rank(), epoch = %self.view.epoch(), origin = %notice.origin, "declared dead while stalled; evicted");
            self.evict(
                self.view.epoch(),
                Eviction::Declared {
                    origin: notice.origin,
                    evidence: notice.evidence,
                },
            );
        } else {
            tracing::debug!(rank = %self.view.rank(), epoch = %self.view.epoch(), origin = %notice.origin, "accused of being dead while running; awaiting agreement");
        }
    }

    // -----------------------------------------------------------------------------------
    // Knowledge

    /// Records a verdict, tells the application, floods it, and lets the overlay and the
    /// agreement react.
    fn learn(&mut self, notice: Notice, from: Option<Rank>, now: Instant) {
        if notice.subject == self.view.rank() || !self.ledger.mark_absent(notice, now) {
            return;
        }
        self.knowledge_at = now;
        let epoch = self.view.epoch();
        let event = match (notice.verdict, notice.evidence) {
            (Verdict::Departed, Evidence::Departed { code }) => Event::PeerDeparted {
                epoch,
                rank: notice.subject,
                code,
                origin: notice.origin,
                hops: notice.hops,
            },
            (Verdict::Departed, _) => Event::PeerDeparted {
                epoch,
                rank: notice.subject,
                code: CloseCode::LEFT,
                origin: notice.origin,
                hops: notice.hops,
            },
            _ => Event::PeerDead {
                epoch,
                rank: notice.subject,
                evidence: notice.evidence,
                origin: notice.origin,
                hops: notice.hops,
            },
        };
        tracing::info!(at = %now, rank = %self.view.rank(), %epoch, peer = %notice.subject, verdict = ?notice.verdict, evidence = ?notice.evidence, origin = %notice.origin, hops = notice.hops, "peer absent");
        self.out.events.push_back(event);
        self.reset_overlay(now);
        let targets: Vec<Rank> = self.fingers.targets(from).collect();
        for to in targets {
            self.stats.notices += 1;
            self.send(to, epoch, Message::Notice(notice));
        }
        if self.no_quorum() {
            return;
        }
        let (agreement, ctx, out) = self.agreement_parts(now);
        let decided = agreement.on_view_change(&ctx, out);
        self.decided(decided, now);
    }

    /// Applies `revoke` (as received, `hops` already counted) the first time, and forwards
    /// it as it came: origin and cause unchanged.
    fn revoke(&mut self, revoke: Revoke, from: Option<Rank>, now: Instant) {
        let Revoke {
            origin,
            hops,
            cause,
        } = revoke;
        if !self.revocation.revoke(origin, cause) {
            return;
        }
        self.knowledge_at = now;
        let epoch = self.view.epoch();
        tracing::info!(at = %now, rank = %self.view.rank(), %epoch, %origin, hops, ?cause, "communicator revoked");
        self.out.events.push_back(Event::Revoked {
            epoch,
            origin,
            cause,
        });
        let targets: Vec<Rank> = self.fingers.targets(from).collect();
        for to in targets {
            self.send(to, epoch, Message::Revoke(revoke));
        }
    }

    fn own_notice(&self, subject: Rank, verdict: Verdict, evidence: Evidence) -> Notice {
        Notice {
            origin: self.view.rank(),
            subject,
            verdict,
            evidence,
            hops: 0,
        }
    }

    fn heard(&mut self, from: Rank, now: Instant) {
        self.detector.heard(from, now);
        if self.ledger.heard(from, now) {
            self.out.events.push_back(Event::PeerRecovered {
                epoch: self.view.epoch(),
                rank: from,
            });
        }
    }

    // -----------------------------------------------------------------------------------
    // Timers

    /// Detects a late wake-up and credits it back to the watched peers.
    fn observe_wake(&mut self, now: Instant) {
        let Some(wake) = self.next_wake else { return };
        if now <= wake + self.config.stall_tolerance {
            return;
        }
        let stall = now.saturating_since(wake);
        self.stats.stalls += 1;
        self.detector.credit_stall(stall, now);
        if stall >= self.config.deadline / 2 {
            // Long enough that observers may have declared this member dead. Their verdict
            // reaches us when we next talk to one of them: at once through our heartbeats,
            // or within a deadline through our own verdicts if our observers are gone too.
            self.stalled_until = Some(now + self.config.deadline * 2);
        }
        tracing::debug!(rank = %self.view.rank(), stall_ms = millis(stall), "woken late; not counting the stall against peers");
    }

    fn tick(&mut self, now: Instant) {
        let epoch = self.view.epoch();
        for expiry in self.detector.expired(now) {
            if self.status != Status::Member || self.view.epoch() != epoch {
                return;
            }
            match expiry {
                Expiry::Suspect { rank, silent } => {
                    if self.ledger.suspect(rank, silent, self.config.deadline, now) {
                        self.out.events.push_back(Event::PeerSuspect {
                            epoch,
                            rank,
                            silent,
                        });
                    }
                }
                Expiry::Dead { rank, silent } => {
                    let evidence = Evidence::MissedDeadline {
                        silent_ms: millis(silent),
                        deadline_ms: millis(self.config.deadline),
                    };
                    let notice = self.own_notice(rank, Verdict::Dead, evidence);
                    self.learn(notice, None, now);
                }
            }
        }
        if self.status != Status::Member || self.view.epoch() != epoch {
            return;
        }
        if let Some(seq) = self.detector.heartbeat_due(now) {
            let digest = self.digest().get();
            for to in self.detector.observers().to_vec() {
                self.stats.heartbeats += 1;
                self.send(to, epoch, Message::Heartbeat(Heartbeat { seq, digest }));
            }
        }
        self.knock(now);
        let (agreement, ctx, out) = self.agreement_parts(now);
        let decided = agreement.on_timeout(&ctx, out);
        self.decided(decided, now);
        if self.view.epoch() == epoch
            && let Some(event) = self.request.expired(epoch, now)
        {
            tracing::warn!(at = %now, rank = %self.view.rank(), %epoch, "shrink request timed out");
            self.out.events.push_back(event);
        }
    }

    /// While this member's own view cannot reach a quorum, asks one member it holds dead
    /// at a time whether it is there (see [`crate::knock`]): a heartbeat of this epoch,
    /// which a member that removed it answers with an eviction.
    fn knock(&mut self, now: Instant) {
        if self.knock.next_deadline().is_some_and(|at| now < at) {
            return;
        }
        let absent = self.ledger.absent();
        let dead: BTreeSet<Rank> = if reach(self.view.world(), absent, self.config.quorum).is_err()
        {
            absent
                .iter()
                .copied()
                .filter(|r| self.ledger.state(*r) == PeerState::Dead)
                .collect()
        } else {
            BTreeSet::new()
        };
        let Some(to) = self.knock.due(now, self.config.heartbeat_interval, &dead) else {
            return;
        };
        let (seq, digest) = (self.detector.seq(), self.digest().get());
        self.stats.heartbeats += 1;
        self.send(
            to,
            self.view.epoch(),
            Message::Heartbeat(Heartbeat { seq, digest }),
        );
    }

    /// With a shrink requested, checks that this member's view can still reach a quorum;
    /// if not, answers the request with `NoQuorum` at once and stops coordinating (see
    /// [`crate::quorum`]). True when it gave up.
    fn no_quorum(&mut self) -> bool {
        if !self.request.is_pending() {
            return false;
        }
        let Err(verdict) = reach(self.view.world(), self.ledger.absent(), self.config.quorum)
        else {
            return false;
        };
        tracing::warn!(rank = %self.view.rank(), epoch = %self.view.epoch(), %verdict, "shrink cannot reach a quorum");
        self.agreement.give_up();
        let event = self.request.no_quorum(self.view.epoch(), verdict);
        self.out.events.push_back(event);
        true
    }

    fn compute_next_wake(&self, now: Instant) -> Option<Instant> {
        if self.status != Status::Member {
            return None;
        }
        let ctx = Ctx {
            view: self.view,
            absent: self.ledger.absent(),
            config: &self.config,
            now,
        };
        let mut next = self.detector.next_deadline();
        if let Some(at) = self.agreement.next_deadline(&ctx) {
            next = next.min(at);
        }
        if let Some(at) = self.request.deadline() {
            next = next.min(at);
        }
        if let Some(at) = self.knock.next_deadline() {
            next = next.min(at);
        }
        Some(next)
    }

    // -----------------------------------------------------------------------------------
    // Epochs

    fn decided(&mut self, commit: Option<Commit>, now: Instant) {
        let Some(commit) = commit else { return };
        match Plan::from_proposal(self.view.world(), self.view.epoch(), &commit.proposal) {
            Ok(plan) => self.install(commit, plan, None, now),
            Err(e) => {
                tracing::error!(rank = %self.view.rank(), error = %e, "decided an invalid proposal")
            }
        }
    }

    /// Installs the next epoch: floods the commit over the old overlay, renumbers, and
    /// starts watching the new neighbours.
    fn install(&mut self, commit: Commit, plan: Plan, from: Option<Rank>, now: Instant) {
        let old_epoch = self.view.epoch();
        for to in self.commit_targets(from) {
            self.send(to, old_epoch, Message::Commit(commit.clone()));
        }
        self.history
            .push_back((commit.clone(), plan.old_world(), now));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        let Some(rank) = plan.new_rank(self.view.rank()) else {
            tracing::warn!(rank = %self.view.rank(), epoch = %plan.epoch(), "removed by the agreed membership");
            self.evict(
                plan.epoch(),
                Eviction::Removed {
                    epoch: plan.epoch(),
                },
            );
            return;
        };
        let view = match View::new(self.view.comm(), plan.epoch(), plan.world(), rank) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "agreed view is impossible");
                return;
            }
        };
        for r in plan.removed() {
            if self.links.contains(r) {
                self.out.intents.push_back(ConnectionIntent::Close {
                    peer: *r,
                    epoch: old_epoch,
                    code: CloseCode::EVICTED,
                });
            }
        }
        let joiner_ranks = (0..commit.proposal.joiners.len()).filter_map(|i| plan.joiner_rank(i));
        self.ledger =
            self.ledger
                .remap(plan.world(), rank, |r| plan.new_rank(r), joiner_ranks, now);
        self.links = self
            .links
            .iter()
            .filter_map(|r| plan.new_rank(*r))
            .collect();
        self.view = view;
        self.revocation = Revocation::default();
        self.replies.clear();
        self.knock.stop();
        self.knowledge_at = now;
        let leftover: Vec<PeerInfo> = self
            .agreement
            .pending_joiners()
            .iter()
            .filter(|p| !commit.proposal.joiners.iter().any(|j| same_process(j, p)))
            .cloned()
            .collect();
        self.agreement = Agreement::new(now, leftover);
        self.request.answered();
        self.detector.renumber(|r| plan.new_rank(r));
        self.reset_overlay(now);
        self.detector.heartbeat_now(now);
        tracing::info!(at = %now, rank = %rank, epoch = %plan.epoch(), world = plan.world(), removed = ?plan.removed(), "membership agreed");
        self.out.events.push_back(Event::MembershipAgreed(Agreed {
            comm: self.view.comm(),
            previous: old_epoch,
            rank,
            plan,
            joiners: commit.proposal.joiners,
            ballot: commit.ballot,
        }));
        // Members still absent after the change stay absent; say so at the new epoch.
        let epoch = self.view.epoch();
        let carried: Vec<Notice> = self.ledger.notices().collect();
        for n in carried {
            let event = match n.evidence {
                Evidence::Departed { code } if n.verdict == Verdict::Departed => {
                    Event::PeerDeparted {
                        epoch,
                        rank: n.subject,
                        code,
                        origin: n.origin,
                        hops: 0,
                    }
                }
                evidence => Event::PeerDead {
                    epoch,
                    rank: n.subject,
                    evidence,
                    origin: n.origin,
                    hops: 0,
                },
            };
            self.out.events.push_back(event);
        }
    }

    fn evict(&mut self, epoch: Epoch, cause: Eviction) {
        self.status = Status::Evicted;
        self.out.events.push_back(Event::Evicted { epoch, cause });
        let old = self.view.epoch();
        for peer in std::mem::take(&mut self.links) {
            self.out.intents.push_back(ConnectionIntent::Close {
                peer,
                epoch: old,
                code: CloseCode::ABORTED,
            });
        }
        self.next_wake = None;
    }

    /// Departure is a message (principle 1): `Depart` to every neighbour, then closes.
    fn depart(&mut self, code: CloseCode, mut detail: String) {
        truncate(&mut detail, MAX_DETAIL);
        let epoch = self.view.epoch();
        let mut to: BTreeSet<Rank> = self.links.clone();
        to.extend(self.detector.observers().iter().copied());
        to.extend(self.detector.watched());
        to.extend(self.fingers.all().iter().copied());
        to.remove(&self.view.rank());
        for peer in &to {
            self.send(
                *peer,
                epoch,
                Message::Depart(Depart {
                    code,
                    detail: detail.clone(),
                }),
            );
        }
        for peer in to {
            self.out
                .intents
                .push_back(ConnectionIntent::Close { peer, epoch, code });
        }
        self.links.clear();
        self.status = Status::Departed { code };
        self.next_wake = None;
        tracing::info!(rank = %self.view.rank(), %epoch, %code, "departed");
    }

    // -----------------------------------------------------------------------------------
    // Helpers

    /// Where a commit goes on from this member: its fingers on its view's ring (absent ranks
    /// skipped, so the flood routes around the dead), and its fingers on the epoch's whole
    /// ring as well. A rank declared absent after the value was chosen is kept by the commit
    /// yet skipped by every view's fingers; a rank the commit removes may still be running
    /// (one-way loss, a false suspicion). Both must hear the commit from somebody, or the
    /// one waits for a membership that moved on without it until its own detector fires,
    /// and the other learns it is out only if it speaks to a newer member. The whole
    /// ring's fingers are at most log2 N more frames per member, only at an install.
    fn commit_targets(&self, from: Option<Rank>) -> Vec<Rank> {
        let mut targets: Vec<Rank> = self.fingers.targets(from).collect();
        let nobody = BTreeSet::new();
        let whole = Ring::new(self.view.world(), &nobody).fingers(self.view.rank());
        for to in whole {
            if Some(to) != from && !targets.contains(&to) {
                targets.push(to);
            }
        }
        targets
    }

    /// Recomputes observers, watches and fingers from the ledger and asks for connections
    /// to new neighbours.
    fn reset_overlay(&mut self, now: Instant) {
        let me = self.view.rank();
        let ring = Ring::new(self.view.world(), self.ledger.absent());
        let (fresh, _gained) = self.detector.reset(&ring, me, now);
        self.fingers.reset(&ring, me);
        for r in fresh {
            self.ledger.watch(r, now);
        }
        let epoch = self.view.epoch();
        let mut wanted: Vec<Rank> = self.detector.observers().to_vec();
        wanted.extend(self.detector.watched());
        wanted.extend(self.fingers.all().iter().copied());
        for peer in wanted {
            if self.links.insert(peer) {
                self.out
                    .intents
                    .push_back(ConnectionIntent::Open { peer, epoch });
            }
        }
    }

    /// The agreement, what it reads, and where it writes: disjoint borrows of `self`.
    fn agreement_parts(&mut self, now: Instant) -> (&mut Agreement, Ctx<'_>, &mut Outbox) {
        let ctx = Ctx {
            view: self.view,
            absent: self.ledger.absent(),
            config: &self.config,
            now,
        };
        (&mut self.agreement, ctx, &mut self.out)
    }

    fn send(&mut self, to: Rank, epoch: Epoch, message: Message) {
        self.out.transmits.push_back(Transmit {
            to,
            comm: self.view.comm(),
            epoch,
            message,
        });
    }

    /// Connection events and local evidence must be about the current epoch's numbering.
    fn check_epoch(&self, epoch: Epoch) -> Result<(), InputError> {
        let current = self.view.epoch();
        match epoch.cmp(&current) {
            std::cmp::Ordering::Less => Err(InputError::StaleEpoch {
                frame: epoch,
                current,
            }),
            std::cmp::Ordering::Greater => Err(InputError::FutureEpoch {
                frame: epoch,
                current,
            }),
            std::cmp::Ordering::Equal => Ok(()),
        }
    }

    fn check_peer(&self, peer: Rank) -> Result<(), InputError> {
        if peer.get() >= self.view.world() {
            return Err(InputError::RankOutOfRange {
                rank: peer,
                world: self.view.world(),
            });
        }
        if peer == self.view.rank() {
            return Err(invalid(Kind::Notice, "event about this member's own rank"));
        }
        Ok(())
    }

    /// Rate limit: true (and remembered) if no reply of this kind went to `to` within `every`.
    fn allow(&mut self, kind: Reply, to: Rank, now: Instant, every: Duration) -> bool {
        let key = (kind, self.view.epoch().get(), to);
        if let Some(at) = self.replies.get(&key)
            && now < *at + every
        {
            return false;
        }
        if self.replies.len() >= MAX_REPLY_MEMORY {
            self.replies.clear();
        }
        self.replies.insert(key, now);
        true
    }
}

fn is_control(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Heartbeat
            | Kind::Depart
            | Kind::Notice
            | Kind::Revoke
            | Kind::Prepare
            | Kind::Promise
            | Kind::Propose
            | Kind::Accept
            | Kind::Commit
            | Kind::Join
            | Kind::Welcome
    )
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

fn same_process(a: &PeerInfo, b: &PeerInfo) -> bool {
    a.fingerprint == b.fingerprint
        && a.incarnation == b.incarnation
        && a.pid == b.pid
        && a.host == b.host
}

fn invalid(kind: Kind, reason: &str) -> InputError {
    InputError::Invalid {
        kind,
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use chorus_protocol::OpSeq;
    use chorus_protocol::message::{
        Accept, Ballot, Chunk, ChunkHeader, Prepare, Promise, Proposal, Propose, Reject,
        RevokeCause,
    };

    use super::*;

    /// A process that is not yet a member, as it announces itself: rank `rank` (the slot it
    /// is given, or `LAUNCHER` before one), process `pid`, its fingerprint made of `pid`.
    fn newcomer(rank: Rank, pid: u32, incarnation: u64) -> PeerInfo {
        PeerInfo {
            rank,
            host: "new".into(),
            pid,
            control: chorus_protocol::message::WireAddr {
                ip: [0; 16],
                port: 1,
            },
            data: chorus_protocol::message::WireAddr {
                ip: [0; 16],
                port: 2,
            },
            fingerprint: [pid as u8; 32],
            caps: 0,
            incarnation,
        }
    }

    const COMM: CommId = CommId(7);

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    fn node(world: u32, rank: u32) -> Node {
        let view = View::new(COMM, Epoch(0), world, Rank(rank)).unwrap();
        Node::new(Config::default(), view, ms(0)).unwrap()
    }

    fn frame(from: u32, epoch: u64, message: Message) -> Input {
        Input::Frame(Received {
            from: Rank(from),
            comm: COMM,
            epoch: Epoch(epoch),
            message,
        })
    }

    fn transmits(n: &mut Node) -> Vec<Transmit> {
        std::iter::from_fn(|| n.poll_transmit()).collect()
    }

    fn events(n: &mut Node) -> Vec<Event> {
        std::iter::from_fn(|| n.poll_event()).collect()
    }

    fn intents(n: &mut Node) -> Vec<ConnectionIntent> {
        std::iter::from_fn(|| n.poll_intent()).collect()
    }

    fn heartbeat() -> Message {
        Message::Heartbeat(Heartbeat { seq: 1, digest: 0 })
    }

    #[test]
    fn a_new_node_opens_its_neighbours_and_heartbeats_its_observers() {
        let mut n = node(8, 3);
        let opened: Vec<Rank> = intents(&mut n)
            .into_iter()
            .map(|i| match i {
                ConnectionIntent::Open { peer, epoch } => {
                    assert_eq!(epoch, Epoch(0));
                    peer
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        // Observers 4 and 5, watched 2 and 1, fingers 4, 5 and 7.
        assert_eq!(opened, vec![Rank(4), Rank(5), Rank(2), Rank(1), Rank(7)]);
        assert_eq!(n.poll_timeout(), Some(ms(0)));
        n.handle(ms(0), Input::Timeout).unwrap();
        let hb: Vec<Rank> = transmits(&mut n).iter().map(|t| t.to).collect();
        assert_eq!(hb, vec![Rank(4), Rank(5)]);
        assert_eq!(
            n.poll_timeout(),
            Some(ms(200)),
            "next heartbeat one interval later"
        );
    }

    #[test]
    fn silence_past_the_deadline_is_a_verdict_that_floods() {
        let mut n = node(8, 3);
        n.handle(ms(0), Input::Timeout).unwrap();
        let mut t = 0;
        while t < 2_000 {
            t += 200;
            n.handle(ms(t), frame(2, 0, heartbeat())).unwrap();
            n.handle(ms(t), Input::Timeout).unwrap();
        }
        let evs = events(&mut n);
        assert!(
            evs.iter()
                .any(|e| matches!(e, Event::PeerSuspect { rank: Rank(1), .. })),
            "{evs:?}"
        );
        let dead = evs.iter().find_map(|e| match e {
            Event::PeerDead {
                rank,
                evidence,
                origin,
                hops,
                ..
            } => Some((*rank, *evidence, *origin, *hops)),
            _ => None,
        });
        assert_eq!(
            dead,
            Some((
                Rank(1),
                Evidence::MissedDeadline {
                    silent_ms: 2000,
                    deadline_ms: 2000
                },
                Rank(3),
                0
            ))
        );
        assert!(n.ledger().is_absent(Rank(1)));
        assert_eq!(n.ledger().state(Rank(2)), PeerState::Alive);
        let notices: Vec<Rank> = transmits(&mut n)
            .into_iter()
            .filter(|t| {
                matches!(
                    t.message,
                    Message::Notice(Notice {
                        subject: Rank(1),
                        ..
                    })
                )
            })
            .map(|t| t.to)
            .collect();
        assert_eq!(notices, vec![Rank(4), Rank(5), Rank(7)]);
        // The ring closed over rank 1: rank 3 now watches 2 and 0.
        assert_eq!(n.watched(), vec![Rank(2), Rank(0)]);
    }

    #[test]
    fn frames_that_do_not_belong_are_refused_without_effect() {
        let mut n = node(4, 1);
        let wrong_comm = Input::Frame(Received {
            from: Rank(0),
            comm: CommId(8),
            epoch: Epoch(0),
            message: heartbeat(),
        });
        let e = n.handle(ms(1), wrong_comm).unwrap_err();
        assert_eq!(e.close_code(), Some(CloseCode::UNKNOWN_COMM));
        assert!(matches!(
            n.handle(ms(1), frame(0, 1, heartbeat())),
            Err(InputError::FutureEpoch { .. })
        ));
        assert!(matches!(
            n.handle(ms(1), frame(9, 0, heartbeat())),
            Err(InputError::RankOutOfRange { .. })
        ));
        assert!(matches!(
            n.handle(ms(1), frame(1, 0, heartbeat())),
            Err(InputError::Invalid { .. })
        ));
        let chunk = Message::Chunk(Chunk {
            header: ChunkHeader {
                collective: 0,
                dtype: 0,
                op: OpSeq(0),
                step: 0,
                offset: 0,
            },
            payload: Default::default(),
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, chunk)),
            Err(InputError::NotControl { .. })
        ));
        let reject = Message::Reject(Reject {
            code: CloseCode::INTERNAL,
            detail: String::new(),
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, reject)),
            Err(InputError::NotControl { .. })
        ));
        assert!(matches!(
            n.handle(
                ms(1),
                Input::ConnectionLost {
                    epoch: Epoch(0),
                    peer: Rank(4),
                    code: CloseCode::INTERNAL
                }
            ),
            Err(InputError::RankOutOfRange { .. })
        ));
        assert!(matches!(
            n.handle(
                ms(1),
                Input::ConnectionLost {
                    epoch: Epoch(0),
                    peer: Rank(1),
                    code: CloseCode::INTERNAL
                }
            ),
            Err(InputError::Invalid { .. })
        ));
        assert!(n.ledger().absent().is_empty());
        assert!(events(&mut n).is_empty());
    }

    #[test]
    fn malformed_control_messages_are_invalid_not_panics() {
        let mut n = node(4, 1);
        let bad_notice = Notice {
            origin: Rank(0),
            subject: Rank(40),
            verdict: Verdict::Dead,
            evidence: Evidence::ConnectionLost {
                code: CloseCode::INTERNAL,
            },
            hops: u16::MAX,
        };
        let e = n
            .handle(ms(1), frame(0, 0, Message::Notice(bad_notice)))
            .unwrap_err();
        assert_eq!(e.close_code(), Some(CloseCode::PROTOCOL_VIOLATION));
        let ballot = Ballot {
            round: 1,
            coordinator: Rank(0),
        };
        let impostor = Message::Prepare(Prepare {
            ballot: Ballot {
                round: 1,
                coordinator: Rank(2),
            },
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, impostor)),
            Err(InputError::Invalid { .. })
        ));
        let unsorted = Proposal {
            comm: COMM,
            epoch: Epoch(1),
            removed: vec![Rank(3), Rank(2)],
            joiners: vec![],
        };
        let propose = Message::Propose(Propose {
            ballot,
            proposal: unsorted,
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, propose)),
            Err(InputError::Invalid { .. })
        ));
        let everyone = Proposal {
            comm: COMM,
            epoch: Epoch(1),
            removed: (0..4).map(Rank).collect(),
            joiners: vec![],
        };
        let commit = Message::Commit(Commit {
            ballot,
            proposal: everyone,
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, commit)),
            Err(InputError::Invalid { .. })
        ));
        let far = Proposal {
            comm: COMM,
            epoch: Epoch(9),
            removed: vec![],
            joiners: vec![],
        };
        let commit = Message::Commit(Commit {
            ballot,
            proposal: far,
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, commit)),
            Err(InputError::FutureEpoch { .. })
        ));
        let promise = Message::Promise(Promise {
            ballot,
            accepted: None,
            absent: vec![Rank(u32::MAX)],
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, promise)),
            Err(InputError::Invalid { .. })
        ));
        let accept = Message::Accept(Accept {
            ballot,
            ok: true,
            absent: vec![Rank(4)],
        });
        assert!(matches!(
            n.handle(ms(1), frame(0, 0, accept)),
            Err(InputError::Invalid { .. })
        ));
        assert_eq!(n.epoch(), Epoch(0));
        assert_eq!(n.status(), Status::Member);
    }

    #[test]
    fn departure_is_a_message_then_a_close_then_silence() {
        let mut n = node(8, 3);
        intents(&mut n);
        n.handle(
            ms(5),
            Input::Command(Command::Depart {
                code: CloseCode::LEFT,
                detail: "bye".into(),
            }),
        )
        .unwrap();
        let sent = transmits(&mut n);
        assert!(!sent.is_empty());
        assert!(
            sent.iter()
                .all(|t| matches!(&t.message, Message::Depart(d) if d.code == CloseCode::LEFT))
        );
        let closes = intents(&mut n);
        assert_eq!(closes.len(), sent.len());
        assert!(closes.iter().all(|i| matches!(
            i,
            ConnectionIntent::Close {
                code: CloseCode::LEFT,
                ..
            }
        )));
        assert_eq!(
            n.status(),
            Status::Departed {
                code: CloseCode::LEFT
            }
        );
        assert_eq!(n.poll_timeout(), None);
        assert_eq!(n.handle(ms(6), Input::Timeout), Err(InputError::Inactive));
        assert_eq!(
            n.handle(ms(6), Input::Command(Command::Abort)),
            Ok(()),
            "abort after leaving is a no-op"
        );
        assert!(transmits(&mut n).is_empty());
    }

    #[test]
    fn a_depart_frame_or_a_departure_close_is_learned_at_once() {
        let mut n = node(8, 3);
        let depart = Message::Depart(Depart {
            code: CloseCode::NORMAL,
            detail: String::new(),
        });
        n.handle(ms(1), frame(6, 0, depart)).unwrap();
        n.handle(
            ms(1),
            Input::ConnectionClosed {
                epoch: Epoch(0),
                peer: Rank(2),
                code: CloseCode::ABORTED,
            },
        )
        .unwrap();
        let departed: Vec<(Rank, CloseCode)> = events(&mut n)
            .into_iter()
            .filter_map(|e| match e {
                Event::PeerDeparted { rank, code, .. } => Some((rank, code)),
                _ => None,
            })
            .collect();
        assert_eq!(
            departed,
            vec![(Rank(6), CloseCode::NORMAL), (Rank(2), CloseCode::ABORTED)]
        );
        assert_eq!(n.ledger().state(Rank(6)), PeerState::Departed);
        // A close from a live peer refusing us is not evidence.
        n.handle(
            ms(2),
            Input::ConnectionClosed {
                epoch: Epoch(0),
                peer: Rank(5),
                code: CloseCode::STALE_EPOCH,
            },
        )
        .unwrap();
        assert!(!n.ledger().is_absent(Rank(5)));
    }

    #[test]
    fn conclusive_local_evidence_acts_without_waiting() {
        let mut n = node(8, 3);
        n.handle(
            ms(1),
            Input::ConnectionLost {
                epoch: Epoch(0),
                peer: Rank(5),
                code: CloseCode::INTERNAL,
            },
        )
        .unwrap();
        n.handle(
            ms(1),
            Input::PeerExited {
                epoch: Epoch(0),
                peer: Rank(6),
                status: 9,
                witness: Witness::Pidfd,
            },
        )
        .unwrap();
        n.handle(
            ms(1),
            Input::PeerExited {
                epoch: Epoch(0),
                peer: Rank(7),
                status: 0,
                witness: Witness::Launcher,
            },
        )
        .unwrap();
        let evidence: Vec<(Rank, Evidence)> = events(&mut n)
            .into_iter()
            .filter_map(|e| match e {
                Event::PeerDead { rank, evidence, .. } => Some((rank, evidence)),
                _ => None,
            })
            .collect();
        assert_eq!(
            evidence,
            vec![
                (
                    Rank(5),
                    Evidence::ConnectionLost {
                        code: CloseCode::INTERNAL
                    }
                ),
                (Rank(6), Evidence::ProcessExited { status: 9 }),
                (Rank(7), Evidence::LauncherWitness { status: 0 }),
            ]
        );
        let rows = n.peers(ms(1));
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[5].state, PeerState::Dead);
        assert_eq!(rows[3].state, PeerState::Alive);
    }

    #[test]
    fn revoke_is_idempotent_and_floods_once() {
        let mut n = node(8, 3);
        n.handle(ms(1), Input::Command(Command::Revoke { cause: None }))
            .unwrap();
        assert_eq!(
            events(&mut n),
            vec![Event::Revoked {
                epoch: Epoch(0),
                origin: Rank(3),
                cause: None,
            }]
        );
        assert_eq!(
            transmits(&mut n)
                .iter()
                .filter(|t| matches!(t.message, Message::Revoke(_)))
                .count(),
            3
        );
        n.handle(ms(2), Input::Command(Command::Revoke { cause: None }))
            .unwrap();
        n.handle(
            ms(2),
            frame(
                1,
                0,
                Message::Revoke(Revoke {
                    origin: Rank(1),
                    hops: 0,
                    cause: None,
                }),
            ),
        )
        .unwrap();
        assert!(events(&mut n).is_empty());
        assert!(
            transmits(&mut n)
                .iter()
                .all(|t| !matches!(t.message, Message::Revoke(_)))
        );
        assert_eq!(n.revoked_by(), Some(Rank(3)));
        assert_ne!(
            n.digest(),
            Digest::default(),
            "the revocation is in the digest"
        );
    }

    /// The revokes among `n`'s transmits.
    fn revokes(n: &mut Node) -> Vec<Revoke> {
        transmits(n)
            .into_iter()
            .filter_map(|t| match t.message {
                Message::Revoke(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_revoke_carries_its_cause_to_every_member_unchanged() {
        let cause = RevokeCause {
            subject: Rank(5),
            evidence: Evidence::Departed {
                code: CloseCode::NORMAL,
            },
        };
        // The origin: its event and every copy it sends name the cause.
        let mut origin = node(8, 3);
        origin
            .handle(
                ms(1),
                Input::Command(Command::Revoke { cause: Some(cause) }),
            )
            .unwrap();
        let revoked = vec![Event::Revoked {
            epoch: Epoch(0),
            origin: Rank(3),
            cause: Some(cause),
        }];
        assert_eq!(events(&mut origin), revoked);
        let sent = revokes(&mut origin);
        assert!(!sent.is_empty());
        assert!(sent.iter().all(|r| r.cause == Some(cause) && r.hops == 0));
        // A receiver reports it and forwards it with one more hop, cause kept.
        let mut n = node(8, 6);
        n.handle(ms(2), frame(3, 0, Message::Revoke(sent[0])))
            .unwrap();
        assert_eq!(events(&mut n), revoked);
        let forwarded = revokes(&mut n);
        assert!(!forwarded.is_empty());
        assert!(
            forwarded
                .iter()
                .all(|r| r.cause == Some(cause) && r.origin == Rank(3) && r.hops == 1)
        );
        // A cause naming a rank outside the world is refused.
        let mut m = node(8, 6);
        let bad = Revoke {
            origin: Rank(3),
            hops: 0,
            cause: Some(RevokeCause {
                subject: Rank(8),
                ..cause
            }),
        };
        assert!(m.handle(ms(2), frame(3, 0, Message::Revoke(bad))).is_err());
        assert!(events(&mut m).is_empty());
    }

    #[test]
    fn declared_dead_while_stalled_means_evicted() {
        let mut n = node(4, 1);
        n.handle(ms(0), Input::Timeout).unwrap();
        let accusation = Notice {
            origin: Rank(2),
            subject: Rank(1),
            verdict: Verdict::Dead,
            evidence: Evidence::MissedDeadline {
                silent_ms: 2000,
                deadline_ms: 2000,
            },
            hops: 0,
        };
        // Running normally: an accusation is not enough.
        n.handle(ms(100), frame(2, 0, Message::Notice(accusation)))
            .unwrap();
        assert_eq!(n.status(), Status::Member);
        // Frozen for three seconds (woken far past its timer), then told it was declared dead.
        n.handle(ms(3_300), frame(2, 0, Message::Notice(accusation)))
            .unwrap();
        assert_eq!(n.status(), Status::Evicted);
        let evs = events(&mut n);
        assert!(
            evs.iter().any(|e| matches!(
                e,
                Event::Evicted {
                    cause: Eviction::Declared {
                        origin: Rank(2),
                        ..
                    },
                    ..
                }
            )),
            "{evs:?}"
        );
        assert!(
            evs.iter().all(|e| !matches!(e, Event::PeerDead { .. })),
            "its own stall must not condemn its peers"
        );
        assert!(intents(&mut n).iter().any(|i| matches!(
            i,
            ConnectionIntent::Close {
                code: CloseCode::ABORTED,
                ..
            }
        )));
        assert_eq!(
            n.handle(ms(3_301), Input::Timeout),
            Err(InputError::Inactive)
        );
    }

    #[test]
    fn a_close_with_evicted_evicts() {
        let mut n = node(4, 1);
        n.handle(
            ms(1),
            Input::ConnectionClosed {
                epoch: Epoch(0),
                peer: Rank(0),
                code: CloseCode::EVICTED,
            },
        )
        .unwrap();
        assert_eq!(n.status(), Status::Evicted);
        assert!(matches!(
            events(&mut n).as_slice(),
            [Event::Evicted {
                cause: Eviction::Closed { peer: Rank(0) },
                ..
            }]
        ));
    }

    #[test]
    fn a_sole_member_agrees_with_itself() {
        let mut n = node(1, 0);
        n.handle(ms(1), Input::Command(Command::Shrink)).unwrap();
        let agreed = events(&mut n).into_iter().find_map(|e| match e {
            Event::MembershipAgreed(a) => Some(a),
            _ => None,
        });
        let agreed = agreed.expect("agreed");
        assert_eq!(
            (agreed.epoch(), agreed.world(), agreed.rank),
            (Epoch(1), 1, Rank(0))
        );
        assert_eq!(n.epoch(), Epoch(1));
    }

    fn lost(n: &mut Node, at: u64, peer: u32) {
        n.handle(
            ms(at),
            Input::ConnectionLost {
                epoch: Epoch(0),
                peer: Rank(peer),
                code: CloseCode::INTERNAL,
            },
        )
        .unwrap();
    }

    /// Rank 0 of 2 removes rank 1 (the survivors' quorum: it agrees alone); rank 1, cut off
    /// and now back, speaks at epoch 0 and is told it was removed, whatever the frame.
    #[test]
    fn a_stale_frame_from_a_removed_rank_is_answered_with_its_eviction() {
        let view = View::new(COMM, Epoch(0), 2, Rank(0)).unwrap();
        let config = Config {
            quorum: crate::Quorum::Survivors,
            ..Config::default()
        };
        let mut n = Node::new(config, view, ms(0)).unwrap();
        lost(&mut n, 1, 1);
        n.handle(ms(2), Input::Command(Command::Shrink)).unwrap();
        assert_eq!((n.epoch(), n.world()), (Epoch(1), 1));
        transmits(&mut n);
        intents(&mut n);
        assert!(n.handle(ms(3), frame(1, 0, heartbeat())).is_err());
        let told = transmits(&mut n);
        assert!(
            matches!(
                told.as_slice(),
                [Transmit {
                    to: Rank(1),
                    epoch: Epoch(0),
                    message: Message::Depart(Depart {
                        code: CloseCode::EVICTED,
                        ..
                    }),
                    ..
                }]
            ),
            "at once, no flood to wait for: {told:?}"
        );
        assert_eq!(
            intents(&mut n),
            [ConnectionIntent::Close {
                peer: Rank(1),
                epoch: Epoch(0),
                code: CloseCode::EVICTED
            }]
        );
        assert!(n.handle(ms(4), frame(1, 0, heartbeat())).is_err());
        assert!(transmits(&mut n).is_empty(), "rate limited");
        assert!(n.handle(ms(203), frame(1, 0, heartbeat())).is_err());
        assert_eq!(transmits(&mut n).len(), 1, "told again an interval later");
        assert_eq!(n.status(), Status::Member);
    }

    #[test]
    fn told_it_was_removed_it_is_evicted_even_by_a_member_it_holds_dead() {
        let mut n = node(4, 3);
        for (at, peer) in [(1, 0), (2, 1), (3, 2)] {
            lost(&mut n, at, peer);
        }
        events(&mut n);
        let told = Message::Depart(Depart {
            code: CloseCode::EVICTED,
            detail: "removed at epoch 1".into(),
        });
        n.handle(ms(10), frame(1, 0, told)).unwrap();
        assert_eq!(n.status(), Status::Evicted);
        assert_eq!(
            events(&mut n),
            [Event::Evicted {
                epoch: Epoch(0),
                cause: Eviction::Closed { peer: Rank(1) }
            }]
        );
    }

    /// A member whose own view has no quorum knocks on the dead, one per heartbeat
    /// interval, in turn; once it has its quorum back (or never lost it) it does not.
    #[test]
    fn without_a_quorum_a_member_knocks_on_the_dead_in_turn() {
        let mut n = node(4, 3);
        lost(&mut n, 1, 0);
        transmits(&mut n);
        n.handle(ms(150), Input::Timeout).unwrap();
        assert!(
            transmits(&mut n).iter().all(|t| t.to != Rank(0)),
            "3 of 4 is a quorum: nobody knocks"
        );
        lost(&mut n, 200, 1);
        lost(&mut n, 200, 2);
        let mut knocked = Vec::new();
        let mut at = 200;
        while at < 1400 {
            for t in transmits(&mut n) {
                if let Message::Heartbeat(_) = t.message {
                    assert_eq!(t.epoch, Epoch(0));
                    knocked.push((at, t.to));
                }
            }
            at = n
                .poll_timeout()
                .map_or(at + 10, |w| w.as_micros() / 1000)
                .max(at + 1);
            n.handle(ms(at), Input::Timeout).unwrap();
        }
        let order: Vec<Rank> = knocked.iter().map(|(_, r)| *r).collect();
        assert!(order.len() >= 6 && order.len() <= 7, "{knocked:?}");
        assert_eq!(order[..6], [0, 1, 2, 0, 1, 2].map(Rank), "{knocked:?}");
    }

    /// The commit of epoch 1 from epoch 0, as rank `from` floods it.
    fn commit(removed: &[u32], joiners: Vec<PeerInfo>) -> Message {
        Message::Commit(Commit {
            ballot: Ballot {
                round: 1,
                coordinator: Rank(1),
            },
            proposal: Proposal {
                comm: COMM,
                epoch: Epoch(1),
                removed: removed.iter().copied().map(Rank).collect(),
                joiners,
            },
        })
    }

    /// Runs `n`'s timers on time from `from` to `until` (ms), never late (a late wake is
    /// credited to the watched peers as this member's stall), and returns when `rank` of
    /// epoch 1 was first declared dead for a missed deadline in that window, if it was.
    fn run_timers(n: &mut Node, rank: u32, from: u64, until: u64) -> Option<u64> {
        let mut at = from;
        let mut dead = None;
        loop {
            n.handle(ms(at), Input::Timeout).unwrap();
            transmits(n);
            let declared = events(n).into_iter().any(|e| {
                matches!(e, Event::PeerDead { epoch: Epoch(1), rank: r, evidence: Evidence::MissedDeadline { .. }, .. } if r == Rank(rank))
            });
            if declared && dead.is_none() {
                dead = Some(at);
            }
            let next = n
                .poll_timeout()
                .map_or(at + 10, |w| w.as_micros() / 1000)
                .clamp(at + 1, at + 10);
            if next > until {
                return dead;
            }
            at = next;
        }
    }

    /// The `control_node` fuzz case: rank 0 of 5 installs the epoch without rank 4 and
    /// starts watching new rank 2 (old rank 2), `Joining` until first heard. A stale
    /// frame of epoch 0 from old rank 2 is refused and leaves the ledger alone (`Joining`,
    /// never heard), but it is life all the same: it moves the watch's baseline, so the
    /// verdict comes a deadline after that frame, not after the watch began. And only
    /// that long: a stale frame defers a verdict, it does not stop one.
    #[test]
    fn a_stale_frame_defers_its_senders_verdict_and_leaves_the_ledger_alone() {
        let mut n = node(5, 0);
        n.handle(ms(10), frame(1, 0, commit(&[4], Vec::new())))
            .unwrap();
        assert_eq!((n.epoch(), n.world()), (Epoch(1), 4));
        assert!(n.watched().contains(&Rank(2)), "{:?}", n.watched());
        assert_eq!(n.ledger().state(Rank(2)), PeerState::Joining);
        transmits(&mut n);
        events(&mut n);
        assert_eq!(run_timers(&mut n, 2, 10, 800), None);
        let before = n.peers(ms(800));
        let prepare = Message::Prepare(Prepare {
            ballot: Ballot {
                round: 4,
                coordinator: Rank(1),
            },
        });
        assert_eq!(
            n.handle(ms(800), frame(2, 0, prepare)),
            Err(InputError::StaleEpoch {
                frame: Epoch(0),
                current: Epoch(1)
            })
        );
        assert_eq!(n.peers(ms(800)), before, "the ledger is as it was");
        assert_eq!(n.ledger().state(Rank(2)), PeerState::Joining);
        let dead = run_timers(&mut n, 2, 800, 4000);
        let deadline = 2000;
        assert!(
            dead.is_some_and(|t| (800 + deadline..=800 + deadline + 200).contains(&t)),
            "declared dead at {dead:?}: a deadline after the stale frame, not after the \
             watch began (10 ms)"
        );
    }

    /// A joiner slot of the new epoch has no old rank: a frame of the old epoch from the
    /// rank number the joiner now holds (there, a removed member) is no life of the joiner.
    #[test]
    fn a_frame_of_the_old_epoch_is_no_life_for_a_joiner_slot() {
        let joiner = newcomer(Rank(2), 9, 1);
        let mut n = node(3, 0);
        n.handle(ms(10), frame(1, 0, commit(&[2], vec![joiner])))
            .unwrap();
        assert_eq!((n.epoch(), n.world()), (Epoch(1), 3));
        assert!(n.watched().contains(&Rank(2)), "{:?}", n.watched());
        transmits(&mut n);
        events(&mut n);
        let mut at = 10;
        while at < 1900 {
            assert_eq!(run_timers(&mut n, 2, at, at + 100), None);
            at += 100;
            assert!(n.handle(ms(at), frame(2, 0, heartbeat())).is_err());
            let rec = n.ledger().record(Rank(2)).expect("the joiner is watched");
            assert_eq!(rec.last_heard, None, "never heard, at {at} ms");
            assert_ne!(rec.state, PeerState::Alive, "at {at} ms");
        }
        let dead = run_timers(&mut n, 2, at, 2200);
        assert!(
            dead.is_some_and(|t| t <= 10 + 2000 + 10),
            "the joiner's watch began at 10 ms and nothing it sent came: {dead:?}"
        );
    }

    /// Three members, rank 2 dead: rank 0 coordinates the shrink by hand-carried frames,
    /// and afterwards answers a laggard's stale frame with the commit it missed.
    #[test]
    fn shrink_by_paxos_then_catch_up_a_laggard() {
        let mut c = node(3, 0);
        let mut m = node(3, 1);
        for n in [&mut c, &mut m] {
            n.handle(
                ms(1),
                Input::ConnectionLost {
                    epoch: Epoch(0),
                    peer: Rank(2),
                    code: CloseCode::INTERNAL,
                },
            )
            .unwrap();
            transmits(n);
            events(n);
        }
        m.handle(ms(2), Input::Command(Command::Shrink)).unwrap();
        assert!(
            transmits(&mut m).is_empty(),
            "rank 1 waits for the lowest present rank to coordinate"
        );
        c.handle(ms(2), Input::Command(Command::Shrink)).unwrap();
        let prepare = transmits(&mut c);
        assert_eq!(prepare.len(), 1);
        assert_eq!(prepare[0].to, Rank(1));
        m.handle(ms(3), frame(0, 0, prepare[0].message.clone()))
            .unwrap();
        let promise = transmits(&mut m);
        assert!(matches!(&promise[0].message, Message::Promise(p) if p.absent == vec![Rank(2)]));
        c.handle(ms(4), frame(1, 0, promise[0].message.clone()))
            .unwrap();
        let propose = transmits(&mut c);
        let Message::Propose(p) = &propose[0].message else {
            panic!("{propose:?}")
        };
        assert_eq!(p.proposal.removed, vec![Rank(2)]);
        assert_eq!(p.proposal.epoch, Epoch(1));
        m.handle(ms(5), frame(0, 0, propose[0].message.clone()))
            .unwrap();
        let accept = transmits(&mut m);
        c.handle(ms(6), frame(1, 0, accept[0].message.clone()))
            .unwrap();
        assert_eq!(c.epoch(), Epoch(1));
        let agreed = events(&mut c).into_iter().find_map(|e| match e {
            Event::MembershipAgreed(a) => Some(a),
            _ => None,
        });
        let agreed = agreed.expect("the coordinator installed");
        assert_eq!(
            (agreed.world(), agreed.rank, agreed.plan.removed()),
            (2, Rank(0), &[Rank(2)][..])
        );
        let flood = transmits(&mut c);
        let commit = flood
            .iter()
            .find(|t| matches!(t.message, Message::Commit(_)))
            .expect("commit flooded");
        assert_eq!((commit.to, commit.epoch), (Rank(1), Epoch(0)));
        assert!(intents(&mut c).iter().any(|i| matches!(
            i,
            ConnectionIntent::Close {
                peer: Rank(2),
                code: CloseCode::EVICTED,
                ..
            }
        )));
        // The member never got the commit; its next stale heartbeat is answered with it.
        assert_eq!(
            c.handle(ms(7), frame(1, 0, heartbeat())),
            Err(InputError::StaleEpoch {
                frame: Epoch(0),
                current: Epoch(1)
            })
        );
        assert!(
            transmits(&mut c).is_empty(),
            "the flood gets a heartbeat interval first"
        );
        assert!(c.handle(ms(300), frame(1, 0, heartbeat())).is_err());
        let catch_up: Vec<Transmit> = transmits(&mut c)
            .into_iter()
            .filter(|t| t.epoch == Epoch(0))
            .collect();
        assert!(
            matches!(
                catch_up.as_slice(),
                [Transmit {
                    to: Rank(1),
                    message: Message::Commit(_),
                    ..
                }]
            ),
            "{catch_up:?}"
        );
        m.handle(ms(301), frame(0, 0, catch_up[0].message.clone()))
            .unwrap();
        assert_eq!((m.epoch(), m.rank(), m.world()), (Epoch(1), Rank(1), 2));
        // Nothing from the old epoch is accepted after the commit.
        assert!(matches!(
            m.handle(ms(302), frame(0, 0, heartbeat())),
            Err(InputError::StaleEpoch { .. })
        ));
    }

    #[test]
    fn a_frame_from_a_dead_rank_is_answered_with_its_verdict() {
        let mut n = node(4, 1);
        n.handle(
            ms(1),
            Input::ConnectionLost {
                epoch: Epoch(0),
                peer: Rank(3),
                code: CloseCode::INTERNAL,
            },
        )
        .unwrap();
        transmits(&mut n);
        assert_eq!(
            n.handle(ms(2), frame(3, 0, heartbeat())),
            Err(InputError::FromAbsent { rank: Rank(3) })
        );
        let reply = transmits(&mut n);
        assert!(matches!(
            reply.as_slice(),
            [Transmit {
                to: Rank(3),
                message: Message::Notice(Notice {
                    subject: Rank(3),
                    verdict: Verdict::Dead,
                    ..
                }),
                ..
            }]
        ));
        assert!(n.handle(ms(3), frame(3, 0, heartbeat())).is_err());
        assert!(transmits(&mut n).is_empty(), "rate limited");
    }

    #[test]
    fn a_differing_digest_is_repaired_by_pushing_notices() {
        let mut n = node(8, 3);
        n.handle(
            ms(1),
            Input::ConnectionLost {
                epoch: Epoch(0),
                peer: Rank(6),
                code: CloseCode::INTERNAL,
            },
        )
        .unwrap();
        transmits(&mut n);
        // Rank 2 heartbeats with an empty digest long after: it missed the notice.
        n.handle(ms(500), frame(2, 0, heartbeat())).unwrap();
        let pushed = transmits(&mut n);
        assert!(pushed.iter().any(|t| t.to == Rank(2)
            && matches!(
                t.message,
                Message::Notice(Notice {
                    subject: Rank(6),
                    ..
                })
            )));
        assert!(pushed.iter().any(|t| t.to == Rank(2)
            && matches!(t.message, Message::Heartbeat(h) if h.digest == n.digest().get())));
        n.handle(ms(501), frame(2, 0, heartbeat())).unwrap();
        assert!(
            transmits(&mut n).iter().all(|t| t.to != Rank(2)),
            "rate limited to one repair per interval"
        );
    }

    #[test]
    fn closing_an_old_epochs_stream_is_not_a_departure() {
        let mut n = node(1, 0);
        n.handle(ms(1), Input::Command(Command::Shrink)).unwrap();
        assert_eq!(n.epoch(), Epoch(1));
        let old = Input::ConnectionClosed {
            peer: Rank(0),
            epoch: Epoch(0),
            code: CloseCode::NORMAL,
        };
        assert!(matches!(
            n.handle(ms(2), old),
            Err(InputError::StaleEpoch { .. })
        ));
        assert_eq!(n.status(), Status::Member);
    }

    #[test]
    fn a_relayed_grow_join_is_coordinated_here() {
        let mut n = node(3, 2);
        let joiner = newcomer(LAUNCHER, 1, 0);
        let join = Message::Join(chorus_protocol::message::Join {
            world: 0,
            peer: joiner,
        });
        n.handle(ms(1), frame(0, 0, join)).unwrap();
        let prepares = transmits(&mut n)
            .into_iter()
            .filter(|t| matches!(t.message, Message::Prepare(Prepare { ballot }) if ballot.coordinator == Rank(2)))
            .count();
        assert_eq!(prepares, 2);
        assert_eq!(n.pending_joiners().len(), 1);
    }

    #[test]
    fn a_launcher_witness_notice_is_accepted() {
        let mut n = node(4, 1);
        let witness = Notice {
            origin: LAUNCHER,
            subject: Rank(3),
            verdict: Verdict::Dead,
            evidence: Evidence::LauncherWitness { status: -9 },
            hops: 0,
        };
        n.handle(ms(1), frame(0, 0, Message::Notice(witness)))
            .unwrap();
        assert!(n.ledger().is_absent(Rank(3)));
        // A rankless origin with any other evidence is malformed.
        let forged = Notice {
            subject: Rank(2),
            evidence: Evidence::ProcessExited { status: 0 },
            ..witness
        };
        assert!(matches!(
            n.handle(ms(2), frame(0, 0, Message::Notice(forged))),
            Err(InputError::Invalid { .. })
        ));
    }

    #[test]
    fn a_long_departure_detail_is_cut_to_what_the_wire_carries() {
        let mut n = node(2, 0);
        let detail = "é".repeat(400);
        n.handle(
            ms(1),
            Input::Command(Command::Depart {
                code: CloseCode::LEFT,
                detail,
            }),
        )
        .unwrap();
        let sent = transmits(&mut n);
        let Message::Depart(d) = &sent[0].message else {
            panic!("{sent:?}")
        };
        assert!(d.detail.len() <= MAX_DETAIL && d.detail.len() >= MAX_DETAIL - 1);
    }

    #[test]
    fn a_rejected_config_is_an_error() {
        let view = View::new(COMM, Epoch(0), 2, Rank(0)).unwrap();
        let config = Config {
            observers: 0,
            ..Config::default()
        };
        assert_eq!(
            Node::new(config, view, ms(0)).unwrap_err(),
            ConfigError::NoObservers
        );
    }
}
