//! The launch options (`--nnodes`, `--node-rank`, `--master`, `--token`, `--token-file`,
//! `--bind`) checked together into a plan: where this node sits and whether it hosts the
//! bootstrap root or joins node 0's. A combination that cannot work is a usage error (exit
//! 2) with the reason, before anything starts.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use chorus::UniqueId;

use crate::LaunchArgs;
use crate::launcher::Layout;

/// Where the bootstrap root listens when nothing says.
const DEFAULT_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// What this node's launcher does.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) layout: Layout,
    pub(crate) root: RootPlan,
}

/// Where the job's bootstrap root comes from.
#[derive(Clone, Debug)]
pub(crate) enum RootPlan {
    /// This launcher hosts it, listening on `bind` (node 0, or a single-node job).
    Host { bind: SocketAddr },
    /// Node 0 hosts it at `master`; the token comes from `token`.
    Join {
        master: SocketAddr,
        token: TokenSource,
    },
}

/// How a joining node learns the job token.
#[derive(Clone, Debug)]
pub(crate) enum TokenSource {
    /// Given on the command line (`--token`).
    Given(Box<UniqueId>),
    /// Written by node 0 to this file (`--token-file`), waited for.
    File(PathBuf),
}

/// Checks the options together; `resolve` turns `HOST:PORT` into an address.
pub(crate) fn plan(
    args: &LaunchArgs,
    per_node: u32,
    resolve: impl Fn(&str) -> Result<SocketAddr, String>,
) -> Result<Plan, String> {
    let nnodes = args.nnodes;
    let node = match (nnodes, args.node_rank) {
        (1, None) => 0,
        (_, Some(i)) => i,
        (n, None) => return Err(format!("--nnodes {n} needs --node-rank (0 to {})", n - 1)),
    };
    let layout = Layout::new(nnodes, node, per_node)?;
    let master = args.master.as_deref().map(&resolve).transpose()?;
    if let Some(m) = master
        && m.port() == 0
    {
        return Err("--master needs a port the other nodes can be told (HOST:PORT, not 0)".into());
    }
    if layout.hosts_root() {
        if args.token.is_some() {
            return Err(
                "--token is for the other nodes: node 0 makes the job token (see --token-file)"
                    .into(),
            );
        }
        let bind = match (master, args.bind) {
            (Some(m), _) => m,
            (None, _) if layout.multi() => {
                return Err(format!(
                    "--nnodes {nnodes} needs --master HOST:PORT (node 0's address)"
                ));
            }
            (None, bind) => bind.unwrap_or(DEFAULT_BIND),
        };
        return Ok(Plan {
            layout,
            root: RootPlan::Host { bind },
        });
    }
    let Some(master) = master else {
        return Err(format!(
            "--node-rank {node} needs --master HOST:PORT (node 0's address)"
        ));
    };
    let token = match (&args.token, &args.token_file) {
        (Some(text), _) => {
            let id = UniqueId::parse(text.trim()).map_err(|e| format!("--token: {e}"))?;
            if id.root != master {
                return Err(format!(
                    "--token names the root {}, not --master {master}",
                    id.root
                ));
            }
            TokenSource::Given(Box::new(id))
        }
        (None, Some(path)) => TokenSource::File(path.clone()),
        (None, None) => {
            return Err(format!(
                "node {node} needs the job token: --token-file PATH (node 0 writes it) or \
                 --token TOKEN (node 0 prints it)"
            ));
        }
    };
    Ok(Plan {
        layout,
        root: RootPlan::Join { master, token },
    })
}

/// `10.0.0.1:29500`, `[::1]:29500` or `node0:29500` (resolved; IPv4 first).
pub(crate) fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("--master {text:?} is not HOST:PORT"));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("--master {text:?}: {port:?} is not a port"))?;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("--master {text:?}: cannot resolve {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("--master {text:?}: {host:?} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cmd {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    fn parse(line: &str) -> Result<Plan, String> {
        let argv = std::iter::once("chorus").chain(line.split_whitespace());
        let cmd = Cmd::try_parse_from(argv).map_err(|e| format!("clap: {e}"))?;
        plan(&cmd.launch, 2, |text| {
            // Names resolve in tests without a resolver: `node0` is 10.0.0.1.
            resolve(&text.replace("node0", "10.0.0.1"))
        })
    }

    fn token_for(root: &str) -> String {
        let config = chorus::Config::default();
        let host = chorus::RootHost::start(root.parse().unwrap(), 1, &config).unwrap();
        host.unique_id().to_token()
    }

    #[test]
    fn one_node_hosts_its_root_on_bind_or_loopback() {
        let p = parse("").unwrap();
        assert_eq!(p.layout, Layout::single(2));
        assert!(matches!(p.root, RootPlan::Host { bind } if bind == DEFAULT_BIND));
        let p = parse("--bind 10.1.1.1:7000").unwrap();
        assert!(matches!(p.root, RootPlan::Host { bind } if bind.port() == 7000));
        let p = parse("--master 10.1.1.1:7001").unwrap();
        assert!(matches!(p.root, RootPlan::Host { bind } if bind.port() == 7001));
    }

    #[test]
    fn node_zero_binds_the_master_address() {
        let p = parse("--nnodes 3 --node-rank 0 --master node0:29500 --token-file /t").unwrap();
        assert_eq!(p.layout, Layout::new(3, 0, 2).unwrap());
        let want: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        assert!(matches!(p.root, RootPlan::Host { bind } if bind == want));
    }

    #[test]
    fn other_nodes_join_with_a_token_file_or_a_token() {
        let p = parse("--nnodes 2 --node-rank 1 --master 10.0.0.1:29500 --token-file /t").unwrap();
        assert!(matches!(
            p.root,
            RootPlan::Join { token: TokenSource::File(ref f), .. } if f.as_os_str() == "/t"
        ));
        let token = token_for("127.0.0.1:0");
        let root = UniqueId::parse(&token).unwrap().root;
        let p = parse(&format!(
            "--nnodes 2 --node-rank 1 --master {root} --token {token}"
        ))
        .unwrap();
        assert!(
            matches!(p.root, RootPlan::Join { master, token: TokenSource::Given(_) } if master == root)
        );
        // A token for another root is refused before anything starts.
        let err = parse(&format!(
            "--nnodes 2 --node-rank 1 --master 10.0.0.1:1 --token {token}"
        ))
        .unwrap_err();
        assert!(err.contains("not --master"), "{err}");
    }

    #[test]
    fn bad_combinations_are_usage_errors_with_the_reason() {
        for (line, says) in [
            ("--nnodes 2 --master 10.0.0.1:29500", "needs --node-rank"),
            (
                "--nnodes 2 --node-rank 2 --master 10.0.0.1:29500",
                "not below --nnodes 2",
            ),
            ("--nnodes 2 --node-rank 0", "needs --master"),
            ("--nnodes 2 --node-rank 1 --token-file /t", "needs --master"),
            (
                "--nnodes 2 --node-rank 1 --master 10.0.0.1:29500",
                "needs the job token",
            ),
            (
                "--nnodes 2 --node-rank 0 --master 10.0.0.1:29500 --token x",
                "node 0 makes",
            ),
            (
                "--nnodes 2 --node-rank 1 --master 10.0.0.1:29500 --token x",
                "--token:",
            ),
            ("--nnodes 2 --node-rank 0 --master 10.0.0.1:0", "not 0"),
            (
                "--nnodes 2 --node-rank 0 --master 10.0.0.1",
                "not HOST:PORT",
            ),
            ("--nnodes 2 --node-rank 0 --master 10.0.0.1:x", "not a port"),
            ("--node-rank 1", "not below --nnodes 1"),
            ("--nnodes 0", "clap"),
            ("--master 10.0.0.1:1 --bind 10.0.0.1", "clap"),
            ("--token-file /t --token x", "clap"),
        ] {
            let err = parse(line).unwrap_err();
            assert!(err.contains(says), "{line}: {err}");
        }
    }
}
