//! Transport configuration: plain data. Parsing it from the environment is the runtime's job.

use std::time::Duration;

use chorus_protocol::Limits;

/// Which event engine drives TCP links.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub enum Backend {
    /// io_uring when the kernel lets us set up a ring, epoll otherwise.
    #[default]
    Auto,
    /// io_uring only; creating the transport fails if the ring cannot be set up.
    Uring,
    /// epoll (tokio) only.
    Epoll,
}

/// Bounded, exponentially backed-off retries for `connect`.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Ceiling for any single delay.
    pub max: Duration,
    /// Attempts in all (the first one included); the connect deadline bounds them too.
    pub attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(500),
            attempts: 12,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (0-based), doubling from `initial` up to `max`.
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(16)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Everything a transport needs to know; `Default` gives the values chorus ships with.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TransportConfig {
    /// Event engine for TCP links.
    pub backend: Backend,
    /// A connecting or accepted connection must finish the handshake within this.
    pub handshake_timeout: Duration,
    /// `connect` gives up (retries included) after this.
    pub connect_timeout: Duration,
    /// Retry schedule for refused or unreachable connects.
    pub backoff: Backoff,
    /// `SO_SNDBUF` / `SO_RCVBUF` requested for TCP sockets (the kernel may clamp them).
    pub socket_buffer: usize,
    /// When the io_uring backend sends a payload with `IORING_OP_SEND_ZC`.
    pub zero_copy_threshold: ZeroCopy,
    /// Bytes that arrived before their `recv` was posted that a link holds (each arrival
    /// also counts 64 bytes of bookkeeping, so empty ones are bounded too); past this the
    /// link fails with `LinkError::Overflow` and closes with a protocol-violation code.
    pub held_limit: u64,
    /// Bytes a link accepts from `send` callers before the wire has taken them; `send`
    /// waits (cancellably) past it.
    pub send_window: u64,
    /// Largest chunk payload a peer may announce; larger frames close the connection. Both
    /// ends must agree (it is the codec's `Limits::max_chunk_payload`); the default is the
    /// protocol's.
    pub max_chunk: u32,
    /// Budget of a link's close (`cancel`, drop): the frame part-way out, the departure
    /// after it and the peer's taking of both (see `tcp/teardown.rs`), before the
    /// connection is shut regardless. A reading peer sees the departure however loaded it
    /// is, within this; one that stops reading holds the close this long, never more. The
    /// runtime sets it to half its teardown budget.
    pub depart_timeout: Duration,
    /// Size of each registered io_uring buffer slot (the ring's sends of small frames that
    /// could not be written directly).
    pub uring_slot: usize,
    /// Number of registered buffer slots per ring.
    pub uring_slots: u16,
    /// Submission queue depth per ring.
    pub uring_entries: u32,
    /// How long the io_uring progress thread spins on its completion queue before it sleeps
    /// in the kernel. Spinning saves the wake-up of a sleeping thread (several µs) on every
    /// receive that arrives within the window, at the cost of a busy core while it lasts;
    /// zero never spins.
    pub busy_poll: Duration,
    /// How long a TCP `recv` that finds nothing held reads the socket itself (non-blocking,
    /// yielding the core between tries) before it parks and leaves the socket to the
    /// progress thread. A message that lands within the window reaches the caller with no
    /// thread hop, which is most of a small message's latency; the cost is a caller that
    /// polls for up to this long, and an operation whose abort is noticed up to this much
    /// later. Each link narrows its window (to a sixteenth of this) while spins keep
    /// missing, and widens it back as they catch. Zero parks at once.
    pub recv_spin: Duration,
    /// Bytes of each direction's ring in a shared-memory segment (rounded up to a power
    /// of two); also the largest ring an accepted segment may declare. A frame larger than
    /// the ring streams through it in pieces.
    ///
    /// The default, 2 MiB (eight of the engine's 256 KiB chunks), is a trade between two
    /// effects measured on the 2-core, 32 MiB-L3 machine. A ring is written and read
    /// circularly, so all of it cycles through both ends' caches, and a rank of a 4-rank
    /// ring all-reduce uses a ring to each neighbour and from each: with 4 MiB rings (the
    /// default until 2026-12-06) a 4-rank, 2 MiB all-reduce spent over half its time in
    /// `memcpy`, the copies into the rings 1.6 times as long as the copies out, and
    /// smaller rings made it faster. Between two ranks at 8–512 KiB, though, 1 MiB rings
    /// were slower than larger ones. In-place µs, `chorus bench all-reduce --transport
    /// shm`, binaries differing only in this default alternated in four rounds, segments
    /// pre-faulted (then at set-up; `Segment::prefault` now does it as a link starts),
    /// median (range; the machine had a slow spell in one round):
    ///
    /// | ranks | size | 4 MiB | 2 MiB | 1 MiB |
    /// |---|---|---|---|---|
    /// | 2 | 32 KiB | 3.5 (3.4–5.8) | 3.7 (3.3–14.7) | 5.7 (4.4–20.3) |
    /// | 2 | 128 KiB | 11.4 (10.4–14.8) | 11.1 (10.6–57.9) | 16.8 (12.7–92.0) |
    /// | 2 | 512 KiB | 39.1 (36.0–50.2) | 37.5 (37.3–297.6) | 48.2 (44.6–266.6) |
    /// | 2 | 2 MiB | 169 (152–188) | 152 (148–868) | 194 (150–1010) |
    /// | 4 | 128 KiB | 125 (87–133) | 80 (65–125) | 103 (81–209) |
    /// | 4 | 512 KiB | 367 (296–449) | 284 (202–357) | 374 (136–852) |
    /// | 4 | 2 MiB | 1798 (1667–2053) | 1390 (1186–2631) | 1196 (941–2535) |
    /// | 4 | 8 MiB | 7343 (7119–8459) | 6537 (5286–9415) | 5369 (3973–5729) |
    ///
    /// (`-n 2 -b 8K -e 8M -f 4 -w 50 -i 300`, `-n 4 -b 32K -e 8M -f 4 -w 10 -i 60`.)
    /// Without pre-faulting, six rounds of `-n 4 -b 512K -e 8M -f 4 -w 10 -i 100` gave the
    /// same order at 4 ranks (2 MiB: 1445, 1019 and 904 µs) and 512 KiB or 256 KiB rings
    /// lost everywhere (the writer of a 256 KiB chunk waits for the reader sooner, and on a
    /// crowded core a wait is a switch).
    pub shm_ring: usize,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            socket_buffer: 4 << 20,
            zero_copy_threshold: ZeroCopy::default(),
            held_limit: 1 << 30,
            send_window: 64 << 20,
            max_chunk: Limits::DEFAULT.max_chunk_payload,
            depart_timeout: Duration::from_secs(1),
            uring_slot: 64 << 10,
            uring_slots: 64,
            uring_entries: 256,
            busy_poll: Duration::ZERO,
            recv_spin: Duration::from_micros(50),
            shm_ring: 2 << 20,
        }
    }
}

impl TransportConfig {
    /// The codec limits both ends of every stream enforce: the protocol's defaults with this
    /// configuration's chunk bound.
    pub fn limits(&self) -> Limits {
        Limits {
            max_chunk_payload: self.max_chunk,
            ..Limits::DEFAULT
        }
    }
}

/// Payload sizes at or above which the io_uring backend uses `SEND_ZC`, per path. The
/// default is never, on every path, because zero-copy lost wherever it was measured:
///
/// - on loopback a copying send beat `SEND_ZC` at every size from 16 KiB to 4 MiB
///   (`cargo bench -p chorus-benches --bench transport`): the loopback receiver copies
///   anyway, so zero-copy only adds page pinning and a second completion;
/// - across two network namespaces joined by a veth pair (`benches/peer/netns.sh`), the same
///   `chorus bench` with a 256 KiB remote threshold against never, alternated, 2 rounds each
///   (2026-12-02): 8 MiB all-reduce 11.0–13.4 → 6.4–7.2 ms at 2 ranks and 31–35 → 18–19 ms
///   at 4 ranks; 2 MiB at 4 ranks 8.0–8.1 → 5.1–5.5 ms. A veth peer copies like loopback.
///
/// Over a physical NIC the kernel can send from the pinned pages and zero-copy may win; that
/// has not been measured (no NIC on the test machine), so set `remote` per fabric after
/// measuring it.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct ZeroCopy {
    /// Threshold for peers on a loopback address (`usize::MAX`: never).
    pub loopback: usize,
    /// Threshold for every other peer.
    pub remote: usize,
}

impl Default for ZeroCopy {
    fn default() -> Self {
        Self {
            loopback: usize::MAX,
            remote: usize::MAX,
        }
    }
}

impl ZeroCopy {
    /// The same threshold for every path.
    pub const fn always_from(bytes: usize) -> Self {
        Self {
            loopback: bytes,
            remote: bytes,
        }
    }

    pub(crate) fn effective(&self, loopback: bool) -> usize {
        if loopback { self.loopback } else { self.remote }
    }
}

/// Liveness values the QUIC transport derives its idle timeout and keep-alive from.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Liveness {
    /// How often the control plane expects to hear from a peer.
    pub heartbeat_interval: Duration,
    /// Silence after which the control plane declares a peer dead.
    pub deadline: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(250),
            deadline: Duration::from_secs(3),
        }
    }
}

impl Liveness {
    /// QUIC idle timeout: the detector's deadline plus one interval, so the detector, which
    /// names the peer and the evidence, always fires first; the connection then dies too.
    pub fn idle_timeout(&self) -> Duration {
        self.deadline + self.heartbeat_interval
    }

    /// QUIC keep-alive: half the heartbeat interval, so an idle data connection never
    /// looks silent to a middlebox or to the idle timer.
    pub fn keep_alive(&self) -> Duration {
        (self.heartbeat_interval / 2).max(Duration::from_millis(10))
    }

    /// The round trip QUIC assumes before its first sample: a quarter of the heartbeat
    /// interval (at most RFC 9002's 333 ms). It sets when a lost handshake packet is sent
    /// again (three of it): with the RFC's value a connection opened into a cut that then
    /// heals waits a second for its first resend, far longer than the heartbeats the
    /// liveness contract is built on. Too small an estimate on a slow path costs one
    /// early resend of a handshake packet; samples replace it after the first answer.
    pub fn initial_rtt(&self) -> Duration {
        (self.heartbeat_interval / 4).clamp(Duration::from_millis(1), Duration::from_millis(333))
    }

    /// How often a QUIC connect that no one has answered starts a fresh handshake: every
    /// heartbeat interval (at least 10 ms). A member healed from a cut is then heard
    /// within about one interval, as its heartbeats would be, rather than at the next of
    /// a backed-off handshake's resends; on a path slower than that, an extra attempt or
    /// two is all it costs.
    pub fn hedge_every(&self) -> Duration {
        self.heartbeat_interval.max(Duration::from_millis(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), Duration::from_millis(10));
        assert_eq!(b.delay(1), Duration::from_millis(20));
        assert_eq!(b.delay(5), Duration::from_millis(320));
        assert_eq!(b.delay(6), Duration::from_millis(500));
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(500));
    }

    #[test]
    fn quic_timers_follow_liveness() {
        let l = Liveness::default();
        assert!(l.idle_timeout() > l.deadline);
        assert!(l.keep_alive() < l.heartbeat_interval);
        // A handshake packet lost into a cut is resent within an interval, not a second.
        assert!(3 * l.initial_rtt() < l.heartbeat_interval, "{l:?}");
        let slow = Liveness {
            heartbeat_interval: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
        };
        assert_eq!(
            slow.initial_rtt(),
            Duration::from_millis(333),
            "RFC 9002's at most"
        );
    }
}
