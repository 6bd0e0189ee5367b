//! A bed of hosts: N network namespaces, each with one veth into a bridge namespace and one
//! address (`10.77.0.{i+1}`), each running one node launcher (`chorus run --nnodes N
//! --node-rank i`) in a UTS namespace of its own, so its ranks see a host of their own
//! (another hostname: no same-host pidfd or shm shortcut between hosts).
//!
//! Faults are the ones a cluster has: a host's link cut at the bridge (packets vanish both
//! ways, no error anywhere) or deleted, `tc netem` delay, jitter, loss and duplication on a
//! link, an nftables drop one way only, and SIGSTOP, SIGCONT or SIGKILL of every process of
//! a host at once. [`Bed::vanish`] silences the link *before* it kills, so the kernel's FIN
//! for the dead sockets reaches nobody.
//!
//! A kernel without `sch_netem` still gets delay, jitter, loss and duplication:
//! [`Bed::bad_network`] then builds the hosts on [`crate::wire`]'s userspace router
//! instead of the bridge (each host's link a TUN device), where the same faults work.
//!
//! Ranks are `chorus-test-rank` with `CT_COMMANDS`/`CT_EVENTS` files (the launcher closes
//! their stdin and shares their stdout); a slot is the rank's global first-epoch rank.
//! Dropping the bed kills every process in every host and deletes every namespace (their
//! links go with them), also when a test panics. Names are unique per bed; beds in one
//! process run one at a time (a lock), as jobs do. Where it cannot work (not root, no `ip`, `nft` or `unshare`, no `chorus`
//! binary), [`Bed::new`] says why and the test skips with one line.

#![allow(clippy::print_stderr)] // cleanup trouble goes to the test's stderr

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use crate::clock::mono_ns;
use crate::event::Event;
use crate::wire::{Impairment, Router};

/// The port node 0's launcher hosts the bootstrap root on (each bed has its own network).
pub const MASTER_PORT: u16 = 29400;

/// The nftables table of one-way drops.
const TABLE: &str = "chorus_bed";

static BEDS: AtomicU32 = AtomicU32::new(0);

/// One bed at a time per process: the tests assert detection bounds, and two beds of six
/// looping ranks on a 2-core machine would starve each other's heartbeats.
static SERIAL: Mutex<()> = Mutex::new(());

/// How the job on the bed runs.
#[derive(Clone, Debug)]
pub struct BedJob {
    /// Ranks per host.
    pub per_node: u32,
    /// Environment of every rank and launcher (`CHORUS_*`, `CT_*`).
    pub env: Vec<(String, String)>,
    /// Extra environment of one host's launcher and ranks.
    pub host_env: Vec<(usize, String, String)>,
    /// How long starting (every `ready`) may take.
    pub start_timeout: Duration,
    /// The `chorus-test-rank` executable.
    pub rank: PathBuf,
}

struct Host {
    ns: String,
    /// The host's end of its link (inside `ns`).
    veth: String,
    /// The bridge's end (inside the bridge namespace).
    port: String,
    addr: Ipv4Addr,
    launcher: Option<Child>,
}

/// One slot's report file, read as it grows.
struct Reports {
    path: PathBuf,
    offset: u64,
    partial: String,
    queue: VecDeque<Event>,
    log: Vec<Event>,
}

/// What joins the hosts' links.
enum Fabric {
    /// A bridge in a namespace of its own; each host's veth has its other end there.
    Bridge(String),
    /// [`crate::wire`]'s router in this process; each host's link is a TUN device.
    Router(Router),
    /// Not built yet, or already taken down.
    None,
}

/// A running bed; see the module docs.
pub struct Bed {
    id: String,
    fabric: Fabric,
    hosts: Vec<Host>,
    dir: PathBuf,
    slots: Vec<Reports>,
    per_node: u32,
    /// Ranks started on a host outside its launcher ([`Bed::spawn_rank`]).
    extra: Vec<Child>,
    _serial: MutexGuard<'static, ()>,
}

impl Bed {
    /// [`Bed::new`], or `None` after a skip line naming `what` and why there is no bed.
    pub fn new_or_skip(n: usize, what: &str) -> Option<Bed> {
        Bed::new(n)
            .map_err(|why| crate::skip(&format!("{what}: no host bed ({why})")))
            .ok()
    }

    /// Builds `n` hosts on a bridge; `Err` says why it cannot (the caller skips).
    pub fn new(n: usize) -> Result<Bed, String> {
        let mut bed = Bed::empty()?;
        let br = format!("{}-br", bed.id);
        // From here on Drop removes whatever was made, whatever fails next.
        run("ip", &["netns", "add", &br])?;
        bed.fabric = Fabric::Bridge(br.clone());
        run("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..n {
            bed.add_host(i)?;
            let h = &bed.hosts[i];
            // A fixed address per host, so that [`Bed::pin_neighbours`] needs no lookup.
            let mac = host_mac(i);
            let peer = [
                "link", "add", &h.veth, "address", &mac, "type", "veth", "peer", "name", &h.port,
            ];
            run("ip", &peer)?;
            run("ip", &["link", "set", &h.veth, "netns", &h.ns])?;
            run("ip", &["link", "set", &h.port, "netns", &br])?;
            run("ip", &["-n", &br, "link", "set", &h.port, "master", "br0"])?;
            run("ip", &["-n", &br, "link", "set", &h.port, "up"])?;
            address(h)?;
        }
        Ok(bed)
    }

    /// Builds `n` hosts joined by [`crate::wire`]'s userspace router, every host's link
    /// already impaired by `spec` (netem's words, [`Impairment::parse`]).
    pub fn on_router(n: usize, spec: &[&str]) -> Result<Bed, String> {
        let imp = Impairment::parse(spec)?;
        let mut bed = Bed::empty()?;
        let mut devices = Vec::new();
        // Until the router owns them, the devices close (and vanish) with `devices`; the
        // namespaces are the bed's from `add_host` on.
        for i in 0..n {
            bed.add_host(i)?;
            let h = &bed.hosts[i];
            let dev = crate::wire::open_tun(&bed.ns_path(i), &h.veth)
                .map_err(|e| format!("cannot make TUN device {} in {}: {e}", h.veth, h.ns))?;
            devices.push(dev);
            address(h)?;
        }
        let seed = u64::from(std::process::id()) << 16 | u64::from(BEDS.load(Ordering::Relaxed));
        let router =
            Router::start(devices, seed).map_err(|e| format!("cannot start the router: {e}"))?;
        for i in 0..n {
            router.impair(i, imp);
        }
        bed.fabric = Fabric::Router(router);
        Ok(bed)
    }

    /// `n` hosts with `spec` (netem's words) on every link: `tc netem` on a bridge where
    /// the kernel has it, else [`Bed::on_router`]. Also says which it is, for the report.
    pub fn bad_network(n: usize, spec: &[&str]) -> Result<(Bed, String), String> {
        let bed = Bed::new(n)?;
        match (0..n).find_map(|i| bed.netem(i, spec).err()) {
            None => Ok((bed, format!("tc netem {}", spec.join(" ")))),
            Some(why) => {
                drop(bed);
                let bed = Bed::on_router(n, spec)?;
                let how = format!(
                    "the bed's userspace router with {} (no tc netem here: {why})",
                    spec.join(" ")
                );
                Ok((bed, how))
            }
        }
    }

    /// Host `i`'s namespace, named and made, its loopback up; its link is the caller's.
    fn add_host(&mut self, i: usize) -> Result<(), String> {
        let host = Host {
            ns: format!("{}-h{i}", self.id),
            veth: format!("{}h{i}", self.id),
            port: format!("{}b{i}", self.id),
            addr: Ipv4Addr::new(10, 77, 0, i as u8 + 1),
            launcher: None,
        };
        run("ip", &["netns", "add", &host.ns])?;
        self.hosts.push(host);
        run("ip", &["-n", &self.hosts[i].ns, "link", "set", "lo", "up"])
    }

    /// A bed with no hosts and no fabric yet, once the tools it needs are found.
    fn empty() -> Result<Bed, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (network namespaces)".into());
        }
        for tool in ["ip", "nft", "unshare"] {
            let found = Command::new(tool)
                .arg(if tool == "unshare" { "--version" } else { "-V" })
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok();
            if !found {
                return Err(format!("no `{tool}` (run .ci/netns-deps)"));
            }
        }
        chorus_bin()?;
        let guard = SERIAL.lock();
        let serial = BEDS.fetch_add(1, Ordering::Relaxed);
        // Short (interface names have 15 bytes) and unique: this process, then its beds.
        let id = format!("cb{:04x}{:02x}", std::process::id() & 0xffff, serial & 0xff);
        let dir = std::env::temp_dir().join(format!("chorus-bed-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
        Ok(Bed {
            id,
            fabric: Fabric::None,
            hosts: Vec::new(),
            dir,
            slots: Vec::new(),
            per_node: 0,
            extra: Vec::new(),
            _serial: guard,
        })
    }

    /// Pins every host's neighbour entries for the others (static ARP), so a cut that
    /// heals carries packets at once. Without it, a host whose link was down re-resolves
    /// its peers after the heal, and Linux sends an unresolved neighbour's next ARP request
    /// only once per `retrans_time` (1 s): the first packets after a heal wait 0 to 1 s
    /// for the network, whatever the program above it does (measured on this bed: 10 ms
    /// pinned, 90 to 860 ms not, by the phase of the cut against the ARP timer).
    pub fn pin_neighbours(&self) -> Result<(), String> {
        if matches!(self.fabric, Fabric::Router(_)) {
            return Ok(()); // a TUN device has no neighbours to resolve
        }
        for (i, h) in self.hosts.iter().enumerate() {
            for (j, other) in self.hosts.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (addr, mac) = (other.addr.to_string(), host_mac(j));
                let args = [
                    "-n",
                    &h.ns,
                    "neigh",
                    "replace",
                    &addr,
                    "lladdr",
                    &mac,
                    "dev",
                    &h.veth,
                    "nud",
                    "permanent",
                ];
                run("ip", &args)?;
            }
        }
        Ok(())
    }

    /// What the router has carried and dropped so far (`None` on a bridge).
    pub fn router_counts(&self) -> Option<crate::wire::Counts> {
        match &self.fabric {
            Fabric::Router(r) => Some(r.counts()),
            Fabric::Bridge(_) | Fabric::None => None,
        }
    }

    /// Host `i`'s network namespace, as a path [`crate::wire::in_namespace`] takes.
    pub fn ns_path(&self, i: usize) -> PathBuf {
        Path::new("/run/netns").join(&self.hosts[i].ns)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].addr
    }

    /// Hosts in the bed.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Slots (global ranks) of host `i`.
    pub fn slots_of(&self, i: usize) -> Vec<usize> {
        let k = self.per_node as usize;
        (i * k..(i + 1) * k).collect()
    }

    /// Starts one node launcher per host with `job.per_node` test ranks each, node 0 first,
    /// and waits for every rank's `ready`.
    pub fn launch(&mut self, job: &BedJob) -> Result<(), String> {
        self.start(job)?;
        let until = Instant::now() + job.start_timeout;
        for slot in 0..self.slots.len() {
            let left = until.saturating_duration_since(Instant::now());
            match self.wait_any(slot, &["ready", "init-failed"], left) {
                Some(e) if e.ev() == "ready" => {}
                _ => return Err(format!("slot {slot} not ready: {}", self.diagnose())),
            }
        }
        Ok(())
    }

    /// Starts the node launchers as [`Bed::launch`] does, without waiting for the ranks.
    pub fn start(&mut self, job: &BedJob) -> Result<(), String> {
        let chorus = chorus_bin()?;
        self.per_node = job.per_node;
        let n = self.hosts.len();
        let master = self.master();
        let token = self.dir.join("token");
        self.watch(n * job.per_node as usize);
        for i in 0..n {
            let log = std::fs::File::create(self.dir.join(format!("launcher-{i}.log")))
                .map_err(|e| format!("launcher log: {e}"))?;
            let err = log.try_clone().map_err(|e| format!("launcher log: {e}"))?;
            let mut cmd = self.command(i, &chorus);
            cmd.args([
                "run",
                "--nnodes",
                &n.to_string(),
                "--node-rank",
                &i.to_string(),
            ])
            .args(["--master", &master, "--token-file"])
            .arg(&token)
            .args(["-n", &job.per_node.to_string(), "--"])
            .arg(&job.rank)
            .env("CT_COMMANDS", self.dir.join("cmd-%r"))
            .env("CT_EVENTS", self.dir.join("ev-%r"))
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .envs(
                job.host_env
                    .iter()
                    .filter(|(h, _, _)| *h == i)
                    .map(|(_, k, v)| (k, v)),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot start host {i}: {e}"))?;
            self.hosts[i].launcher = Some(child);
        }
        Ok(())
    }

    /// Follows the report files of slots `0..slots` (`ev-SLOT` in [`Bed::dir`], what
    /// `CT_EVENTS=DIR/ev-%r` names), for ranks started without [`Bed::launch`].
    pub fn watch(&mut self, slots: usize) {
        for slot in self.slots.len()..slots {
            self.slots.push(Reports {
                path: self.dir.join(format!("ev-{slot}")),
                offset: 0,
                partial: String::new(),
                queue: VecDeque::new(),
                log: Vec::new(),
            });
        }
    }

    /// Starts `program` (a `chorus-test-rank`) on host `i` outside its launcher, as the next
    /// slot, with `env` and the bed's command and report files for that slot, binding the
    /// host's address (as a launcher's ranks do); returns the slot. A process that joins a
    /// running job (`CT_JOIN`) after its host came back, say. Dropping the bed kills it.
    pub fn spawn_rank(
        &mut self,
        i: usize,
        program: &Path,
        env: &[(String, String)],
    ) -> Result<usize, String> {
        let slot = self.slots.len();
        self.watch(slot + 1);
        let log = std::fs::File::create(self.dir.join(format!("rank-{slot}.log")))
            .map_err(|e| format!("rank log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("rank log: {e}"))?;
        let mut cmd = self.command(i, program);
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .env("CHORUS_BIND", self.hosts[i].addr.to_string())
            .env("CT_COMMANDS", self.dir.join(format!("cmd-{slot}")))
            .env("CT_EVENTS", self.dir.join(format!("ev-{slot}")))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start a rank on host {i}: {e}"))?;
        self.extra.push(child);
        Ok(slot)
    }

    /// `program` to run on host `i`: in its network namespace, under a UTS namespace with
    /// the host's own hostname. Its processes are the host's ([`Bed::pids`]).
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i].ns, "unshare", "--uts", "--"])
            .args(["sh", "-c", "hostname \"$0\" && exec \"$@\""])
            .arg(format!("{}-host{i}", self.id))
            .arg(program);
        cmd
    }

    /// The address node 0's root listens on (`--master`).
    pub fn master(&self) -> String {
        format!("{}:{MASTER_PORT}", self.hosts[0].addr)
    }

    /// Appends `command` to `slot`'s command file.
    pub fn send(&self, slot: usize, command: &str) {
        let path = self.dir.join(format!("cmd-{slot}"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        if let Ok(mut f) = file {
            let _ = f.write_all(format!("{command}\n").as_bytes());
        }
    }

    /// Sends `command` to every slot in `slots`.
    pub fn send_all(&self, slots: &[usize], command: &str) {
        for &s in slots {
            self.send(s, command);
        }
    }

    /// The next report of `slot` among `evs`, waiting at most `timeout` (reports before it
    /// that are not among `evs` are consumed).
    pub fn wait_any(&mut self, slot: usize, evs: &[&str], timeout: Duration) -> Option<Event> {
        let until = Instant::now() + timeout;
        loop {
            self.read(slot);
            let queue = &mut self.slots[slot].queue;
            while let Some(e) = queue.pop_front() {
                if evs.contains(&e.ev()) {
                    return Some(e);
                }
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every report `slot` made so far.
    pub fn log(&mut self, slot: usize) -> Vec<Event> {
        self.read(slot);
        self.slots[slot].log.clone()
    }

    fn read(&mut self, slot: usize) {
        let r = &mut self.slots[slot];
        let Ok(mut f) = std::fs::File::open(&r.path) else {
            return;
        };
        let mut more = String::new();
        if f.seek(SeekFrom::Start(r.offset)).is_err() || f.read_to_string(&mut more).is_err() {
            return;
        }
        r.offset += more.len() as u64;
        r.partial.push_str(&more);
        while let Some(end) = r.partial.find('\n') {
            let line: String = r.partial.drain(..=end).collect();
            if let Ok(v) = serde_json::from_str(line.trim()) {
                let e = Event(v);
                r.log.push(e.clone());
                r.queue.push_back(e);
            }
        }
    }

    /// What every slot reported and every launcher said, for a failing test's message.
    pub fn diagnose(&mut self) -> String {
        let mut text = String::new();
        for slot in 0..self.slots.len() {
            self.read(slot);
            let tail: Vec<String> = self.slots[slot]
                .log
                .iter()
                .rev()
                .take(6)
                .map(|e| e.to_string())
                .collect();
            text.push_str(&format!("\nslot {slot}: {}", tail.join(" | ")));
        }
        for i in 0..self.hosts.len() {
            let log = std::fs::read_to_string(self.dir.join(format!("launcher-{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            text.push_str(&format!("\nhost {i} launcher: {}", tail.join(" | ")));
        }
        text
    }

    // ---------------------------------------------------------------------------------
    // Faults

    /// Cuts host `i` off at the bridge (or the router): its packets and those to it
    /// vanish, no error.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        self.set_port(i, false)
    }

    /// Undoes [`Bed::cut`].
    pub fn heal(&self, i: usize) -> Result<(), String> {
        self.set_port(i, true)
    }

    fn set_port(&self, i: usize, up: bool) -> Result<(), String> {
        match &self.fabric {
            Fabric::Bridge(br) => {
                let state = if up { "up" } else { "down" };
                run("ip", &["-n", br, "link", "set", &self.hosts[i].port, state])
            }
            Fabric::Router(router) => {
                router.cut(i, !up);
                Ok(())
            }
            Fabric::None => Err("the bed has no fabric".into()),
        }
    }

    /// Takes host `i`'s own link down (the host sees its interface go).
    pub fn link_down(&self, i: usize) -> Result<(), String> {
        let h = &self.hosts[i];
        run("ip", &["-n", &h.ns, "link", "set", &h.veth, "down"])
    }

    /// The host vanishes: link silenced, every process SIGKILLed, link deleted, in that
    /// order with nothing between, so no FIN or RST of its dying sockets reaches anyone.
    /// Returns when (`mono_ns`) the host went silent.
    pub fn vanish(&mut self, i: usize) -> Result<u64, String> {
        self.cut(i)?;
        let at = mono_ns();
        self.signal_host(i, libc::SIGKILL);
        let h = &self.hosts[i];
        if matches!(self.fabric, Fabric::Router(_)) {
            // A TUN device goes with its descriptor, which the router holds; the cut
            // stays, so the host is as gone.
            run("ip", &["-n", &h.ns, "link", "set", &h.veth, "down"])?;
        } else {
            run("ip", &["-n", &h.ns, "link", "del", &h.veth])?;
        }
        if let Some(mut child) = self.hosts[i].launcher.take() {
            reap(&mut child, Duration::from_secs(5));
        }
        Ok(at)
    }

    /// Sends `signal` to every process of host `i` (SIGSTOP, SIGCONT, SIGKILL); returns when
    /// (`mono_ns`) it was sent.
    pub fn signal_host(&self, i: usize, signal: i32) -> u64 {
        let at = mono_ns();
        for pid in self.pids(i) {
            // SAFETY: kill has no memory preconditions; a pid gone meanwhile is ESRCH.
            unsafe { libc::kill(pid, signal) };
        }
        at
    }

    /// Every process in host `i`'s network namespace.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.hosts[i].ns])
            .stderr(Stdio::null())
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
    }

    /// `tc netem` on both ends of host `i`'s link (`["delay", "20ms", "5ms", "loss", "1%"]`):
    /// traffic from and to the host. On a bridge, `Err` if the kernel has no netem (see
    /// [`Bed::bad_network`]); on the router, the router's own impairment.
    pub fn netem(&self, i: usize, spec: &[&str]) -> Result<(), String> {
        let h = &self.hosts[i];
        let br = match &self.fabric {
            Fabric::Bridge(br) => br,
            Fabric::Router(router) => {
                router.impair(i, Impairment::parse(spec)?);
                return Ok(());
            }
            Fabric::None => return Err("the bed has no fabric".into()),
        };
        for (ns, dev) in [(&h.ns, &h.veth), (br, &h.port)] {
            let mut args = vec!["-n", ns.as_str(), "qdisc", "replace", "dev", dev.as_str()];
            args.extend(["root", "netem"]);
            args.extend_from_slice(spec);
            run("tc", &args)?;
        }
        Ok(())
    }

    /// Drops every packet from host `from` arriving at host `to` (the other way still
    /// flows).
    pub fn drop_one_way(&self, from: usize, to: usize) -> Result<(), String> {
        let ns = &self.hosts[to].ns;
        let _ = run(
            "ip",
            &["netns", "exec", ns, "nft", "add", "table", "inet", TABLE],
        );
        let chain = format!("add chain inet {TABLE} in {{ type filter hook input priority 0 ; }}");
        let _ = run("ip", &["netns", "exec", ns, "nft", &chain]);
        let rule = format!(
            "add rule inet {TABLE} in ip saddr {} drop",
            self.hosts[from].addr
        );
        run("ip", &["netns", "exec", ns, "nft", &rule])
    }

    /// Removes every one-way drop at host `to`.
    pub fn allow(&self, to: usize) -> Result<(), String> {
        let ns = &self.hosts[to].ns;
        run(
            "ip",
            &["netns", "exec", ns, "nft", "delete", "table", "inet", TABLE],
        )
    }

    /// Waits (bounded) for host `i`'s launcher to exit; its exit code.
    pub fn wait_launcher(&mut self, i: usize, timeout: Duration) -> Option<i32> {
        let child = self.hosts[i].launcher.as_mut()?;
        let until = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.hosts[i].launcher = None;
                return status.code();
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The bed's scratch directory (token, command and report files, launcher logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for i in 0..self.hosts.len() {
            // Frozen processes die of SIGKILL too.
            self.signal_host(i, libc::SIGKILL);
            if let Some(mut child) = self.hosts[i].launcher.take() {
                reap(&mut child, Duration::from_secs(5));
            }
        }
        for mut child in std::mem::take(&mut self.extra) {
            reap(&mut child, Duration::from_secs(5));
        }
        // The router's devices close with it, before their namespaces go.
        let bridge = match std::mem::replace(&mut self.fabric, Fabric::None) {
            Fabric::Bridge(br) => Some(br),
            Fabric::Router(_) | Fabric::None => None,
        };
        for ns in self.hosts.iter().map(|h| h.ns.clone()).chain(bridge) {
            if let Err(e) = run("ip", &["netns", "del", &ns]) {
                eprintln!("cannot delete network namespace {ns}: {e}");
            }
        }
        if std::env::var_os("CHORUS_TESTS_KEEP").is_some() {
            eprintln!("kept the bed's files in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn reap(child: &mut Child, limit: Duration) {
    let _ = child.kill();
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("process {} not reaped within {limit:?}", child.id());
}

/// The `chorus` binary: `CHORUS_BIN`, or beside this test's executables (`cargo build -p
/// chorus-cli` puts it there).
pub fn chorus_bin() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("CHORUS_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| format!("no current exe: {e}"))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Test executables live in target/debug/deps, binaries in target/debug.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("chorus");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no chorus binary at {} (cargo build -p chorus-cli)",
            path.display()
        ))
    }
}

/// Host `i`'s link-layer address: locally administered, unique in the bed.
fn host_mac(i: usize) -> String {
    format!("02:77:00:00:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)
}

/// Gives host `h` its address on its link and brings the link up.
fn address(h: &Host) -> Result<(), String> {
    let cidr = format!("{}/24", h.addr);
    run("ip", &["-n", &h.ns, "addr", "add", &cidr, "dev", &h.veth])?;
    run("ip", &["-n", &h.ns, "link", "set", &h.veth, "up"])
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
