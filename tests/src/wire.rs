//! The bed's userspace network, for kernels without `sch_netem`: each host's one link is a
//! TUN device in its namespace, and a router thread in the test process carries IPv4
//! packets between them, applying per host what `tc netem` would on both ends of a veth
//! (delay with jitter, loss, duplication) and cutting a host off when told.
//!
//! Two layers, as the lower floors are built:
//! - [`Model`] decides, without IO, what becomes of one packet from host `a` to host `b`:
//!   dropped, or delivered once or more, each copy at its own time. A packet crosses two
//!   links, `a`'s and `b`'s, so it passes `a`'s impairment and then `b`'s, as it would
//!   pass netem on the sender's veth and then on the receiver's bridge port; a cut of either
//!   host drops it. Seeded, so a test of it is exact.
//! - [`Router`] reads each TUN device, asks the model, holds delayed copies in a time
//!   heap (at most [`HELD`] packets) and writes each to its destination's device when it is due. It stops, and its
//!   devices go with their descriptors, when it is dropped.
//!
//! Jitter is uniform in `delay ± jitter` and reorders packets, as netem's does when no rate
//! is set. Only IPv4 between the bed's addresses (`10.77.0.{i+1}`) is carried; anything else
//! a host sends (IPv6 solicitations) is dropped and counted.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one host's link does to the packets crossing it (netem's knobs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairment {
    pub delay: Duration,
    /// Each packet's delay is uniform in `delay ± jitter` (never below zero).
    pub jitter: Duration,
    /// Probability that a packet is lost, in `[0, 1]`.
    pub loss: f64,
    /// Probability that a packet is sent twice, in `[0, 1]`.
    pub duplicate: f64,
}

impl Impairment {
    /// Parses netem's argument words: `delay TIME [JITTER]`, `loss PERCENT`, `duplicate
    /// PERCENT`, in any order (`["delay", "20ms", "5ms", "loss", "1%"]`). Anything else,
    /// or a value out of range, is an error naming it.
    pub fn parse(spec: &[&str]) -> Result<Impairment, String> {
        let mut imp = Impairment::default();
        let mut words = spec.iter().copied().peekable();
        while let Some(word) = words.next() {
            let mut value = || {
                words
                    .next()
                    .ok_or_else(|| format!("`{word}` needs a value"))
            };
            match word {
                "delay" => {
                    imp.delay = time(value()?)?;
                    if let Some(j) = words.peek().and_then(|w| time(w).ok()) {
                        imp.jitter = j;
                        words.next();
                    }
                }
                "loss" => imp.loss = percent(value()?)?,
                "duplicate" => imp.duplicate = percent(value()?)?,
                other => return Err(format!("unknown impairment `{other}` in {spec:?}")),
            }
        }
        Ok(imp)
    }

    /// One packet's delay on this link.
    fn sample(&self, rng: &mut impl Rng) -> Duration {
        if self.jitter.is_zero() {
            return self.delay;
        }
        let j = self.jitter.as_secs_f64();
        let d = self.delay.as_secs_f64() + rng.random_range(-j..=j);
        Duration::from_secs_f64(d.max(0.0))
    }
}

/// `20ms`, `1.5s`, `300us`.
fn time(word: &str) -> Result<Duration, String> {
    let bad = || format!("`{word}` is not a time (20ms, 1s, 300us)");
    let (num, scale) = if let Some(n) = word.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = word.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = word.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad());
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 || v * scale > 3600.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// `1%` (or a bare `1`, as netem takes it) as a probability.
fn percent(word: &str) -> Result<f64, String> {
    let v: f64 = word
        .strip_suffix('%')
        .unwrap_or(word)
        .parse()
        .map_err(|_| format!("`{word}` is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{word}` is not within 0–100 %"));
    }
    Ok(v / 100.0)
}

/// The sans-IO half: per host, its link's impairment and whether it is cut.
pub struct Model {
    links: Vec<(Impairment, bool)>,
    rng: ChaCha8Rng,
}

impl Model {
    /// `hosts` clean, uncut links; `seed` fixes every random choice.
    pub fn new(hosts: usize, seed: u64) -> Model {
        Model {
            links: vec![(Impairment::default(), false); hosts],
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    pub fn impair(&mut self, host: usize, imp: Impairment) {
        self.links[host].0 = imp;
    }

    pub fn cut(&mut self, host: usize, cut: bool) {
        self.links[host].1 = cut;
    }

    /// When each copy of a packet from `from` to `to` sent at `now` arrives: empty if it
    /// is lost or either host is cut.
    pub fn route(&mut self, from: usize, to: usize, now: Instant) -> Vec<Instant> {
        let (Some(&(a, cut_a)), Some(&(b, cut_b))) = (self.links.get(from), self.links.get(to))
        else {
            return Vec::new();
        };
        if cut_a || cut_b {
            return Vec::new();
        }
        // Through the sender's link, then each copy through the receiver's.
        let mut out = Vec::with_capacity(1);
        for first in self.cross(&a, now) {
            out.extend(self.cross(&b, first));
        }
        out
    }

    /// The copies one link lets through, and when.
    fn cross(&mut self, imp: &Impairment, at: Instant) -> Vec<Instant> {
        if imp.loss > 0.0 && self.rng.random_bool(imp.loss) {
            return Vec::new();
        }
        let copies = if imp.duplicate > 0.0 && self.rng.random_bool(imp.duplicate) {
            2
        } else {
            1
        };
        (0..copies)
            .map(|_| at + imp.sample(&mut self.rng))
            .collect()
    }
}

/// Packets the router has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub delivered: u64,
    /// Lost to an impairment, a cut, or the router's limit ([`HELD`]).
    pub dropped: u64,
    /// Not IPv4 to a bed address, or the destination would not take it.
    pub refused: u64,
}

struct Shared {
    model: Mutex<Model>,
    counts: Mutex<Counts>,
    stop: AtomicBool,
}

/// The router thread over one TUN device per host; see the module docs.
pub struct Router {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The base of the bed's addresses: host `i` is `10.77.0.{i+1}`.
const NET: [u8; 3] = [10, 77, 0];

/// How long the router sleeps at most between looks at its stop flag.
const TICK: Duration = Duration::from_millis(10);

/// Packets the router holds at most, over all links (netem's `limit`, 1000 per link by
/// default): past it a packet is dropped, so a flood cannot grow the router without end.
/// 10 000 full packets are 15 MB, far above what the bed's jobs keep in flight.
const HELD: usize = 10_000;

impl Router {
    /// Starts routing between `devices` (host `i`'s TUN device is `devices[i]`).
    pub fn start(devices: Vec<OwnedFd>, seed: u64) -> io::Result<Router> {
        for d in &devices {
            set_nonblocking(d)?;
        }
        let shared = Arc::new(Shared {
            model: Mutex::new(Model::new(devices.len(), seed)),
            counts: Mutex::new(Counts::default()),
            stop: AtomicBool::new(false),
        });
        let inner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("bed-router".into())
            .spawn(move || route_loop(&inner, &devices))?;
        Ok(Router {
            shared,
            thread: Some(thread),
        })
    }

    pub fn impair(&self, host: usize, imp: Impairment) {
        self.shared.model.lock().impair(host, imp);
    }

    pub fn cut(&self, host: usize, cut: bool) {
        self.shared.model.lock().cut(host, cut);
    }

    pub fn counts(&self) -> Counts {
        *self.shared.counts.lock()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A packet waiting for its time.
struct Due {
    at: Instant,
    /// Arrival order among equal times.
    seq: u64,
    to: usize,
    packet: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Where an IPv4 packet goes: the host index of its destination, if it is a bed address.
fn destination(packet: &[u8], hosts: usize) -> Option<usize> {
    if packet.len() < 20 || packet[0] >> 4 != 4 || packet[16..19] != NET {
        return None;
    }
    let i = usize::from(packet[19]).checked_sub(1)?;
    (i < hosts).then_some(i)
}

fn route_loop(shared: &Shared, devices: &[OwnedFd]) {
    let mut heap: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut polls: Vec<libc::pollfd> = devices
        .iter()
        .map(|d| libc::pollfd {
            fd: d.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse(d)| d.at <= now) {
            let Some(Reverse(d)) = heap.pop() else { break };
            // SAFETY: the descriptor is open (owned by `devices`) and the slice is valid.
            let n = unsafe {
                libc::write(
                    devices[d.to].as_raw_fd(),
                    d.packet.as_ptr().cast(),
                    d.packet.len(),
                )
            };
            let mut counts = shared.counts.lock();
            if n == d.packet.len() as isize {
                counts.delivered += 1;
            } else {
                counts.refused += 1;
            }
        }
        let wait = heap
            .peek()
            .map_or(TICK, |Reverse(d)| d.at.saturating_duration_since(now))
            .min(TICK);
        // Round up, so a packet due in 0.3 ms is not polled for in a busy loop of zeros.
        let ms = wait.as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: `polls` is a valid array of its length.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
        if ready <= 0 {
            continue;
        }
        for (from, p) in polls.iter_mut().enumerate() {
            if p.revents == 0 {
                continue;
            }
            p.revents = 0;
            loop {
                // SAFETY: the descriptor is open and `buf` is writable for its length.
                let n = unsafe { libc::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) };
                let Ok(len) = usize::try_from(n) else { break };
                if len == 0 {
                    break;
                }
                let packet = &buf[..len];
                let Some(to) = destination(packet, devices.len()) else {
                    shared.counts.lock().refused += 1;
                    continue;
                };
                let mut times = shared.model.lock().route(from, to, Instant::now());
                times.truncate(HELD.saturating_sub(heap.len()));
                if times.is_empty() {
                    shared.counts.lock().dropped += 1;
                }
                for at in times {
                    seq += 1;
                    heap.push(Reverse(Due {
                        at,
                        seq,
                        to,
                        packet: packet.to_vec(),
                    }));
                }
            }
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an open descriptor with integer arguments.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0
        || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread of its own inside the network namespace at `ns`
/// (`/run/netns/NAME`), so the caller's thread stays where it was. Sockets and devices `f`
/// makes belong to that namespace for good.
pub fn in_namespace<T: Send>(ns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = File::open(ns)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns on this thread only, with a namespace descriptor we opened.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

/// Creates the TUN device `name` (IPv4 packets, no packet-information header) inside the
/// network namespace at `ns` (`/run/netns/NAME`); the device lives until the descriptor is
/// closed.
pub fn open_tun(ns: &Path, name: &str) -> io::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "interface name {name:?} is longer than {} bytes",
                libc::IFNAMSIZ - 1
            ),
        ));
    }
    in_namespace(ns, || {
        // SAFETY: a NUL-terminated path and plain flags.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor we just opened and own from here on.
        let dev = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero is a valid ifreq.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `req` is.
        if unsafe { libc::ioctl(dev.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(dev)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_netems_words_and_names_what_it_refuses() {
        let imp = Impairment::parse(&["delay", "20ms", "5ms", "loss", "1%"]).unwrap();
        assert_eq!(imp.delay, Duration::from_millis(20));
        assert_eq!(imp.jitter, Duration::from_millis(5));
        assert!((imp.loss - 0.01).abs() < 1e-12);
        let imp = Impairment::parse(&["loss", "0.5", "delay", "1s", "duplicate", "2%"]).unwrap();
        assert_eq!(
            (imp.delay, imp.jitter),
            (Duration::from_secs(1), Duration::ZERO)
        );
        assert!((imp.loss - 0.005).abs() < 1e-12 && (imp.duplicate - 0.02).abs() < 1e-12);
        for (spec, names) in [
            (&["rate", "1mbit"][..], "rate"),
            (&["loss", "101%"][..], "101%"),
            (&["delay", "20"][..], "20"),
            (&["delay"][..], "delay"),
            (&["loss", "-1%"][..], "-1%"),
        ] {
            let e = Impairment::parse(spec).unwrap_err();
            assert!(e.contains(names), "{spec:?}: {e}");
        }
    }

    #[test]
    fn a_packet_crosses_both_links_and_each_one_delays_it() {
        let mut m = Model::new(3, 7);
        let imp = Impairment::parse(&["delay", "20ms", "5ms"]).unwrap();
        m.impair(0, imp);
        m.impair(1, imp);
        let t0 = Instant::now();
        for _ in 0..10_000 {
            let at = m.route(0, 1, t0);
            assert_eq!(at.len(), 1);
            let d = at[0] - t0;
            assert!(
                d >= Duration::from_millis(30) && d <= Duration::from_millis(50),
                "{d:?}"
            );
        }
        // Host 2's link is clean: only host 0's delay.
        for _ in 0..1000 {
            let d = m.route(0, 2, t0)[0] - t0;
            assert!(
                d >= Duration::from_millis(15) && d <= Duration::from_millis(25),
                "{d:?}"
            );
        }
        assert_eq!(m.route(2, 2, t0), vec![t0], "a clean path is immediate");
    }

    #[test]
    fn loss_and_duplication_come_at_their_rates() {
        let mut m = Model::new(2, 11);
        m.impair(
            0,
            Impairment::parse(&["loss", "1%", "duplicate", "2%"]).unwrap(),
        );
        let t0 = Instant::now();
        let (mut lost, mut doubled) = (0u32, 0u32);
        let n = 200_000;
        for _ in 0..n {
            match m.route(0, 1, t0).len() {
                0 => lost += 1,
                1 => {}
                2 => doubled += 1,
                k => panic!("{k} copies"),
            }
        }
        // 1 % of 200 000 is 2000 (sd ~45), 2 % of the rest about 3960 (sd ~62).
        assert!((1800..2200).contains(&lost), "{lost}");
        assert!((3700..4250).contains(&doubled), "{doubled}");
    }

    #[test]
    fn a_cut_host_sends_and_receives_nothing_until_healed() {
        let mut m = Model::new(3, 1);
        let t0 = Instant::now();
        m.cut(1, true);
        assert!(m.route(0, 1, t0).is_empty());
        assert!(m.route(1, 2, t0).is_empty());
        assert_eq!(m.route(0, 2, t0).len(), 1, "the others still talk");
        m.cut(1, false);
        assert_eq!(m.route(0, 1, t0).len(), 1);
        assert!(m.route(0, 9, t0).is_empty(), "no such host");
    }

    #[test]
    fn only_ipv4_to_a_bed_address_is_routed() {
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[16..20].copy_from_slice(&[10, 77, 0, 2]);
        assert_eq!(destination(&p, 3), Some(1));
        p[19] = 4;
        assert_eq!(destination(&p, 3), None, "past the last host");
        p[19] = 0;
        assert_eq!(destination(&p, 3), None, "10.77.0.0 is no host");
        p[19] = 1;
        p[0] = 0x60;
        assert_eq!(destination(&p, 3), None, "IPv6");
        assert_eq!(destination(&p[..10], 3), None, "truncated");
    }
}
