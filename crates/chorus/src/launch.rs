//! Launch-environment detection: which rank am I, how many are we, where is the root.
//!
//! `Comm::from_env` understands the environments launchers already set, in this order of
//! precedence: chorus's own `CHORUS_*` (set by `chorus run`), torchrun's
//! `RANK`/`WORLD_SIZE`/`LOCAL_RANK`/`MASTER_ADDR`/`MASTER_PORT`, Slurm's `SLURM_*`, and Open
//! MPI's `OMPI_COMM_WORLD_*`. Rank and world size always come from one launcher's pair of
//! variables, never mixed. The root comes from `CHORUS_UNIQUE_ID` (a token: address,
//! fingerprint, secret, comm id), else `CHORUS_ROOT` or `MASTER_ADDR:MASTER_PORT`, else the
//! first host of Slurm's node list.
//!
//! Without a token the job secret comes from `CHORUS_SECRET` (64 hexadecimal digits) or
//! `CHORUS_SECRET_FILE` (a file holding them that only its owner may read). Failing both, a
//! secret derived from the job's identity (root address, job ids) is allowed only while the
//! root listens on loopback: anyone who can reach a wider address can compute it too. Rank 0
//! binds the root to the address the ranks were told, not to every interface, unless
//! `CHORUS_ROOT_BIND` names another (e.g. `0.0.0.0`). `CHORUS_INSECURE_DERIVED_SECRET=1`
//! accepts a derived secret anyway, with a warning.

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use chorus_protocol::Rank;
use sha2::{Digest, Sha256};

use chorus_protocol::JobSecret;

use crate::unique_id::{UniqueId, secret_from_hex};

/// The largest world this version accepts from an environment variable.
pub const MAX_WORLD: u32 = 1 << 20;

/// Which launcher's variables gave the rank and world size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    /// `chorus run` (`CHORUS_*`).
    Chorus,
    /// torchrun (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...).
    Torchrun,
    /// Slurm (`SLURM_*`).
    Slurm,
    /// Open MPI (`OMPI_COMM_WORLD_*`).
    OpenMpi,
}

impl fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaunchSource::Chorus => "chorus",
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::Slurm => "slurm",
            LaunchSource::OpenMpi => "open-mpi",
        })
    }
}

/// How to reach and trust the bootstrap root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootSpec {
    /// A full token: address, fingerprint, secret, comm id.
    Token(UniqueId),
    /// A host and port; the secret is given or derived, the root certificate is derived
    /// from the secret.
    Address {
        /// The root's host name or address.
        host: String,
        /// The root's port.
        port: u16,
        /// `host:port`, resolved: where the ranks connect.
        addr: SocketAddr,
        /// Where rank 0's root listens: `addr`, or `CHORUS_ROOT_BIND` with the same port.
        bind: SocketAddr,
        /// The job secret.
        secret: JobSecret,
        /// Where the secret came from (given, from a file, or derived from public values).
        secret_from: SecretSource,
    },
}

/// Where the job secret of a [`RootSpec::Address`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// `CHORUS_SECRET`.
    Env,
    /// `CHORUS_SECRET_FILE`.
    File(PathBuf),
    /// Derived from the launch environment while the root binds loopback.
    Derived,
    /// Derived while the root binds a wider address, under
    /// `CHORUS_INSECURE_DERIVED_SECRET=1`: anyone who can reach the root can join.
    DerivedInsecure,
}

/// What the environment says about this process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Which launcher's variables gave the rank and world size.
    pub source: LaunchSource,
    /// This process's rank.
    pub rank: Rank,
    /// The number of ranks.
    pub world: u32,
    /// This process's rank on its host, if the launcher says.
    pub local_rank: Option<u32>,
    /// The number of ranks on this host, if the launcher says.
    pub local_world: Option<u32>,
    /// Where the bootstrap root is.
    pub root: RootSpec,
}

/// The environment does not describe a usable launch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// No launcher's variables are set.
    #[error(
        "no launch environment: set CHORUS_RANK and CHORUS_WORLD_SIZE (or use chorus run, torchrun, srun or mpirun)"
    )]
    NoRank,
    /// A launcher's variables give a rank but not everything else.
    #[error("{launcher} launch gives a rank but no {missing}")]
    Incomplete {
        /// The launcher.
        launcher: LaunchSource,
        /// The variable it lacks.
        missing: &'static str,
    },
    /// A variable holds an unusable value.
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The rank is not below the world size.
    #[error("{launcher} launch: rank {rank} is not below the world size {world}")]
    RankOutOfRange {
        /// The launcher.
        launcher: LaunchSource,
        /// The rank it gave.
        rank: u32,
        /// The world size it gave.
        world: u32,
    },
    /// Nothing says where the bootstrap root is.
    #[error(
        "no root address: set CHORUS_UNIQUE_ID, CHORUS_ROOT=host:port or MASTER_ADDR and MASTER_PORT"
    )]
    NoRoot,
    #[error(
        "no job secret, and the root binds {bind}, not loopback, so a secret derived from the \
         launch environment would admit anyone who can reach it: set CHORUS_SECRET (64 hex \
         digits) or CHORUS_SECRET_FILE (a file only its owner can read), or launch with \
         chorus run or the torch backend's store (CHORUS_INSECURE_DERIVED_SECRET=1 accepts \
         the risk)"
    )]
    /// A secret derived from public values was refused because the root binds `bind`.
    DerivedSecretRefused {
        /// The address the root would listen on.
        bind: IpAddr,
    },
    #[error("CHORUS_SECRET_FILE={}: {reason}", path.display())]
    /// `CHORUS_SECRET_FILE` names a file that cannot be used.
    SecretFile {
        /// The file.
        path: PathBuf,
        /// Why it cannot be used (unreadable, readable by others, not 64 hex digits, ...).
        reason: String,
    },
}

/// The address this host reaches `root` from: what a member should bind so that members on
/// other hosts reach it (the default bind, loopback, reaches only this host). `None` for a
/// loopback root, or when no route says. Nothing is sent: connecting a UDP socket only
/// picks the route and the source address.
pub fn local_ip_toward(root: SocketAddr) -> Option<IpAddr> {
    if root.ip().is_loopback() {
        return None;
    }
    let any: SocketAddr = if root.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let probe = std::net::UdpSocket::bind(any).ok()?;
    probe.connect(root).ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// Reads the launch from the process environment.
pub fn detect() -> Result<Launch, LaunchError> {
    detect_with(|var| std::env::var(var).ok())
}

/// Reads the launch through `lookup` (variable name to value), for tests.
pub fn detect_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
    detect_using(&lookup, &system_resolver)
}

/// A name and port to the first address the system's resolver gives.
type Resolver = dyn Fn(&str, u16) -> Option<SocketAddr>;

fn system_resolver(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
}

fn detect_using(
    lookup: &dyn Fn(&str) -> Option<String>,
    resolve: &Resolver,
) -> Result<Launch, LaunchError> {
    let env = Env { lookup, resolve };
    let (source, rank, world, local_rank, local_world) = rank_and_world(&env)?;
    let root = root(&env, source)?;
    Ok(Launch {
        source,
        rank: Rank(rank),
        world,
        local_rank,
        local_world,
        root,
    })
}

struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    resolve: &'a Resolver,
}

impl Env<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    fn number(&self, var: &'static str) -> Result<Option<u32>, LaunchError> {
        self.get(var)
            .map(|v| {
                v.parse::<u32>().map_err(|_| LaunchError::Invalid {
                    var,
                    value: v.clone(),
                    reason: "not a whole number".into(),
                })
            })
            .transpose()
    }
}

type RankWorld = (LaunchSource, u32, u32, Option<u32>, Option<u32>);

fn rank_and_world(env: &Env<'_>) -> Result<RankWorld, LaunchError> {
    // (source, rank var, world var, local rank var, local world var), by precedence.
    const SOURCES: [(LaunchSource, &str, &str, &str, &str); 4] = [
        (
            LaunchSource::Chorus,
            "CHORUS_RANK",
            "CHORUS_WORLD_SIZE",
            "CHORUS_LOCAL_RANK",
            "CHORUS_LOCAL_WORLD_SIZE",
        ),
        (
            LaunchSource::Torchrun,
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
        ),
        (
            LaunchSource::Slurm,
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
            "SLURM_NTASKS_PER_NODE",
        ),
        (
            LaunchSource::OpenMpi,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    ];
    for (source, rank_var, world_var, local_var, local_world_var) in SOURCES {
        let Some(rank) = env.number(rank_var)? else {
            continue;
        };
        let world = env.number(world_var)?.ok_or(LaunchError::Incomplete {
            launcher: source,
            missing: world_var,
        })?;
        if world == 0 || world > MAX_WORLD {
            return Err(LaunchError::Invalid {
                var: world_var,
                value: world.to_string(),
                reason: format!("world size must be 1..={MAX_WORLD}"),
            });
        }
        if rank >= world {
            return Err(LaunchError::RankOutOfRange {
                launcher: source,
                rank,
                world,
            });
        }
        // Slurm's tasks-per-node may read "4(x2)"; only a plain number is a local world.
        let local_world = env.get(local_world_var).and_then(|v| v.parse().ok());
        return Ok((source, rank, world, env.number(local_var)?, local_world));
    }
    Err(LaunchError::NoRank)
}

fn root(env: &Env<'_>, source: LaunchSource) -> Result<RootSpec, LaunchError> {
    if let Some(token) = env.get("CHORUS_UNIQUE_ID") {
        return UniqueId::parse(&token)
            .map(RootSpec::Token)
            .map_err(|e| LaunchError::Invalid {
                var: "CHORUS_UNIQUE_ID",
                value: token,
                reason: e.to_string(),
            });
    }
    let (var, host, port) = if let Some(root) = env.get("CHORUS_ROOT") {
        let (host, port) = host_port("CHORUS_ROOT", &root)?;
        ("CHORUS_ROOT", host, port)
    } else if let Some(host) = env.get("MASTER_ADDR") {
        let port = env.get("MASTER_PORT").ok_or(LaunchError::Incomplete {
            launcher: source,
            missing: "MASTER_PORT",
        })?;
        ("MASTER_ADDR", host, port_number("MASTER_PORT", &port)?)
    } else if let Some(list) = env
        .get("SLURM_STEP_NODELIST")
        .or_else(|| env.get("SLURM_JOB_NODELIST"))
    {
        let host = first_host(&list).ok_or_else(|| LaunchError::Invalid {
            var: "SLURM_STEP_NODELIST",
            value: list.clone(),
            reason: "not a Slurm node list".into(),
        })?;
        let port = match env.get("CHORUS_PORT") {
            Some(p) => port_number("CHORUS_PORT", &p)?,
            // Every task of a job derives the same port from the job id.
            None => 20_000 + (env.number("SLURM_JOB_ID")?.unwrap_or(0) % 20_000) as u16,
        };
        ("SLURM_STEP_NODELIST", host, port)
    } else {
        return Err(LaunchError::NoRoot);
    };
    let addr = resolve(env, var, &host, port)?;
    let bind = match env.get("CHORUS_ROOT_BIND") {
        Some(v) => SocketAddr::new(
            v.parse::<IpAddr>().map_err(|_| LaunchError::Invalid {
                var: "CHORUS_ROOT_BIND",
                value: v.clone(),
                reason: "not an IP address (0.0.0.0 or :: for every interface)".into(),
            })?,
            port,
        ),
        None => addr,
    };
    let (secret, secret_from) = secret(env, &host, port, bind.ip())?;
    Ok(RootSpec::Address {
        host,
        port,
        addr,
        bind,
        secret,
        secret_from,
    })
}

/// The job secret: `CHORUS_SECRET`, else `CHORUS_SECRET_FILE`, else derived, which only a
/// root bound to loopback (or an explicit opt-out) allows.
fn secret(
    env: &Env<'_>,
    host: &str,
    port: u16,
    bind: IpAddr,
) -> Result<(JobSecret, SecretSource), LaunchError> {
    if let Some(hex) = env.get("CHORUS_SECRET") {
        let secret = secret_from_hex(&hex).map_err(|reason| LaunchError::Invalid {
            var: "CHORUS_SECRET",
            value: "<redacted>".into(),
            reason,
        })?;
        return Ok((secret, SecretSource::Env));
    }
    if let Some(path) = env.get("CHORUS_SECRET_FILE") {
        let path = PathBuf::from(path);
        let secret = read_secret_file(&path)?;
        return Ok((secret, SecretSource::File(path)));
    }
    let insecure = match env.get("CHORUS_INSECURE_DERIVED_SECRET").as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(LaunchError::Invalid {
                var: "CHORUS_INSECURE_DERIVED_SECRET",
                value: other.to_owned(),
                reason: "expected 1 (or 0)".into(),
            });
        }
    };
    let derived = derived_secret(env, host, port);
    if is_loopback(bind) {
        Ok((derived, SecretSource::Derived))
    } else if insecure {
        Ok((derived, SecretSource::DerivedInsecure))
    } else {
        Err(LaunchError::DerivedSecretRefused { bind })
    }
}

/// The largest secret file read: the secret is 64 hex digits and a newline.
const SECRET_FILE_MAX: u64 = 4096;

/// The secret in `path`: a regular file that neither group nor others may access, holding
/// 64 hexadecimal digits.
fn read_secret_file(path: &Path) -> Result<JobSecret, LaunchError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let bad = |reason: String| LaunchError::SecretFile {
        path: path.to_owned(),
        reason,
    };
    // Non-blocking, so a FIFO put there cannot hang the open; the checks below are on the
    // opened file itself, not on a name that could be swapped in between.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| bad(format!("cannot open it ({e})")))?;
    let meta = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat it ({e})")))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "mode {mode:04o} lets group or others at the job secret; chmod 600 it"
        )));
    }
    let mut text = String::new();
    file.take(SECRET_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("cannot read it ({e})")))?;
    secret_from_hex(&text).map_err(|reason| bad(format!("not a secret: {reason}")))
}

/// Whether `ip` is reachable only from this host (`127.0.0.0/8`, `::1`, or a v4-mapped
/// loopback address).
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// `host:port` as an address (the first the resolver gives, as every rank asks alike).
fn resolve(
    env: &Env<'_>,
    var: &'static str,
    host: &str,
    port: u16,
) -> Result<SocketAddr, LaunchError> {
    (env.resolve)(host, port).ok_or_else(|| LaunchError::Invalid {
        var,
        value: host.to_owned(),
        reason: "cannot resolve this host".into(),
    })
}

/// A secret every rank of the job computes alike from what its launcher told all of them.
fn derived_secret(env: &Env<'_>, host: &str, port: u16) -> JobSecret {
    let mut h = Sha256::new();
    h.update(b"chorus derived job secret\0");
    h.update(host.as_bytes());
    h.update(port.to_le_bytes());
    for var in [
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "OMPI_MCA_ess_base_jobid",
    ] {
        h.update(var.as_bytes());
        h.update(env.get(var).unwrap_or_default().as_bytes());
        h.update([0]);
    }
    JobSecret::new(h.finalize().into())
}

fn host_port(var: &'static str, value: &str) -> Result<(String, u16), LaunchError> {
    let bad = |reason: &str| LaunchError::Invalid {
        var,
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    Ok((host.to_owned(), port_number(var, port)?))
}

fn port_number(var: &'static str, value: &str) -> Result<u16, LaunchError> {
    match value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(LaunchError::Invalid {
            var,
            value: value.to_owned(),
            reason: "not a port number 1..=65535".into(),
        }),
    }
}

/// The first host of a Slurm node list: `node[01-04,07],gpu3` gives `node01`.
fn first_host(list: &str) -> Option<String> {
    let first = list.trim();
    let end = first.find([',', '[']).unwrap_or(first.len());
    let prefix = &first[..end];
    if let Some(rest) = first[end..].strip_prefix('[') {
        // The closing bracket after this one: a stray ']' earlier must not end the range.
        let inner = &rest[..rest.find(']')?];
        let start = inner.split([',', '-']).next()?.trim();
        if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some(format!("{prefix}{start}"));
    }
    (!prefix.is_empty()).then(|| prefix.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect_from(vars: &[(&str, &str)]) -> Result<Launch, LaunchError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect_using(&|k| map.get(k).cloned(), &resolver)
    }

    /// A resolver without DNS: IP literals are themselves, `localhost` is loopback, names
    /// starting with `nowhere` do not resolve, any other name is a LAN host.
    fn resolver(host: &str, port: u16) -> Option<SocketAddr> {
        let ip: IpAddr = match host.parse() {
            Ok(ip) => ip,
            Err(_) if host == "localhost" => [127, 0, 0, 1].into(),
            Err(_) if host.starts_with("nowhere") => return None,
            Err(_) => [10, 9, 9, 9].into(),
        };
        Some(SocketAddr::new(ip, port))
    }

    fn address(l: Launch) -> (SocketAddr, SocketAddr, SecretSource) {
        match l.root {
            RootSpec::Address {
                addr,
                bind,
                secret_from,
                ..
            } => (addr, bind, secret_from),
            RootSpec::Token(_) => panic!("expected an address"),
        }
    }

    const HEX: &str = "0101010101010101010101010101010101010101010101010101010101010101";

    fn torchrun_at(addr: &str, more: &[(&'static str, &str)]) -> Result<Launch, LaunchError> {
        let mut vars = vec![
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", addr),
            ("MASTER_PORT", "29500"),
        ];
        vars.extend_from_slice(more);
        detect_from(&vars)
    }

    #[test]
    fn a_derived_secret_is_refused_off_loopback_naming_the_three_ways() {
        let err = torchrun_at("10.0.0.5", &[]).unwrap_err();
        assert_eq!(
            err,
            LaunchError::DerivedSecretRefused {
                bind: [10, 0, 0, 5].into()
            }
        );
        let text = err.to_string();
        for way in [
            "CHORUS_SECRET ",
            "CHORUS_SECRET_FILE",
            "chorus run",
            "torch backend's store",
        ] {
            assert!(text.contains(way), "names {way}: {text}");
        }
        // A host name that resolves off loopback is refused alike.
        assert!(matches!(
            torchrun_at("node0", &[]),
            Err(LaunchError::DerivedSecretRefused { .. })
        ));
        assert!(matches!(
            torchrun_at("nowhere.example", &[]),
            Err(LaunchError::Invalid {
                var: "MASTER_ADDR",
                ..
            })
        ));
    }

    #[test]
    fn a_derived_secret_is_allowed_on_loopback() {
        for host in [
            "127.0.0.1",
            "127.3.4.5",
            "::1",
            "localhost",
            "::ffff:127.0.0.1",
        ] {
            let (addr, bind, from) = address(torchrun_at(host, &[]).unwrap());
            assert_eq!(from, SecretSource::Derived, "{host}");
            assert_eq!(bind, addr, "{host}");
        }
    }

    #[test]
    fn the_root_binds_the_address_the_ranks_were_told() {
        let (addr, bind, from) =
            address(torchrun_at("10.0.0.5", &[("CHORUS_SECRET", HEX)]).unwrap());
        assert_eq!(addr, "10.0.0.5:29500".parse::<SocketAddr>().unwrap());
        assert_eq!(bind, addr, "not every interface");
        assert_eq!(from, SecretSource::Env);
        let (_, bind, _) = address(
            torchrun_at(
                "10.0.0.5",
                &[("CHORUS_SECRET", HEX), ("CHORUS_ROOT_BIND", "0.0.0.0")],
            )
            .unwrap(),
        );
        assert_eq!(
            bind,
            "0.0.0.0:29500".parse::<SocketAddr>().unwrap(),
            "unless asked to"
        );
        assert!(matches!(
            torchrun_at("10.0.0.5", &[("CHORUS_ROOT_BIND", "everywhere")]),
            Err(LaunchError::Invalid {
                var: "CHORUS_ROOT_BIND",
                ..
            })
        ));
    }

    #[test]
    fn binding_every_interface_is_not_loopback() {
        for any in ["0.0.0.0", "::"] {
            assert!(matches!(
                torchrun_at("127.0.0.1", &[("CHORUS_ROOT_BIND", any)]),
                Err(LaunchError::DerivedSecretRefused { .. })
            ));
        }
        let (_, bind, from) =
            address(torchrun_at("10.0.0.5", &[("CHORUS_ROOT_BIND", "127.0.0.1")]).unwrap());
        assert_eq!(
            (bind.ip(), from),
            ([127, 0, 0, 1].into(), SecretSource::Derived)
        );
    }

    #[test]
    fn the_insecure_opt_out_is_explicit() {
        let (_, _, from) =
            address(torchrun_at("10.0.0.5", &[("CHORUS_INSECURE_DERIVED_SECRET", "1")]).unwrap());
        assert_eq!(from, SecretSource::DerivedInsecure);
        assert!(matches!(
            torchrun_at("10.0.0.5", &[("CHORUS_INSECURE_DERIVED_SECRET", "0")]),
            Err(LaunchError::DerivedSecretRefused { .. })
        ));
        assert!(matches!(
            torchrun_at(
                "10.0.0.5",
                &[("CHORUS_INSECURE_DERIVED_SECRET", "yes please")]
            ),
            Err(LaunchError::Invalid {
                var: "CHORUS_INSECURE_DERIVED_SECRET",
                ..
            })
        ));
    }

    /// A file under the temporary directory with `text` and `mode`, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, text: &str, mode: u32) -> TempFile {
            use std::os::unix::fs::PermissionsExt;
            let path =
                std::env::temp_dir().join(format!("chorus-launch-{}-{name}", std::process::id()));
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            TempFile(path)
        }
        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_secret_file_readable_only_by_its_owner_gives_the_secret() {
        let file = TempFile::new("owner", &format!("{HEX}\n"), 0o600);
        let l = torchrun_at("10.0.0.5", &[("CHORUS_SECRET_FILE", file.path())]).unwrap();
        let RootSpec::Address {
            secret,
            secret_from,
            ..
        } = l.root
        else {
            panic!()
        };
        assert_eq!(secret, JobSecret::new([1; 32]));
        assert_eq!(secret_from, SecretSource::File(file.0.clone()));
        let read_only = TempFile::new("read-only", HEX, 0o400);
        assert!(torchrun_at("10.0.0.5", &[("CHORUS_SECRET_FILE", read_only.path())]).is_ok());
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused_naming_file_and_mode() {
        for (mode, shown) in [(0o640, "0640"), (0o604, "0604"), (0o620, "0620")] {
            let file = TempFile::new("open", HEX, mode);
            let err = torchrun_at("127.0.0.1", &[("CHORUS_SECRET_FILE", file.path())]).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, LaunchError::SecretFile { .. }), "{text}");
            assert!(text.contains(file.path()), "names the file: {text}");
            assert!(text.contains(shown), "names the mode: {text}");
            assert!(!text.contains(HEX), "never echoes the secret: {text}");
        }
    }

    #[test]
    fn unusable_secret_files_are_errors() {
        let missing = std::env::temp_dir().join("chorus-launch-no-such-secret");
        let not_hex = TempFile::new("not-hex", "password123", 0o600);
        let fifo = std::env::temp_dir().join(format!("chorus-launch-{}-fifo", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let dir = std::env::temp_dir();
        for path in [
            missing.as_path(),
            not_hex.0.as_path(),
            fifo.as_path(),
            dir.as_path(),
        ] {
            let err = torchrun_at(
                "127.0.0.1",
                &[("CHORUS_SECRET_FILE", path.to_str().unwrap())],
            )
            .unwrap_err();
            assert!(matches!(err, LaunchError::SecretFile { .. }), "{err}");
        }
        let _ = std::fs::remove_file(&fifo);
    }

    #[test]
    fn chorus_secret_wins_over_a_secret_file() {
        let missing = "/nonexistent/chorus-secret";
        let (_, _, from) = address(
            torchrun_at(
                "10.0.0.5",
                &[("CHORUS_SECRET", HEX), ("CHORUS_SECRET_FILE", missing)],
            )
            .unwrap(),
        );
        assert_eq!(from, SecretSource::Env);
    }

    #[test]
    fn torchrun() {
        let l = detect_from(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
            ("CHORUS_SECRET", HEX),
        ])
        .unwrap();
        assert_eq!(l.source, LaunchSource::Torchrun);
        assert_eq!(
            (l.rank, l.world, l.local_rank, l.local_world),
            (Rank(3), 8, Some(1), Some(2))
        );
        let RootSpec::Address {
            host,
            port,
            secret_from,
            ..
        } = l.root
        else {
            panic!()
        };
        assert_eq!(
            (host.as_str(), port, secret_from),
            ("10.0.0.5", 29500, SecretSource::Env)
        );
    }

    #[test]
    fn chorus_token_wins_over_torchrun_root() {
        let id = UniqueId {
            comm: chorus_protocol::CommId(5),
            root: "127.0.0.1:4000".parse().unwrap(),
            fingerprint: [1; 32],
            secret: JobSecret::new([2; 32]),
        };
        let token = id.to_token();
        let l = detect_from(&[
            ("CHORUS_RANK", "0"),
            ("CHORUS_WORLD_SIZE", "2"),
            ("CHORUS_UNIQUE_ID", &token),
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "elsewhere"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap();
        assert_eq!(l.source, LaunchSource::Chorus);
        assert_eq!((l.rank, l.world), (Rank(0), 2));
        assert_eq!(l.root, RootSpec::Token(id));
    }

    #[test]
    fn slurm_root_from_node_list() {
        let l = detect_from(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x4)"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_STEP_NODELIST", "gpu[07-10,12],login1"),
            ("CHORUS_SECRET", HEX),
        ])
        .unwrap();
        assert_eq!(l.source, LaunchSource::Slurm);
        assert_eq!(
            (l.rank, l.world, l.local_rank, l.local_world),
            (Rank(5), 16, Some(1), None)
        );
        let RootSpec::Address { host, port, .. } = l.root else {
            panic!()
        };
        assert_eq!(host, "gpu07");
        assert_eq!(port, 20_000 + (123456 % 20_000) as u16);
    }

    #[test]
    fn open_mpi_needs_a_root() {
        let vars = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")];
        assert_eq!(detect_from(&vars), Err(LaunchError::NoRoot));
        let mut with_root = vars.to_vec();
        let zeros = "00".repeat(32);
        with_root.push(("CHORUS_ROOT", "[::1]:7000"));
        with_root.push(("CHORUS_SECRET", &zeros));
        let l = detect_from(&with_root).unwrap();
        assert_eq!(l.source, LaunchSource::OpenMpi);
        let RootSpec::Address {
            host,
            port,
            secret,
            secret_from,
            ..
        } = l.root
        else {
            panic!()
        };
        assert_eq!(
            (host.as_str(), port, secret_from),
            ("::1", 7000, SecretSource::Env)
        );
        assert_eq!(secret, JobSecret::new([0; 32]));
    }

    #[test]
    fn derived_secret_is_shared_by_all_ranks() {
        let rank = |r: &'static str| {
            detect_from(&[
                ("RANK", r),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "localhost"),
                ("MASTER_PORT", "9"),
                ("TORCHELASTIC_RUN_ID", "job-1"),
            ])
            .unwrap()
            .root
        };
        assert_eq!(rank("0"), rank("1"));
    }

    #[test]
    fn bad_environments_are_named() {
        assert_eq!(detect_from(&[]), Err(LaunchError::NoRank));
        assert!(matches!(
            detect_from(&[("RANK", "1")]),
            Err(LaunchError::Incomplete {
                missing: "WORLD_SIZE",
                ..
            })
        ));
        assert!(matches!(
            detect_from(&[("RANK", "x"), ("WORLD_SIZE", "2")]),
            Err(LaunchError::Invalid { var: "RANK", .. })
        ));
        assert!(matches!(
            detect_from(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]),
            Err(LaunchError::RankOutOfRange {
                rank: 2,
                world: 2,
                ..
            })
        ));
        assert!(matches!(
            detect_from(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            Err(LaunchError::Invalid {
                var: "WORLD_SIZE",
                ..
            })
        ));
        assert!(matches!(
            detect_from(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]),
            Err(LaunchError::Incomplete {
                missing: "MASTER_PORT",
                ..
            })
        ));
        assert!(matches!(
            detect_from(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "0")
            ]),
            Err(LaunchError::Invalid {
                var: "MASTER_PORT",
                ..
            })
        ));
        assert!(matches!(
            detect_from(&[
                ("CHORUS_RANK", "0"),
                ("CHORUS_WORLD_SIZE", "1"),
                ("CHORUS_UNIQUE_ID", "x")
            ]),
            Err(LaunchError::Invalid {
                var: "CHORUS_UNIQUE_ID",
                ..
            })
        ));
        let err = detect_from(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("CHORUS_ROOT", "h:1"),
            ("CHORUS_SECRET", "zz"),
        ])
        .unwrap_err();
        assert!(
            !err.to_string().contains("zz"),
            "the secret is never echoed: {err}"
        );
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("n1").as_deref(), Some("n1"));
        assert_eq!(first_host("n1,n2").as_deref(), Some("n1"));
        assert_eq!(first_host("n[3-5]").as_deref(), Some("n3"));
        assert_eq!(first_host("n[003,9]").as_deref(), Some("n003"));
        assert_eq!(first_host("n[x]"), None);
        assert_eq!(first_host("n[3-5"), None);
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("n]x[1]").as_deref(), Some("n]x1"));
        assert_eq!(first_host("a]b["), None);
    }

    const LAUNCH_VARS: [&str; 22] = [
        "CHORUS_RANK",
        "CHORUS_WORLD_SIZE",
        "CHORUS_LOCAL_RANK",
        "CHORUS_LOCAL_WORLD_SIZE",
        "CHORUS_UNIQUE_ID",
        "CHORUS_ROOT",
        "CHORUS_SECRET",
        "CHORUS_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
    ];

    /// Values near what each variable accepts, mixed with noise.
    fn value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<String>(),
            "[0-9]{1,12}",
            "[a-z0-9\\[\\],:.-]{0,30}",
            "chorus1-[A-Za-z0-9_-]{0,130}",
            "[0-9a-f]{64}",
        ]
    }

    proptest::proptest! {
        #[test]
        fn any_environment_is_a_launch_or_an_error(
            vars in proptest::collection::vec((0..LAUNCH_VARS.len(), value()), 0..10),
        ) {
            let vars: Vec<(&str, &str)> =
                vars.iter().map(|(i, v)| (LAUNCH_VARS[*i], v.as_str())).collect();
            if let Ok(l) = detect_from(&vars) {
                proptest::prop_assert!(l.rank.get() < l.world && l.world <= MAX_WORLD);
            }
        }

        #[test]
        fn any_node_list_has_a_first_host_or_none(list in value()) {
            if let Some(host) = first_host(&list) {
                proptest::prop_assert!(!host.is_empty());
            }
        }
    }
}
