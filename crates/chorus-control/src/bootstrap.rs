//! Bootstrap: the root collects one `Join` per rank and answers every joiner with the same
//! `Welcome`, the peer table of epoch 0.
//!
//! Sans-IO like the node: the runtime hands in joins with an opaque connection handle `C`
//! of its choosing (the root's own join included), then drains the frames and closes to
//! send. A join that cannot be admitted is refused at once with a `Reject` and a close
//! carrying the named code: `WORLD_MISMATCH` (different world size, or a rank outside it),
//! `DUPLICATE_RANK` (the rank is taken; the first claimant keeps it). The whole wait is
//! bounded: at the deadline every joined connection gets `Reject{DEADLINE}` naming the
//! missing ranks, and the outcome is [`BootstrapError::Timeout`]. A launcher that saw a
//! rank's process exit ends it sooner: `Reject{ABORTED}` naming the rank.
//!
//! This flat root is O(N) frames and O(N²) bytes of tables; a hierarchy of roots for very
//! large worlds is future work.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use chorus_protocol::message::{ExitStatus, Join, Message, PeerInfo, Reject, Welcome};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use thiserror::Error;

use crate::time::Instant;

/// How many missing ranks a timeout message names before it abbreviates.
const NAMED_MISSING: usize = 8;

/// The bootstrap root for one communicator.
#[derive(Debug)]
pub struct Rendezvous<C> {
    comm: CommId,
    world: u32,
    deadline: Instant,
    slots: Vec<Option<(C, PeerInfo)>>,
    joined: u32,
    outcome: Option<Result<Welcome, BootstrapError>>,
    transmits: VecDeque<(C, Message)>,
    closes: VecDeque<(C, CloseCode)>,
}

impl<C: Copy + Eq + fmt::Debug> Rendezvous<C> {
    /// A root expecting `world` ranks, giving up `timeout` after `now`.
    pub fn new(
        comm: CommId,
        world: u32,
        now: Instant,
        timeout: Duration,
    ) -> Result<Rendezvous<C>, BootstrapError> {
        if world == 0 {
            return Err(BootstrapError::EmptyWorld);
        }
        Ok(Rendezvous {
            comm,
            world,
            deadline: now + timeout,
            slots: (0..world).map(|_| None).collect(),
            joined: 0,
            outcome: None,
            transmits: VecDeque::new(),
            closes: VecDeque::new(),
        })
    }

    /// A `Join` arrived on `conn`. On refusal the `Reject` and close are already queued.
    pub fn handle_join(&mut self, now: Instant, conn: C, join: Join) -> Result<(), JoinError> {
        self.handle_timeout(now);
        let result = self.admit(conn, join);
        if let Err(e) = &result {
            tracing::warn!(?conn, error = %e, "bootstrap join refused");
            self.refuse(conn, e.code(), e.to_string());
        }
        result
    }

    /// The connection `conn` closed before bootstrap finished: its rank is free again.
    pub fn handle_closed(&mut self, conn: C) {
        if self.outcome.is_some() {
            return;
        }
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|(c, _)| *c == conn) {
                *slot = None;
                self.joined -= 1;
            }
        }
    }

    /// The launcher saw `rank`'s process exit (`status` as [`ExitStatus`] reads it) before
    /// bootstrap finished: that rank will never join, so waiting out the deadline helps
    /// nobody. Every joined connection gets `Reject{ABORTED}` naming it, and the outcome is
    /// [`BootstrapError::Exited`]. After bootstrap the launcher tells the members instead
    /// (a `LauncherWitness` notice); here it changes nothing.
    pub fn handle_exited(&mut self, rank: Rank, status: i32) {
        if self.outcome.is_some() || rank.get() >= self.world {
            return;
        }
        let error = BootstrapError::Exited {
            rank,
            status: ExitStatus(status),
        };
        tracing::error!(error = %error, "bootstrap failed");
        self.fail(CloseCode::ABORTED, error);
    }

    /// Checks the deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.outcome.is_some() || now < self.deadline {
            return;
        }
        let missing: Vec<Rank> = (0..self.world)
            .map(Rank)
            .filter(|r| self.slots[r.index()].is_none())
            .collect();
        let error = BootstrapError::Timeout {
            joined: self.joined,
            world: self.world,
            missing,
        };
        tracing::error!(error = %error, "bootstrap timed out");
        self.fail(CloseCode::DEADLINE, error);
    }

    /// Ends bootstrap with `error`: every joined connection is refused with `code`.
    fn fail(&mut self, code: CloseCode, error: BootstrapError) {
        let detail = error.to_string();
        let joined: Vec<C> = self.slots.iter().flatten().map(|(c, _)| *c).collect();
        for conn in joined {
            self.refuse(conn, code, detail.clone());
        }
        self.outcome = Some(Err(error));
    }

    /// The next frame to send, with the connection to send it on.
    pub fn poll_transmit(&mut self) -> Option<(C, Message)> {
        self.transmits.pop_front()
    }

    /// The next connection to close, with its code (after sending what was queued for it).
    pub fn poll_close(&mut self) -> Option<(C, CloseCode)> {
        self.closes.pop_front()
    }

    /// When to call [`Rendezvous::handle_timeout`]; `None` once finished.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.outcome.is_none().then_some(self.deadline)
    }

    /// The result, once every rank joined or the deadline passed.
    pub fn outcome(&self) -> Option<&Result<Welcome, BootstrapError>> {
        self.outcome.as_ref()
    }

    /// How many ranks have joined so far.
    pub fn joined(&self) -> u32 {
        self.joined
    }

    fn admit(&mut self, conn: C, join: Join) -> Result<(), JoinError> {
        match &self.outcome {
            Some(Ok(_)) => return Err(JoinError::Finished),
            Some(Err(BootstrapError::Exited { rank, status })) => {
                return Err(JoinError::Abandoned {
                    rank: *rank,
                    status: *status,
                });
            }
            Some(Err(_)) => return Err(JoinError::TimedOut),
            None => {}
        }
        if join.world != self.world {
            return Err(JoinError::WorldMismatch {
                root: self.world,
                joiner: join.world,
            });
        }
        let rank = join.peer.rank;
        if rank.get() >= self.world {
            return Err(JoinError::RankOutOfRange {
                rank,
                world: self.world,
            });
        }
        if self.slots.iter().flatten().any(|(c, _)| *c == conn) {
            return Err(JoinError::SecondJoin);
        }
        let slot = &mut self.slots[rank.index()];
        if slot.is_some() {
            return Err(JoinError::DuplicateRank { rank });
        }
        *slot = Some((conn, join.peer));
        self.joined += 1;
        if self.joined == self.world {
            self.complete();
        }
        Ok(())
    }

    fn complete(&mut self) {
        let members: Vec<PeerInfo> = self
            .slots
            .iter()
            .flatten()
            .map(|(_, p)| p.clone())
            .collect();
        let welcome = Welcome {
            comm: self.comm,
            epoch: Epoch(0),
            members,
        };
        let conns: Vec<C> = self.slots.iter().flatten().map(|(c, _)| *c).collect();
        for conn in conns {
            self.transmits
                .push_back((conn, Message::Welcome(welcome.clone())));
        }
        tracing::info!(comm = %self.comm, world = self.world, "bootstrap complete");
        self.outcome = Some(Ok(welcome));
    }

    fn refuse(&mut self, conn: C, code: CloseCode, detail: String) {
        self.transmits
            .push_back((conn, Message::Reject(Reject { code, detail })));
        self.closes.push_back((conn, code));
    }
}

/// Why one join was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum JoinError {
    #[error("world size mismatch: root expects {root}, joiner says {joiner}")]
    WorldMismatch { root: u32, joiner: u32 },
    #[error("{rank} is outside the world of {world}")]
    RankOutOfRange { rank: Rank, world: u32 },
    #[error("{rank} has already joined")]
    DuplicateRank { rank: Rank },
    #[error("this connection has already joined")]
    SecondJoin,
    #[error("bootstrap already finished")]
    Finished,
    #[error("bootstrap timed out")]
    TimedOut,
    #[error("bootstrap was abandoned: {rank}'s process ended ({status})")]
    Abandoned { rank: Rank, status: ExitStatus },
}

impl JoinError {
    /// The code the refusal carries.
    pub fn code(&self) -> CloseCode {
        match self {
            JoinError::WorldMismatch { .. } | JoinError::RankOutOfRange { .. } => {
                CloseCode::WORLD_MISMATCH
            }
            JoinError::DuplicateRank { .. } | JoinError::Finished => CloseCode::DUPLICATE_RANK,
            JoinError::SecondJoin => CloseCode::PROTOCOL_VIOLATION,
            JoinError::TimedOut => CloseCode::DEADLINE,
            JoinError::Abandoned { .. } => CloseCode::ABORTED,
        }
    }
}

/// Why bootstrap failed as a whole.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("world size is zero")]
    EmptyWorld,
    #[error("bootstrap timed out: {joined} of {world} ranks joined; missing {}", list(.missing))]
    Timeout {
        joined: u32,
        world: u32,
        missing: Vec<Rank>,
    },
    #[error("{rank}'s process ended ({status}) before every rank joined")]
    Exited { rank: Rank, status: ExitStatus },
}

fn list(ranks: &[Rank]) -> String {
    let mut s: Vec<String> = ranks
        .iter()
        .take(NAMED_MISSING)
        .map(|r| r.to_string())
        .collect();
    if ranks.len() > NAMED_MISSING {
        s.push(format!("and {} more", ranks.len() - NAMED_MISSING));
    }
    s.join(", ")
}

#[cfg(test)]
mod tests {
    use chorus_protocol::message::WireAddr;

    use super::*;

    fn join(world: u32, rank: u32) -> Join {
        Join {
            world,
            peer: PeerInfo {
                rank: Rank(rank),
                host: "h".into(),
                pid: rank,
                control: WireAddr {
                    ip: [0; 16],
                    port: 1,
                },
                data: WireAddr {
                    ip: [0; 16],
                    port: 2,
                },
                fingerprint: [rank as u8; 32],
                caps: 0,
                incarnation: 1,
            },
        }
    }

    fn secs(s: u64) -> Instant {
        Instant::from_micros(s * 1_000_000)
    }

    type Drained = (Vec<(u32, Message)>, Vec<(u32, CloseCode)>);

    fn drain(r: &mut Rendezvous<u32>) -> Drained {
        let t = std::iter::from_fn(|| r.poll_transmit()).collect();
        let c = std::iter::from_fn(|| r.poll_close()).collect();
        (t, c)
    }

    #[test]
    fn welcomes_everyone_with_the_table_in_rank_order() {
        let mut r = Rendezvous::new(CommId(9), 3, secs(0), Duration::from_secs(10)).unwrap();
        for (conn, rank) in [(10, 2), (11, 0), (12, 1)] {
            r.handle_join(secs(1), conn, join(3, rank)).unwrap();
        }
        let (sent, closes) = drain(&mut r);
        assert!(closes.is_empty());
        assert_eq!(sent.len(), 3);
        let Some(Ok(welcome)) = r.outcome() else {
            panic!("not complete")
        };
        assert_eq!(welcome.epoch, Epoch(0));
        assert!(
            welcome
                .members
                .iter()
                .enumerate()
                .all(|(i, p)| p.rank.index() == i)
        );
        assert!(
            sent.iter()
                .all(|(_, m)| matches!(m, Message::Welcome(w) if w == welcome))
        );
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn refuses_duplicates_and_world_mismatches_with_named_codes() {
        let mut r = Rendezvous::new(CommId(1), 4, secs(0), Duration::from_secs(10)).unwrap();
        r.handle_join(secs(0), 1, join(4, 0)).unwrap();
        assert_eq!(
            r.handle_join(secs(0), 2, join(4, 0)),
            Err(JoinError::DuplicateRank { rank: Rank(0) })
        );
        assert_eq!(
            r.handle_join(secs(0), 3, join(8, 1)),
            Err(JoinError::WorldMismatch { root: 4, joiner: 8 })
        );
        assert_eq!(
            r.handle_join(secs(0), 4, join(4, 4)),
            Err(JoinError::RankOutOfRange {
                rank: Rank(4),
                world: 4
            })
        );
        assert_eq!(
            r.handle_join(secs(0), 1, join(4, 1)),
            Err(JoinError::SecondJoin)
        );
        let (sent, closes) = drain(&mut r);
        assert_eq!(
            closes,
            vec![
                (2, CloseCode::DUPLICATE_RANK),
                (3, CloseCode::WORLD_MISMATCH),
                (4, CloseCode::WORLD_MISMATCH),
                (1, CloseCode::PROTOCOL_VIOLATION),
            ]
        );
        assert!(
            matches!(&sent[0].1, Message::Reject(Reject { code, detail }) if *code == CloseCode::DUPLICATE_RANK && detail.contains("r0"))
        );
        assert_eq!(r.joined(), 1, "the first claimant keeps its rank");
    }

    #[test]
    fn times_out_naming_the_missing_ranks() {
        let mut r = Rendezvous::new(CommId(1), 3, secs(0), Duration::from_secs(5)).unwrap();
        r.handle_join(secs(1), 7, join(3, 1)).unwrap();
        r.handle_timeout(secs(4));
        assert!(r.outcome().is_none());
        assert_eq!(r.poll_timeout(), Some(secs(5)));
        r.handle_timeout(secs(5));
        let Some(Err(e)) = r.outcome() else {
            panic!("expected a timeout")
        };
        assert_eq!(
            e.to_string(),
            "bootstrap timed out: 1 of 3 ranks joined; missing r0, r2"
        );
        let (sent, closes) = drain(&mut r);
        assert_eq!(closes, vec![(7, CloseCode::DEADLINE)]);
        assert!(
            matches!(&sent[0].1, Message::Reject(Reject { code, .. }) if *code == CloseCode::DEADLINE)
        );
        assert_eq!(
            r.handle_join(secs(6), 8, join(3, 0)),
            Err(JoinError::TimedOut)
        );
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn a_launcher_seen_exit_ends_bootstrap_at_once_naming_the_rank() {
        let mut r = Rendezvous::new(CommId(1), 3, secs(0), Duration::from_secs(60)).unwrap();
        r.handle_join(secs(1), 7, join(3, 0)).unwrap();
        r.handle_join(secs(1), 8, join(3, 1)).unwrap();
        // Out of range: not this job's rank; nothing changes.
        r.handle_exited(Rank(3), 1);
        assert!(r.outcome().is_none());
        r.handle_exited(Rank(2), -9);
        let Some(Err(e)) = r.outcome() else {
            panic!("expected a failure")
        };
        assert_eq!(
            e.to_string(),
            "r2's process ended (signal 9) before every rank joined"
        );
        let (sent, closes) = drain(&mut r);
        assert_eq!(
            closes,
            vec![(7, CloseCode::ABORTED), (8, CloseCode::ABORTED)]
        );
        assert!(sent.iter().all(|(_, m)| matches!(
            m,
            Message::Reject(Reject { code, detail })
                if *code == CloseCode::ABORTED && detail.contains("r2") && detail.contains("signal 9")
        )));
        // A late joiner hears why, and nothing waits for the deadline any more.
        assert_eq!(
            r.handle_join(secs(2), 9, join(3, 2)),
            Err(JoinError::Abandoned {
                rank: Rank(2),
                status: ExitStatus(-9)
            })
        );
        assert_eq!(r.poll_timeout(), None);
        // A second exit, or one after bootstrap finished, changes nothing.
        r.handle_exited(Rank(1), 0);
        assert!(matches!(
            r.outcome(),
            Some(Err(BootstrapError::Exited { rank: Rank(2), .. }))
        ));
    }

    #[test]
    fn a_rank_whose_connection_dropped_can_join_again() {
        let mut r = Rendezvous::new(CommId(1), 2, secs(0), Duration::from_secs(5)).unwrap();
        r.handle_join(secs(0), 1, join(2, 0)).unwrap();
        r.handle_closed(1);
        assert_eq!(r.joined(), 0);
        r.handle_join(secs(0), 2, join(2, 0)).unwrap();
        r.handle_join(secs(0), 3, join(2, 1)).unwrap();
        assert!(matches!(r.outcome(), Some(Ok(_))));
        assert!(Rendezvous::<u32>::new(CommId(1), 0, secs(0), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn timeout_message_abbreviates_long_lists() {
        let e = BootstrapError::Timeout {
            joined: 0,
            world: 10,
            missing: (0..10).map(Rank).collect(),
        };
        assert!(e.to_string().ends_with("r7, and 2 more"));
    }
}
