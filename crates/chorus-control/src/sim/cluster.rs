//! The simulated cluster: processes running [`Node`]s, a faulty network between them, and
//! the scenario's faults, advanced event by event in simulated time.

use std::collections::BTreeMap;
use std::time::Duration;

use chorus_protocol::message::{Kind, PeerInfo, WireAddr};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};

use super::queue::Queue;
use super::record::Record;
use super::rng::Rng;
use super::scenario::{FaultKind, Scenario};
use crate::event::Event;
use crate::input::{Command, Input, Received, Witness};
use crate::node::Node;
use crate::plan::Plan;
use crate::time::Instant;
use crate::transmit::{ConnectionIntent, Transmit};
use crate::view::View;

/// Processes per simulated host (for same-host pidfd evidence).
const PROCS_PER_HOST: u32 = 8;

/// The communicator every simulated member belongs to.
pub(crate) const COMM: CommId = CommId(0xc0);

#[derive(Debug)]
enum Ev {
    Frame {
        to: u32,
        frame: Received,
    },
    /// A connection event; `epoch` is the closing stream's epoch (`None`: the receiver's).
    Conn {
        to: u32,
        peer: u32,
        epoch: Option<Epoch>,
        what: Conn,
    },
    Timer {
        proc: u32,
    },
    Fault(usize),
    Resume {
        proc: u32,
    },
    Shrink {
        proc: u32,
        epoch: Epoch,
    },
    Start {
        proc: u32,
        view: View,
    },
}

#[derive(Copy, Clone, Debug)]
enum Conn {
    Opened,
    Closed(CloseCode),
    Lost(CloseCode),
    Exited,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Run {
    /// A joiner not welcomed yet, or a member not started yet.
    Pending,
    Running,
    Frozen,
    Crashed,
    /// Departed, aborted, or evicted: the process is gone or inert.
    Gone,
}

#[derive(Debug)]
struct Proc {
    node: Option<Node>,
    run: Run,
    backlog: Vec<Ev>,
    timer: Option<Instant>,
    links: Vec<u32>,
    shrink_for: Option<Epoch>,
    admitted: Vec<u32>,
}

impl Proc {
    fn new() -> Proc {
        Proc {
            node: None,
            run: Run::Pending,
            backlog: Vec::new(),
            timer: None,
            links: Vec::new(),
            shrink_for: None,
            admitted: Vec::new(),
        }
    }
}

/// The members of one epoch: rank → process, and back.
#[derive(Debug)]
struct Table {
    procs: Vec<u32>,
    ranks: Vec<u32>,
    removed: Vec<Rank>,
}

impl Table {
    fn new(procs: Vec<u32>, total: usize, removed: Vec<Rank>) -> Table {
        let mut ranks = vec![u32::MAX; total];
        for (rank, p) in procs.iter().enumerate() {
            if let Some(slot) = ranks.get_mut(*p as usize) {
                *slot = rank as u32;
            }
        }
        Table {
            procs,
            ranks,
            removed,
        }
    }

    fn proc_of(&self, rank: Rank) -> Option<u32> {
        self.procs.get(rank.index()).copied()
    }

    fn rank_of(&self, proc: u32) -> Option<Rank> {
        self.ranks
            .get(proc as usize)
            .copied()
            .filter(|r| *r != u32::MAX)
            .map(Rank)
    }
}

/// One run in progress.
pub(crate) struct Cluster {
    scenario: Scenario,
    rng: Rng,
    now: Instant,
    queue: Queue,
    slab: Vec<Option<Ev>>,
    free: Vec<u32>,
    seq: u64,
    procs: Vec<Proc>,
    tables: BTreeMap<u64, Table>,
    pub(crate) record: Record,
    armed: Option<Kind>,
    /// The process whose outputs are being drained is about to crash.
    crashing: bool,
}

impl Cluster {
    pub(crate) fn new(scenario: Scenario) -> Cluster {
        let n = scenario.ranks;
        let mut rng = Rng::new(scenario.seed ^ 0x00c1_a5e7);
        let record = Record::new(n as usize, scenario.tolerated_freeze());
        let mut c = Cluster {
            rng: rng.fork(1),
            now: Instant::ZERO,
            queue: Queue::new(),
            slab: Vec::new(),
            free: Vec::new(),
            seq: 0,
            procs: (0..n).map(|_| Proc::new()).collect(),
            tables: BTreeMap::new(),
            record,
            armed: None,
            crashing: false,
            scenario,
        };
        c.tables
            .insert(0, Table::new((0..n).collect(), n as usize, Vec::new()));
        let interval = c.scenario.config.heartbeat_interval;
        for p in 0..n {
            // Processes start at different moments, so heartbeats are not in lockstep.
            let at = Instant::ZERO + Duration::from_micros(rng.below(interval.as_micros() as u64));
            if let Ok(view) = View::new(COMM, Epoch(0), n, Rank(p)) {
                c.push(at, Ev::Start { proc: p, view });
            }
        }
        for i in 0..c.scenario.faults.len() {
            let at = c.scenario.faults[i].at;
            c.push(at, Ev::Fault(i));
        }
        c
    }

    /// Runs to the scenario's end.
    pub(crate) fn run(&mut self) {
        let end = self.scenario.end;
        if let Some(p) = self
            .scenario
            .net
            .partitions
            .iter()
            .filter(|p| p.lasts(self.long_partition()))
            .map(|p| p.from)
            .min()
        {
            self.record.long_partition_from = Some(p);
        }
        while let Some((at, slot)) = self.queue.pop() {
            if at > end {
                break;
            }
            self.now = at;
            let Some(ev) = self.slab.get_mut(slot as usize).and_then(Option::take) else {
                continue;
            };
            self.free.push(slot);
            self.record.events += 1;
            self.dispatch(ev);
        }
        self.now = end;
    }

    pub(crate) fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    pub(crate) fn now(&self) -> Instant {
        self.now
    }

    /// The process at `rank` of `epoch`.
    pub(crate) fn proc_at(&self, epoch: Epoch, rank: Rank) -> Option<u32> {
        self.tables.get(&epoch.get())?.proc_of(rank)
    }

    /// Processes in `epoch`'s membership.
    pub(crate) fn members(&self, epoch: Epoch) -> Option<&[u32]> {
        self.tables.get(&epoch.get()).map(|t| t.procs.as_slice())
    }

    /// Number of processes ever created.
    pub(crate) fn proc_count(&self) -> usize {
        self.procs.len()
    }

    /// The node of `proc`, if it has one.
    pub(crate) fn node(&self, proc: u32) -> Option<&Node> {
        self.procs.get(proc as usize)?.node.as_ref()
    }

    /// A partition longer than this lets members on both sides be declared dead.
    fn long_partition(&self) -> Duration {
        self.scenario.tolerated_partition() + Duration::from_micros(1)
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(ev);
                s
            }
            None => {
                self.slab.push(Some(ev));
                (self.slab.len() - 1) as u32
            }
        };
        self.seq += 1;
        self.queue.push(at, self.seq, slot);
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Frame { to, .. } | Ev::Conn { to, .. } => {
                let p = to as usize;
                match self.procs[p].run {
                    Run::Running => self.deliver(ev),
                    Run::Frozen => self.procs[p].backlog.push(ev),
                    Run::Pending | Run::Crashed | Run::Gone => {}
                }
            }
            Ev::Timer { proc } => {
                let p = proc as usize;
                if self.procs[p].run == Run::Running && self.procs[p].timer == Some(self.now) {
                    self.procs[p].timer = None;
                    self.handle(proc, Input::Timeout);
                }
            }
            Ev::Fault(i) => self.fault(i),
            Ev::Resume { proc } => self.resume(proc),
            Ev::Shrink { proc, epoch } => {
                let p = proc as usize;
                match self.procs[p].run {
                    Run::Running
                        if self.procs[p]
                            .node
                            .as_ref()
                            .is_some_and(|n| n.epoch() == epoch) =>
                    {
                        self.record.asked.entry((proc, epoch)).or_insert(self.now);
                        self.handle(proc, Input::Command(Command::Shrink));
                    }
                    Run::Frozen => self.procs[p].backlog.push(Ev::Shrink { proc, epoch }),
                    _ => {}
                }
            }
            Ev::Start { proc, view } => self.start(proc, view),
        }
    }

    fn deliver(&mut self, ev: Ev) {
        match ev {
            Ev::Frame { to, frame } => {
                let Some(node) = self.procs[to as usize].node.as_mut() else {
                    return;
                };
                let before = node.epoch();
                let stale = frame.epoch < before;
                let kind = frame.message.kind();
                let result = node.handle(self.now, Input::Frame(frame));
                if stale && !matches!(result, Err(crate::InputError::StaleEpoch { .. })) {
                    self.record.violation(format!(
                        "{}: proc {to} at {before} did not refuse a stale {kind:?} frame: {result:?}",
                        self.now
                    ));
                }
                self.after(to);
            }
            Ev::Conn {
                to,
                peer,
                epoch,
                what,
            } => {
                let Some(node) = self.procs[to as usize].node.as_ref() else {
                    return;
                };
                let epoch = epoch.unwrap_or_else(|| node.epoch());
                let Some(rank) = self.tables.get(&epoch.get()).and_then(|t| t.rank_of(peer)) else {
                    return;
                };
                let input = match what {
                    Conn::Opened => Input::ConnectionOpened { peer: rank, epoch },
                    Conn::Closed(code) => Input::ConnectionClosed {
                        peer: rank,
                        epoch,
                        code,
                    },
                    Conn::Lost(code) => Input::ConnectionLost {
                        peer: rank,
                        epoch,
                        code,
                    },
                    Conn::Exited => Input::PeerExited {
                        epoch,
                        peer: rank,
                        status: 9,
                        witness: Witness::Pidfd,
                    },
                };
                self.handle(to, input);
            }
            other => self.dispatch(other),
        }
    }

    fn handle(&mut self, proc: u32, input: Input) {
        let Some(node) = self.procs[proc as usize].node.as_mut() else {
            return;
        };
        let _ = node.handle(self.now, input);
        self.after(proc);
    }

    fn start(&mut self, proc: u32, view: View) {
        let p = proc as usize;
        if self.procs[p].run != Run::Pending {
            return;
        }
        match Node::new(self.scenario.config.clone(), view, self.now) {
            Ok(node) => {
                self.procs[p].node = Some(node);
                self.procs[p].run = Run::Running;
                if view.epoch() != Epoch(0) {
                    self.record.faults[p].joined = Some(self.now);
                    self.record.installs[p].push((view.epoch(), self.now));
                }
                self.after(proc);
            }
            Err(e) => self
                .record
                .violation(format!("proc {proc}: node refused its configuration: {e}")),
        }
    }

    /// Drains a node's outputs into the network, the record and the application.
    fn after(&mut self, proc: u32) {
        let p = proc as usize;
        let Some(node) = self.procs[p].node.as_mut() else {
            return;
        };
        let epoch = node.epoch();
        let transmits: Vec<Transmit> = std::iter::from_fn(|| node.poll_transmit()).collect();
        let intents: Vec<ConnectionIntent> = std::iter::from_fn(|| node.poll_intent()).collect();
        let events: Vec<Event> = std::iter::from_fn(|| node.poll_event()).collect();
        let timeout = node.poll_timeout();

        // The scenario may crash the next coordinator part-way through this batch.
        let mut limit = transmits.len();
        let mut crash = false;
        if let Some(kind) = self.armed {
            let total = transmits
                .iter()
                .filter(|t| t.message.kind() == kind)
                .count();
            if total > 0 {
                let keep = self.rng.below(total as u64 + 1) as usize;
                let mut seen = 0;
                limit = transmits
                    .iter()
                    .position(|t| {
                        if t.message.kind() == kind {
                            seen += 1;
                            seen > keep
                        } else {
                            false
                        }
                    })
                    .unwrap_or(transmits.len());
                crash = true;
                self.armed = None;
            }
        }

        // Events first: an installed epoch's table must exist before its frames are routed.
        self.crashing = crash;
        for e in events {
            self.observe(proc, e);
        }
        self.crashing = false;
        let epoch_after = self.procs[p].node.as_ref().map_or(epoch, Node::epoch);
        for t in transmits.into_iter().take(limit) {
            self.route(proc, epoch_after, t);
        }
        if crash {
            self.procs[p].run = Run::Crashed;
            self.record.faults[p].crashed = Some(self.now);
            return;
        }
        for i in intents {
            self.intent(proc, i);
        }
        if self.procs[p].run != Run::Running {
            return;
        }
        if let Some(at) = timeout {
            let at = at.max(self.now);
            if self.procs[p].timer != Some(at) {
                self.procs[p].timer = Some(at);
                self.push(at, Ev::Timer { proc });
            }
        }
    }

    fn route(&mut self, proc: u32, node_epoch: Epoch, t: Transmit) {
        if t.epoch > node_epoch {
            self.record.violation(format!(
                "{}: proc {proc} at {node_epoch} sent for {}",
                self.now, t.epoch
            ));
            return;
        }
        let Some(table) = self.tables.get(&t.epoch.get()) else {
            self.record.violation(format!(
                "{}: proc {proc} sent at unknown {}",
                self.now, t.epoch
            ));
            return;
        };
        let (Some(from), Some(to)) = (table.rank_of(proc), table.proc_of(t.to)) else {
            self.record.violation(format!(
                "{}: proc {proc} sent {:?} to {} at {} where one of them is not a member",
                self.now,
                t.message.kind(),
                t.to,
                t.epoch
            ));
            return;
        };
        self.record.frames += 1;
        let (w0, w1) = self.scenario.measure;
        if self.now >= w0 && self.now < w1 {
            self.record.window_frames += 1;
        }
        let kind = t.message.kind();
        let Some(delay) = self
            .scenario
            .net
            .delay(&mut self.rng, proc, to, self.now, kind)
        else {
            self.record.lost += 1;
            return;
        };
        let frame = Received {
            from,
            comm: t.comm,
            epoch: t.epoch,
            message: t.message,
        };
        self.push(self.now + delay, Ev::Frame { to, frame });
    }

    fn intent(&mut self, proc: u32, intent: ConnectionIntent) {
        match intent {
            ConnectionIntent::Open { peer, epoch } => {
                let Some(q) = self.proc_at(epoch, peer) else {
                    return;
                };
                if self.procs[proc as usize].links.contains(&q) {
                    return;
                }
                self.procs[proc as usize].links.push(q);
                if !self.procs[q as usize].links.contains(&proc) {
                    self.procs[q as usize].links.push(proc);
                }
                if self.procs[q as usize].run == Run::Running
                    && !self.scenario.net.cut(proc, q, self.now)
                {
                    let d = self.scenario.net.signal_delay(&mut self.rng);
                    self.push(
                        self.now + d,
                        Ev::Conn {
                            to: q,
                            peer: proc,
                            epoch: None,
                            what: Conn::Opened,
                        },
                    );
                    self.push(
                        self.now + d * 2,
                        Ev::Conn {
                            to: proc,
                            peer: q,
                            epoch: None,
                            what: Conn::Opened,
                        },
                    );
                }
            }
            ConnectionIntent::Close { peer, epoch, code } => {
                let Some(q) = self.proc_at(epoch, peer) else {
                    return;
                };
                self.procs[proc as usize].links.retain(|l| *l != q);
                self.procs[q as usize].links.retain(|l| *l != proc);
                if self.scenario.net.cut(proc, q, self.now) {
                    return;
                }
                let d = self.scenario.net.signal_delay(&mut self.rng);
                self.push(
                    self.now + d,
                    Ev::Conn {
                        to: q,
                        peer: proc,
                        epoch: Some(epoch),
                        what: Conn::Closed(code),
                    },
                );
            }
        }
    }

    fn observe(&mut self, proc: u32, event: Event) {
        let total = self.procs.len();
        match event {
            Event::PeerDead {
                epoch, rank, hops, ..
            }
            | Event::PeerDeparted {
                epoch, rank, hops, ..
            } => {
                let Some(subject) = self.proc_at(epoch, rank) else {
                    return;
                };
                // A process that was itself frozen past its deadline is a zombie until it
                // learns of its eviction; its local verdicts are dropped by everyone else.
                if !self.record.may_be_absent(subject, self.now)
                    && !self.record.may_be_absent(proc, self.now)
                {
                    self.record.violation(format!(
                        "{}: false verdict: proc {proc} declared proc {subject} ({rank} at {epoch}) absent: {event:?}",
                        self.now
                    ));
                }
                let first = self
                    .record
                    .learned
                    .get(&subject)
                    .and_then(|row| row.get(proc as usize))
                    .is_none_or(|t| *t == super::record::NEVER);
                if first {
                    self.record.hops.push(f64::from(hops));
                }
                self.record.learn(proc, subject, self.now, total);
                self.react(proc, epoch);
            }
            Event::Revoked { epoch, .. } => {
                let now = self.now.as_micros();
                for r in self.record.revokes.iter_mut().filter(|r| r.epoch == epoch) {
                    if let Some(slot) = r.learned.get_mut(proc as usize) {
                        *slot = (*slot).min(now);
                    }
                }
            }
            Event::MembershipAgreed(agreed) => self.installed(proc, agreed),
            Event::AgreementStalled { .. } => self.record.stalls += 1,
            Event::AgreementFailed { epoch, failure } => {
                let asked = self.record.asked.get(&(proc, epoch)).copied();
                self.record.gave_up.push(super::report::GaveUp {
                    proc,
                    epoch,
                    asked: asked.unwrap_or(self.now),
                    at: self.now,
                    failure,
                });
            }
            Event::Evicted { epoch, cause } => {
                self.record.evictions += 1;
                if !self.record.may_be_absent(proc, self.now) {
                    self.record.violation(format!(
                        "{}: healthy proc {proc} evicted at {epoch}: {cause:?}",
                        self.now
                    ));
                }
                self.record.faults[proc as usize].evicted = Some((self.now, epoch));
                self.procs[proc as usize].run = Run::Gone;
            }
            Event::PeerSuspect { .. } | Event::PeerRecovered { .. } => {}
        }
    }

    /// The application reacts to an absence by asking to shrink (once per epoch).
    fn react(&mut self, proc: u32, epoch: Epoch) {
        let Some(delay) = self.scenario.shrink else {
            return;
        };
        let p = proc as usize;
        if self.procs[p].shrink_for == Some(epoch) {
            return;
        }
        self.procs[p].shrink_for = Some(epoch);
        let d = Duration::from_micros(self.rng.below(delay.as_micros() as u64 + 1));
        self.push(self.now + d, Ev::Shrink { proc, epoch });
    }

    fn installed(&mut self, proc: u32, agreed: crate::event::Agreed) {
        let p = proc as usize;
        let new = agreed.epoch();
        let last = self.record.installs[p].last().map(|(e, _)| *e);
        if last != Some(agreed.previous) || new.get() != agreed.previous.get() + 1 {
            self.record.violation(format!(
                "{}: proc {proc} installed {new} after {:?} (agreed from {})",
                self.now, last, agreed.previous
            ));
        }
        self.record.installs[p].push((new, self.now));
        let joiner_procs: Vec<u32> = agreed.joiners.iter().map(|j| j.pid).collect();
        match self.tables.get(&new.get()) {
            Some(t) => {
                if t.removed != agreed.plan.removed()
                    || t.procs.len() as u32 != agreed.plan.world()
                    || !t.procs.ends_with(&joiner_procs)
                {
                    self.record.violation(format!(
                        "{}: proc {proc} installed a different membership for {new}: removed {:?} world {} joiners {:?}; first installer had removed {:?} world {}",
                        self.now,
                        agreed.plan.removed(),
                        agreed.plan.world(),
                        joiner_procs,
                        t.removed,
                        t.procs.len()
                    ));
                }
            }
            None => {
                let Some(old) = self.tables.get(&agreed.previous.get()) else {
                    self.record.violation(format!(
                        "{}: proc {proc} installed {new} from unknown {}",
                        self.now, agreed.previous
                    ));
                    return;
                };
                let procs = build_table(old, &agreed.plan, &joiner_procs);
                let total = self.procs.len();
                self.tables.insert(
                    new.get(),
                    Table::new(procs, total, agreed.plan.removed().to_vec()),
                );
            }
        }
        if self.tables.get(&new.get()).and_then(|t| t.rank_of(proc)) != Some(agreed.rank) {
            self.record.violation(format!(
                "{}: proc {proc} believes it is {} at {new}, the table disagrees",
                self.now, agreed.rank
            ));
        }
        let removed: Vec<u32> = agreed
            .plan
            .removed()
            .iter()
            .filter_map(|r| self.proc_at(agreed.previous, *r))
            .collect();
        let total = self.procs.len();
        for subject in removed {
            self.record.learn(proc, subject, self.now, total);
        }
        // The member that admitted joiners welcomes them (unless it dies first).
        if self.crashing {
            return;
        }
        let welcome: Vec<u32> = self.procs[p]
            .admitted
            .iter()
            .copied()
            .filter(|j| joiner_procs.contains(j))
            .collect();
        for j in welcome {
            self.procs[p].admitted.retain(|a| *a != j);
            let Some(rank) = self.tables.get(&new.get()).and_then(|t| t.rank_of(j)) else {
                continue;
            };
            if let Ok(view) = View::new(COMM, new, agreed.plan.world(), rank) {
                let d = self.scenario.net.signal_delay(&mut self.rng);
                self.push(self.now + d, Ev::Start { proc: j, view });
            }
        }
    }

    fn fault(&mut self, i: usize) {
        let fault = self.scenario.faults[i].clone();
        let proc = fault.proc;
        let p = proc as usize;
        if let FaultKind::CrashCoordinator(kind) = fault.kind {
            self.armed = Some(kind);
            return;
        }
        if p >= self.procs.len() || self.procs[p].run != Run::Running {
            return;
        }
        match fault.kind {
            FaultKind::Crash => {
                self.procs[p].run = Run::Crashed;
                self.record.faults[p].crashed = Some(self.now);
            }
            FaultKind::Kill => {
                self.procs[p].run = Run::Crashed;
                self.record.faults[p].crashed = Some(self.now);
                for q in self.procs[p].links.clone() {
                    let d = self.scenario.net.signal_delay(&mut self.rng);
                    self.push(
                        self.now + d,
                        Ev::Conn {
                            to: q,
                            peer: proc,
                            epoch: None,
                            what: Conn::Lost(CloseCode::INTERNAL),
                        },
                    );
                }
                let host = proc / PROCS_PER_HOST;
                let neighbour = (host * PROCS_PER_HOST..(host + 1) * PROCS_PER_HOST).find(|q| {
                    *q != proc
                        && (*q as usize) < self.procs.len()
                        && self.procs[*q as usize].run == Run::Running
                });
                if let Some(q) = neighbour {
                    self.push(
                        self.now + Duration::from_micros(50),
                        Ev::Conn {
                            to: q,
                            peer: proc,
                            epoch: None,
                            what: Conn::Exited,
                        },
                    );
                }
            }
            FaultKind::Freeze(d) => {
                self.procs[p].run = Run::Frozen;
                self.record.faults[p].freezes.push((self.now, self.now + d));
                self.push(self.now + d, Ev::Resume { proc });
            }
            FaultKind::Depart | FaultKind::Abort => {
                self.record.faults[p].departed = Some(self.now);
                let command = if fault.kind == FaultKind::Abort {
                    Command::Abort
                } else {
                    Command::Depart {
                        code: CloseCode::LEFT,
                        detail: "scale-down".to_owned(),
                    }
                };
                self.handle(proc, Input::Command(command));
                self.procs[p].run = Run::Gone;
            }
            FaultKind::Revoke => {
                let Some(epoch) = self.procs[p].node.as_ref().map(Node::epoch) else {
                    return;
                };
                let total = self.procs.len();
                let mut learned = vec![super::record::NEVER; total];
                learned[p] = self.now.as_micros();
                // Members that already hold a revocation of this epoch learned this one too.
                for (q, other) in self.procs.iter().enumerate() {
                    if let Some(node) = other.node.as_ref()
                        && node.epoch() == epoch
                        && node.revoked_by().is_some()
                    {
                        learned[q] = self.now.as_micros();
                    }
                }
                self.record.revokes.push(super::record::RevokeRecord {
                    at: self.now,
                    epoch,
                    learned,
                });
                self.handle(proc, Input::Command(Command::Revoke { cause: None }));
            }
            FaultKind::Admit(n) => {
                let mut infos = Vec::new();
                for _ in 0..n {
                    let id = self.procs.len() as u32;
                    self.procs.push(Proc::new());
                    self.record.add_proc(true);
                    self.procs[p].admitted.push(id);
                    infos.push(peer_info(id));
                }
                self.handle(proc, Input::Command(Command::Admit(infos)));
            }
            FaultKind::CrashCoordinator(_) => {}
        }
    }

    fn resume(&mut self, proc: u32) {
        let p = proc as usize;
        if self.procs[p].run != Run::Frozen {
            return;
        }
        self.procs[p].run = Run::Running;
        let backlog = std::mem::take(&mut self.procs[p].backlog);
        for ev in backlog {
            if self.procs[p].run != Run::Running {
                break;
            }
            self.deliver(ev);
        }
        if self.procs[p].run == Run::Running {
            self.procs[p].timer = None;
            self.handle(proc, Input::Timeout);
        }
    }
}

/// The next epoch's rank → process table.
fn build_table(old: &Table, plan: &Plan, joiners: &[u32]) -> Vec<u32> {
    let mut procs: Vec<u32> = old
        .procs
        .iter()
        .enumerate()
        .filter(|(rank, _)| plan.new_rank(Rank(*rank as u32)).is_some())
        .map(|(_, p)| *p)
        .collect();
    procs.extend_from_slice(joiners);
    procs
}

/// What a simulated joiner announces; `pid` is its process number in the simulation.
fn peer_info(id: u32) -> PeerInfo {
    let mut fingerprint = [0u8; 32];
    fingerprint[..4].copy_from_slice(&id.to_le_bytes());
    PeerInfo {
        rank: Rank(0),
        host: format!("sim{}", id / PROCS_PER_HOST),
        pid: id,
        control: WireAddr {
            ip: [0; 16],
            port: 1,
        },
        data: WireAddr {
            ip: [0; 16],
            port: 2,
        },
        fingerprint,
        caps: 0,
        incarnation: 1,
    }
}
