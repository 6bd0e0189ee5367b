//! The status client (`chorus status`): asks a running job, through its token alone, what
//! every rank is doing, and names the rank the others are waiting on (seed `000_…` spent
//! hours finding it by hand).
//!
//! The flow is SPEC section 13's: a `StatusRequest { with_members }` to the bootstrap root
//! (the token's address; in `chorus run` that is the launcher) returns the first epoch's peer
//! table; then every member is asked at once for its ledger, its epoch and its flight
//! recorder. Answers come from each member's control thread, so an application that is busy
//! or stuck in a collective still answers; a process that is frozen or gone does not, and is
//! reported unreachable when the deadline passes — the query itself never hangs.
//!
//! Ranks here are the first epoch's (the numbering the launcher gave, `CHORUS_RANK`). A
//! member that has been through a shrink reports in its current numbering; every reply
//! carries its current table, and processes are matched across tables by certificate and
//! incarnation.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_protocol::message::{
    Message, OpRecord, OpState, PeerInfo, PeerState, Role, StatusReply, StatusRequest,
};
use chorus_protocol::{CloseCode, CommId, Envelope, Epoch, Rank};
use chorus_transport::{Admission, Fingerprint, Identity, Liveness, QuicEndpoint, TransportConfig};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use crate::error::{Error, ErrorKind};
use crate::runtime::socket_addr;
use crate::unique_id::UniqueId;

/// How many flight-recorder entries each member is asked for.
const MAX_OPS: u32 = 64;

/// What a job said about itself, at one moment.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobStatus {
    /// The job's communicator.
    pub comm: CommId,
    /// The bootstrap root asked (the token's address).
    pub root: SocketAddr,
    /// The world size the job was launched with.
    pub world: u32,
    /// The first epoch's peer table, from the root; empty while the ranks are still joining.
    pub members: Vec<PeerInfo>,
    /// One entry per member of `members`, in rank order.
    pub ranks: Vec<RankStatus>,
    /// How long the query took.
    pub elapsed: Duration,
}

/// One member's answer, or why there is none.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RankStatus {
    /// The member's rank in the first epoch (the launcher's numbering).
    pub rank: Rank,
    /// Its entry in the first epoch's peer table.
    pub info: PeerInfo,
    /// What it said.
    pub answer: Answer,
}

/// What asking one process gave.
#[derive(Clone, Debug)]
pub enum Answer {
    /// The member answered from its control thread.
    Replied(Box<StatusReply>),
    /// No answer by the deadline, or the connection was refused: frozen, gone, or no longer
    /// serving this communicator.
    Unreachable(String),
}

/// The rank a stalled job is waiting on, and who waits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stall {
    /// The rank at the end of the wait chains (first-epoch numbering).
    pub rank: Rank,
    /// Ranks whose in-flight operation waits, directly or through others, on `rank`.
    pub waiters: Vec<Rank>,
    /// Ranks whose in-flight operation waits on `rank` itself.
    pub direct: Vec<Rank>,
    /// Whether `rank` itself answered (false: frozen or gone).
    pub answered: bool,
    /// Whether `rank` is itself inside an operation (false: its application is elsewhere).
    pub in_operation: bool,
}

/// Asks the job `id` names for its status; every wait ends by `timeout` (members that have
/// not answered by then are [`Answer::Unreachable`]). Fails only when the root itself cannot
/// be reached or refuses, or when `timeout` lies outside [`crate::config::WAIT`]. Blocking:
/// it runs its own runtime on a helper thread, so it may be called from anywhere, an async
/// context included.
pub fn query(id: &UniqueId, timeout: Duration) -> Result<JobStatus, Error> {
    // Bounded here, before the transport adds it to an instant of its own.
    crate::config::WAIT
        .check("timeout", timeout)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("status {e}")))?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("chorus-status".into())
            .spawn_scoped(s, || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::new(ErrorKind::Internal, format!("status runtime: {e}")))?;
                rt.block_on(query_async(id, timeout))
            })
            .map_err(|e| Error::new(ErrorKind::Internal, format!("status thread: {e}")))?;
        worker
            .join()
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::Internal, "status thread panicked")))
    })
}

async fn query_async(id: &UniqueId, timeout: Duration) -> Result<JobStatus, Error> {
    let started = Instant::now();
    let deadline = started
        .checked_add(timeout)
        .ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "status timeout is too long"))?;
    let endpoint = client_endpoint(id, timeout)?;
    let root = ask(
        &endpoint,
        id.comm,
        id.root,
        id.fingerprint,
        Rank::NONE,
        deadline,
    )
    .await
    .map_err(|why| {
        Error::new(
            ErrorKind::Bootstrap,
            format!("the job's root at {} did not answer: {why}", id.root),
        )
    })?;
    let members = root.members.clone();
    let answers = ask_members(&endpoint, id.comm, &members, deadline).await;
    endpoint.close(CloseCode::NORMAL, "status done");
    let ranks = members
        .iter()
        .zip(answers)
        .map(|(info, answer)| RankStatus {
            rank: info.rank,
            info: info.clone(),
            answer,
        })
        .collect();
    Ok(JobStatus {
        comm: id.comm,
        root: id.root,
        world: root.world,
        members,
        ranks,
        elapsed: started.elapsed(),
    })
}

/// A QUIC endpoint that only connects: it admits nobody.
pub(crate) fn client_endpoint(id: &UniqueId, timeout: Duration) -> Result<QuicEndpoint, Error> {
    let transport = |what: &str, e: chorus_transport::TransportError| {
        Error::new(ErrorKind::Transport, format!("{what}: {e}"))
    };
    let identity = Identity::generate().map_err(|e| transport("status certificate", e))?;
    let refuse: Admission = Arc::new(|_, _, _, _| {
        Err((
            CloseCode::UNKNOWN_COMM,
            "a status client serves nothing".to_owned(),
        ))
    });
    let any: IpAddr = match id.root.ip() {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let config = TransportConfig {
        connect_timeout: timeout,
        handshake_timeout: timeout,
        ..TransportConfig::default()
    };
    QuicEndpoint::bind(
        SocketAddr::new(any, 0),
        &identity,
        id.secret.clone(),
        config,
        Liveness::default(),
        refuse,
    )
    .map_err(|e| transport("cannot bind a status endpoint", e))
}

/// One `StatusRequest` with the table, on a fresh `Status` stream to `addr`, expecting
/// `rank` to answer; bounded by `deadline`.
pub(crate) async fn ask(
    endpoint: &QuicEndpoint,
    comm: CommId,
    addr: SocketAddr,
    fingerprint: [u8; 32],
    rank: Rank,
    deadline: Instant,
) -> Result<StatusReply, String> {
    let exchange = async {
        let route = Envelope::new(comm, Epoch(0), Rank::NONE);
        let conn = endpoint
            .connect(addr, Fingerprint(fingerprint), Role::Status, route, rank)
            .await
            .map_err(|e| e.to_string())?;
        let ch = conn.into_control();
        let request = Message::StatusRequest(StatusRequest {
            max_ops: MAX_OPS,
            with_members: true,
        });
        let result = async {
            ch.send(request).await.map_err(|e| e.to_string())?;
            loop {
                let frame = ch.recv().await.map_err(|e| e.to_string())?;
                match frame.message {
                    Message::StatusReply(reply) => return Ok(reply),
                    Message::Reject(r) => return Err(format!("refused: {}", r.detail)),
                    _ => {}
                }
            }
        }
        .await;
        ch.close(CloseCode::NORMAL, "status read");
        result
    };
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, exchange).await {
        Ok(result) => result,
        Err(_) => Err("no answer in time (frozen, overloaded or unreachable)".to_owned()),
    }
}

/// Asks every member at once. A member that refuses under its first-epoch rank may be known
/// by another rank since a shrink: once any reply carries a newer table naming the same
/// process, it is asked again under that rank.
async fn ask_members(
    endpoint: &QuicEndpoint,
    comm: CommId,
    members: &[PeerInfo],
    deadline: Instant,
) -> Vec<Answer> {
    let mut answers: Vec<Option<Answer>> = vec![None; members.len()];
    let mut failures: BTreeMap<usize, String> = BTreeMap::new();
    let mut tried: HashSet<(usize, Rank)> = HashSet::new();
    let mut newest: Option<(Epoch, Vec<PeerInfo>)> = None;
    let mut pending = FuturesUnordered::new();
    let launch = |i: usize, rank: Rank| {
        let info = &members[i];
        let (addr, fingerprint) = (socket_addr(&info.control), info.fingerprint);
        async move {
            let result = ask(endpoint, comm, addr, fingerprint, rank, deadline).await;
            (i, result)
        }
    };
    for (i, info) in members.iter().enumerate() {
        tried.insert((i, info.rank));
        pending.push(launch(i, info.rank));
    }
    while let Some((i, result)) = pending.next().await {
        match result {
            Ok(reply) => {
                if !reply.members.is_empty()
                    && newest.as_ref().is_none_or(|(e, _)| reply.epoch > *e)
                {
                    newest = Some((reply.epoch, reply.members.clone()));
                }
                answers[i] = Some(Answer::Replied(Box::new(reply)));
            }
            Err(why) => {
                failures.insert(i, why);
            }
        }
        // Retry failures under the rank the newest table gives them, once per rank.
        if let Some((_, table)) = &newest {
            let retry: Vec<(usize, Rank)> = failures
                .keys()
                .filter_map(|&i| Some((i, find(table, &members[i])?.rank)))
                .filter(|key| !tried.contains(key))
                .collect();
            for (i, rank) in retry {
                failures.remove(&i);
                tried.insert((i, rank));
                pending.push(launch(i, rank));
            }
        }
    }
    answers
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.unwrap_or_else(|| {
                Answer::Unreachable(failures.remove(&i).unwrap_or_else(|| "not asked".into()))
            })
        })
        .collect()
}

/// The entry of `table` that is the same process as `who`.
fn find<'a>(table: &'a [PeerInfo], who: &PeerInfo) -> Option<&'a PeerInfo> {
    table
        .iter()
        .find(|p| p.fingerprint == who.fingerprint && p.incarnation == who.incarnation)
}

impl JobStatus {
    /// The reply of first-epoch rank `rank`, if it answered.
    pub fn reply(&self, rank: Rank) -> Option<&StatusReply> {
        match &self.ranks.get(rank.index())?.answer {
            Answer::Replied(r) => Some(r),
            Answer::Unreachable(_) => None,
        }
    }

    /// `rank` in `reply`'s numbering, translated to the first epoch's.
    pub fn first_rank(&self, reply: &StatusReply, rank: Rank) -> Option<Rank> {
        if reply.members.is_empty() {
            return Some(rank).filter(|r| r.index() < self.members.len());
        }
        let who = reply.members.get(rank.index())?;
        find(&self.members, who).map(|p| p.rank)
    }

    /// The oldest operation `rank` is running, if any.
    pub fn in_flight(&self, rank: Rank) -> Option<&OpRecord> {
        self.reply(rank)?
            .ops
            .iter()
            .find(|op| matches!(op.state, OpState::Running | OpState::Queued))
    }

    /// The first-epoch rank `rank`'s in-flight operation waits on.
    pub fn waits_on(&self, rank: Rank) -> Option<Rank> {
        let reply = self.reply(rank)?;
        let peer = self.in_flight(rank)?.waiting_on?;
        self.first_rank(reply, peer)
    }

    /// How the other members see `rank`: the most telling state any of them records (dead
    /// or departed over suspect over alive over joining), and the most recent time any of
    /// them heard from it. `None` when no other member answered about it.
    pub fn seen(&self, rank: Rank) -> Option<(PeerState, Option<Duration>)> {
        let mut state: Option<PeerState> = None;
        let mut heard: Option<u64> = None;
        for other in &self.ranks {
            if other.rank == rank {
                continue;
            }
            let Answer::Replied(reply) = &other.answer else {
                continue;
            };
            for peer in &reply.peers {
                if self.first_rank(reply, peer.rank) != Some(rank) {
                    continue;
                }
                state = Some(match state {
                    Some(s) if severity(s) >= severity(peer.state) => s,
                    _ => peer.state,
                });
                if peer.last_heard_ms != u64::MAX {
                    heard = Some(heard.map_or(peer.last_heard_ms, |h| h.min(peer.last_heard_ms)));
                }
            }
        }
        state.map(|s| (s, heard.map(Duration::from_millis)))
    }

    /// The rank the job is waiting on: follow each member's in-flight wait ("rank 1 waits
    /// on 0, which waits on 3, which waits on 2") to its end; the end most chains reach is
    /// the answer. A chain ends at a rank that does not answer, is not inside an operation,
    /// or waits on nobody. `None` when no member is waiting on anyone (or the waits form a
    /// cycle with no end).
    pub fn waiting_on(&self) -> Option<Stall> {
        let n = self.ranks.len();
        let mut ends: BTreeMap<Rank, Vec<Rank>> = BTreeMap::new();
        for start in &self.ranks {
            let Some(mut at) = self.waits_on(start.rank) else {
                continue;
            };
            let mut steps = 0;
            let end = loop {
                match self.waits_on(at) {
                    Some(next) if steps < n => {
                        at = next;
                        steps += 1;
                    }
                    Some(_) => break None,
                    None => break Some(at),
                }
            };
            if let Some(end) = end.filter(|e| *e != start.rank) {
                ends.entry(end).or_default().push(start.rank);
            }
        }
        // Most waiters first; on a tie, a rank that does not answer, then the lowest rank.
        let (rank, waiters) = ends.into_iter().max_by_key(|(rank, waiters)| {
            (
                waiters.len(),
                self.reply(*rank).is_none(),
                std::cmp::Reverse(*rank),
            )
        })?;
        let direct = self
            .ranks
            .iter()
            .filter(|r| self.waits_on(r.rank) == Some(rank))
            .map(|r| r.rank)
            .collect();
        Some(Stall {
            rank,
            waiters,
            direct,
            answered: self.reply(rank).is_some(),
            in_operation: self.in_flight(rank).is_some(),
        })
    }
}

/// Orders ledger states from least to most telling: a member that never heard from a peer
/// (it does not observe it) still lists it as joining, which says nothing.
fn severity(state: PeerState) -> u8 {
    match state {
        PeerState::Joining => 0,
        PeerState::Alive => 1,
        PeerState::Suspect => 2,
        PeerState::Departed => 3,
        PeerState::Dead => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::peer_info as info;
    use chorus_protocol::OpSeq;
    use chorus_protocol::message::PeerStatus;

    fn op(waiting_on: Option<u32>, state: OpState) -> OpRecord {
        OpRecord {
            seq: OpSeq(5),
            collective: chorus_protocol::Collective::AllReduce.code(),
            bytes: 8,
            algorithm: "ring".into(),
            state,
            step: 1,
            waiting_on: waiting_on.map(Rank),
            age_ms: 10,
            elapsed_ms: 10,
        }
    }

    fn reply(rank: u32, members: Vec<PeerInfo>, ops: Vec<OpRecord>) -> Answer {
        let peers = members
            .iter()
            .map(|p| PeerStatus {
                rank: p.rank,
                state: PeerState::Alive,
                last_heard_ms: 40 + u64::from(rank),
                evidence: None,
            })
            .collect();
        Answer::Replied(Box::new(StatusReply {
            rank: Rank(rank),
            epoch: Epoch(0),
            world: members.len() as u32,
            peers,
            ops,
            async_error: None,
            members,
        }))
    }

    fn job(answers: Vec<Answer>) -> JobStatus {
        let members: Vec<PeerInfo> = (0..answers.len() as u32).map(info).collect();
        JobStatus {
            comm: CommId(1),
            root: "127.0.0.1:1".parse().unwrap(),
            world: members.len() as u32,
            ranks: members
                .iter()
                .cloned()
                .zip(answers)
                .map(|(info, answer)| RankStatus {
                    rank: info.rank,
                    info,
                    answer,
                })
                .collect(),
            members,
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn a_timeout_past_any_clock_is_an_error_not_a_panic() {
        let id = UniqueId {
            comm: CommId(1),
            root: "127.0.0.1:9".parse().unwrap(),
            fingerprint: [0; 32],
            secret: chorus_protocol::JobSecret::new([0; 32]),
        };
        for timeout in [
            Duration::MAX,
            Duration::from_secs(u64::MAX / 2),
            Duration::ZERO,
        ] {
            let err = query(&id, timeout).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            assert!(err.to_string().contains("timeout"), "{err}");
        }
    }

    #[test]
    fn a_ring_stalled_on_a_frozen_rank_names_it() {
        // Ring all-reduce with rank 2 frozen: 3 waits on 2, 0 on 3, 1 on 0.
        let table: Vec<PeerInfo> = (0..4).map(info).collect();
        let j = job(vec![
            reply(0, table.clone(), vec![op(Some(3), OpState::Running)]),
            reply(1, table.clone(), vec![op(Some(0), OpState::Running)]),
            Answer::Unreachable("no answer".into()),
            reply(3, table, vec![op(Some(2), OpState::Running)]),
        ]);
        let stall = j.waiting_on().unwrap();
        assert_eq!(stall.rank, Rank(2));
        assert_eq!(stall.waiters, vec![Rank(0), Rank(1), Rank(3)]);
        assert_eq!(stall.direct, vec![Rank(3)]);
        assert!(!stall.answered);
        assert_eq!(j.seen(Rank(1)).unwrap().0, PeerState::Alive);
        assert_eq!(
            j.seen(Rank(1)).unwrap().1,
            Some(Duration::from_millis(40)),
            "the freshest word anyone has"
        );
    }

    #[test]
    fn a_rank_outside_any_operation_is_the_one_waited_on() {
        let table: Vec<PeerInfo> = (0..3).map(info).collect();
        let j = job(vec![
            reply(0, table.clone(), vec![op(Some(1), OpState::Running)]),
            reply(1, table.clone(), vec![op(None, OpState::Done)]),
            reply(2, table, vec![op(Some(1), OpState::Running)]),
        ]);
        let stall = j.waiting_on().unwrap();
        assert_eq!(stall.rank, Rank(1));
        assert!(stall.answered && !stall.in_operation);
    }

    #[test]
    fn nobody_waiting_means_no_stall() {
        let table: Vec<PeerInfo> = (0..2).map(info).collect();
        let j = job(vec![
            reply(0, table.clone(), vec![op(None, OpState::Done)]),
            reply(1, table, vec![]),
        ]);
        assert_eq!(j.waiting_on(), None);
    }

    #[test]
    fn ranks_after_a_shrink_are_translated_to_the_first_epoch() {
        // Rank 1 died; the survivors 0, 2, 3 are now 0, 1, 2. Old rank 3 (now 2) waits on
        // new rank 1, which is old rank 2.
        let first: Vec<PeerInfo> = (0..4).map(info).collect();
        let mut now: Vec<PeerInfo> = vec![first[0].clone(), first[2].clone(), first[3].clone()];
        for (i, p) in now.iter_mut().enumerate() {
            p.rank = Rank(i as u32);
        }
        let j = job(vec![
            reply(0, now.clone(), vec![]),
            Answer::Unreachable("gone".into()),
            reply(1, now.clone(), vec![op(None, OpState::Running)]),
            reply(2, now, vec![op(Some(1), OpState::Running)]),
        ]);
        assert_eq!(j.waits_on(Rank(3)), Some(Rank(2)));
        let stall = j.waiting_on().unwrap();
        assert_eq!(stall.rank, Rank(2));
        assert!(stall.in_operation);
    }
}
