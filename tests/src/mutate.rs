//! The attack's mutation engine: first frames a stranger, or someone replaying what they
//! recorded on the wire, can put on a listener — the protocol's golden vectors and this
//! job's own `Hello`s with bytes flipped, cut short or lengthened, with a wrong
//! communicator, epoch or rank, under a wrong secret, or replayed — and, for each, what the
//! spec says the listener answers (SPEC.md sections 5.2, 7 and 14).
//!
//! The expected answer of a mutated frame comes from the protocol crate's own reference
//! decoder and acceptor run on the same bytes (the codec and handshake are checked against
//! the spec by their own golden-vector and property tests); what this adds is the check that
//! the live listener behind a real port answers exactly that. Structured cases (a valid
//! `Hello` with one thing wrong) carry the spec's code directly. Seeded: the same seed gives
//! the same sequence of attempts.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::handshake::{Acceptor, AcceptorConfig, Nonce};
use chorus_protocol::message::Role;
use chorus_protocol::{
    ChannelBinding, CloseCode, CommId, Connector, ConnectorConfig, Decoder, Envelope, Epoch,
    HEADER_LEN, JobSecret, Limits, Rank, Side,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Which kind of listening port an attempt goes to.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Port {
    /// A member's TCP data listener.
    Data,
    /// A member's QUIC control endpoint.
    Control,
    /// The bootstrap root's QUIC endpoint.
    Root,
}

impl Port {
    pub fn name(self) -> &'static str {
        match self {
            Port::Data => "tcp data",
            Port::Control => "quic control",
            Port::Root => "quic root",
        }
    }

    fn is_quic(self) -> bool {
        self != Port::Data
    }
}

/// The listener an attempt is aimed at, as the attacker knows it.
#[derive(Clone, Debug)]
pub struct Target {
    pub port: Port,
    pub comm: CommId,
    /// The communicator's current epoch.
    pub epoch: Epoch,
    pub world: u32,
    /// The listening member's rank (`None` for the root).
    pub rank: Option<Rank>,
}

/// What the listener must answer.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Expect {
    /// A `Reject` with this code, then the close (on QUIC, with the same application code).
    Refused(CloseCode),
    /// The handshake passes (a `HelloAck`), then the stream is closed with this code before
    /// anything it carries is read (a replayed `Hello` of a rank whose link is live).
    AdmittedThenClosed(CloseCode),
    /// The first frame is cut short and the attacker ends its side: the listener closes
    /// without a frame to refuse (any close, no silence).
    Closed,
    /// Datagrams that are no QUIC connection's: no connection comes of them (nothing
    /// answers, or QUIC's version negotiation does).
    Silence,
}

/// What an attempt writes.
#[derive(Clone, Debug)]
pub enum Payload {
    /// These bytes, as they are.
    Bytes(Vec<u8>),
    /// A `Hello` built on the QUIC connection, bound to its TLS session (so only what is
    /// wrong in it on purpose is wrong).
    BoundHello {
        secret: JobSecret,
        envelope: Envelope,
        role: Role,
    },
    /// Garbage datagrams at the UDP port (QUIC ports only).
    Datagrams(Vec<Vec<u8>>),
}

/// One connection's worth of attack.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The mutation's name, for the per-port report.
    pub what: &'static str,
    pub payload: Payload,
    /// End the attacker's side after writing (TCP write shutdown, QUIC stream finish).
    pub finish: bool,
    pub expect: Expect,
}

/// The seeded source of attempts; see the module docs.
pub struct Mutator {
    rng: ChaCha8Rng,
    secret: JobSecret,
    vectors: Vec<(&'static str, Vec<u8>)>,
    /// A `Hello` "recorded" per claimed rank at the current epoch: what a replay sends.
    recorded: Vec<(Epoch, Rank, Vec<u8>)>,
}

/// How long a listener takes to refuse a stream that never completes its `Hello`: the
/// transport's handshake timeout (its default).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

impl Mutator {
    /// A mutator for a job whose secret is `secret` (the attacker knows it only to record
    /// `Hello`s as a member would send them: a replay, not a forgery).
    pub fn new(seed: u64, secret: JobSecret) -> Mutator {
        Mutator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            secret,
            vectors: golden_vectors(),
            recorded: Vec::new(),
        }
    }

    /// The next attempt against `target`.
    pub fn next(&mut self, target: &Target) -> Attempt {
        let pick = self.rng.random_range(0..100u32);
        match pick {
            0..30 => self.mutated_vector(target),
            30..55 => self.mutated_hello(target),
            55..90 => self.structured(target),
            90..95 if target.port.is_quic() => self.datagrams(),
            _ => {
                let len = self.rng.random_range(1..600);
                let bytes: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
                self.oracle("garbage", bytes, true, target)
            }
        }
    }

    fn mutated_vector(&mut self, target: &Target) -> Attempt {
        let i = self.rng.random_range(0..self.vectors.len());
        let bytes = self.vectors[i].1.clone();
        self.mutate(bytes, target, "golden vector")
    }

    fn mutated_hello(&mut self, target: &Target) -> Attempt {
        let rank = self.claimed_rank(target);
        let bytes = self.hello(self.envelope(target, target.epoch, rank), role_for(target));
        self.mutate(bytes, target, "job hello")
    }

    /// Flips, truncates or lengthens `bytes` (or sends them as they are) and asks the
    /// reference decoder and acceptor what the answer is.
    fn mutate(&mut self, mut bytes: Vec<u8>, target: &Target, from: &str) -> Attempt {
        let what = match self.rng.random_range(0..5u32) {
            0 => {
                let at = self.rng.random_range(0..HEADER_LEN.min(bytes.len()));
                bytes[at] ^= 1 << self.rng.random_range(0..8);
                "header bit flipped"
            }
            1 => {
                for _ in 0..self.rng.random_range(1..8) {
                    let at = self.rng.random_range(0..bytes.len());
                    bytes[at] = self.rng.random();
                }
                "bytes replaced"
            }
            2 => {
                let keep = self.rng.random_range(0..bytes.len());
                bytes.truncate(keep);
                "truncated"
            }
            3 => {
                // The header claims more body, and more bytes follow.
                let extra: u32 = self.rng.random_range(1..5000);
                let len = u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
                bytes[28..32].copy_from_slice(&len.saturating_add(extra).to_le_bytes());
                let n = (extra as usize).min(2048);
                bytes.extend((0..n).map(|_| self.rng.random::<u8>()));
                "lengthened"
            }
            _ => "as recorded",
        };
        let what = leak(format!("{from}, {what}"));
        // A frame cut short is either ended (the listener sees the end of the stream) or left
        // hanging (the listener's handshake deadline refuses it).
        let finish = self.rng.random_bool(0.5);
        self.oracle(what, bytes, finish, target)
    }

    /// A `Hello` with exactly one thing wrong, and the spec's code for it.
    fn structured(&mut self, target: &Target) -> Attempt {
        let role = role_for(target);
        let rank = self.claimed_rank(target);
        let env = self.envelope(target, target.epoch, rank);
        let stranger = JobSecret::new(self.rng.random());
        let other_comm = CommId(target.comm.get() ^ self.rng.random_range(1..u64::MAX));
        let ahead = Epoch(target.epoch.get() + self.rng.random_range(1..1000));
        let pick = self.rng.random_range(0..6u32);
        let (what, secret, envelope, role, expect) = match pick {
            0 => (
                "wrong secret",
                stranger,
                env,
                role,
                Expect::Refused(CloseCode::AUTH_FAILED),
            ),
            1 => (
                "wrong communicator",
                self.secret.clone(),
                Envelope::new(other_comm, env.epoch, env.sender),
                role,
                Expect::Refused(CloseCode::UNKNOWN_COMM),
            ),
            2 if target.port != Port::Root => (
                "epoch ahead",
                self.secret.clone(),
                Envelope::new(env.comm, ahead, env.sender),
                role,
                Expect::Refused(CloseCode::UNKNOWN_COMM),
            ),
            3 => (
                "role not served here",
                self.secret.clone(),
                env,
                match target.port {
                    Port::Data => Role::Member,
                    Port::Control | Port::Root => Role::Data,
                },
                Expect::Refused(CloseCode::PROTOCOL_VIOLATION),
            ),
            _ => return self.replay(target),
        };
        if target.port.is_quic() {
            return Attempt {
                what,
                payload: Payload::BoundHello {
                    secret,
                    envelope,
                    role,
                },
                finish: false,
                expect,
            };
        }
        let (bytes, _) = hello_bytes(&secret, envelope, role, ChannelBinding::None);
        Attempt {
            what,
            payload: Payload::Bytes(bytes),
            finish: false,
            expect,
        }
    }

    /// A `Hello` recorded earlier, sent again. On QUIC it is bound to the TLS session it
    /// was recorded on, so it fails authentication; on TCP it authenticates (nothing to
    /// bind to), and the rank it claims holds a live link (or is the listener's own), so the
    /// stream is closed with `duplicate-rank` before anything it carries is read.
    fn replay(&mut self, target: &Target) -> Attempt {
        let rank = self.claimed_rank(target);
        let env = self.envelope(target, target.epoch, rank);
        let role = role_for(target);
        let bytes = match self
            .recorded
            .iter()
            .find(|(e, r, _)| *e == target.epoch && *r == rank)
        {
            Some((_, _, b)) => b.clone(),
            None => {
                let binding = if target.port.is_quic() {
                    // Recorded on some other TLS session.
                    ChannelBinding::Tls(self.rng.random())
                } else {
                    ChannelBinding::None
                };
                let (b, _) = hello_bytes(&self.secret, env, role, binding);
                if !target.port.is_quic() {
                    self.recorded.push((target.epoch, rank, b.clone()));
                }
                b
            }
        };
        let expect = match target.port {
            Port::Data => Expect::AdmittedThenClosed(CloseCode::DUPLICATE_RANK),
            Port::Control | Port::Root => Expect::Refused(CloseCode::AUTH_FAILED),
        };
        Attempt {
            what: "replayed hello",
            payload: Payload::Bytes(bytes),
            finish: false,
            expect,
        }
    }

    fn datagrams(&mut self) -> Attempt {
        let n = self.rng.random_range(1..40);
        let grams = (0..n)
            .map(|_| {
                let len = self.rng.random_range(1..1300);
                (0..len).map(|_| self.rng.random::<u8>()).collect()
            })
            .collect();
        Attempt {
            what: "garbage datagrams",
            payload: Payload::Datagrams(grams),
            finish: true,
            expect: Expect::Silence,
        }
    }

    /// A rank a member of this job could claim towards `target`: any rank on a member's
    /// port (its own included), the unranked joiner's on the root's.
    fn claimed_rank(&mut self, target: &Target) -> Rank {
        match target.port {
            Port::Root => Rank::NONE,
            Port::Data | Port::Control => Rank(self.rng.random_range(0..target.world)),
        }
    }

    fn envelope(&self, target: &Target, epoch: Epoch, rank: Rank) -> Envelope {
        let epoch = if target.port == Port::Root {
            Epoch(0)
        } else {
            epoch
        };
        Envelope::new(target.comm, epoch, rank)
    }

    fn hello(&self, envelope: Envelope, role: Role) -> Vec<u8> {
        hello_bytes(&self.secret, envelope, role, ChannelBinding::None).0
    }

    /// What the listener must answer to `bytes` as its first bytes, by the reference
    /// decoder and acceptor (QUIC: bound to a session these bytes were never bound to).
    fn oracle(
        &mut self,
        what: &'static str,
        bytes: Vec<u8>,
        finish: bool,
        target: &Target,
    ) -> Attempt {
        let expect = first_frame_answer(&bytes, finish, &self.secret, target, self.rng.random());
        Attempt {
            what,
            payload: Payload::Bytes(bytes),
            finish,
            expect,
        }
    }
}

/// The answer the spec gives to `bytes` as a stream's first bytes (see [`Mutator`]).
pub fn first_frame_answer(
    bytes: &[u8],
    finish: bool,
    secret: &JobSecret,
    target: &Target,
    session: [u8; 32],
) -> Expect {
    let mut decoder = Decoder::new(Side::Acceptor, Limits::DEFAULT);
    decoder.push(bytes);
    let frame = match decoder.next() {
        Err(e) => return Expect::Refused(e.code()),
        Ok(None) if finish => return Expect::Closed,
        Ok(None) => return Expect::Refused(CloseCode::DEADLINE),
        Ok(Some(frame)) => frame,
    };
    let mut config = AcceptorConfig::new(
        secret.clone(),
        Nonce([0; 32]),
        Instant::now() + HANDSHAKE_TIMEOUT,
    );
    if target.port.is_quic() {
        config.binding = ChannelBinding::Tls(session);
    }
    let mut out = BytesMut::new();
    let hello = match Acceptor::new(config).handle(&frame, &mut out) {
        Err(e) => return Expect::Refused(e.code()),
        Ok(hello) => hello,
    };
    // Only a TCP `Hello` (nothing to bind to) authenticates here: the listener's policy.
    if hello.comm != target.comm {
        return Expect::Refused(CloseCode::UNKNOWN_COMM);
    }
    if hello.role != Role::Data {
        return Expect::Refused(CloseCode::PROTOCOL_VIOLATION);
    }
    if hello.epoch > target.epoch {
        return Expect::Refused(CloseCode::UNKNOWN_COMM);
    }
    if hello.epoch < target.epoch {
        return Expect::Refused(CloseCode::STALE_EPOCH);
    }
    Expect::AdmittedThenClosed(CloseCode::DUPLICATE_RANK)
}

fn role_for(target: &Target) -> Role {
    match target.port {
        Port::Data => Role::Data,
        Port::Control => Role::Member,
        Port::Root => Role::Bootstrap,
    }
}

/// The bytes of a `Hello` from `envelope` in `role` under `secret`, bound to `binding`.
pub fn hello_bytes(
    secret: &JobSecret,
    envelope: Envelope,
    role: Role,
    binding: ChannelBinding,
) -> (Vec<u8>, Option<Connector>) {
    let mut config = ConnectorConfig::new(
        secret.clone(),
        envelope,
        role,
        chorus_transport::fresh::nonce(),
        Instant::now() + HANDSHAKE_TIMEOUT,
    );
    config.binding = binding;
    let mut out = BytesMut::new();
    let connector = Connector::new(config, &mut out).ok();
    (out.to_vec(), connector)
}

/// The mutation names are few and fixed; leaking each distinct one once keeps `Attempt`
/// `'static` for the report's keys.
fn leak(name: String) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| Mutex::new(HashSet::new()));
    let mut names = match names.lock() {
        Ok(n) => n,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(n) = names.get(name.as_str()) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// The protocol's golden vectors (`protocol/vectors/*.hex`), compiled in.
fn golden_vectors() -> Vec<(&'static str, Vec<u8>)> {
    macro_rules! vectors {
        ($($name:literal),* $(,)?) => {
            vec![$(($name, include_str!(concat!("../../protocol/vectors/", $name, ".hex")))),*]
        };
    }
    let files: Vec<(&str, &str)> = vectors![
        "accept",
        "chunk",
        "commit",
        "depart-short",
        "depart",
        "heartbeat",
        "hello-ack",
        "hello",
        "join-grow",
        "join",
        "notice-departed",
        "notice-launcher",
        "notice",
        "prepare",
        "promise-fresh",
        "promise",
        "propose",
        "reject",
        "revoke",
        "status-reply",
        "status-request",
        "welcome",
    ];
    files
        .into_iter()
        .filter_map(|(name, text)| {
            let hex: String = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .flat_map(|l| l.split_whitespace())
                .collect();
            hex::decode(hex).ok().map(|b| (name, b))
        })
        .filter(|(_, b)| b.len() >= HEADER_LEN)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(port: Port) -> Target {
        Target {
            port,
            comm: CommId(77),
            epoch: Epoch(0),
            world: 4,
            rank: Some(Rank(1)),
        }
    }

    #[test]
    fn every_golden_vector_is_compiled_in() {
        assert_eq!(golden_vectors().len(), 22);
    }

    #[test]
    fn the_oracle_follows_the_spec_on_known_first_frames() {
        let secret = JobSecret::new([3; 32]);
        let t = target(Port::Data);
        let env = Envelope::new(CommId(77), Epoch(0), Rank(2));
        let (hello, _) = hello_bytes(&secret, env, Role::Data, ChannelBinding::None);
        let answer = |b: &[u8], finish| first_frame_answer(b, finish, &secret, &t, [0; 32]);
        assert_eq!(
            answer(&hello, false),
            Expect::AdmittedThenClosed(CloseCode::DUPLICATE_RANK)
        );
        let mut magic = hello.clone();
        magic[0] = b'X';
        assert_eq!(
            answer(&magic, false),
            Expect::Refused(CloseCode::PROTOCOL_VIOLATION)
        );
        let mut version = hello.clone();
        version[4] = 7;
        assert_eq!(
            answer(&version, false),
            Expect::Refused(CloseCode::VERSION_MISMATCH)
        );
        assert_eq!(answer(&hello[..50], true), Expect::Closed);
        assert_eq!(
            answer(&hello[..50], false),
            Expect::Refused(CloseCode::DEADLINE)
        );
        let mut proof = hello.clone();
        let last = proof.len() - 1;
        proof[last] ^= 1;
        assert_eq!(
            answer(&proof, false),
            Expect::Refused(CloseCode::AUTH_FAILED)
        );
        // The same bytes at a QUIC port are bound to no session: authentication fails.
        let q = target(Port::Control);
        assert_eq!(
            first_frame_answer(&hello, false, &secret, &q, [9; 32]),
            Expect::Refused(CloseCode::AUTH_FAILED)
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_attempts() {
        let secret = JobSecret::new([5; 32]);
        let names = |seed| {
            let mut m = Mutator::new(seed, secret.clone());
            (0..200)
                .map(|i| {
                    let port = [Port::Data, Port::Control, Port::Root][i % 3];
                    let a = m.next(&target(port));
                    (a.what, a.expect)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(names(11), names(11));
        assert_ne!(names(11), names(12));
    }
}
