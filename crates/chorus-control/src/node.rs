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
    Commit, Depart, Evidence, Heartbeat, Kind, Message, Notice, PeerInfo, PeerState, PeerStatus, Revoke,
    Verdict,
};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use crate::agreement::{Agreement, Ctx};
use crate::broadcast::{Digest, Fingers};
use crate::config::{Config, ConfigError};
use crate::detector::{Detector, Expiry};
use crate::error::InputError;
use crate::event::{Agreed, Event, Eviction};
use crate::input::{Command, Frame, Input, Witness};
use crate::ledger::Ledger;
use crate::outbox::Outbox;
use crate::overlay::Ring;
use crate::plan::Plan;
use crate::revoke::Revocation;
use crate::time::{Instant, millis};
use crate::transmit::{ConnectionIntent, Transmit};
use crate::view::View;

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
    history: VecDeque<(Commit, u32, Instant)>,
    links: BTreeSet<Rank>,
    next_wake: Option<Instant>,
    knowledge_at: Instant,
    /// Until when an accusation of death is explained by this member's own long stall.
    stalled_until: Option<Instant>,
    replies: BTreeMap<(Reply, u64, Rank), Instant>,
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
            history: VecDeque::new(),
            links: BTreeSet::new(),
            next_wake: None,
            knowledge_at: now,
            stalled_until: None,
            replies: BTreeMap::new(),
            out: Outbox::default(),
            stats: Stats::default(),
        };
        node.reset_overlay(now);
        node.next_wake = node.compute_next_wake(now);
        Ok(node)
    }

    /// Feeds one input. A refusal changes nothing (see [`InputError`]).
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
            Input::ConnectionOpened { peer } => self.on_opened(peer, now),
            Input::ConnectionClosed { peer, code } => self.on_closed(peer, code, now),
            Input::ConnectionLost { peer, code } => {
                self.on_local_evidence(peer, Verdict::Dead, Evidence::ConnectionLost { code }, now)
            }
            Input::PeerExited { peer, status, witness } => {
                let evidence = match witness {
                    Witness::Pidfd => Evidence::ProcessExited { status },
                    Witness::Launcher => Evidence::LauncherWitness { status },
                };
                self.on_local_evidence(peer, Verdict::Dead, evidence, now)
            }
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

    /// One row per member (`StatusReply::peers`, `health()`); this member's own row is
    /// `Alive`, heard now.
    pub fn peers(&self, now: Instant) -> Vec<PeerStatus> {
        (0..self.view.world())
            .map(Rank)
            .map(|r| {
                if r == self.view.rank() {
                    PeerStatus { rank: r, state: PeerState::Alive, last_heard_ms: 0, evidence: None }
                } else {
                    self.ledger.status(r, now)
                }
            })
            .collect()
    }

    /// The digest of this member's knowledge at its epoch.
    pub fn digest(&self) -> Digest {
        self.ledger.digest().with_revoked(self.revocation.is_revoked())
    }

    // -----------------------------------------------------------------------------------
    // Inputs

    fn on_frame(&mut self, frame: Frame, now: Instant) -> Result<(), InputError> {
        self.stats.frames += 1;
        let kind = frame.message.kind();
        if frame.comm != self.view.comm() {
            return Err(InputError::UnknownComm { comm: frame.comm, expected: self.view.comm() });
        }
        if !is_control(kind) {
            return Err(InputError::NotControl { kind });
        }
        let current = self.view.epoch();
        if frame.epoch < current {
            self.stats.stale += 1;
            self.on_stale(&frame, now);
            return Err(InputError::StaleEpoch { frame: frame.epoch, current });
        }
        if frame.epoch > current {
            self.stats.future += 1;
            return Err(InputError::FutureEpoch { frame: frame.epoch, current });
        }
        let from = frame.from;
        if from.get() >= self.view.world() {
            return Err(InputError::RankOutOfRange { rank: from, world: self.view.world() });
        }
        if from == self.view.rank() {
            return Err(invalid(kind, "frame claims this member's own rank"));
        }
        if self.ledger.is_absent(from) {
            self.stats.from_absent += 1;
            self.on_from_absent(from, now);
            return Err(InputError::FromAbsent { rank: from });
        }
        self.heard(from, now);
        match frame.message {
            Message::Heartbeat(hb) => {
                self.on_heartbeat(from, hb, now);
                Ok(())
            }
            Message::Depart(depart) => {
                let notice = self.own_notice(from, Verdict::Departed, Evidence::Departed { code: depart.code });
                tracing::debug!(rank = %self.view.rank(), peer = %from, code = %depart.code, detail = %depart.detail, "peer departed");
                self.learn(notice, None, now);
                Ok(())
            }
            Message::Notice(notice) => self.on_notice(from, notice, now),
            Message::Revoke(revoke) => self.on_revoke(from, revoke, now),
            Message::Prepare(p) => {
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                self.agreement.on_prepare(from, p, &ctx, &mut self.out)
            }
            Message::Promise(p) => {
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                let decided = self.agreement.on_promise(from, p, &ctx, &mut self.out)?;
                self.decided(decided, now);
                Ok(())
            }
            Message::Propose(p) => {
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                self.agreement.on_propose(from, p, &ctx, &mut self.out)
            }
            Message::Accept(a) => {
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                let decided = self.agreement.on_accept(from, a, &ctx, &mut self.out)?;
                self.decided(decided, now);
                Ok(())
            }
            Message::Commit(c) => self.on_commit(from, c, now),
            Message::Join(_) | Message::Welcome(_) => {
                Err(invalid(kind, "joins go to the bootstrap root, or to the runtime as Command::Admit"))
            }
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
            return self.on_local_evidence(peer, Verdict::Departed, Evidence::Departed { code }, now);
        }
        if code == CloseCode::INTERNAL {
            return self.on_local_evidence(peer, Verdict::Dead, Evidence::ConnectionLost { code }, now);
        }
        // Other codes (deadline, stale epoch, protocol violation, ...) come from a live peer
        // refusing this connection: not evidence that it is gone.
        tracing::debug!(rank = %self.view.rank(), %peer, %code, "connection closed by a live peer");
        Ok(())
    }

    fn on_local_evidence(&mut self, peer: Rank, verdict: Verdict, evidence: Evidence, now: Instant) -> Result<(), InputError> {
        self.check_peer(peer)?;
        let notice = self.own_notice(peer, verdict, evidence);
        self.learn(notice, None, now);
        Ok(())
    }

    fn on_command(&mut self, command: Command, now: Instant) -> Result<(), InputError> {
        match command {
            Command::Depart { code, detail } => self.depart(code, detail),
            Command::Abort => self.depart(CloseCode::ABORTED, "aborted".to_owned()),
            Command::Revoke => {
                let me = self.view.rank();
                self.revoke(me, 0, None, now);
            }
            Command::Shrink => {
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                let decided = self.agreement.request(&ctx, &mut self.out);
                self.decided(decided, now);
            }
            Command::Admit(joiners) => {
                if joiners.is_empty() {
                    return Ok(());
                }
                let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
                let decided = self.agreement.admit(joiners, &ctx, &mut self.out);
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
        if let Some(origin) = self.revocation.origin() {
            self.send(from, epoch, Message::Revoke(Revoke { origin, hops: 0 }));
        }
        // Our digest lets the sender push what it knows and we lack.
        let seq = self.detector.seq();
        self.send(from, epoch, Message::Heartbeat(Heartbeat { seq, digest: mine.get() }));
    }

    fn on_notice(&mut self, from: Rank, notice: Notice, now: Instant) -> Result<(), InputError> {
        let world = self.view.world();
        for r in [notice.origin, notice.subject] {
            if r.get() >= world {
                return Err(invalid(Kind::Notice, &format!("{r} outside the world of {world}")));
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
        let notice = Notice { hops: notice.hops.saturating_add(1), ..notice };
        self.learn(notice, Some(from), now);
        Ok(())
    }

    fn on_revoke(&mut self, from: Rank, revoke: Revoke, now: Instant) -> Result<(), InputError> {
        if revoke.origin.get() >= self.view.world() {
            return Err(invalid(Kind::Revoke, "origin outside the world"));
        }
        self.revoke(revoke.origin, revoke.hops.saturating_add(1), Some(from), now);
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
            return Err(InputError::FutureEpoch { frame: commit.proposal.epoch, current: epoch });
        }
        let plan = Plan::from_proposal(self.view.world(), epoch, &commit.proposal)
            .map_err(|e| invalid(Kind::Commit, &e.to_string()))?;
        self.install(commit, plan, Some(from), now);
        Ok(())
    }

    /// A frame from an epoch this member left: the sender missed a commit. Answer with the
    /// one that follows its epoch, once the flood has had time to reach it.
    fn on_stale(&mut self, frame: &Frame, now: Instant) {
        if matches!(frame.message, Message::Commit(_)) {
            return;
        }
        let Some(next) = frame.epoch.get().checked_add(1) else { return };
        let Some((commit, old_world, at)) = self.history.iter().find(|(c, _, _)| c.proposal.epoch.get() == next) else {
            return;
        };
        if now < *at + self.config.heartbeat_interval || frame.from.get() >= *old_world {
            return;
        }
        let commit = commit.clone();
        if !self.allow(Reply::CatchUp, frame.from, now, self.config.retransmit) {
            return;
        }
        self.stats.catch_ups += 1;
        self.send(frame.from, frame.epoch, Message::Commit(commit));
    }

    /// A frame from a member this one holds dead: tell it (it may have been frozen).
    fn on_from_absent(&mut self, from: Rank, now: Instant) {
        if self.ledger.state(from) != PeerState::Dead {
            return;
        }
        let Some(notice) = self.ledger.notice(from) else { return };
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
            self.evict(self.view.epoch(), Eviction::Declared { origin: notice.origin, evidence: notice.evidence });
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
        let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
        let decided = self.agreement.on_view_change(&ctx, &mut self.out);
        self.decided(decided, now);
    }

    fn revoke(&mut self, origin: Rank, hops: u16, from: Option<Rank>, now: Instant) {
        if !self.revocation.revoke(origin) {
            return;
        }
        self.knowledge_at = now;
        let epoch = self.view.epoch();
        tracing::info!(at = %now, rank = %self.view.rank(), %epoch, %origin, hops, "communicator revoked");
        self.out.events.push_back(Event::Revoked { epoch, origin });
        let targets: Vec<Rank> = self.fingers.targets(from).collect();
        for to in targets {
            self.send(to, epoch, Message::Revoke(Revoke { origin, hops }));
        }
    }

    fn own_notice(&self, subject: Rank, verdict: Verdict, evidence: Evidence) -> Notice {
        Notice { origin: self.view.rank(), subject, verdict, evidence, hops: 0 }
    }

    fn heard(&mut self, from: Rank, now: Instant) {
        self.detector.heard(from, now);
        if self.ledger.heard(from, now) {
            self.out.events.push_back(Event::PeerRecovered { epoch: self.view.epoch(), rank: from });
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
            // reaches us as soon as we talk to them again: within a deadline, surely.
            self.stalled_until = Some(now + self.config.deadline);
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
                        self.out.events.push_back(Event::PeerSuspect { epoch, rank, silent });
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
            let observers = self.detector.observers().to_vec();
            for to in observers {
                self.stats.heartbeats += 1;
                self.send(to, epoch, Message::Heartbeat(Heartbeat { seq, digest }));
            }
        }
        let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
        let decided = self.agreement.on_timeout(&ctx, &mut self.out);
        self.decided(decided, now);
    }

    fn compute_next_wake(&self, now: Instant) -> Option<Instant> {
        if self.status != Status::Member {
            return None;
        }
        let ctx = Ctx { view: self.view, absent: self.ledger.absent(), config: &self.config, now };
        let mut next = self.detector.next_deadline();
        if let Some(at) = self.agreement.next_deadline(&ctx) {
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
            Err(e) => tracing::error!(rank = %self.view.rank(), error = %e, "decided an invalid proposal"),
        }
    }

    /// Installs the next epoch: floods the commit over the old overlay, renumbers, and
    /// starts watching the new neighbours.
    fn install(&mut self, commit: Commit, plan: Plan, from: Option<Rank>, now: Instant) {
        let old_epoch = self.view.epoch();
        let targets: Vec<Rank> = self.fingers.targets(from).collect();
        for to in targets {
            self.send(to, old_epoch, Message::Commit(commit.clone()));
        }
        self.history.push_back((commit.clone(), plan.old_world(), now));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        let Some(rank) = plan.new_rank(self.view.rank()) else {
            tracing::warn!(rank = %self.view.rank(), epoch = %plan.epoch(), "removed by the agreed membership");
            self.evict(plan.epoch(), Eviction::Removed { epoch: plan.epoch() });
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
                self.out.intents.push_back(ConnectionIntent::Close { peer: *r, epoch: old_epoch, code: CloseCode::EVICTED });
            }
        }
        let joiner_ranks = (0..commit.proposal.joiners.len()).filter_map(|i| plan.joiner_rank(i));
        self.ledger = self.ledger.remap(plan.world(), |r| plan.new_rank(r), joiner_ranks, now);
        self.links = self.links.iter().filter_map(|r| plan.new_rank(*r)).collect();
        self.view = view;
        self.revocation = Revocation::default();
        self.replies.clear();
        self.knowledge_at = now;
        let leftover: Vec<PeerInfo> = self
            .agreement
            .pending_joiners()
            .iter()
            .filter(|p| !commit.proposal.joiners.iter().any(|j| same_process(j, p)))
            .cloned()
            .collect();
        self.agreement = Agreement::new(now, leftover);
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
                    Event::PeerDeparted { epoch, rank: n.subject, code, origin: n.origin, hops: 0 }
                }
                evidence => Event::PeerDead { epoch, rank: n.subject, evidence, origin: n.origin, hops: 0 },
            };
            self.out.events.push_back(event);
        }
    }

    fn evict(&mut self, epoch: Epoch, cause: Eviction) {
        self.status = Status::Evicted;
        self.out.events.push_back(Event::Evicted { epoch, cause });
        let old = self.view.epoch();
        for peer in std::mem::take(&mut self.links) {
            self.out.intents.push_back(ConnectionIntent::Close { peer, epoch: old, code: CloseCode::ABORTED });
        }
        self.next_wake = None;
    }

    /// Departure is a message (principle 1): `Depart` to every neighbour, then closes.
    fn depart(&mut self, code: CloseCode, detail: String) {
        let epoch = self.view.epoch();
        let mut to: BTreeSet<Rank> = self.links.clone();
        to.extend(self.detector.observers().iter().copied());
        to.extend(self.detector.watched());
        to.extend(self.fingers.all().iter().copied());
        to.remove(&self.view.rank());
        for peer in &to {
            self.send(*peer, epoch, Message::Depart(Depart { code, detail: detail.clone() }));
        }
        for peer in to {
            self.out.intents.push_back(ConnectionIntent::Close { peer, epoch, code });
        }
        self.links.clear();
        self.status = Status::Departed { code };
        self.next_wake = None;
        tracing::info!(rank = %self.view.rank(), %epoch, %code, "departed");
    }

    // -----------------------------------------------------------------------------------
    // Helpers

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
                self.out.intents.push_back(ConnectionIntent::Open { peer, epoch });
            }
        }
    }

    fn send(&mut self, to: Rank, epoch: Epoch, message: Message) {
        self.out.transmits.push_back(Transmit { to, comm: self.view.comm(), epoch, message });
    }

    fn check_peer(&self, peer: Rank) -> Result<(), InputError> {
        if peer.get() >= self.view.world() {
            return Err(InputError::RankOutOfRange { rank: peer, world: self.view.world() });
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

fn same_process(a: &PeerInfo, b: &PeerInfo) -> bool {
    a.fingerprint == b.fingerprint && a.incarnation == b.incarnation && a.pid == b.pid && a.host == b.host
}

fn invalid(kind: Kind, reason: &str) -> InputError {
    InputError::Invalid { kind, reason: reason.to_owned() }
}
