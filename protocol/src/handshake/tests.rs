use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::*;
use crate::frame::Frame;
use crate::header::Envelope;
use crate::limits::Limits;
use crate::message::{Heartbeat, Message};

const SECRET: [u8; 32] = [7; 32];

fn connector_config(role: Role, now: Instant) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(
        JobSecret::new(SECRET),
        Envelope::new(CommId(42), Epoch(3), Rank(1)),
        role,
        Nonce([0xc0; 32]),
        now + Duration::from_secs(5),
    );
    c.peer = Some(Rank(0));
    c
}

fn acceptor_config(now: Instant) -> AcceptorConfig {
    AcceptorConfig::new(
        JobSecret::new(SECRET),
        Nonce([0xac; 32]),
        now + Duration::from_secs(5),
    )
}

/// Decodes every frame in `bytes` as `local` would, in the handshake phase.
fn frames(local: Side, bytes: &[u8]) -> Vec<Frame> {
    let mut d = Decoder::new(local, Limits::DEFAULT);
    d.push(bytes);
    let mut out = Vec::new();
    while let Some(f) = d.next().unwrap() {
        out.push(f);
    }
    out
}

fn one(local: Side, bytes: &[u8]) -> Frame {
    let mut f = frames(local, bytes);
    assert_eq!(f.len(), 1, "expected one frame");
    f.remove(0)
}

#[test]
fn both_ends_agree_on_a_successful_handshake() {
    let now = Instant::now();
    let mut wire = BytesMut::new();
    let mut conn = Connector::new(connector_config(Role::Member, now), &mut wire).unwrap();
    let hello = one(Side::Acceptor, &wire);

    let mut acc = Acceptor::new(acceptor_config(now));
    let mut back = BytesMut::new();
    let peer = acc.handle(&hello, &mut back).unwrap();
    assert_eq!(
        peer,
        PeerHello {
            role: Role::Member,
            comm: CommId(42),
            epoch: Epoch(3),
            sender: Rank(1),
            version: 1
        }
    );
    assert!(back.is_empty(), "nothing is sent before the policy decides");
    let a = acc.accept(Epoch(3), Rank(0), &mut back).unwrap();
    let c = conn.handle(&one(Side::Connector, &back)).unwrap();

    assert_eq!(a.version, 1);
    assert_eq!(c.version, 1);
    assert_eq!(
        (a.peer, a.local, a.role),
        (Rank(1), Side::Acceptor, Role::Member)
    );
    assert_eq!(
        (c.peer, c.local, c.peer_epoch),
        (Rank(0), Side::Connector, Epoch(3))
    );

    // The encoders continue the sequence after the handshake frames.
    let mut ce = conn.into_encoder();
    assert_eq!(ce.next_seq(), 1);
    let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
    d.push(&wire);
    assert!(matches!(
        d.next().unwrap().unwrap().message,
        Message::Hello(_)
    ));
    a.apply(&mut d);
    let mut more = BytesMut::new();
    ce.encode(
        &Envelope::new(CommId(42), Epoch(3), Rank(1)),
        &Message::Heartbeat(Heartbeat { seq: 0, digest: 0 }),
        &mut more,
    )
    .unwrap();
    d.push(&more);
    assert!(matches!(
        d.next().unwrap().unwrap().message,
        Message::Heartbeat(_)
    ));
    assert_eq!(acc.into_encoder().next_seq(), 1);
}

#[test]
fn wrong_secret_is_refused_with_auth_failed() {
    let now = Instant::now();
    let mut cfg = connector_config(Role::Data, now);
    cfg.secret = JobSecret::new([8; 32]);
    let mut wire = BytesMut::new();
    Connector::new(cfg, &mut wire).unwrap();
    let mut acc = Acceptor::new(acceptor_config(now));
    let mut back = BytesMut::new();
    let e = acc
        .handle(&one(Side::Acceptor, &wire), &mut back)
        .unwrap_err();
    assert_eq!(e, HandshakeError::AuthFailed);
    assert_eq!(e.code(), CloseCode::AUTH_FAILED);
    let Message::Reject(r) = one(Side::Connector, &back).message else {
        panic!("no reject")
    };
    assert_eq!(r.code, CloseCode::AUTH_FAILED);
    // The acceptor is done: no second chance on this stream.
    assert_eq!(
        acc.accept(Epoch(0), Rank(0), &mut back),
        Err(HandshakeError::Finished)
    );
}

type Tamper = Box<dyn Fn(&mut Frame)>;

#[test]
fn any_tampered_hello_field_fails_the_proof() {
    let now = Instant::now();
    let mut wire = BytesMut::new();
    Connector::new(connector_config(Role::Member, now), &mut wire).unwrap();
    let good = one(Side::Acceptor, &wire);
    let tamperings: Vec<Tamper> = vec![
        Box::new(|f| f.header.comm = CommId(43)),
        Box::new(|f| f.header.epoch = Epoch(4)),
        Box::new(|f| f.header.sender = Rank(2)),
        Box::new(|f| {
            if let Message::Hello(h) = &mut f.message {
                h.role = Role::Data
            }
        }),
        Box::new(|f| {
            if let Message::Hello(h) = &mut f.message {
                h.version_max = 2
            }
        }),
        Box::new(|f| {
            if let Message::Hello(h) = &mut f.message {
                h.nonce[0] ^= 1
            }
        }),
    ];
    for tamper in tamperings {
        let mut f = good.clone();
        tamper(&mut f);
        let mut acc = Acceptor::new(acceptor_config(now));
        let e = acc.handle(&f, &mut BytesMut::new()).unwrap_err();
        assert_eq!(e, HandshakeError::AuthFailed, "{f:?}");
    }
}

#[test]
fn channel_binding_must_match_on_both_ends() {
    let now = Instant::now();
    let mut cfg = connector_config(Role::Member, now);
    cfg.binding = ChannelBinding::Tls([1; 32]);
    let mut wire = BytesMut::new();
    Connector::new(cfg, &mut wire).unwrap();
    let hello = one(Side::Acceptor, &wire);
    let mut acfg = acceptor_config(now);
    acfg.binding = ChannelBinding::Tls([2; 32]);
    let e = Acceptor::new(acfg.clone())
        .handle(&hello, &mut BytesMut::new())
        .unwrap_err();
    assert_eq!(e, HandshakeError::AuthFailed);
    acfg.binding = ChannelBinding::Tls([1; 32]);
    Acceptor::new(acfg)
        .handle(&hello, &mut BytesMut::new())
        .unwrap();
}

#[test]
fn disjoint_versions_are_refused_with_version_mismatch() {
    let now = Instant::now();
    let mut cfg = connector_config(Role::Member, now);
    cfg.versions = VersionRange { min: 2, max: 3 };
    let mut wire = BytesMut::new();
    Connector::new(cfg, &mut wire).unwrap();
    let mut back = BytesMut::new();
    let e = Acceptor::new(acceptor_config(now))
        .handle(&one(Side::Acceptor, &wire), &mut back)
        .unwrap_err();
    assert_eq!(e.code(), CloseCode::VERSION_MISMATCH);
    let Message::Reject(r) = one(Side::Connector, &back).message else {
        panic!("no reject")
    };
    assert_eq!(r.code, CloseCode::VERSION_MISMATCH);
}

#[test]
fn policy_rejection_reaches_the_connector_with_its_code() {
    let now = Instant::now();
    let mut wire = BytesMut::new();
    let mut conn = Connector::new(connector_config(Role::Bootstrap, now), &mut wire).unwrap();
    let mut acc = Acceptor::new(acceptor_config(now));
    let mut back = BytesMut::new();
    acc.handle(&one(Side::Acceptor, &wire), &mut back).unwrap();
    let e = acc.reject(
        CloseCode::UNKNOWN_COMM,
        "no communicator c42 here",
        &mut back,
    );
    assert_eq!(e.code(), CloseCode::UNKNOWN_COMM);
    let got = conn.handle(&one(Side::Connector, &back)).unwrap_err();
    assert_eq!(
        got,
        HandshakeError::Rejected {
            code: CloseCode::UNKNOWN_COMM,
            detail: "no communicator c42 here".into()
        }
    );
}

#[test]
fn acceptor_deadline_sends_reject_deadline_once() {
    let now = Instant::now();
    let mut acc = Acceptor::new(acceptor_config(now));
    let mut back = BytesMut::new();
    assert_eq!(acc.handle_timeout(now, &mut back), None);
    let e = acc
        .handle_timeout(now + Duration::from_secs(5), &mut back)
        .unwrap();
    assert_eq!(e.code(), CloseCode::DEADLINE);
    let Message::Reject(r) = one(Side::Connector, &back).message else {
        panic!("no reject")
    };
    assert_eq!(r.code, CloseCode::DEADLINE);
    assert_eq!(
        acc.handle_timeout(now + Duration::from_secs(9), &mut back),
        None
    );
}

#[test]
fn connector_deadline_fires_only_without_an_answer() {
    let now = Instant::now();
    let mut wire = BytesMut::new();
    let mut conn = Connector::new(connector_config(Role::Member, now), &mut wire).unwrap();
    assert_eq!(conn.handle_timeout(now), None);
    assert_eq!(
        conn.handle_timeout(now + Duration::from_secs(6)),
        Some(HandshakeError::Deadline)
    );
    assert_eq!(HandshakeError::Deadline.code(), CloseCode::DEADLINE);
}

/// Runs a handshake up to the acceptor's answer and returns the connector and the answer.
fn answered(now: Instant, epoch: Epoch, rank: Rank) -> (Connector, Frame) {
    let mut wire = BytesMut::new();
    let conn = Connector::new(connector_config(Role::Member, now), &mut wire).unwrap();
    let mut acc = Acceptor::new(acceptor_config(now));
    let mut back = BytesMut::new();
    acc.handle(&one(Side::Acceptor, &wire), &mut back).unwrap();
    acc.accept(epoch, rank, &mut back).unwrap();
    (conn, one(Side::Connector, &back))
}

#[test]
fn an_answer_from_the_wrong_rank_is_refused() {
    let (mut conn, ack) = answered(Instant::now(), Epoch(3), Rank(5));
    assert_eq!(
        conn.handle(&ack),
        Err(HandshakeError::WrongPeer {
            expected: Rank(0),
            found: Rank(5)
        })
    );
}

#[test]
fn a_forged_or_replayed_ack_fails_authentication() {
    let now = Instant::now();
    let (_, ack) = answered(now, Epoch(3), Rank(0));
    // A recorded HelloAck replayed to a connector that used a fresh nonce.
    let mut cfg = connector_config(Role::Member, now);
    cfg.nonce = Nonce([0x55; 32]);
    let mut conn = Connector::new(cfg, &mut BytesMut::new()).unwrap();
    assert_eq!(conn.handle(&ack), Err(HandshakeError::AuthFailed));
    // A tampered version.
    let (mut conn, mut ack) = answered(now, Epoch(3), Rank(0));
    if let Message::HelloAck(a) = &mut ack.message {
        a.version = 2;
    }
    assert_eq!(conn.handle(&ack), Err(HandshakeError::AuthFailed));
}

#[test]
fn a_connector_handles_one_answer_only() {
    let (mut conn, ack) = answered(Instant::now(), Epoch(3), Rank(0));
    conn.handle(&ack).unwrap();
    assert_eq!(conn.handle(&ack), Err(HandshakeError::Finished));
}

#[test]
fn the_job_secret_never_prints() {
    let s = format!("{:?}", JobSecret::new(SECRET));
    assert_eq!(s, "JobSecret(..)");
}
