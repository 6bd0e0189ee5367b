//! One control-plane `Node` under an arbitrary stream of inputs.
//!
//! The fuzz input picks the world (2–16), the node's rank, its observers and quorum, then a
//! sequence of steps: advance the clock (a little, to the node's next timer, or far), a
//! frame from any rank at any epoch and comm (heartbeat, notice, revoke, depart, prepare,
//! promise, propose, accept, commit), a connection event or process exit, or a local
//! command (shrink, revoke, admit, depart, abort). Frames pass the protocol's validation
//! first, as the runtime's decoder does. Members are trusted (SPEC 19): no input forges a
//! notice in this node's own name.
//!
//! Oracles, checked after every step:
//! - no panic, and the heap stays below `HEAP_LIMIT` (a counting allocator; inputs are at
//!   most a few KiB, so more means state that grows without bound);
//! - a member's next timer is at most one heartbeat interval away (the runtime's contract);
//! - no false death: a peer this node declares dead for a missed deadline was not sent a
//!   heartbeat at the current epoch within the deadline before;
//! - one membership per epoch: every `Commit` the node sends for an epoch carries the same
//!   proposal, and it installs at most one change per epoch, the one it sends;
//! - a stale input (a frame or connection event of an older epoch) changes nothing of the
//!   current epoch: epoch, rank, status, ledger, digest, revocation, pending joiners.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chorus_control::{
    Command, Config, Event, Input, Instant, Node, Quorum, Received, Status, View, Witness,
};
use chorus_protocol::message::{
    Accept, Ballot, Commit, Depart, Evidence, Heartbeat, Message, Notice, PeerInfo, Prepare,
    Promise, Proposal, Propose, Revoke, RevokeCause, Verdict, WireAddr,
};
use chorus_protocol::{CloseCode, CommId, Epoch, Limits, Rank};
use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;

/// The most heap the target may hold between steps.
const HEAP_LIMIT: usize = 64 << 20;
/// The most steps one input drives.
const MAX_STEPS: usize = 2048;
const COMM: CommId = CommId(0xc0);

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the same arguments; the counter
// is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let baseline = LIVE.load(Ordering::Relaxed);
    let _ = drive(&mut Unstructured::new(data), baseline);
});

fn drive(u: &mut Unstructured<'_>, baseline: usize) -> ArbResult<()> {
    let world = u.int_in_range(2..=16u32)?;
    let me = Rank(u.int_in_range(0..=world - 1)?);
    let config = Config {
        observers: u.int_in_range(1..=3)?,
        quorum: if u.arbitrary()? {
            Quorum::Survivors
        } else {
            Quorum::Majority
        },
        ..Config::default()
    };
    let start = Instant::from_micros(1_000_000);
    let view = View::new(COMM, Epoch(u.int_in_range(0..=3)?), world, me).expect("a valid view");
    let node = Node::new(config, view, start).expect("a valid config");
    let mut h = Harness {
        heard: (0..world).map(|r| (Rank(r), start)).collect(),
        reported: BTreeSet::new(),
        node,
        now: start,
        sent_commits: BTreeMap::new(),
        installed: BTreeMap::new(),
    };
    h.drain();
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        h.step(u)?;
        h.drain();
        h.check_timer();
        let live = LIVE.load(Ordering::Relaxed).saturating_sub(baseline);
        assert!(live < HEAP_LIMIT, "heap grew to {live} bytes");
    }
    Ok(())
}

struct Harness {
    node: Node,
    now: Instant,
    /// When each rank (current numbering) was last sent a heartbeat at the current epoch.
    heard: BTreeMap<Rank, Instant>,
    /// Ranks (current numbering) already reported dead or departed: after a membership
    /// change the node says again, at the new epoch, who is still absent.
    reported: BTreeSet<Rank>,
    /// Per old epoch, the removed ranks and joiner count of the `Commit`s the node sent.
    sent_commits: BTreeMap<Epoch, (Vec<Rank>, usize)>,
    /// Per old epoch, the change the node installed.
    installed: BTreeMap<Epoch, (Vec<Rank>, usize)>,
}

/// What a stale input must leave alone.
#[derive(PartialEq, Debug)]
struct Snapshot {
    epoch: Epoch,
    rank: Rank,
    world: u32,
    status: Status,
    digest: u64,
    revoked_by: Option<Rank>,
    peers: Vec<chorus_protocol::message::PeerStatus>,
    joiners: usize,
}

impl Harness {
    fn step(&mut self, u: &mut Unstructured<'_>) -> ArbResult<()> {
        match u.int_in_range(0..=15u8)? {
            0 | 1 => {
                let ms = u.int_in_range(0..=400u64)?;
                self.now = self.now + Duration::from_millis(ms);
                self.feed(Input::Timeout);
            }
            2 => {
                if let Some(t) = self.node.poll_timeout() {
                    self.now = self.now.max(t);
                }
                self.feed(Input::Timeout);
            }
            3 => {
                let s = u.int_in_range(1..=120u64)?;
                self.now = self.now + Duration::from_secs(s);
                self.feed(Input::Timeout);
            }
            4..=9 => {
                let frame = self.frame(u)?;
                if frame.message.validate(&Limits::DEFAULT).is_ok() {
                    if frame.epoch < self.node.epoch() {
                        self.stale(Input::Frame(frame));
                    } else {
                        if matches!(frame.message, Message::Heartbeat(_))
                            && frame.epoch == self.node.epoch()
                            && frame.comm == self.node.comm()
                        {
                            self.heard.insert(frame.from, self.now);
                        }
                        self.feed(Input::Frame(frame));
                    }
                }
            }
            10 | 11 => {
                let peer = self.rank(u)?;
                let epoch = self.epoch(u)?;
                let code = CloseCode(u.arbitrary()?);
                let input = match u.int_in_range(0..=3u8)? {
                    0 => Input::ConnectionOpened { peer, epoch },
                    1 => Input::ConnectionClosed { peer, epoch, code },
                    2 => Input::ConnectionLost { peer, epoch, code },
                    _ => Input::PeerExited {
                        peer,
                        epoch,
                        status: u.arbitrary()?,
                        witness: if u.arbitrary()? {
                            Witness::Pidfd
                        } else {
                            Witness::Launcher
                        },
                    },
                };
                if epoch < self.node.epoch() {
                    self.stale(input);
                } else {
                    self.feed(input);
                }
            }
            12 => self.feed(Input::Command(Command::Shrink)),
            13 => {
                let cause = if u.arbitrary()? {
                    Some(RevokeCause {
                        subject: self.rank(u)?,
                        evidence: evidence(u)?,
                    })
                } else {
                    None
                };
                self.feed(Input::Command(Command::Revoke { cause }));
            }
            14 => {
                let joiners = (0..u.int_in_range(1..=2)?)
                    .map(|_| peer_info(u))
                    .collect::<ArbResult<Vec<_>>>()?;
                self.feed(Input::Command(Command::Admit(joiners)));
            }
            _ => {
                // Leaving ends the node's life; rare, so most inputs explore a live node.
                if u.int_in_range(0..=7u8)? == 0 {
                    let command = if u.arbitrary()? {
                        Command::Abort
                    } else {
                        Command::Depart {
                            code: CloseCode::LEFT,
                            detail: "fuzz".into(),
                        }
                    };
                    self.feed(Input::Command(command));
                }
            }
        }
        Ok(())
    }

    fn feed(&mut self, input: Input) {
        let _ = self.node.handle(self.now, input);
    }

    /// Feeds a stale input between two snapshots of the current epoch's state. Due timers
    /// run first (twice, so anything they schedule for now has run), so only the input can
    /// change what the second snapshot shows.
    fn stale(&mut self, input: Input) {
        self.feed(Input::Timeout);
        self.drain();
        self.feed(Input::Timeout);
        self.drain();
        let before = self.snapshot();
        self.feed(Input::Timeout);
        self.drain();
        if self.snapshot() != before {
            // Timers still firing at this instant; the comparison would not isolate the input.
            return;
        }
        self.feed(input.clone());
        self.drain();
        let after = self.snapshot();
        assert_eq!(
            before, after,
            "a stale input changed the current epoch: {input:?}"
        );
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            epoch: self.node.epoch(),
            rank: self.node.rank(),
            world: self.node.world(),
            status: self.node.status(),
            digest: self.node.digest().get(),
            revoked_by: self.node.revoked_by(),
            peers: self.node.peers(self.now),
            joiners: self.node.pending_joiners().len(),
        }
    }

    /// Takes every output and checks the membership and liveness oracles on it.
    fn drain(&mut self) {
        while let Some(t) = self.node.poll_transmit() {
            if let Message::Commit(c) = &t.message {
                let change = (c.proposal.removed.clone(), c.proposal.joiners.len());
                let first = self.sent_commits.entry(t.epoch).or_insert(change.clone());
                assert_eq!(
                    *first, change,
                    "two different commits sent for epoch {}",
                    t.epoch
                );
            }
        }
        while self.node.poll_intent().is_some() {}
        while let Some(event) = self.node.poll_event() {
            match event {
                Event::PeerDead {
                    epoch,
                    rank,
                    evidence: Evidence::MissedDeadline { .. },
                    origin,
                    ..
                } if origin == self.node.rank()
                    && epoch == self.node.epoch()
                    && self.reported.insert(rank) =>
                {
                    let heard = self.heard.get(&rank).copied().unwrap_or(Instant::ZERO);
                    let silent = self.now.saturating_since(heard);
                    let deadline = self.node.config().deadline;
                    assert!(
                        silent >= deadline,
                        "{rank} declared dead after {silent:?} of silence (deadline {deadline:?})"
                    );
                }
                Event::PeerDead { epoch, rank, .. } | Event::PeerDeparted { epoch, rank, .. }
                    if epoch == self.node.epoch() =>
                {
                    self.reported.insert(rank);
                }
                Event::MembershipAgreed(agreed) => {
                    let change = (agreed.plan.removed().to_vec(), agreed.joiners.len());
                    assert!(
                        self.installed
                            .insert(agreed.previous, change.clone())
                            .is_none(),
                        "two memberships installed for epoch {}",
                        agreed.previous
                    );
                    if let Some(sent) = self.sent_commits.get(&agreed.previous) {
                        assert_eq!(*sent, change, "installed another change than it sent");
                    }
                    // The detector keeps what it heard across the renumbering; so does the
                    // oracle. Joiners are heard from now.
                    let plan = &agreed.plan;
                    let mut heard: BTreeMap<Rank, Instant> = self
                        .heard
                        .iter()
                        .filter_map(|(r, t)| plan.new_rank(*r).map(|n| (n, *t)))
                        .collect();
                    for r in 0..plan.world() {
                        heard.entry(Rank(r)).or_insert(self.now);
                    }
                    self.heard = heard;
                    self.reported = self
                        .reported
                        .iter()
                        .filter_map(|r| plan.new_rank(*r))
                        .collect();
                }
                _ => {}
            }
        }
    }

    fn check_timer(&self) {
        if self.node.status() != Status::Member {
            return;
        }
        let next = self
            .node
            .poll_timeout()
            .expect("a member always has a timer");
        let interval = self.node.config().heartbeat_interval;
        assert!(
            next <= self.now + interval,
            "next timer {next} is more than {interval:?} after {}",
            self.now
        );
    }

    /// A rank of the current world, or now and then one outside it.
    fn rank(&self, u: &mut Unstructured<'_>) -> ArbResult<Rank> {
        Ok(if u.int_in_range(0..=15u8)? == 0 {
            Rank(u.arbitrary()?)
        } else {
            Rank(u.int_in_range(0..=self.node.world() - 1)?)
        })
    }

    /// Mostly the current epoch; sometimes an older, the next, or any.
    fn epoch(&self, u: &mut Unstructured<'_>) -> ArbResult<Epoch> {
        let now = self.node.epoch().get();
        Ok(Epoch(match u.int_in_range(0..=11u8)? {
            0..=6 => now,
            7 | 8 => now.saturating_sub(u.int_in_range(1..=3)?),
            9 => now + 1,
            10 => 0,
            _ => u.arbitrary()?,
        }))
    }

    fn ballot(&self, u: &mut Unstructured<'_>) -> ArbResult<Ballot> {
        Ok(Ballot {
            round: u.int_in_range(0..=4)?,
            coordinator: self.rank(u)?,
        })
    }

    fn proposal(&self, u: &mut Unstructured<'_>) -> ArbResult<Proposal> {
        let world = self.node.world();
        let mut removed: Vec<Rank> = (0..world)
            .filter(|_| u.int_in_range(0..=5u8).is_ok_and(|x| x == 0))
            .map(Rank)
            .collect();
        if u.int_in_range(0..=15u8)? == 0 {
            removed.push(Rank(u.arbitrary()?));
        }
        let joiners = (0..u.int_in_range(0..=1)?)
            .map(|_| peer_info(u))
            .collect::<ArbResult<Vec<_>>>()?;
        let epoch = if u.int_in_range(0..=7u8)? == 0 {
            self.epoch(u)?
        } else {
            self.node.epoch().next()
        };
        Ok(Proposal {
            comm: self.node.comm(),
            epoch,
            removed,
            joiners,
        })
    }

    fn absent(&self, u: &mut Unstructured<'_>) -> ArbResult<Vec<Rank>> {
        Ok((0..self.node.world())
            .filter(|_| u.int_in_range(0..=5u8).is_ok_and(|x| x == 0))
            .map(Rank)
            .collect())
    }

    fn frame(&self, u: &mut Unstructured<'_>) -> ArbResult<Received> {
        let me = self.node.rank();
        let mut from = self.rank(u)?;
        if from == me {
            from = Rank((me.get() + 1) % self.node.world());
        }
        let epoch = self.epoch(u)?;
        let comm = if u.int_in_range(0..=15u8)? == 0 {
            CommId(u.arbitrary()?)
        } else {
            self.node.comm()
        };
        let message = match u.int_in_range(0..=9u8)? {
            0..=2 => Message::Heartbeat(Heartbeat {
                seq: u.arbitrary()?,
                digest: if u.arbitrary()? {
                    self.node.digest().get()
                } else {
                    u.arbitrary()?
                },
            }),
            3 => {
                let mut origin = self.rank(u)?;
                if origin == me {
                    origin = from;
                }
                Message::Notice(Notice {
                    origin,
                    subject: self.rank(u)?,
                    verdict: match u.int_in_range(0..=2u8)? {
                        0 => Verdict::Suspect,
                        1 => Verdict::Dead,
                        _ => Verdict::Departed,
                    },
                    evidence: evidence(u)?,
                    hops: u.int_in_range(0..=5)?,
                })
            }
            4 => Message::Revoke(Revoke {
                origin: from,
                hops: u.int_in_range(0..=5)?,
                cause: None,
            }),
            5 => Message::Depart(Depart::new(CloseCode(u.arbitrary()?), "fuzz")),
            6 => Message::Prepare(Prepare {
                ballot: self.ballot(u)?,
            }),
            7 => Message::Promise(Promise {
                ballot: self.ballot(u)?,
                accepted: if u.arbitrary()? {
                    Some((self.ballot(u)?, self.proposal(u)?))
                } else {
                    None
                },
                absent: self.absent(u)?,
            }),
            8 => {
                let ballot = self.ballot(u)?;
                match u.int_in_range(0..=2u8)? {
                    0 => Message::Propose(Propose {
                        ballot,
                        proposal: self.proposal(u)?,
                    }),
                    1 => Message::Accept(Accept {
                        ballot,
                        ok: u.arbitrary()?,
                        absent: self.absent(u)?,
                    }),
                    _ => Message::Commit(Commit {
                        ballot,
                        proposal: self.proposal(u)?,
                    }),
                }
            }
            _ => Message::Accept(Accept {
                ballot: self.ballot(u)?,
                ok: true,
                absent: self.absent(u)?,
            }),
        };
        Ok(Received {
            from,
            comm,
            epoch,
            message,
        })
    }
}

fn evidence(u: &mut Unstructured<'_>) -> ArbResult<Evidence> {
    Ok(match u.int_in_range(0..=4u8)? {
        0 => Evidence::Departed {
            code: CloseCode(u.arbitrary()?),
        },
        1 => Evidence::ConnectionLost {
            code: CloseCode(u.arbitrary()?),
        },
        2 => Evidence::MissedDeadline {
            silent_ms: u.arbitrary()?,
            deadline_ms: u.arbitrary()?,
        },
        3 => Evidence::ProcessExited {
            status: u.arbitrary()?,
        },
        _ => Evidence::LauncherWitness {
            status: u.arbitrary()?,
        },
    })
}

fn peer_info(u: &mut Unstructured<'_>) -> ArbResult<PeerInfo> {
    Ok(PeerInfo {
        rank: Rank(u.int_in_range(0..=40)?),
        host: "fuzz".into(),
        pid: u.arbitrary()?,
        control: WireAddr {
            ip: [0; 16],
            port: u.arbitrary()?,
        },
        data: WireAddr {
            ip: [0; 16],
            port: u.arbitrary()?,
        },
        fingerprint: [u.arbitrary()?; 32],
        caps: 0,
        incarnation: u.arbitrary()?,
    })
}
