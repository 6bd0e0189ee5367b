//! One representative frame of every kind (and a few variants): the messages the golden
//! vectors in `protocol/vectors/` hold, reused by benches, fuzz seeds and other crates'
//! tests. Every field is set to a value whose encoding is distinguishable (no all-zero
//! fields where a byte-order mistake would hide), and strings are long enough to be stored
//! out of line as well as short enough to be stored inline.

use bytes::Bytes;

use crate::code::CloseCode;
use crate::dtype::{Collective, DType};
use crate::handshake::{ChannelBinding, JobSecret};
use crate::header::Envelope;
use crate::ids::{CommId, Epoch, OpSeq, Rank};
use crate::message::{
    Accept, Ballot, Chunk, ChunkHeader, Commit, Depart, Evidence, Heartbeat, Hello, HelloAck, Join,
    Message, Notice, OpRecord, OpState, PeerInfo, PeerState, PeerStatus, Prepare, Promise,
    Proposal, Propose, Reject, Revoke, RevokeCause, Role, StatusReply, StatusRequest, Verdict,
    Welcome, WireAddr,
};

/// The job secret the sample `Hello` and `HelloAck` proofs are computed with.
pub const SECRET: JobSecret = JobSecret::new(*b"chorus golden vector job secret!");

/// A named frame: what the encoder is given to produce one golden vector.
#[derive(Clone, PartialEq, Debug)]
pub struct Sample {
    /// The golden vector's file stem in `protocol/vectors/` (`hello`, `chunk-f32`, ...).
    pub name: &'static str,
    /// The routing fields the frame is encoded with.
    pub envelope: Envelope,
    /// The body; encoding it with a fresh encoder gives the vector's bytes exactly.
    pub message: Message,
}

/// Every sample, at least one per kind, in kind order.
pub fn all() -> Vec<Sample> {
    let env = Envelope::new(CommId(0x0123_4567_89ab_cdef), Epoch(3), Rank(2));
    let none = Envelope::new(env.comm, Epoch(0), Rank::NONE);
    let hello = hello();
    let ack_env = Envelope::new(env.comm, env.epoch, Rank(0));
    let s = |name, envelope, message| Sample {
        name,
        envelope,
        message,
    };
    vec![
        s("hello", env, Message::Hello(hello.clone())),
        s(
            "hello-ack",
            ack_env,
            Message::HelloAck(hello_ack(&hello, &ack_env)),
        ),
        s(
            "reject",
            none,
            Message::Reject(Reject::new(
                CloseCode::AUTH_FAILED,
                "peer failed to prove the job secret",
            )),
        ),
        s(
            "join",
            Envelope::new(env.comm, Epoch(0), Rank(1)),
            Message::Join(Join {
                world: 4,
                peer: peer(1),
            }),
        ),
        s(
            "join-grow",
            none,
            Message::Join(Join {
                world: 0,
                peer: PeerInfo {
                    rank: Rank::NONE,
                    ..peer(9)
                },
            }),
        ),
        s(
            "welcome",
            Envelope::new(env.comm, Epoch(0), Rank(0)),
            Message::Welcome(Welcome {
                comm: env.comm,
                epoch: Epoch(0),
                members: (0..3).map(peer).collect(),
            }),
        ),
        heartbeat(),
        s(
            "depart",
            env,
            Message::Depart(Depart::new(CloseCode::ABORTED, "aborted by user")),
        ),
        s(
            "depart-short",
            env,
            Message::Depart(Depart::new(CloseCode::NORMAL, "bye")),
        ),
        s(
            "notice",
            env,
            Message::Notice(Notice {
                origin: Rank(2),
                subject: Rank(3),
                verdict: Verdict::Dead,
                evidence: Evidence::MissedDeadline {
                    silent_ms: 2_750,
                    deadline_ms: 2_000,
                },
                hops: 1,
            }),
        ),
        s(
            "notice-departed",
            env,
            Message::Notice(Notice {
                origin: Rank(2),
                subject: Rank(1),
                verdict: Verdict::Departed,
                evidence: Evidence::Departed {
                    code: CloseCode::LEFT,
                },
                hops: 0,
            }),
        ),
        s(
            "notice-launcher",
            none,
            Message::Notice(Notice {
                origin: Rank::NONE,
                subject: Rank(3),
                verdict: Verdict::Dead,
                evidence: Evidence::LauncherWitness { status: -9 },
                hops: 0,
            }),
        ),
        s(
            "revoke",
            env,
            Message::Revoke(Revoke {
                origin: Rank(1),
                hops: 2,
                cause: Some(RevokeCause {
                    subject: Rank(3),
                    evidence: Evidence::Departed {
                        code: CloseCode::NORMAL,
                    },
                }),
            }),
        ),
        s(
            "prepare",
            env,
            Message::Prepare(Prepare { ballot: ballot() }),
        ),
        s(
            "promise",
            env,
            Message::Promise(Promise {
                ballot: ballot(),
                accepted: Some((
                    Ballot {
                        round: 1,
                        coordinator: Rank(1),
                    },
                    proposal(),
                )),
                absent: vec![Rank(3)],
            }),
        ),
        s(
            "promise-fresh",
            env,
            Message::Promise(Promise {
                ballot: ballot(),
                accepted: None,
                absent: vec![],
            }),
        ),
        s(
            "propose",
            env,
            Message::Propose(Propose {
                ballot: ballot(),
                proposal: proposal(),
            }),
        ),
        s(
            "accept",
            env,
            Message::Accept(Accept {
                ballot: ballot(),
                ok: false,
                absent: vec![Rank(1), Rank(3)],
            }),
        ),
        s(
            "commit",
            env,
            Message::Commit(Commit {
                ballot: ballot(),
                proposal: proposal(),
            }),
        ),
        s(
            "chunk",
            env,
            Message::Chunk(Chunk {
                header: ChunkHeader::new(
                    Collective::AllReduce,
                    DType::BF16,
                    OpSeq(0x0a0b),
                    5,
                    0x0001_0000,
                ),
                payload: Bytes::from_static(b"0123456789abcdef"),
            }),
        ),
        s(
            "status-request",
            none,
            Message::StatusRequest(StatusRequest {
                max_ops: 16,
                with_members: true,
            }),
        ),
        s("status-reply", env, Message::StatusReply(status_reply())),
    ]
}

/// The sample heartbeat frame (what the codec benchmark encodes and decodes).
pub fn heartbeat() -> Sample {
    Sample {
        name: "heartbeat",
        envelope: Envelope::new(CommId(0x0123_4567_89ab_cdef), Epoch(3), Rank(2)),
        message: Message::Heartbeat(Heartbeat {
            seq: 0x1122_3344_5566_7788,
            digest: 0x0f1e_2d3c_4b5a_6978,
        }),
    }
}

/// The sample with `name`, if there is one.
pub fn named(name: &str) -> Option<Sample> {
    all().into_iter().find(|s| s.name == name)
}

fn hello() -> Hello {
    let env = Envelope::new(CommId(0x0123_4567_89ab_cdef), Epoch(3), Rank(2));
    let mut h = Hello {
        version_min: 1,
        version_max: 1,
        role: Role::Member,
        nonce: *b"connector nonce: 32 random bytes",
        proof: [0; 32],
    };
    h.proof = crate::handshake::proof::hello_proof(&SECRET, &env, &h, &ChannelBinding::None);
    h
}

fn hello_ack(hello: &Hello, ack_env: &Envelope) -> HelloAck {
    let mut a = HelloAck {
        version: 1,
        nonce: *b"acceptor nonce: 32 random bytes!",
        proof: [0; 32],
    };
    a.proof =
        crate::handshake::proof::ack_proof(&SECRET, hello, ack_env, &a, &ChannelBinding::None);
    a
}

fn peer(rank: u32) -> PeerInfo {
    let octet = 10 + rank as u8;
    PeerInfo {
        rank: Rank(rank),
        host: format!("node-{rank:02}.cluster.example"),
        pid: 4000 + rank,
        control: WireAddr {
            ip: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, octet],
            port: 29500,
        },
        data: WireAddr {
            ip: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, octet],
            port: 29600 + rank as u16,
        },
        fingerprint: [octet; 32],
        caps: crate::caps::TCP | crate::caps::QUIC,
        incarnation: 0x0100 + u64::from(rank),
    }
}

fn ballot() -> Ballot {
    Ballot {
        round: 2,
        coordinator: Rank(0),
    }
}

fn proposal() -> Proposal {
    // Old members 0..4, rank 3 dead: the survivors keep their order (0, 1, 2) and one
    // joiner is admitted as rank 3.
    Proposal {
        comm: CommId(0x0123_4567_89ab_cdef),
        epoch: Epoch(4),
        removed: vec![Rank(3)],
        joiners: vec![PeerInfo {
            rank: Rank(3),
            ..peer(7)
        }],
    }
}

fn status_reply() -> StatusReply {
    StatusReply {
        rank: Rank(2),
        epoch: Epoch(3),
        world: 4,
        peers: vec![
            PeerStatus {
                rank: Rank(1),
                state: PeerState::Alive,
                last_heard_ms: 12,
                evidence: None,
            },
            PeerStatus {
                rank: Rank(3),
                state: PeerState::Suspect,
                last_heard_ms: 1_900,
                evidence: Some(Evidence::ConnectionLost {
                    code: CloseCode::DEADLINE,
                }),
            },
        ],
        ops: vec![OpRecord {
            seq: OpSeq(41),
            collective: Collective::AllReduce.code(),
            bytes: 1 << 20,
            algorithm: "ring".into(),
            state: OpState::Running,
            step: 3,
            waiting_on: Some(Rank(3)),
            age_ms: 2_000,
            elapsed_ms: 1_999,
        }],
        async_error: Some("[chorus:peer-failed] r3 missed its heartbeat deadline".into()),
        members: (0..4).map(peer).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;
    use crate::message::Kind;

    #[test]
    fn every_kind_has_a_sample_and_every_sample_is_valid() {
        let samples = all();
        for kind in Kind::ALL {
            assert!(
                samples.iter().any(|s| s.message.kind() == kind),
                "no sample of {kind}"
            );
        }
        for s in &samples {
            s.message
                .validate(&Limits::DEFAULT)
                .unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }
}
