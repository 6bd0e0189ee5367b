//! Property tests of the codec: every kind round-trips; no input makes the decoder panic;
//! any slicing of a valid stream decodes exactly like the whole stream; and whatever the
//! decoder accepts is the canonical encoding of what it returns.

// Test code: a failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use chorus_protocol::message::{
    Accept, Ballot, Chunk, ChunkHeader, Commit, Depart, Evidence, Heartbeat, Hello, HelloAck, Join,
    Notice, OpRecord, OpState, PeerInfo, PeerState, PeerStatus, Prepare, Promise, Proposal,
    Propose, Reject, Revoke, RevokeCause, Role, StatusReply, StatusRequest, Verdict, Welcome,
    WireAddr,
};
use chorus_protocol::{
    CloseCode, Collective, CommId, DType, DecodeError, Decoder, Encoder, Envelope, Epoch, Frame,
    Gate, HEADER_LEN, Kind, Limits, Message, OpSeq, Rank, Side,
};
use proptest::collection::{btree_set, vec};
use proptest::option;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Strategies for valid messages

fn rank() -> impl Strategy<Value = Rank> {
    (0u32..100_000).prop_map(Rank)
}

fn code() -> impl Strategy<Value = CloseCode> {
    any::<u16>().prop_map(CloseCode)
}

/// Up to `max` bytes of text, sometimes inline-short, sometimes long, sometimes non-ASCII.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,8}",
        "[a-z0-9:. -]{0,64}",
        "\\PC{0,40}",
        vec(any::<char>(), 0..max / 4).prop_map(|c| c.into_iter().collect()),
    ]
    .prop_map(move |s: String| {
        let mut s = s;
        while s.len() > max {
            s.pop();
        }
        s
    })
}

fn addr() -> impl Strategy<Value = WireAddr> {
    (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| WireAddr { ip, port })
}

fn peer(rank: Rank) -> impl Strategy<Value = PeerInfo> {
    (
        text(255),
        any::<u32>(),
        addr(),
        addr(),
        any::<[u8; 32]>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            move |(host, pid, control, data, fingerprint, caps, incarnation)| PeerInfo {
                rank,
                host,
                pid,
                control,
                data,
                fingerprint,
                caps,
                incarnation,
            },
        )
}

fn table() -> impl Strategy<Value = Vec<PeerInfo>> {
    (1usize..6).prop_flat_map(|n| (0..n as u32).map(|r| peer(Rank(r))).collect::<Vec<_>>())
}

fn ranks() -> impl Strategy<Value = Vec<Rank>> {
    btree_set(0u32..10_000, 0..8).prop_map(|s| s.into_iter().map(Rank).collect())
}

fn ballot() -> impl Strategy<Value = Ballot> {
    (any::<u32>(), rank()).prop_map(|(round, coordinator)| Ballot { round, coordinator })
}

fn proposal() -> impl Strategy<Value = Proposal> {
    (any::<u64>(), any::<u64>(), ranks(), table(), 0u32..1000).prop_map(
        |(c, e, removed, table, first)| Proposal {
            comm: CommId(c),
            epoch: Epoch(e),
            removed,
            // Joiners take consecutive ranks after the kept members.
            joiners: table
                .into_iter()
                .enumerate()
                .map(|(i, p)| PeerInfo {
                    rank: Rank(first + i as u32),
                    ..p
                })
                .collect(),
        },
    )
}

fn evidence() -> impl Strategy<Value = Evidence> {
    prop_oneof![
        code().prop_map(|code| Evidence::Departed { code }),
        code().prop_map(|code| Evidence::ConnectionLost { code }),
        (any::<u64>(), any::<u64>()).prop_map(|(silent_ms, deadline_ms)| {
            Evidence::MissedDeadline {
                silent_ms,
                deadline_ms,
            }
        }),
        any::<i32>().prop_map(|status| Evidence::ProcessExited { status }),
        any::<i32>().prop_map(|status| Evidence::LauncherWitness { status }),
    ]
}

fn revoke() -> impl Strategy<Value = Revoke> {
    (rank(), any::<u16>(), option::of((rank(), evidence())))
        .prop_filter(
            "a cause names another member, not a launcher",
            |(o, _, c)| {
                c.is_none_or(|(s, e)| s != *o && !matches!(e, Evidence::LauncherWitness { .. }))
            },
        )
        .prop_map(|(origin, hops, cause)| Revoke {
            origin,
            hops,
            cause: cause.map(|(subject, evidence)| RevokeCause { subject, evidence }),
        })
}

fn notice() -> impl Strategy<Value = Notice> {
    (rank(), rank(), evidence(), any::<u16>(), any::<bool>())
        .prop_filter("origin differs from subject", |(o, s, ..)| o != s)
        .prop_map(|(origin, subject, evidence, hops, suspect)| {
            let verdict = match evidence {
                Evidence::Departed { .. } => Verdict::Departed,
                Evidence::MissedDeadline { .. } | Evidence::ConnectionLost { .. } if suspect => {
                    Verdict::Suspect
                }
                _ => Verdict::Dead,
            };
            Notice {
                origin,
                subject,
                verdict,
                evidence,
                hops,
            }
        })
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::Member),
        Just(Role::Data),
        Just(Role::Bootstrap),
        Just(Role::Joiner),
        Just(Role::Status),
        Just(Role::Launcher),
    ]
}

fn chunk() -> impl Strategy<Value = Chunk> {
    (
        0..Collective::ALL.len(),
        0..DType::ALL.len(),
        any::<u64>(),
        any::<u32>(),
        0u64..1 << 40,
        0usize..64,
    )
        .prop_map(|(c, d, op, step, offset, elems)| {
            let dtype = DType::ALL[d];
            let size = dtype.size();
            let payload: Vec<u8> = (0..elems * size).map(|i| i as u8).collect();
            Chunk {
                header: ChunkHeader::new(
                    Collective::ALL[c],
                    dtype,
                    OpSeq(op),
                    step,
                    offset * size as u64,
                ),
                payload: Bytes::from(payload),
            }
        })
}

fn op_record() -> impl Strategy<Value = OpRecord> {
    (
        any::<u64>(),
        0..Collective::ALL.len(),
        any::<u64>(),
        text(64),
        0u8..5,
        any::<u32>(),
        option::of(rank()),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(seq, c, bytes, algorithm, state, step, waiting_on, age_ms, elapsed_ms)| OpRecord {
                seq: OpSeq(seq),
                collective: Collective::ALL[c].code(),
                bytes,
                algorithm,
                state: [
                    OpState::Queued,
                    OpState::Running,
                    OpState::Done,
                    OpState::Failed,
                    OpState::Aborted,
                ][state as usize],
                step,
                waiting_on,
                age_ms,
                elapsed_ms,
            },
        )
}

fn peer_status() -> impl Strategy<Value = PeerStatus> {
    (rank(), 0u8..5, any::<u64>(), option::of(evidence())).prop_map(
        |(rank, state, last_heard_ms, evidence)| PeerStatus {
            rank,
            state: [
                PeerState::Joining,
                PeerState::Alive,
                PeerState::Suspect,
                PeerState::Dead,
                PeerState::Departed,
            ][state as usize],
            last_heard_ms,
            evidence,
        },
    )
}

fn status_reply() -> impl Strategy<Value = StatusReply> {
    (
        rank(),
        any::<u64>(),
        any::<u32>(),
        vec(peer_status(), 0..6),
        vec(op_record(), 0..4),
        option::of(text(4096)),
        prop_oneof![Just(Vec::new()), table()],
    )
        .prop_map(
            |(rank, epoch, world, peers, ops, async_error, members)| StatusReply {
                rank,
                epoch: Epoch(epoch),
                world,
                peers,
                ops,
                async_error,
                members,
            },
        )
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            1u16..100,
            0u16..100,
            role(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>()
        )
            .prop_map(|(min, span, role, nonce, proof)| Message::Hello(Hello {
                version_min: min,
                version_max: min.saturating_add(span),
                role,
                nonce,
                proof,
            })),
        (1u16.., any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(version, nonce, proof)| {
            Message::HelloAck(HelloAck {
                version,
                nonce,
                proof,
            })
        }),
        (code(), text(512)).prop_map(|(code, detail)| Message::Reject(Reject { code, detail })),
        prop_oneof![
            (1u32..1000)
                .prop_flat_map(|world| (Just(world), (0..world).prop_flat_map(|r| peer(Rank(r)))))
                .prop_map(|(world, peer)| Message::Join(Join { world, peer })),
            peer(Rank::NONE).prop_map(|peer| Message::Join(Join { world: 0, peer })),
        ],
        (any::<u64>(), any::<u64>(), table()).prop_map(|(c, e, members)| {
            Message::Welcome(Welcome {
                comm: CommId(c),
                epoch: Epoch(e),
                members,
            })
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(seq, digest)| Message::Heartbeat(Heartbeat { seq, digest })),
        (code(), text(512)).prop_map(|(code, detail)| Message::Depart(Depart { code, detail })),
        notice().prop_map(Message::Notice),
        revoke().prop_map(Message::Revoke),
        ballot().prop_map(|ballot| Message::Prepare(Prepare { ballot })),
        (ballot(), option::of((ballot(), proposal())), ranks()).prop_map(
            |(ballot, accepted, absent)| Message::Promise(Promise {
                ballot,
                accepted,
                absent,
            })
        ),
        (ballot(), proposal())
            .prop_map(|(ballot, proposal)| Message::Propose(Propose { ballot, proposal })),
        (ballot(), any::<bool>(), ranks())
            .prop_map(|(ballot, ok, absent)| Message::Accept(Accept { ballot, ok, absent })),
        (ballot(), proposal())
            .prop_map(|(ballot, proposal)| Message::Commit(Commit { ballot, proposal })),
        chunk().prop_map(Message::Chunk),
        (any::<u32>(), any::<bool>()).prop_map(|(max_ops, with_members)| {
            Message::StatusRequest(StatusRequest {
                max_ops,
                with_members,
            })
        }),
        status_reply().prop_map(Message::StatusReply),
    ]
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (any::<u64>(), any::<u64>(), any::<u32>())
        .prop_map(|(c, e, s)| Envelope::new(CommId(c), Epoch(e), Rank(s)))
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn encode_all(frames: &[(Envelope, Message)]) -> BytesMut {
    let mut enc = Encoder::default();
    let mut out = BytesMut::new();
    for (env, m) in frames {
        enc.encode(env, m, &mut out).expect("valid message encodes");
    }
    out
}

fn open() -> Decoder {
    Decoder::with_gate(Gate::Open, Limits::DEFAULT)
}

/// Drains every frame; stops at the first error.
fn drain(d: &mut Decoder, into: &mut Vec<Frame>) -> Result<(), DecodeError> {
    while let Some(f) = d.next()? {
        into.push(f);
    }
    Ok(())
}

/// Decodes `bytes` in pieces cut at `cuts`, through `push` or through `recv_buf`.
fn decode_split(bytes: &[u8], cuts: &[usize], lend: bool) -> (Vec<Frame>, Option<DecodeError>) {
    let mut d = open();
    let mut frames = Vec::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    for w in points.windows(2) {
        let piece = &bytes[w[0]..w[1]];
        if lend {
            d.recv_buf().extend_from_slice(piece);
        } else {
            d.push(piece);
        }
        if let Err(e) = drain(&mut d, &mut frames) {
            return (frames, Some(e));
        }
    }
    (frames, None)
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every kind round-trips: the decoded frame is the message and envelope encoded.
    #[test]
    fn every_message_round_trips(env in envelope(), m in message()) {
        let bytes = encode_all(&[(env, m.clone())]);
        let mut d = open();
        d.push(&bytes);
        let f = d.next().unwrap().unwrap();
        prop_assert_eq!(&f.message, &m);
        prop_assert_eq!(f.header.envelope(), env);
        prop_assert_eq!(f.header.kind, m.kind());
        prop_assert_eq!(f.header.body_len as usize, bytes.len() - HEADER_LEN);
        prop_assert_eq!(d.next(), Ok(None));
    }

    /// Any slicing of a valid stream, fed by copy or read into the lent buffer, decodes to
    /// exactly the frames of the unsplit stream.
    #[test]
    fn any_split_decodes_like_the_whole_stream(
        frames in vec((envelope(), message()), 1..6),
        cuts in vec(any::<usize>(), 0..12),
        lend in any::<bool>(),
    ) {
        let bytes = encode_all(&frames);
        let (whole, err) = decode_split(&bytes, &[], false);
        prop_assert!(err.is_none());
        prop_assert_eq!(whole.len(), frames.len());
        let (split, err) = decode_split(&bytes, &cuts, lend);
        prop_assert!(err.is_none());
        prop_assert_eq!(split, whole);
    }

    /// Arbitrary bytes never panic, in any phase, whatever the slicing.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..512),
        cuts in vec(any::<usize>(), 0..6),
        side in prop_oneof![Just(None), Just(Some(Side::Acceptor)), Just(Some(Side::Connector))],
    ) {
        let mut d = match side {
            None => open(),
            Some(s) => Decoder::new(s, Limits::DEFAULT),
        };
        let mut frames = Vec::new();
        let mut at = 0;
        for c in cuts.iter().map(|c| c % (bytes.len() + 1)).chain([bytes.len()]) {
            if c > at {
                d.push(&bytes[at..c]);
                at = c;
            }
            if drain(&mut d, &mut frames).is_err() {
                // Poisoned: it keeps failing and holds nothing.
                prop_assert!(d.next().is_err());
                prop_assert_eq!(d.buffered(), 0);
                break;
            }
        }
    }

    /// A valid header with an arbitrary body of the claimed length never panics, and
    /// whatever decodes is the canonical encoding of the result.
    #[test]
    fn arbitrary_bodies_never_panic_and_accepted_ones_are_canonical(
        kind in 0..Kind::ALL.len(),
        env in envelope(),
        body in vec(any::<u8>(), 0..600),
    ) {
        let kind = Kind::ALL[kind];
        let header = chorus_protocol::Header {
            version: 1, kind, flags: 0, comm: env.comm, epoch: env.epoch, sender: env.sender,
            body_len: body.len() as u32, seq: 0,
        };
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(&body);
        check_canonical(&bytes)?;
    }

    /// Flipping bytes of a valid frame never panics; a mutant that still decodes re-encodes
    /// to exactly the mutant (there is one encoding per message).
    #[test]
    fn mutated_frames_never_panic_and_accepted_ones_are_canonical(
        env in envelope(),
        m in message(),
        flips in vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode_all(&[(env, m)]).to_vec();
        for (at, x) in flips {
            let at = at % bytes.len();
            bytes[at] ^= x.max(1);
        }
        check_canonical(&bytes)?;
    }
}

fn check_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut d = open();
    d.push(bytes);
    if let Ok(Some(f)) = d.next() {
        let again = encode_all(&[(f.header.envelope(), f.message.clone())]);
        let used = HEADER_LEN + f.header.body_len as usize;
        prop_assert_eq!(&again[..], &bytes[..used]);
    }
    Ok(())
}

/// Runs a whole handshake between fresh state machines; returns both ends' outcomes.
fn handshake(
    env: Envelope,
    role: Role,
    ours: chorus_protocol::VersionRange,
    theirs: chorus_protocol::VersionRange,
    same_secret: bool,
) -> (
    Result<chorus_protocol::Established, chorus_protocol::HandshakeError>,
    Result<chorus_protocol::Established, chorus_protocol::HandshakeError>,
) {
    use chorus_protocol::{Acceptor, AcceptorConfig, Connector, ConnectorConfig, JobSecret, Nonce};
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wire = BytesMut::new();
    let mut cfg =
        ConnectorConfig::new(JobSecret::new([1; 32]), env, role, Nonce([2; 32]), deadline);
    cfg.versions = ours;
    let mut conn = Connector::new(cfg, &mut wire).unwrap();
    let secret = if same_secret { [1; 32] } else { [9; 32] };
    let mut acfg = AcceptorConfig::new(JobSecret::new(secret), Nonce([3; 32]), deadline);
    acfg.versions = theirs;
    let mut acc = Acceptor::new(acfg);
    let mut rx = Decoder::new(Side::Acceptor, Limits::DEFAULT);
    rx.push(&wire);
    let hello = rx.next().unwrap().unwrap();
    let mut back = BytesMut::new();
    let a = acc
        .handle(&hello, &mut back)
        .and_then(|_| acc.accept(Epoch(env.epoch.0), Rank(0), &mut back));
    let mut crx = Decoder::new(Side::Connector, Limits::DEFAULT);
    crx.push(&back);
    let answer = crx.next().unwrap().unwrap();
    (a, conn.handle(&answer))
}

proptest! {
    /// Any overlapping version ranges agree on the highest common version, on both ends,
    /// for every role and envelope; disjoint ranges or another secret fail on both ends with
    /// the same code.
    #[test]
    fn handshakes_agree_or_fail_on_both_ends_with_one_code(
        env in envelope(),
        role in role(),
        (a_min, a_span, b_min, b_span) in (1u16..5, 0u16..3, 1u16..5, 0u16..3),
        same_secret in any::<bool>(),
    ) {
        use chorus_protocol::VersionRange;
        let ours = VersionRange { min: a_min, max: a_min + a_span };
        let theirs = VersionRange { min: b_min, max: b_min + b_span };
        let (a, c) = handshake(env, role, ours, theirs, same_secret);
        match (ours.negotiate(theirs), same_secret) {
            (Some(v), true) => {
                let (a, c) = (a.unwrap(), c.unwrap());
                prop_assert_eq!(u16::from(a.version), v);
                prop_assert_eq!(a.version, c.version);
                prop_assert_eq!(a.role, role);
                prop_assert_eq!(c.role, role);
                prop_assert_eq!(a.peer, env.sender);
                prop_assert_eq!(c.peer, Rank(0));
            }
            _ => {
                let (a, c) = (a.unwrap_err(), c.unwrap_err());
                prop_assert_eq!(a.code(), c.code());
                let expected = if same_secret {
                    CloseCode::VERSION_MISMATCH
                } else {
                    CloseCode::AUTH_FAILED
                };
                prop_assert_eq!(a.code(), expected);
            }
        }
    }
}
