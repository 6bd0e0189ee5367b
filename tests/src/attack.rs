//! A stream of hostile connections at a running job's listeners: every member's TCP data
//! and QUIC control ports and the bootstrap root's, fed by the seeded [`Mutator`], a few at
//! a time, for a duration. Each connection's answer is read (bounded) and compared with
//! what the spec says; the [`Report`] keeps, per port and mutation, what came back, and
//! every answer that differed from the spec's. Shared by `tests/tests/attack.rs` and
//! `chorus-figures attack`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_protocol::message::Message;
use chorus_protocol::{ChannelBinding, CloseCode, Decoder, JobSecret, Limits, Side};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::mutate::{Attempt, Expect, HANDSHAKE_TIMEOUT, Mutator, Payload, Port, Target};
use crate::probe;

/// How long past the listener's handshake timeout an answer may take before it counts as
/// silence (a loaded 2-core machine, and QUIC's own close round trip).
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// One listener under attack.
#[derive(Clone, Debug)]
pub struct Listener {
    pub addr: SocketAddr,
    pub target: Target,
}

/// What a listener answered one connection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Outcome {
    /// A `Reject` (or `Depart`) frame with this code; `close`: the QUIC application close
    /// code (`None` on TCP, where the stream's end carries no code).
    Refused { code: u16, close: Option<u64> },
    /// A `HelloAck`, then a `Depart`/close with this code (`close` as above).
    AdmittedThenClosed { code: u16, close: Option<u64> },
    /// A `HelloAck`, then the stream ended with no frame after it (a TCP end of stream).
    AdmittedThenEnded,
    /// The stream ended with no frame: a TCP end of stream, or a QUIC close with this code.
    Closed { close: Option<u64> },
    /// A TCP reset.
    Reset,
    /// Nothing by the answer's deadline.
    Silence,
    /// Datagrams came back to garbage datagrams (QUIC may answer a long header of an
    /// unknown version with version negotiation; no connection comes of it).
    DatagramAnswer,
    /// The attacker could not connect at all (TCP connect, QUIC TLS handshake).
    NoConnection,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |c: u16| CloseCode(c).name();
        let close = |c: &Option<u64>| match c {
            Some(c) => format!(", quic close {}", CloseCode(*c as u16).name()),
            None => String::new(),
        };
        match self {
            Outcome::Refused { code, close: c } => write!(f, "reject {}{}", name(*code), close(c)),
            Outcome::AdmittedThenClosed { code, close: c } => {
                write!(f, "hello-ack, then {}{}", name(*code), close(c))
            }
            Outcome::AdmittedThenEnded => write!(f, "hello-ack, then end of stream (no departure)"),
            Outcome::Closed { close: c } => write!(f, "closed, no frame{}", close(c)),
            Outcome::Reset => write!(f, "reset"),
            Outcome::Silence => write!(f, "silence"),
            Outcome::DatagramAnswer => write!(f, "datagram answered (no connection)"),
            Outcome::NoConnection => write!(f, "no connection"),
        }
    }
}

/// Whether `outcome` is what the spec says for `expect` on `port`.
pub fn conforms(port: Port, expect: Expect, outcome: Outcome) -> bool {
    let quic = port != Port::Data;
    let closed_with = |close: Option<u64>, code: CloseCode| {
        if quic {
            close == Some(u64::from(code.0))
        } else {
            close.is_none()
        }
    };
    match (expect, outcome) {
        (Expect::Refused(want), Outcome::Refused { code, close }) => {
            code == want.0 && closed_with(close, want)
        }
        // On QUIC the connection close carries the code (SPEC 6); the `Reject` before it gets
        // a bounded moment to be acknowledged (50 ms), and a loaded listener may close first.
        (Expect::Refused(want), Outcome::Closed { close }) => {
            quic && close == Some(u64::from(want.0))
        }
        (Expect::AdmittedThenClosed(want), Outcome::AdmittedThenClosed { code, close }) => {
            code == want.0 && closed_with(close, want)
        }
        (Expect::Closed, Outcome::Closed { .. } | Outcome::Reset) => true,
        (Expect::Silence, Outcome::Silence | Outcome::DatagramAnswer) => true,
        _ => false,
    }
}

/// What the attack saw; see the module docs.
#[derive(Default, Debug)]
pub struct Report {
    /// (port, mutation) → outcome → count.
    pub seen: BTreeMap<(Port, &'static str), BTreeMap<Outcome, u64>>,
    /// Answers that differed from the spec's: (port, mutation, expected, got), the first
    /// few of each kind.
    pub wrong: Vec<(Port, &'static str, Expect, Outcome)>,
    /// How many answers differed (all of them, not only those kept).
    pub wrong_count: u64,
    pub attempts: u64,
}

impl Report {
    fn record(&mut self, port: Port, attempt: &Attempt, outcome: Outcome) {
        self.attempts += 1;
        *self
            .seen
            .entry((port, attempt.what))
            .or_default()
            .entry(outcome)
            .or_default() += 1;
        if !conforms(port, attempt.expect, outcome) {
            self.wrong_count += 1;
            let key = (port, attempt.what, attempt.expect, outcome);
            if self.wrong.len() < 50 && !self.wrong.contains(&key) {
                self.wrong.push(key);
            }
        }
    }

    /// Per port, what came back for how many connections.
    pub fn by_port(&self) -> BTreeMap<Port, BTreeMap<Outcome, u64>> {
        let mut out: BTreeMap<Port, BTreeMap<Outcome, u64>> = BTreeMap::new();
        for ((port, _), outcomes) in &self.seen {
            for (o, n) in outcomes {
                *out.entry(*port).or_default().entry(*o).or_default() += n;
            }
        }
        out
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| port | mutation | what came back | connections |")?;
        writeln!(f, "|---|---|---|---:|")?;
        for ((port, what), outcomes) in &self.seen {
            for (o, n) in outcomes {
                writeln!(f, "| {} | {what} | {o} | {n} |", port.name())?;
            }
        }
        writeln!(
            f,
            "\n{} connections, {} answered otherwise than the spec says",
            self.attempts, self.wrong_count
        )?;
        for (port, what, expect, got) in &self.wrong {
            writeln!(
                f,
                "- {} {what}: expected {expect:?}, got {got}",
                port.name()
            )?;
        }
        Ok(())
    }
}

/// Runs the attack on `listeners` for `duration`, `concurrency` connections at a time,
/// drawing attempts from a [`Mutator`] seeded with `seed`. Bounded: it returns at most one
/// answer deadline past `duration`.
pub fn run(
    listeners: &[Listener],
    secret: &JobSecret,
    seed: u64,
    duration: Duration,
    concurrency: usize,
) -> Report {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot build the attack's runtime: {e}"),
    };
    let report = Arc::new(Mutex::new(Report::default()));
    let mutator = Arc::new(Mutex::new(Mutator::new(seed, secret.clone())));
    let until = Instant::now() + duration;
    let listeners: Arc<Vec<Listener>> = Arc::new(listeners.to_vec());
    rt.block_on(async {
        let endpoint = match probe::trusting_endpoint() {
            Ok(e) => e,
            Err(e) => panic!("cannot open the attack's QUIC endpoint: {e}"),
        };
        let mut workers = Vec::new();
        for w in 0..concurrency.max(1) {
            let (report, mutator, listeners, endpoint) = (
                report.clone(),
                mutator.clone(),
                listeners.clone(),
                endpoint.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < until {
                    let l = &listeners[i % listeners.len()];
                    i += concurrency.max(1);
                    let attempt = mutator.lock().next(&l.target);
                    let outcome = attack_once(&endpoint, l, &attempt).await;
                    report.lock().record(l.target.port, &attempt, outcome);
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
        endpoint.close(quinn::VarInt::from_u32(0), b"attack over");
    });
    let mut out = report.lock();
    std::mem::take(&mut *out)
}

/// One connection: write the attempt, read the answer (bounded).
async fn attack_once(endpoint: &quinn::Endpoint, l: &Listener, attempt: &Attempt) -> Outcome {
    let wait = HANDSHAKE_TIMEOUT + ANSWER_GRACE;
    match (&attempt.payload, l.target.port) {
        (Payload::Datagrams(grams), _) => datagrams(l.addr, grams).await,
        (_, Port::Data) => {
            let bytes = match &attempt.payload {
                Payload::Bytes(b) => b.clone(),
                // Never built for TCP; an unbound `Hello` is what TCP would carry.
                Payload::BoundHello {
                    secret,
                    envelope,
                    role,
                } => crate::mutate::hello_bytes(secret, *envelope, *role, ChannelBinding::None).0,
                Payload::Datagrams(_) => Vec::new(),
            };
            match tokio::time::timeout(wait, tcp(l.addr, &bytes, attempt.finish, wait)).await {
                Ok(o) => o,
                Err(_) => Outcome::Silence,
            }
        }
        (payload, _) => {
            match tokio::time::timeout(wait, quic(endpoint, l.addr, payload, attempt.finish, wait))
                .await
            {
                Ok(o) => o,
                Err(_) => Outcome::Silence,
            }
        }
    }
}

async fn datagrams(addr: SocketAddr, grams: &[Vec<u8>]) -> Outcome {
    let Ok(sock) = tokio::net::UdpSocket::bind("127.0.0.1:0").await else {
        return Outcome::NoConnection;
    };
    for g in grams {
        let _ = sock.send_to(g, addr).await;
    }
    let mut buf = [0u8; 2048];
    match tokio::time::timeout(Duration::from_millis(50), sock.recv_from(&mut buf)).await {
        Ok(Ok(_)) => Outcome::DatagramAnswer,
        _ => Outcome::Silence,
    }
}

/// Frames seen on an answer so far.
#[derive(Default)]
struct Seen {
    ack: bool,
    code: Option<u16>,
}

impl Seen {
    fn take(&mut self, decoder: &mut Decoder) {
        while let Ok(Some(frame)) = decoder.next() {
            match frame.message {
                Message::HelloAck(_) => {
                    self.ack = true;
                    // What follows a `HelloAck` is the established stream's: the answer's
                    // decoder has no handshake to verify it with, so it reads the rest
                    // as an established stream would.
                    decoder.set_gate(chorus_protocol::Gate::Established {
                        role: chorus_protocol::message::Role::Data,
                        local: Side::Connector,
                        comm: frame.header.comm,
                        peer: frame.header.sender,
                    });
                }
                Message::Reject(r) => self.code = Some(r.code.0),
                Message::Depart(d) => self.code = Some(d.code.0),
                _ => {}
            }
        }
    }

    fn outcome(&self, close: Option<u64>) -> Outcome {
        match (self.ack, self.code) {
            (false, Some(code)) => Outcome::Refused { code, close },
            (true, Some(code)) => Outcome::AdmittedThenClosed { code, close },
            (true, None) => Outcome::AdmittedThenEnded,
            (false, None) => Outcome::Closed { close },
        }
    }
}

async fn tcp(addr: SocketAddr, bytes: &[u8], finish: bool, wait: Duration) -> Outcome {
    let Ok(Ok(mut s)) = tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await
    else {
        return Outcome::NoConnection;
    };
    // A listener may refuse before it read everything: a failed write is part of the answer.
    let _ = s.write_all(bytes).await;
    if finish {
        let _ = s.shutdown().await;
    }
    let mut decoder = Decoder::new(Side::Connector, Limits::DEFAULT);
    let mut seen = Seen::default();
    let mut buf = vec![0u8; 1 << 14];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => {
                seen.take(&mut decoder);
                return seen.outcome(None);
            }
            Ok(n) => {
                decoder.push(&buf[..n]);
                seen.take(&mut decoder);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && seen.code.is_some() => {
                // A close after the refusal frame, with unread bytes of ours left.
                return seen.outcome(None);
            }
            Err(_) => return Outcome::Reset,
        }
    }
}

async fn quic(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    payload: &Payload,
    finish: bool,
    wait: Duration,
) -> Outcome {
    let connecting = match endpoint.connect(addr, "chorus") {
        Ok(c) => c,
        Err(_) => return Outcome::NoConnection,
    };
    let conn = match tokio::time::timeout(wait, connecting).await {
        Ok(Ok(c)) => c,
        _ => return Outcome::NoConnection,
    };
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(s) => s,
        Err(_) => return Outcome::NoConnection,
    };
    let bytes = match payload {
        Payload::Bytes(b) => b.clone(),
        Payload::BoundHello {
            secret,
            envelope,
            role,
        } => {
            let mut b = [0u8; 32];
            if conn
                .export_keying_material(&mut b, b"EXPORTER-chorus-hello", b"")
                .is_err()
            {
                return Outcome::NoConnection;
            }
            crate::mutate::hello_bytes(secret, *envelope, *role, ChannelBinding::Tls(b)).0
        }
        Payload::Datagrams(_) => Vec::new(),
    };
    let _ = send.write_all(&bytes).await;
    if finish {
        let _ = send.finish();
    }
    let mut decoder = Decoder::new(Side::Connector, Limits::DEFAULT);
    let mut seen = Seen::default();
    while let Ok(Some(c)) = recv.read_chunk(1 << 16, true).await {
        decoder.push(&c.bytes);
        seen.take(&mut decoder);
    }
    seen.take(&mut decoder);
    let close = match tokio::time::timeout(Duration::from_secs(2), conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(ac)) => Some(ac.error_code.into_inner()),
        Ok(_) => Some(u64::MAX),
        Err(_) => {
            let outcome = seen.outcome(None);
            conn.close(quinn::VarInt::from_u32(0), b"attack done");
            return match outcome {
                Outcome::Closed { .. } if seen.code.is_none() => Outcome::Silence,
                o => o,
            };
        }
    };
    seen.outcome(close)
}

/// A process's resident set size in KiB (`VmRSS` in `/proc/PID/status`).
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Every member's data and control listener of a job at `epoch` (slot `i` is rank `i`),
/// and the root's.
pub fn listeners(job: &crate::Job, epoch: u64) -> Vec<Listener> {
    let token = job.token();
    let world = job.spec.world;
    let target = |port, rank| Target {
        port,
        comm: token.comm,
        epoch: chorus_protocol::Epoch(epoch),
        world,
        rank,
    };
    let mut out = Vec::new();
    for slot in 0..world as usize {
        let addr = |key: &str| -> Option<SocketAddr> { job.ready(slot).str(key)?.parse().ok() };
        let rank = Some(chorus_protocol::Rank(slot as u32));
        if let Some(a) = addr("data") {
            out.push(Listener {
                addr: a,
                target: target(Port::Data, rank),
            });
        }
        if let Some(a) = addr("control") {
            out.push(Listener {
                addr: a,
                target: target(Port::Control, rank),
            });
        }
    }
    out.push(Listener {
        addr: token.root,
        target: target(Port::Root, None),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance_is_the_code_and_on_quic_the_same_close_code() {
        let pv = CloseCode::PROTOCOL_VIOLATION;
        let refused = |close| Outcome::Refused { code: pv.0, close };
        let want = Expect::Refused(pv);
        assert!(conforms(Port::Data, want, refused(None)));
        assert!(conforms(Port::Control, want, refused(Some(6))));
        assert!(
            !conforms(Port::Control, want, refused(Some(0))),
            "wrong close code"
        );
        assert!(!conforms(Port::Control, want, refused(None)), "left open");
        // The close alone carries the code on QUIC; a TCP end of stream carries none.
        assert!(conforms(
            Port::Root,
            want,
            Outcome::Closed { close: Some(6) }
        ));
        assert!(!conforms(Port::Data, want, Outcome::Closed { close: None }));
        assert!(!conforms(Port::Data, want, Outcome::Silence));
        let dup = Expect::AdmittedThenClosed(CloseCode::DUPLICATE_RANK);
        assert!(conforms(
            Port::Data,
            dup,
            Outcome::AdmittedThenClosed {
                code: 9,
                close: None
            }
        ));
        // A TCP link's close waits (bounded) until the peer has taken its departure, so a
        // loaded listener still sends the code: an end of stream without it is wrong.
        assert!(!conforms(Port::Data, dup, Outcome::AdmittedThenEnded));
        assert!(!conforms(Port::Control, dup, Outcome::AdmittedThenEnded));
        assert!(conforms(Port::Data, Expect::Closed, Outcome::Reset));
        assert!(!conforms(Port::Data, Expect::Closed, Outcome::Silence));
    }
}
