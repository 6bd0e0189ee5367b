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
//! Without a token there is no shared secret unless `CHORUS_SECRET` gives one; the secret
//! is then derived from the job's identity (addresses, job id), which keeps strangers who
//! do not know the job out but not someone who can read the launcher's environment. Set
//! `CHORUS_SECRET` (or use a token) where that matters.

use std::fmt;

use chorus_protocol::Rank;
use sha2::{Digest, Sha256};

use chorus_protocol::JobSecret;

use crate::unique_id::{UniqueId, secret_from_hex};

/// The largest world this version accepts from an environment variable.
pub const MAX_WORLD: u32 = 1 << 20;

/// Which launcher's variables gave the rank and world size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    Chorus,
    Torchrun,
    Slurm,
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
        host: String,
        port: u16,
        secret: JobSecret,
        secret_derived: bool,
    },
}

/// What the environment says about this process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub source: LaunchSource,
    pub rank: Rank,
    pub world: u32,
    pub local_rank: Option<u32>,
    pub local_world: Option<u32>,
    pub root: RootSpec,
}

/// The environment does not describe a usable launch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "no launch environment: set CHORUS_RANK and CHORUS_WORLD_SIZE (or use chorus run, torchrun, srun or mpirun)"
    )]
    NoRank,
    #[error("{launcher} launch gives a rank but no {missing}")]
    Incomplete {
        launcher: LaunchSource,
        missing: &'static str,
    },
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("{launcher} launch: rank {rank} is not below the world size {world}")]
    RankOutOfRange {
        launcher: LaunchSource,
        rank: u32,
        world: u32,
    },
    #[error(
        "no root address: set CHORUS_UNIQUE_ID, CHORUS_ROOT=host:port or MASTER_ADDR and MASTER_PORT"
    )]
    NoRoot,
}

/// Reads the launch from the process environment.
pub fn detect() -> Result<Launch, LaunchError> {
    detect_with(|var| std::env::var(var).ok())
}

/// Reads the launch through `lookup` (variable name to value), for tests.
pub fn detect_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
    let env = Env(&lookup);
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

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
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
    let (host, port) = if let Some(root) = env.get("CHORUS_ROOT") {
        host_port("CHORUS_ROOT", &root)?
    } else if let Some(host) = env.get("MASTER_ADDR") {
        let port = env.get("MASTER_PORT").ok_or(LaunchError::Incomplete {
            launcher: source,
            missing: "MASTER_PORT",
        })?;
        (host, port_number("MASTER_PORT", &port)?)
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
        (host, port)
    } else {
        return Err(LaunchError::NoRoot);
    };
    let (secret, secret_derived) = match env.get("CHORUS_SECRET") {
        Some(hex) => (
            secret_from_hex(&hex).map_err(|reason| LaunchError::Invalid {
                var: "CHORUS_SECRET",
                value: "<redacted>".into(),
                reason,
            })?,
            false,
        ),
        None => (derived_secret(env, &host, port), true),
    };
    Ok(RootSpec::Address {
        host,
        port,
        secret,
        secret_derived,
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
        detect_with(|k| map.get(k).cloned())
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
            secret_derived,
            ..
        } = l.root
        else {
            panic!()
        };
        assert_eq!(
            (host.as_str(), port, secret_derived),
            ("10.0.0.5", 29500, true)
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
            secret_derived,
        } = l.root
        else {
            panic!()
        };
        assert_eq!((host.as_str(), port, secret_derived), ("::1", 7000, false));
        assert_eq!(secret, JobSecret::new([0; 32]));
    }

    #[test]
    fn derived_secret_is_shared_by_all_ranks() {
        let rank = |r: &'static str| {
            detect_from(&[
                ("RANK", r),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
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
