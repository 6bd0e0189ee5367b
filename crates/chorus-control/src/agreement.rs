//! Agreement on the next epoch: single-decree Paxos among the members of the current
//! epoch, deciding one [`Proposal`] (removed ranks, joiners) per epoch.
//!
//! # Who sends what
//!
//! 1. A member asked to shrink (or to admit joiners) coordinates if it is the lowest present
//!    rank in its view (or was asked to admit); the others wait for its `Prepare`.
//! 2. The coordinator claims ballot `(round, rank)` with `Prepare` to every present member.
//!    Each member promises to ignore lower ballots and answers `Promise` with the proposal it
//!    already accepted at this epoch (if any) and the ranks it knows absent; a member that
//!    promised higher answers with that ballot instead (a refusal).
//! 3. Once enough members promised, the coordinator proposes: the highest-ballot proposal a
//!    promise reported (Paxos: it may already be chosen), or else a fresh one removing every
//!    absence anybody reported and appending its pending joiners. Members accept unless they
//!    promised higher.
//! 4. Once enough members accepted, the value is chosen: the coordinator floods `Commit`
//!    (see [`crate::broadcast`]) and every member installs it.
//!
//! "Enough" is [`Quorum`]: a strict majority of the epoch's members, or every member not
//! known absent. The coordinator waits for every present member's promise (so the proposal
//! includes every absence anyone knows) but under `Majority` proceeds with a majority when
//! the phase times out; a member that died mid-round is declared dead by the detector
//! within the deadline and is no longer waited for.
//!
//! # Coordinator failure
//!
//! Members that promised remember the coordinator. When it becomes absent in a member's
//! view (declared dead, departed), the lowest present rank starts a higher ballot at once;
//! failing that, any engaged member takes over after `agreement_timeout` plus a small delay
//! growing with its position, so takeovers rarely collide. Whatever the old coordinator got
//! accepted survives through the promises (step 3), so a value chosen before a crash is the
//! value every later ballot proposes: no two members ever install different memberships for
//! one epoch. Lost frames are covered by the coordinator resending its current phase to
//! members that have not answered every `retransmit`, and by the takeover path.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chorus_protocol::Rank;
use chorus_protocol::message::{
    Accept, Ballot, Commit, Kind, Message, PeerInfo, Prepare, Promise, Proposal, Propose,
};

use crate::config::{Config, Quorum};
use crate::error::InputError;
use crate::event::Event;
use crate::outbox::Outbox;
use crate::overlay::Ring;
use crate::plan::Plan;
use crate::quorum::reach;
use crate::time::Instant;
use crate::transmit::Transmit;
use crate::view::View;

/// How far takeover delays grow with a member's position, in retransmit intervals.
const MAX_TAKEOVER_STAGGER: u32 = 16;

/// What the agreement reads from its member.
pub(crate) struct Ctx<'a> {
    pub(crate) view: View,
    pub(crate) absent: &'a BTreeSet<Rank>,
    pub(crate) config: &'a Config,
    pub(crate) now: Instant,
}

impl Ctx<'_> {
    fn ring(&self) -> Ring<'_> {
        Ring::new(self.view.world(), self.absent)
    }

    fn me(&self) -> Rank {
        self.view.rank()
    }

    fn present_others(&self) -> impl Iterator<Item = Rank> + '_ {
        let me = self.me();
        (0..self.view.world())
            .map(Rank)
            .filter(move |r| *r != me && !self.absent.contains(r))
    }

    fn send(&self, out: &mut Outbox, to: Rank, message: Message) {
        out.transmits.push_back(Transmit {
            to,
            comm: self.view.comm(),
            epoch: self.view.epoch(),
            message,
        });
    }

    fn absent_list(&self) -> Vec<Rank> {
        self.absent.iter().copied().collect()
    }
}

/// The agreement state of one member at one epoch.
#[derive(Debug)]
pub(crate) struct Agreement {
    /// Highest ballot promised.
    promised: Option<Ballot>,
    /// Last proposal accepted, with its ballot.
    accepted: Option<(Ballot, Proposal)>,
    /// Highest round seen in any ballot.
    max_round: u32,
    /// An agreement is wanted or under way at this epoch.
    engaged: bool,
    /// Start a round at the next timer check (joiners left over from the last epoch).
    kick: bool,
    /// Joiners admitted here and not yet in a committed epoch.
    joiners: Vec<PeerInfo>,
    /// Coordinator of the highest ballot promised.
    leader: Option<Rank>,
    /// Last sign of progress from the leader.
    progress: Instant,
    /// The round this member coordinates, if any.
    round: Option<Round>,
}

#[derive(Debug)]
struct Round {
    ballot: Ballot,
    phase: Phase,
    deadline: Instant,
    resend: Instant,
}

#[derive(Debug)]
enum Phase {
    Prepare {
        promises: BTreeMap<Rank, Option<(Ballot, Proposal)>>,
        absent: BTreeSet<Rank>,
    },
    Propose {
        proposal: Proposal,
        accepts: BTreeSet<Rank>,
    },
}

impl Agreement {
    /// A fresh agreement for a new epoch, carrying joiners not yet admitted.
    pub(crate) fn new(now: Instant, joiners: Vec<PeerInfo>) -> Agreement {
        let kick = !joiners.is_empty();
        Agreement {
            promised: None,
            accepted: None,
            max_round: 0,
            engaged: kick,
            kick,
            joiners,
            leader: None,
            progress: now,
            round: None,
        }
    }

    /// The last proposal this member accepted at its epoch, if any.
    pub(crate) fn accepted(&self) -> Option<&Proposal> {
        self.accepted.as_ref().map(|(_, p)| p)
    }

    /// Joiners admitted here and not yet in a committed epoch.
    pub(crate) fn pending_joiners(&self) -> &[PeerInfo] {
        &self.joiners
    }

    /// The local application asks for the next epoch without the absent members.
    pub(crate) fn request(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) -> Option<Commit> {
        if self.round.is_some() {
            return None;
        }
        if !self.engaged {
            self.engaged = true;
            self.progress = ctx.now;
        }
        let leader_gone = self.leader.is_none_or(|l| ctx.absent.contains(&l));
        if leader_gone && ctx.ring().lowest() == Some(ctx.me()) {
            return self.start(ctx, out);
        }
        None
    }

    /// The local runtime asks to admit `joiners`; this member coordinates.
    pub(crate) fn admit(
        &mut self,
        joiners: Vec<PeerInfo>,
        ctx: &Ctx<'_>,
        out: &mut Outbox,
    ) -> Option<Commit> {
        self.joiners.extend(joiners);
        self.engaged = true;
        match &self.round {
            // A round still collecting promises picks the joiners up when it proposes.
            Some(Round {
                phase: Phase::Prepare { .. },
                ..
            }) => None,
            // A proposal in flight is fixed; the joiners wait for the next epoch.
            Some(Round {
                phase: Phase::Propose { .. },
                ..
            }) => None,
            None => self.start(ctx, out),
        }
    }

    pub(crate) fn on_prepare(
        &mut self,
        from: Rank,
        prepare: Prepare,
        ctx: &Ctx<'_>,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let ballot = prepare.ballot;
        if ballot.coordinator != from {
            return Err(invalid(
                Kind::Prepare,
                "sender is not the ballot's coordinator",
            ));
        }
        self.max_round = self.max_round.max(ballot.round);
        if self.promised.is_none_or(|p| ballot >= p) {
            self.follow(ballot, ctx.now);
            let accepted = self.accepted.clone();
            ctx.send(
                out,
                from,
                Message::Promise(Promise {
                    ballot,
                    accepted,
                    absent: ctx.absent_list(),
                }),
            );
        } else if let Some(promised) = self.promised {
            ctx.send(
                out,
                from,
                Message::Promise(Promise {
                    ballot: promised,
                    accepted: None,
                    absent: Vec::new(),
                }),
            );
        }
        Ok(())
    }

    pub(crate) fn on_promise(
        &mut self,
        from: Rank,
        promise: Promise,
        ctx: &Ctx<'_>,
        out: &mut Outbox,
    ) -> Result<Option<Commit>, InputError> {
        let world = ctx.view.world();
        if let Some(bad) = promise.absent.iter().find(|r| r.get() >= world) {
            return Err(invalid(
                Kind::Promise,
                &format!("absent {bad} outside the world"),
            ));
        }
        if let Some((_, proposal)) = &promise.accepted {
            check_proposal(Kind::Promise, proposal, ctx)?;
        }
        self.max_round = self.max_round.max(promise.ballot.round);
        let Some(round) = self.round.as_mut() else {
            return Ok(None);
        };
        if promise.ballot > round.ballot {
            self.yield_to(promise.ballot, ctx.now);
            return Ok(None);
        }
        if promise.ballot != round.ballot {
            return Ok(None);
        }
        if let Phase::Prepare { promises, absent } = &mut round.phase {
            promises.insert(from, promise.accepted);
            absent.extend(promise.absent);
        }
        Ok(self.check(ctx, out))
    }

    pub(crate) fn on_propose(
        &mut self,
        from: Rank,
        propose: Propose,
        ctx: &Ctx<'_>,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let ballot = propose.ballot;
        if ballot.coordinator != from {
            return Err(invalid(
                Kind::Propose,
                "sender is not the ballot's coordinator",
            ));
        }
        check_proposal(Kind::Propose, &propose.proposal, ctx)?;
        self.max_round = self.max_round.max(ballot.round);
        let absent = ctx.absent_list();
        if self.promised.is_none_or(|p| ballot >= p) {
            self.follow(ballot, ctx.now);
            self.accepted = Some((ballot, propose.proposal));
            ctx.send(
                out,
                from,
                Message::Accept(Accept {
                    ballot,
                    ok: true,
                    absent,
                }),
            );
        } else if let Some(promised) = self.promised {
            ctx.send(
                out,
                from,
                Message::Accept(Accept {
                    ballot: promised,
                    ok: false,
                    absent,
                }),
            );
        }
        Ok(())
    }

    pub(crate) fn on_accept(
        &mut self,
        from: Rank,
        accept: Accept,
        ctx: &Ctx<'_>,
        out: &mut Outbox,
    ) -> Result<Option<Commit>, InputError> {
        let world = ctx.view.world();
        if let Some(bad) = accept.absent.iter().find(|r| r.get() >= world) {
            return Err(invalid(
                Kind::Accept,
                &format!("absent {bad} outside the world"),
            ));
        }
        self.max_round = self.max_round.max(accept.ballot.round);
        let Some(round) = self.round.as_mut() else {
            return Ok(None);
        };
        if accept.ballot > round.ballot {
            self.yield_to(accept.ballot, ctx.now);
            return Ok(None);
        }
        if accept.ballot != round.ballot || !accept.ok {
            return Ok(None);
        }
        if let Phase::Propose { accepts, .. } = &mut round.phase {
            accepts.insert(from);
        }
        Ok(self.check(ctx, out))
    }

    /// The member's absent set changed: a round may now be complete, or its coordinator gone.
    pub(crate) fn on_view_change(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) -> Option<Commit> {
        if !self.engaged {
            return None;
        }
        if self.round.is_some() {
            return self.check(ctx, out);
        }
        if let Some(leader) = self.leader
            && ctx.absent.contains(&leader)
        {
            self.leader = None;
            self.progress = ctx.now;
            if ctx.ring().lowest() == Some(ctx.me()) {
                return self.start(ctx, out);
            }
        }
        None
    }

    /// Timers: resends, phase deadlines, takeover.
    pub(crate) fn on_timeout(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) -> Option<Commit> {
        let now = ctx.now;
        if self.kick && self.round.is_none() {
            self.kick = false;
            return self.start(ctx, out);
        }
        if let Some(round) = self.round.as_mut() {
            if now >= round.resend {
                round.resend = now + ctx.config.retransmit;
                resend(round, ctx, out);
            }
            if now < round.deadline {
                return None;
            }
            if let Some(commit) = self.check(ctx, out) {
                return Some(commit);
            }
            let round = self.round.take()?;
            let (votes, needed) = tally(&round, ctx);
            tracing::warn!(
                epoch = %ctx.view.epoch(), ballot = ?round.ballot, votes, needed,
                "agreement round timed out; retrying with a higher ballot"
            );
            out.events.push_back(Event::AgreementStalled {
                epoch: ctx.view.epoch(),
                ballot: round.ballot,
                votes,
                needed,
            });
            return self.start(ctx, out);
        }
        if self.engaged && now >= self.progress + self.takeover_delay(ctx) {
            tracing::info!(epoch = %ctx.view.epoch(), leader = ?self.leader, "coordinator silent; taking over");
            return self.start(ctx, out);
        }
        None
    }

    /// The next moment a timer here needs attention.
    pub(crate) fn next_deadline(&self, ctx: &Ctx<'_>) -> Option<Instant> {
        if self.kick {
            return Some(ctx.now);
        }
        if let Some(round) = &self.round {
            return Some(round.resend.min(round.deadline));
        }
        self.engaged
            .then(|| self.progress + self.takeover_delay(ctx))
    }

    fn takeover_delay(&self, ctx: &Ctx<'_>) -> Duration {
        let position = ctx.ring().position(ctx.me()).min(MAX_TAKEOVER_STAGGER);
        ctx.config.agreement_timeout + ctx.config.retransmit * position
    }

    /// Promise `ballot`: remember its coordinator and drop a lower round of our own.
    fn follow(&mut self, ballot: Ballot, now: Instant) {
        self.promised = Some(ballot);
        self.engaged = true;
        self.leader = Some(ballot.coordinator);
        self.progress = now;
        if self.round.as_ref().is_some_and(|r| r.ballot < ballot) {
            self.round = None;
        }
    }

    /// A higher ballot is under way: stop coordinating and wait for it.
    fn yield_to(&mut self, ballot: Ballot, now: Instant) {
        self.round = None;
        self.engaged = true;
        self.leader = Some(ballot.coordinator);
        self.progress = now;
    }

    /// This member's view can no longer reach a quorum (see [`crate::quorum`]): drop the
    /// round it coordinates and wait for nothing. It still answers other coordinators, and
    /// a `Prepare` engages it again as an acceptor.
    pub(crate) fn give_up(&mut self) {
        self.round = None;
        self.engaged = false;
        self.kick = false;
    }

    /// Claims a new ballot and sends `Prepare` to every present member; none when this
    /// member's view cannot reach a quorum (it would only stall, and retry, forever).
    fn start(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) -> Option<Commit> {
        if reach(ctx.view.world(), ctx.absent, ctx.config.quorum).is_err() {
            self.give_up();
            return None;
        }
        let Some(round) = self.max_round.checked_add(1) else {
            tracing::error!(epoch = %ctx.view.epoch(), "agreement rounds exhausted at this epoch");
            return None;
        };
        let ballot = Ballot {
            round,
            coordinator: ctx.me(),
        };
        self.max_round = round;
        self.engaged = true;
        self.kick = false;
        self.promised = Some(ballot);
        self.leader = Some(ctx.me());
        self.progress = ctx.now;
        let mut promises = BTreeMap::new();
        promises.insert(ctx.me(), self.accepted.clone());
        self.round = Some(Round {
            ballot,
            phase: Phase::Prepare {
                promises,
                absent: ctx.absent.clone(),
            },
            deadline: ctx.now + ctx.config.agreement_timeout,
            resend: ctx.now + ctx.config.retransmit,
        });
        tracing::debug!(at = %ctx.now, epoch = %ctx.view.epoch(), ?ballot, "agreement round started");
        for to in ctx.present_others() {
            ctx.send(out, to, Message::Prepare(Prepare { ballot }));
        }
        self.check(ctx, out)
    }

    /// Moves the coordinated round forward if its phase has the votes it needs.
    fn check(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) -> Option<Commit> {
        let round = self.round.as_mut()?;
        let world = ctx.view.world();
        let quorum = ctx.config.quorum;
        match &mut round.phase {
            Phase::Prepare { promises, absent } => {
                let complete = voted_present(
                    |r| promises.contains_key(r),
                    ctx.absent,
                    &BTreeSet::new(),
                    promises.len(),
                ) == ctx.ring().present_count();
                let majority = majority(promises.len(), world);
                let ready = match quorum {
                    Quorum::Majority => majority && (complete || ctx.now >= round.deadline),
                    Quorum::Survivors => complete,
                };
                if !ready {
                    return None;
                }
                let forced = promises
                    .values()
                    .flatten()
                    .max_by_key(|(b, _)| *b)
                    .map(|(_, p)| p.clone());
                let proposal = match forced {
                    Some(p) => p,
                    None => match fresh(ctx, absent, &self.joiners) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::error!(epoch = %ctx.view.epoch(), error = %e, "cannot plan the next epoch");
                            self.round = None;
                            return None;
                        }
                    },
                };
                let ballot = round.ballot;
                round.phase = Phase::Propose {
                    proposal: proposal.clone(),
                    accepts: BTreeSet::from([ctx.me()]),
                };
                round.deadline = ctx.now + ctx.config.agreement_timeout;
                round.resend = ctx.now + ctx.config.retransmit;
                self.accepted = Some((ballot, proposal.clone()));
                tracing::debug!(at = %ctx.now, epoch = %ctx.view.epoch(), ?ballot, removed = ?proposal.removed, "proposing");
                for to in ctx.present_others() {
                    ctx.send(
                        out,
                        to,
                        Message::Propose(Propose {
                            ballot,
                            proposal: proposal.clone(),
                        }),
                    );
                }
                self.check(ctx, out)
            }
            Phase::Propose { proposal, accepts } => {
                let ready = match quorum {
                    Quorum::Majority => majority(accepts.len(), world),
                    Quorum::Survivors => {
                        let removed: BTreeSet<Rank> = proposal.removed.iter().copied().collect();
                        let needed = ctx
                            .ring()
                            .present_count()
                            .saturating_sub(present_in(&removed, ctx.absent));
                        voted_present(|r| accepts.contains(r), ctx.absent, &removed, accepts.len())
                            >= needed
                    }
                };
                if !ready {
                    return None;
                }
                let commit = Commit {
                    ballot: round.ballot,
                    proposal: proposal.clone(),
                };
                self.round = None;
                Some(commit)
            }
        }
    }
}

/// Resends the round's current phase to present members that have not answered.
fn resend(round: &Round, ctx: &Ctx<'_>, out: &mut Outbox) {
    let ballot = round.ballot;
    match &round.phase {
        Phase::Prepare { promises, .. } => {
            for to in ctx.present_others().filter(|r| !promises.contains_key(r)) {
                ctx.send(out, to, Message::Prepare(Prepare { ballot }));
            }
        }
        Phase::Propose { proposal, accepts } => {
            for to in ctx.present_others().filter(|r| !accepts.contains(r)) {
                ctx.send(
                    out,
                    to,
                    Message::Propose(Propose {
                        ballot,
                        proposal: proposal.clone(),
                    }),
                );
            }
        }
    }
}

/// Votes received and votes needed, for the stalled event.
fn tally(round: &Round, ctx: &Ctx<'_>) -> (u32, u32) {
    let votes = match &round.phase {
        Phase::Prepare { promises, .. } => promises.len(),
        Phase::Propose { accepts, .. } => accepts.len(),
    };
    let needed = match ctx.config.quorum {
        Quorum::Majority => ctx.view.world() / 2 + 1,
        Quorum::Survivors => ctx.ring().present_count(),
    };
    (u32::try_from(votes).unwrap_or(u32::MAX), needed)
}

/// A strict majority of `world`.
fn majority(votes: usize, world: u32) -> bool {
    (votes as u64) * 2 > u64::from(world)
}

/// How many of `total` voters are present and not in `skip`. Looks the (small) absent and
/// skip sets up among the voters rather than walking the voters, so a 10 000-member round
/// stays cheap.
fn voted_present(
    is_voter: impl Fn(&Rank) -> bool,
    absent: &BTreeSet<Rank>,
    skip: &BTreeSet<Rank>,
    total: usize,
) -> u32 {
    let excluded = absent.union(skip).filter(|r| is_voter(r)).count();
    u32::try_from(total.saturating_sub(excluded)).unwrap_or(u32::MAX)
}

/// How many of `ranks` are not in `absent`.
fn present_in(ranks: &BTreeSet<Rank>, absent: &BTreeSet<Rank>) -> u32 {
    u32::try_from(ranks.difference(absent).count()).unwrap_or(u32::MAX)
}

/// A fresh proposal: remove every reported absence, append pending joiners.
fn fresh(
    ctx: &Ctx<'_>,
    absent: &BTreeSet<Rank>,
    joiners: &[PeerInfo],
) -> Result<Proposal, crate::plan::PlanError> {
    let world = ctx.view.world();
    // Absences reported in promises, and everything this coordinator learned since.
    let removed: BTreeSet<Rank> = absent
        .union(ctx.absent)
        .copied()
        .filter(|r| r.get() < world)
        .collect();
    let count = u32::try_from(joiners.len()).map_err(|_| crate::plan::PlanError::TooLarge)?;
    let plan = Plan::new(world, ctx.view.epoch(), &removed, count)?;
    let joiners = joiners
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(PeerInfo {
                rank: plan
                    .joiner_rank(i)
                    .ok_or(crate::plan::PlanError::TooLarge)?,
                ..p.clone()
            })
        })
        .collect::<Result<Vec<_>, crate::plan::PlanError>>()?;
    Ok(Proposal {
        comm: ctx.view.comm(),
        epoch: plan.epoch(),
        removed: removed.into_iter().collect(),
        joiners,
    })
}

/// A proposal must be for this communicator's next epoch and describe a valid change.
fn check_proposal(kind: Kind, proposal: &Proposal, ctx: &Ctx<'_>) -> Result<(), InputError> {
    if proposal.comm != ctx.view.comm() {
        return Err(invalid(kind, &format!("proposal for {}", proposal.comm)));
    }
    Plan::from_proposal(ctx.view.world(), ctx.view.epoch(), proposal)
        .map(|_| ())
        .map_err(|e| invalid(kind, &e.to_string()))
}

fn invalid(kind: Kind, reason: &str) -> InputError {
    InputError::Invalid {
        kind,
        reason: reason.to_owned(),
    }
}
