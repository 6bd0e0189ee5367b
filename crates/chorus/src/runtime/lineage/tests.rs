//! The lineage's policy without sockets, threads or a clock: inputs in, actions out.

use std::collections::HashSet;
use std::time::Duration;

use chorus_control::{Input, Instant};
use chorus_engine::context::AbortReason;
use chorus_protocol::message::{Evidence, PeerInfo, Welcome};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::sync::oneshot;

use super::aborts::Scope;
use super::action::Action;
use super::departure::Departure;
use super::joiners::Joiners;
use super::policy::{Me, Policy};
use super::waiters::{PendingAgreement, PendingAgreements};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::runtime::mailbox::NextEpoch;
use crate::testkit::peer_info as peer;

const COMM: CommId = CommId(7);

fn welcome(world: u32) -> Welcome {
    Welcome {
        comm: COMM,
        epoch: Epoch(0),
        members: (0..world).map(peer).collect(),
    }
}

fn at(ms: u64) -> Instant {
    Instant::from_micros(ms * 1000)
}

/// The policy of `rank` in a world of `world`, at time zero.
fn policy(world: u32, rank: u32) -> Policy {
    let me = Me {
        fingerprint: peer(rank).fingerprint,
        incarnation: peer(rank).incarnation,
    };
    Policy::new(&Config::default(), &welcome(world), Rank(rank), me, at(0)).expect("a policy")
}

/// Every action the policy has for the task now (no link carries a departure).
fn actions(p: &mut Policy) -> Vec<Action> {
    actions_with_links(p, None)
}

fn actions_with_links(p: &mut Policy, departed: Option<Rank>) -> Vec<Action> {
    std::iter::from_fn(|| p.poll_action(|_| departed)).collect()
}

fn recorded(actions: &[Action]) -> Vec<&Error> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn aborts(actions: &[Action]) -> Vec<(Scope, &AbortReason)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Abort { scope, reason } => Some((*scope, reason)),
            _ => None,
        })
        .collect()
}

fn answers(actions: Vec<Action>) -> Vec<Result<NextEpoch, Error>> {
    actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Answer { result, .. } => Some(result),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lost_control_stream_aborts_the_epoch_records_the_failure_and_evicts_the_links() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.handle(
        at(1),
        Input::ConnectionLost {
            peer: Rank(1),
            epoch: Epoch(0),
            code: CloseCode::INTERNAL,
        },
    );
    let done = actions(&mut p);
    let errors = recorded(&done);
    assert_eq!(errors.len(), 1, "one failure recorded");
    assert_eq!(errors[0].kind, ErrorKind::PeerFailed);
    assert_eq!(errors[0].peer, Some(1));
    let aborts = aborts(&done);
    assert_eq!(aborts.len(), 1);
    assert_eq!(aborts[0].0, Scope::Epoch(Epoch(0)));
    assert!(matches!(
        aborts[0].1,
        AbortReason::PeerFailed { rank: Rank(1), .. }
    ));
    assert!(done.iter().any(|a| matches!(
        a,
        Action::CancelLinks {
            epoch: Epoch(0),
            peer: Rank(1),
            code: CloseCode::EVICTED
        }
    )));
    // The epoch cannot run operations any more; a new epoch attached now is born aborted.
    assert!(p.absence(at(2), false).is_some());
}

#[test]
fn a_graceful_departure_aborts_only_the_links_being_built() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.handle(
        at(1),
        Input::ConnectionClosed {
            peer: Rank(2),
            epoch: Epoch(0),
            code: CloseCode::NORMAL,
        },
    );
    let done = actions(&mut p);
    assert!(recorded(&done).is_empty(), "a graceful leave is no failure");
    let aborts = aborts(&done);
    assert_eq!(aborts.len(), 1);
    assert_eq!(aborts[0].0, Scope::Building(Epoch(0)));
    // The departed peer's lost data link is expected, not evidence.
    p.data_lost(at(2), Rank(2), Epoch(0));
    assert!(actions(&mut p).is_empty());
    // Running operations go on; a build (any leave) does not.
    assert!(p.absence(at(3), false).is_none());
    assert!(p.absence(at(3), true).is_some());
}

#[test]
fn an_aborting_peer_is_a_failure_named_by_its_code() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.handle(
        at(1),
        Input::ConnectionClosed {
            peer: Rank(1),
            epoch: Epoch(0),
            code: CloseCode::ABORTED,
        },
    );
    let done = actions(&mut p);
    let errors = recorded(&done);
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].kind,
        crate::error::kind_of_close(CloseCode::ABORTED)
    );
    assert_eq!(
        errors[0].evidence,
        Some(Evidence::Departed {
            code: CloseCode::ABORTED
        })
    );
    assert_eq!(aborts(&done)[0].0, Scope::Epoch(Epoch(0)));
}

#[test]
fn a_graceful_departure_on_a_data_link_revokes_the_epoch_naming_the_leaver() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.data_departed(at(1), Rank(2), Epoch(0), CloseCode::NORMAL);
    let done = actions(&mut p);
    let errors = recorded(&done);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, ErrorKind::PeerDeparted);
    assert_eq!(errors[0].peer, Some(2));
    assert_eq!(aborts(&done)[0].0, Scope::Epoch(Epoch(0)));
    // The other members hear of the revoke.
    assert!(std::iter::from_fn(|| p.poll_transmit()).count() > 0);
}

/// A data link the peer gave up before use (`deadline`, SPEC 6: a member whose build of an
/// epoch's links failed) is a live peer's refusal: nothing recorded, nothing aborted, the
/// peer still counted present for the next agreement. The same link lost without a word
/// is evidence that the peer died.
#[test]
fn a_data_link_given_up_by_a_live_peer_is_not_evidence() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.data_departed(at(1), Rank(2), Epoch(0), CloseCode::DEADLINE);
    let done = actions(&mut p);
    assert!(recorded(&done).is_empty(), "{:?}", recorded(&done));
    assert!(aborts(&done).is_empty());
    assert!(p.absence(at(2), true).is_none(), "the peer was counted out");

    p.data_lost(at(3), Rank(2), Epoch(0));
    let done = actions(&mut p);
    assert_eq!(recorded(&done)[0].kind, ErrorKind::PeerFailed);
    assert!(p.absence(at(4), false).is_some());
}

#[test]
fn a_revoke_without_a_cause_names_a_departure_seen_on_the_links_or_is_a_revoke() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.revoke(at(1));
    let done = actions_with_links(&mut p, Some(Rank(1)));
    let errors = recorded(&done);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].kind, ErrorKind::PeerDeparted);
    assert_eq!(errors[0].peer, Some(1));

    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    p.revoke(at(1));
    let done = actions(&mut p);
    assert_eq!(recorded(&done)[0].kind, ErrorKind::Revoked);
    assert!(matches!(
        aborts(&done)[0].1,
        AbortReason::Revoked {
            origin: Some(Rank(0))
        }
    ));
}

#[test]
fn a_shrink_waits_for_its_agreement_until_the_deadline() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    let (reply, _rx) = oneshot::channel();
    let agree = Config::default().agree_timeout;
    p.shrink(at(0), Epoch(0), at(0) + agree, reply);
    p.expire(at(0) + agree - Duration::from_micros(1));
    assert!(
        answers(actions(&mut p)).is_empty(),
        "not before the deadline"
    );
    p.expire(at(0) + agree);
    let answers = answers(actions(&mut p));
    assert_eq!(answers.len(), 1);
    let error = answers[0].as_ref().expect_err("a timeout");
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(error.detail.contains("shrink agreement"), "{error}");
}

#[test]
fn a_member_cut_off_from_a_majority_fails_its_shrink_at_once_with_no_quorum() {
    // Rank 3 of 4 has lost rank 1, then rank 2: 2 of 4 live, a majority needs 3.
    let mut p = policy(4, 3);
    p.data_lost(at(1), Rank(1), Epoch(0));
    let _ = actions(&mut p);
    let (reply, _rx) = oneshot::channel();
    p.shrink(at(2), Epoch(0), at(30_002), reply);
    assert!(answers(actions(&mut p)).is_empty(), "3 of 4 live can agree");
    p.data_lost(at(3), Rank(2), Epoch(0));
    let first = answers(actions(&mut p));
    assert_eq!(first.len(), 1, "answered at the loss, not at the deadline");
    let error = first[0].as_ref().expect_err("no quorum");
    assert_eq!(error.kind, ErrorKind::NoQuorum);
    assert!(!error.is_recoverable_by_shrink());
    assert!(
        error
            .detail
            .contains("(r1 r2), 2 live; quorum majority needs 3 of 4"),
        "{error}"
    );
    // Asking again is answered at once too, and the node coordinated no round it could
    // not win.
    let (reply, _rx) = oneshot::channel();
    p.shrink(at(4), Epoch(0), at(30_004), reply);
    let again = answers(actions(&mut p));
    assert_eq!(again.len(), 1);
    let error = again[0].as_ref().expect_err("no quorum again");
    assert_eq!(error.kind, ErrorKind::NoQuorum);
    assert_eq!(p.node().epoch(), Epoch(0));
}

#[test]
fn a_member_that_left_refuses_shrink_and_grow_at_once() {
    let mut p = policy(3, 1);
    let _ = actions(&mut p);
    assert!(p.depart(at(1), CloseCode::NORMAL, "bye"));
    let (reply, _rx) = oneshot::channel();
    p.shrink(at(2), Epoch(0), at(3), reply);
    let (reply, _rx) = oneshot::channel();
    p.grow(at(2), Epoch(0), 1, at(3), reply);
    let answers = answers(actions(&mut p));
    assert_eq!(answers.len(), 2);
    for a in answers {
        assert_eq!(a.expect_err("refused").kind, ErrorKind::Destroyed);
    }
}

#[test]
fn a_departure_is_begun_once_and_waits_for_streams_being_opened() {
    let mut p = policy(3, 0);
    let _ = actions(&mut p);
    assert!(p.depart(at(1), CloseCode::NORMAL, "bye"));
    p.departing(at(1), CloseCode::NORMAL, "bye".into(), false);
    assert!(
        !p.depart(at(1), CloseCode::NORMAL, "again"),
        "already leaving"
    );
    let opening = [(Epoch(0), Rank(1))];
    assert!(
        !p.departed(at(2), opening.iter()),
        "a stream to a member is being opened"
    );
    p.delivered();
    assert!(
        p.departed(at(2), opening.iter()),
        "delivered: the members spread it"
    );
    assert!(p.departure().is_none());
}

#[test]
fn a_departure_settles_when_nothing_present_is_being_opened_or_time_is_up() {
    let d = Departure {
        code: CloseCode::NORMAL,
        detail: String::new(),
        until: at(100),
        absent: HashSet::from([(Epoch(1), Rank(2))]),
        delivered: false,
    };
    let opening = [(Epoch(1), Rank(1))];
    assert!(!d.settled(at(10), Epoch(1), opening.iter()));
    assert!(d.settled(at(100), Epoch(1), opening.iter()), "time is up");
    assert!(
        d.settled(at(10), Epoch(2), opening.iter()),
        "older epochs' streams are moot"
    );
    let absent = [(Epoch(1), Rank(2))];
    assert!(
        d.settled(at(10), Epoch(1), absent.iter()),
        "nobody waits to tell the absent"
    );
    assert!(d.settled(at(10), Epoch(1), [].iter()));
}

fn next(previous: u64, joiners: usize) -> NextEpoch {
    // An agreement as the node reports it: shrink 3 → 2 (or grow with `joiners`).
    let absent = std::collections::BTreeSet::from([Rank(2)]);
    let plan =
        chorus_control::Plan::new(3, Epoch(previous), &absent, joiners as u32).expect("a plan");
    let joiners: Vec<PeerInfo> = (0..joiners as u32).map(|i| peer(2 + i)).collect();
    let table = plan
        .apply(&welcome(3).members, &joiners)
        .expect("the plan fits");
    NextEpoch {
        agreed: chorus_control::Agreed {
            comm: COMM,
            previous: Epoch(previous),
            rank: Rank(0),
            plan,
            joiners,
            ballot: chorus_protocol::message::Ballot {
                round: 0,
                coordinator: Rank(0),
            },
        },
        table,
    }
}

#[test]
fn an_agreement_answers_the_waiters_it_satisfies_and_keeps_the_others() {
    let mut waiters = PendingAgreements::default();
    let mut rxs = Vec::new();
    for (after, grow) in [(0, false), (0, true), (1, false)] {
        let (reply, rx) = oneshot::channel();
        rxs.push(rx);
        waiters.push(PendingAgreement {
            after: Epoch(after),
            grow,
            deadline: at(1000),
            reply,
        });
    }
    let shrunk = next(0, 0);
    let answered = waiters.answered(&shrunk);
    assert_eq!(answered.len(), 1, "only the shrink past epoch 0");
    assert!(!answered[0].grow && answered[0].after == Epoch(0));
    assert_eq!(waiters.len(), 2);
    let grown = next(0, 1);
    let answered = waiters.answered(&grown);
    assert_eq!(
        answered.len(),
        1,
        "the grow; the shrink past epoch 1 still waits"
    );
    assert!(answered[0].grow);
    assert!(waiters.expired(at(999)).is_empty());
    assert_eq!(waiters.expired(at(1000)).len(), 1);
    assert_eq!(waiters.len(), 0);
}

#[test]
fn the_grow_coordinator_proposes_once_as_many_joiners_as_wanted_have_asked() {
    let mut joiners = Joiners::default();
    joiners.asked(peer(5), 1);
    assert!(joiners.proposal().is_none(), "no grow wanted yet");
    joiners.want(2);
    assert!(joiners.proposal().is_none(), "one joiner of two");
    // A repeat of an incarnation replaces the earlier request.
    joiners.asked(peer(5), 3);
    assert!(joiners.proposal().is_none());
    joiners.asked(peer(6), 4);
    let proposed = joiners.proposal().expect("two joiners asked");
    assert_eq!(proposed, vec![peer(5), peer(6)]);
    assert!(joiners.proposal().is_none(), "proposed once");
    assert_eq!(joiners.admitted(&[peer(6)]), vec![4]);
    assert!(joiners.proposal().is_none(), "the admission starts over");
}

#[test]
fn a_grow_on_rank_zero_waits_for_its_joiners() {
    let mut p = policy(2, 0);
    let _ = actions(&mut p);
    let (reply, _rx) = oneshot::channel();
    p.grow(at(1), Epoch(0), 1, at(30_000), reply);
    assert!(answers(actions(&mut p)).is_empty());
    let mut joiner = peer(9);
    joiner.rank = Rank::NONE;
    p.join(
        at(2),
        chorus_protocol::message::Join {
            world: 0,
            peer: joiner,
        },
        42,
    );
    // The node proposes the admission to the members.
    assert!(std::iter::from_fn(|| p.poll_transmit()).count() > 0);
    assert!(
        answers(actions(&mut p)).is_empty(),
        "answered by the agreement only"
    );
}

#[test]
fn routes_name_this_members_rank_and_the_peers_entry() {
    let p = policy(3, 1);
    let route = p.route(Epoch(0), Rank(2)).expect("a route");
    assert_eq!(
        (route.comm, route.me, route.peer.rank),
        (COMM, Rank(1), Rank(2))
    );
    assert!(p.route(Epoch(0), Rank(3)).is_none(), "no such member");
    assert!(p.route(Epoch(5), Rank(2)).is_none(), "no such epoch");
    assert_eq!(p.health(at(1)).len(), 3);
}
