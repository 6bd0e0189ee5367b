//! Test 7: bad input on every listening port of a running job — each member's QUIC control
//! endpoint and TCP data listener, and the bootstrap root — is refused with the spec's code
//! (SPEC.md sections 5.2, 7 and 14), and the job's all-reduces (checked every iteration)
//! are unaffected, before and after a shrink.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::print_stdout)] // the answers, shown with --nocapture

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use chorus_protocol::message::Role;
use chorus_protocol::{CloseCode, JobSecret};
use chorus_tests::probe::{self, Answer, QuicBytes};
use chorus_tests::{Job, JobSpec};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_chorus-test-rank"))
}

const WAIT: Duration = Duration::from_secs(20);

fn refused(answer: &Answer, code: CloseCode, what: &str) {
    println!("{what}: {answer:?}");
    assert_eq!(answer.refused, Some(code), "{what}: {answer:?}");
    assert!(!answer.admitted, "{what}: admitted: {answer:?}");
    assert!(answer.closed.is_some(), "{what}: left open: {answer:?}");
}

/// A QUIC refusal also closes the connection with the same application code.
fn quic_refused(answer: &Answer, code: CloseCode, what: &str) {
    refused(answer, code, what);
    assert_eq!(answer.closed, Some(probe::code(code)), "{what}: {answer:?}");
}

/// Every bad first frame a listener must refuse, by the bytes that carry it.
fn bad_hellos(
    secret: &JobSecret,
    comm: u64,
    epoch: u64,
) -> Vec<(&'static str, Vec<u8>, CloseCode)> {
    let env = probe::envelope(comm, epoch, 0);
    let (good, _) = probe::hello(secret, env, Role::Data, Default::default());
    let mut bad_magic = good.clone();
    bad_magic[..4].copy_from_slice(b"HTTP");
    let mut bad_version = good.clone();
    bad_version[4] = 9;
    let mut bad_flags = good.clone();
    bad_flags[6] = 1;
    vec![
        (
            "garbage",
            probe::garbage(300, 7),
            CloseCode::PROTOCOL_VIOLATION,
        ),
        ("wrong magic", bad_magic, CloseCode::PROTOCOL_VIOLATION),
        ("wrong version", bad_version, CloseCode::VERSION_MISMATCH),
        ("flags set", bad_flags, CloseCode::PROTOCOL_VIOLATION),
        (
            "oversize length",
            probe::with_body_len(good, u32::MAX),
            CloseCode::PROTOCOL_VIOLATION,
        ),
    ]
}

/// Probes one member's data listener (TCP) and control endpoint (QUIC).
fn probe_member(secret: &JobSecret, comm: u64, epoch: u64, data: SocketAddr, control: SocketAddr) {
    let stranger = chorus_transport::fresh::job_secret();
    for (what, bytes, code) in bad_hellos(secret, comm, epoch) {
        refused(&probe::tcp(data, &bytes), code, &format!("tcp {what}"));
        quic_refused(
            &probe::quic(control, QuicBytes::Raw(bytes)),
            code,
            &format!("quic {what}"),
        );
    }
    let env = probe::envelope(comm, epoch, 0);
    let unknown = probe::envelope(comm ^ 0x5a5a, epoch, 0);
    let tcp_hello = |s: &JobSecret, e, role| probe::hello(s, e, role, Default::default()).0;
    refused(
        &probe::tcp(data, &tcp_hello(&stranger, env, Role::Data)),
        CloseCode::AUTH_FAILED,
        "tcp wrong secret",
    );
    refused(
        &probe::tcp(data, &tcp_hello(secret, unknown, Role::Data)),
        CloseCode::UNKNOWN_COMM,
        "tcp unknown communicator",
    );
    refused(
        &probe::tcp(data, &tcp_hello(secret, env, Role::Member)),
        CloseCode::PROTOCOL_VIOLATION,
        "tcp control role on the data listener",
    );
    let quic_hello = |s: &JobSecret, envelope, role| QuicBytes::Hello {
        secret: s.clone(),
        envelope,
        role,
    };
    quic_refused(
        &probe::quic(control, quic_hello(&stranger, env, Role::Member)),
        CloseCode::AUTH_FAILED,
        "quic wrong secret",
    );
    quic_refused(
        &probe::quic(control, quic_hello(secret, unknown, Role::Member)),
        CloseCode::UNKNOWN_COMM,
        "quic unknown communicator",
    );
    quic_refused(
        &probe::quic(control, quic_hello(secret, env, Role::Bootstrap)),
        CloseCode::PROTOCOL_VIOLATION,
        "quic bootstrap role at a member",
    );
    probe::udp_garbage(control, 50);
}

fn addr(job: &Job, slot: usize, which: &str) -> SocketAddr {
    job.ready(slot).str(which).unwrap().parse().unwrap()
}

/// No slot reported a failure: the probes did not disturb the job.
fn undisturbed(job: &mut Job, slots: &[usize]) {
    for &s in slots {
        let failures = job.pending(s, "failed");
        assert!(failures.is_empty(), "slot {s} was disturbed: {failures:?}");
    }
}

#[test]
fn t7_bad_input_on_every_port_is_refused_with_its_code_and_the_job_is_unaffected() {
    let mut job = Job::start(
        bin(),
        JobSpec::new(4)
            .env("CHORUS_HEARTBEAT_INTERVAL", "100ms")
            .env("CHORUS_HEARTBEAT_DEADLINE", "1s")
            .env("CT_START", "loop")
            .env("CT_ON_FAIL", "shrink"),
    );
    for s in 0..4 {
        job.wait_for(s, "looping", WAIT);
    }
    let token = job.token().clone();
    let (comm, secret) = (token.comm.get(), token.secret.clone());

    // The bootstrap root: still listening after bootstrap, for launcher notices.
    let stranger = chorus_transport::fresh::job_secret();
    for (what, bytes, code) in bad_hellos(&secret, comm, 0) {
        quic_refused(
            &probe::quic(token.root, QuicBytes::Raw(bytes)),
            code,
            &format!("root {what}"),
        );
    }
    let boot = probe::envelope(comm, 0, 0);
    quic_refused(
        &probe::quic(
            token.root,
            QuicBytes::Hello {
                secret: stranger,
                envelope: boot,
                role: Role::Bootstrap,
            },
        ),
        CloseCode::AUTH_FAILED,
        "root wrong secret",
    );
    quic_refused(
        &probe::quic(
            token.root,
            QuicBytes::Hello {
                secret: secret.clone(),
                envelope: probe::envelope(comm ^ 1, 0, 0),
                role: Role::Bootstrap,
            },
        ),
        CloseCode::UNKNOWN_COMM,
        "root unknown communicator",
    );
    probe::udp_garbage(token.root, 50);

    // Every member, at epoch 0, while it all-reduces.
    for s in 0..4 {
        probe_member(
            &secret,
            comm,
            0,
            addr(&job, s, "data"),
            addr(&job, s, "control"),
        );
    }
    undisturbed(&mut job, &[0, 1, 2, 3]);

    // A shrink to epoch 1, then a stale epoch's handshakes and frames.
    job.signal(3, libc::SIGKILL);
    for s in 0..3 {
        let shrunk = job.wait_for(s, "shrunk", WAIT);
        assert_eq!(shrunk.u64("epoch"), Some(1), "{shrunk}");
    }
    for s in 0..3 {
        let stale = probe::envelope(comm, 0, 0);
        refused(
            &probe::tcp(
                addr(&job, s, "data"),
                &probe::hello(&secret, stale, Role::Data, Default::default()).0,
            ),
            CloseCode::STALE_EPOCH,
            "tcp stale epoch",
        );
        quic_refused(
            &probe::quic(
                addr(&job, s, "control"),
                QuicBytes::Hello {
                    secret: secret.clone(),
                    envelope: stale,
                    role: Role::Member,
                },
            ),
            CloseCode::STALE_EPOCH,
            "quic stale epoch",
        );
        probe_member(
            &secret,
            comm,
            1,
            addr(&job, s, "data"),
            addr(&job, s, "control"),
        );
    }
    // A second data stream claiming rank 0 at epoch 1, while rank 0's own link to rank 2 is
    // live (a replayed or forged Hello that passes the handshake): at most one data link per
    // (comm, epoch, peer), so it is closed with duplicate-rank before any chunk it carries
    // (here one of epoch 0) is read, and the live link keeps working (`undisturbed` below).
    // A stale chunk on an admitted link is refused with stale-epoch in the transport's suite
    // (`tcp.rs`, "a stale epoch").
    let current = probe::envelope(comm, 1, 0);
    let second =
        probe::tcp_after_handshake(addr(&job, 2, "data"), &secret, current, Role::Data, |enc| {
            probe::chunk(enc, probe::envelope(comm, 0, 0), 8)
        });
    println!("second stream for a live rank: {second:?}");
    assert!(second.admitted, "{second:?}");
    assert_eq!(
        second.refused,
        Some(CloseCode::DUPLICATE_RANK),
        "{second:?}"
    );

    undisturbed(&mut job, &[0, 1, 2]);
    job.send_all(&[0, 1, 2], "finish");
    for s in 0..3 {
        let f = job.wait_for(s, "finished", WAIT);
        assert_eq!((f.u64("epoch"), f.u64("world")), (Some(1), Some(3)), "{f}");
        assert_eq!(f.bool("peers_alive"), Some(true), "{f}");
    }
    undisturbed(&mut job, &[0, 1, 2]);
    job.send_all(&[0, 1, 2], "destroy");
    for s in 0..3 {
        assert_eq!(job.wait_for(s, "destroyed", WAIT).bool("ok"), Some(true));
    }
    assert_eq!(job.close(), vec![]);
}
