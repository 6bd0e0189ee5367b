//! The handshake state machines on hostile input.
//!
//! Byte 0 picks the end under test and how its policy answers; the rest is what the peer
//! sends. For the acceptor, a genuine `Hello` (made by a real connector from fuzz-chosen
//! fields) may be placed first, so the policy, accept and reject paths are reached and not
//! only the proof check. Oracles: no panic; an acceptor answers exactly one `HelloAck` or
//! `Reject`; nothing is accepted without a valid proof.
#![no_main]

use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::message::{Message, Role};
use chorus_protocol::{
    Acceptor, AcceptorConfig, CloseCode, CommId, Connector, ConnectorConfig, Decoder, Envelope,
    Epoch, JobSecret, Limits, Nonce, Rank, Side,
};
use libfuzzer_sys::fuzz_target;

const SECRET: JobSecret = JobSecret::new([0x5e; 32]);
const ROLES: [Role; 6] = [
    Role::Member,
    Role::Data,
    Role::Bootstrap,
    Role::Joiner,
    Role::Status,
    Role::Launcher,
];

fuzz_target!(|data: &[u8]| {
    let [mode, a, b, rest @ ..] = data else {
        return;
    };
    let now = Instant::now();
    let deadline = now + Duration::from_secs(1);
    if mode & 1 == 0 {
        acceptor(*mode, *a, *b, rest, now, deadline);
    } else {
        connector(*a, rest, now, deadline);
    }
});

fn acceptor(mode: u8, a: u8, b: u8, rest: &[u8], now: Instant, deadline: Instant) {
    let mut stream = BytesMut::new();
    if mode & 2 != 0 {
        // A genuine Hello from fuzz-chosen fields, then whatever follows.
        let env = Envelope::new(
            CommId(u64::from(a)),
            Epoch(u64::from(b)),
            Rank(u32::from(a)),
        );
        let mut cfg = ConnectorConfig::new(
            SECRET,
            env,
            ROLES[usize::from(b) % 6],
            Nonce([a; 32]),
            deadline,
        );
        cfg.versions.max = u16::from(b % 3) + 1;
        let _ = Connector::new(cfg, &mut stream);
    }
    stream.extend_from_slice(rest);

    let mut acc = Acceptor::new(AcceptorConfig::new(SECRET, Nonce([b; 32]), deadline));
    let mut d = Decoder::new(Side::Acceptor, Limits::DEFAULT);
    d.push(&stream);
    let mut out = BytesMut::new();
    let mut answered = false;
    loop {
        match d.next() {
            Ok(Some(frame)) => match acc.handle(&frame, &mut out) {
                Ok(peer) => {
                    assert!(matches!(frame.message, Message::Hello(_)));
                    if mode & 4 != 0 {
                        let est = acc
                            .accept(Epoch(1), Rank(0), &mut out)
                            .expect("accept once");
                        assert_eq!(est.peer, peer.sender);
                    } else {
                        let _ = acc.reject(CloseCode::DUPLICATE_RANK, "taken", &mut out);
                    }
                    answered = true;
                    break;
                }
                Err(e) => {
                    let _ = e.code();
                    answered = !out.is_empty();
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                let _ = acc.reject(e.code(), e.to_string(), &mut out);
                answered = true;
                break;
            }
        }
    }
    if !answered {
        answered = acc.handle_timeout(deadline, &mut out).is_some();
    }
    assert!(answered, "the acceptor always answers by its deadline");
    assert!(acc.handle_timeout(now, &mut BytesMut::new()).is_none());

    // Exactly one answer frame went out.
    let mut back = Decoder::new(Side::Connector, Limits::DEFAULT);
    back.push(&out);
    assert!(matches!(back.next(), Ok(Some(_))), "answer decodes");
    assert!(matches!(back.next(), Ok(None)), "one answer only");
}

fn connector(a: u8, rest: &[u8], now: Instant, deadline: Instant) {
    let env = Envelope::new(CommId(3), Epoch(1), Rank(1));
    let mut cfg = ConnectorConfig::new(
        SECRET,
        env,
        ROLES[usize::from(a) % 6],
        Nonce([a; 32]),
        deadline,
    );
    if a & 0x40 != 0 {
        cfg.peer = Some(Rank(0));
    }
    let mut wire = BytesMut::new();
    let Ok(mut conn) = Connector::new(cfg, &mut wire) else {
        return;
    };
    let mut d = Decoder::new(Side::Connector, Limits::DEFAULT);
    d.push(rest);
    if let Ok(Some(frame)) = d.next() {
        // Without the secret no answer can authenticate.
        if let Ok(est) = conn.handle(&frame) {
            panic!("accepted a forged answer: {est:?}");
        }
    }
    let _ = conn.handle_timeout(now);
}
