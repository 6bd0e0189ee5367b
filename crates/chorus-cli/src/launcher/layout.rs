//! Where a node's ranks sit in a job of many nodes (torchrun's shape), and the environment
//! each rank is started with. No IO: the launcher carries it out.
//!
//! Global ranks are node-major, as torchrun numbers them with a static rendezvous: node `I`
//! of `N`, with `K` ranks per node, runs global ranks `I*K .. I*K+K`. `LOCAL_RANK` is the
//! index on the node, `GROUP_RANK` the node's index.

use std::net::SocketAddr;

/// One node's place in the job.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Nodes in the job (`--nnodes`).
    pub(crate) nnodes: u32,
    /// This node (`--node-rank`), below `nnodes`.
    pub(crate) node: u32,
    /// Ranks on every node (`-n`).
    pub(crate) per_node: u32,
}

/// The largest world a launch may describe (ranks over every node).
pub(crate) const MAX_WORLD: u32 = 4096;

impl Layout {
    /// A single-node job of `ranks` ranks.
    #[cfg(test)]
    pub(crate) fn single(ranks: u32) -> Layout {
        Layout {
            nnodes: 1,
            node: 0,
            per_node: ranks,
        }
    }

    /// Checks the combination: `node` below `nnodes`, at least one rank per node, and the
    /// world within [`MAX_WORLD`].
    pub(crate) fn new(nnodes: u32, node: u32, per_node: u32) -> Result<Layout, String> {
        if nnodes == 0 || per_node == 0 {
            return Err("a job needs at least one node and one rank per node".into());
        }
        if node >= nnodes {
            return Err(format!(
                "--node-rank {node} is not below --nnodes {nnodes} (nodes are numbered from 0)"
            ));
        }
        match nnodes.checked_mul(per_node) {
            Some(w) if w <= MAX_WORLD => Ok(Layout {
                nnodes,
                node,
                per_node,
            }),
            _ => Err(format!(
                "{nnodes} nodes of {per_node} ranks is more than {MAX_WORLD} ranks"
            )),
        }
    }

    /// Ranks over every node.
    pub(crate) fn world(&self) -> u32 {
        self.nnodes * self.per_node
    }

    /// The global rank of this node's `local`-th rank.
    pub(crate) fn global(&self, local: u32) -> u32 {
        self.node * self.per_node + local
    }

    /// Whether this node hosts the bootstrap root (node 0 does).
    pub(crate) fn hosts_root(&self) -> bool {
        self.node == 0
    }

    /// Whether the job spans more than this node.
    pub(crate) fn multi(&self) -> bool {
        self.nnodes > 1
    }

    /// The environment of this node's `local`-th rank: CHORUS_* (what `Comm::from_env`
    /// reads first) and torchrun's variables, so programs written for either run unchanged.
    /// `root` is the bootstrap root's address (`MASTER_ADDR:MASTER_PORT`).
    pub(crate) fn rank_env(
        &self,
        local: u32,
        token: &str,
        root: SocketAddr,
    ) -> Vec<(&'static str, String)> {
        let rank = self.global(local).to_string();
        let world = self.world().to_string();
        let (local, local_world) = (local.to_string(), self.per_node.to_string());
        let (node, nnodes) = (self.node.to_string(), self.nnodes.to_string());
        vec![
            ("CHORUS_UNIQUE_ID", token.to_owned()),
            ("CHORUS_RANK", rank.clone()),
            ("CHORUS_WORLD_SIZE", world.clone()),
            ("CHORUS_LOCAL_RANK", local.clone()),
            ("CHORUS_LOCAL_WORLD_SIZE", local_world.clone()),
            ("CHORUS_DEPART_ON_SIGNAL", "1".to_owned()),
            ("RANK", rank.clone()),
            ("WORLD_SIZE", world.clone()),
            ("LOCAL_RANK", local),
            ("LOCAL_WORLD_SIZE", local_world),
            ("GROUP_RANK", node),
            ("GROUP_WORLD_SIZE", nnodes),
            ("ROLE_RANK", rank),
            ("ROLE_WORLD_SIZE", world),
            ("MASTER_ADDR", root.ip().to_string()),
            ("MASTER_PORT", root.port().to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(layout: Layout, local: u32) -> std::collections::HashMap<&'static str, String> {
        let root: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        layout.rank_env(local, "TOKEN", root).into_iter().collect()
    }

    #[test]
    fn ranks_are_numbered_node_major_as_torchrun_does() {
        let node1 = Layout::new(3, 1, 2).unwrap();
        assert_eq!(node1.world(), 6);
        assert_eq!((node1.global(0), node1.global(1)), (2, 3));
        let e = env(node1, 1);
        for (var, want) in [
            ("RANK", "3"),
            ("CHORUS_RANK", "3"),
            ("WORLD_SIZE", "6"),
            ("CHORUS_WORLD_SIZE", "6"),
            ("LOCAL_RANK", "1"),
            ("CHORUS_LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "3"),
            ("ROLE_RANK", "3"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("CHORUS_UNIQUE_ID", "TOKEN"),
        ] {
            assert_eq!(e[var], want, "{var}");
        }
        assert!(!node1.hosts_root() && node1.multi());
        assert!(Layout::new(3, 0, 2).unwrap().hosts_root());
    }

    #[test]
    fn a_single_node_job_keeps_the_local_numbering() {
        let one = Layout::single(4);
        assert!(!one.multi() && one.hosts_root());
        let e = env(one, 3);
        assert_eq!((e["RANK"].as_str(), e["LOCAL_RANK"].as_str()), ("3", "3"));
        assert_eq!(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]);
        assert_eq!(e["GROUP_RANK"], "0");
    }

    #[test]
    fn impossible_layouts_are_refused_with_the_reason() {
        let past = Layout::new(2, 2, 4).unwrap_err();
        assert!(
            past.contains("--node-rank 2") && past.contains("--nnodes 2"),
            "{past}"
        );
        assert!(Layout::new(0, 0, 4).is_err());
        assert!(Layout::new(2, 0, 0).is_err());
        assert!(Layout::new(2, 1, 2048).is_ok());
        let big = Layout::new(2, 1, 2049).unwrap_err();
        assert!(big.contains("4096"), "{big}");
        assert!(Layout::new(u32::MAX, 0, u32::MAX).is_err());
    }
}
