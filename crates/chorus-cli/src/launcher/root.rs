//! The job's bootstrap root as one node's launcher sees it: hosted here (node 0, or a
//! single-node job) or joined on node 0 through a [`RootLink`]. Either way the launcher
//! tells the job when one of its own ranks exits; a joined launcher also watches that the
//! master still answers, and gives up on the job when it has been silent too long.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chorus::{RootHost, RootLink, UniqueId};

use super::LaunchError;
use super::token;
use crate::nodes::{RootPlan, TokenSource};

/// How often a joined launcher asks the master.
const ASK_EVERY: Duration = Duration::from_millis(250);

/// The root of the job, from this launcher's side.
pub(crate) enum JobRoot {
    Hosted(RootHost),
    Joined {
        link: RootLink,
        master: SocketAddr,
        /// How long the master may stay silent before the job is given up.
        silence: Duration,
        /// When the link was first answered.
        since: Instant,
    },
}

impl JobRoot {
    /// Hosts the root, or finds node 0's: reads the token (waiting for its file) and waits
    /// for the master's first answer, both within `config.init_timeout`.
    pub(crate) fn start(
        plan: &RootPlan,
        world: u32,
        config: &chorus::Config,
    ) -> Result<JobRoot, LaunchError> {
        let (master, source) = match plan {
            RootPlan::Host { bind } => {
                return RootHost::start(*bind, world, config)
                    .map(JobRoot::Hosted)
                    .map_err(|source| LaunchError::Root {
                        addr: *bind,
                        source,
                    });
            }
            RootPlan::Join { master, token } => (*master, token),
        };
        let started = Instant::now();
        let deadline = started + config.init_timeout;
        let id: UniqueId = match source {
            TokenSource::Given(id) => (**id).clone(),
            TokenSource::File(path) => token::wait_for(path, master, deadline)?,
        };
        let link = RootLink::start(id, ASK_EVERY).map_err(LaunchError::Link)?;
        loop {
            if let Some(since) = link.last_contact() {
                return Ok(JobRoot::Joined {
                    link,
                    master,
                    silence: silence_budget(config.init_timeout),
                    since,
                });
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::Unreachable {
                    master,
                    waited: started.elapsed(),
                    why: link.last_error().unwrap_or_else(|| "no answer".into()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn unique_id(&self) -> &UniqueId {
        match self {
            JobRoot::Hosted(root) => root.unique_id(),
            JobRoot::Joined { link, .. } => link.unique_id(),
        }
    }

    /// Tells the job that `rank` (one of this node's) exited with `status`.
    pub(crate) fn witness_exit(&self, rank: u32, status: i32) {
        match self {
            JobRoot::Hosted(root) => root.witness_exit(rank, status),
            JobRoot::Joined { link, .. } => link.witness_exit(rank, status),
        }
    }

    /// Why the job should be given up at `now`, if it should: the master has been silent
    /// past the budget.
    pub(crate) fn lost(&self, now: Instant) -> Option<String> {
        let JobRoot::Joined {
            link,
            master,
            silence,
            since,
        } = self
        else {
            return None;
        };
        let last = link.last_contact().unwrap_or(*since);
        master_lost(last, now, *silence).then(|| {
            format!(
                "lost the master at {master}: no answer for {} ({}); stopping this node's ranks",
                humantime::format_duration(round_ms(now.saturating_duration_since(last))),
                link.last_error().unwrap_or_else(|| "no answer".into())
            )
        })
    }
}

/// How long a master may be silent: half the init timeout, so that stopping this node's
/// ranks (SIGTERM, they depart) still ends within the init timeout of the loss.
fn silence_budget(init_timeout: Duration) -> Duration {
    (init_timeout / 2).max(ASK_EVERY * 4)
}

/// Whether a master last heard from at `last` counts as lost at `now`.
fn master_lost(last: Instant, now: Instant, silence: Duration) -> bool {
    now.saturating_duration_since(last) >= silence
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_is_lost_only_after_the_whole_silence() {
        let t = Instant::now();
        let budget = silence_budget(Duration::from_secs(60));
        assert_eq!(budget, Duration::from_secs(30));
        assert!(!master_lost(t, t, budget));
        assert!(!master_lost(t, t + Duration::from_secs(29), budget));
        assert!(master_lost(t, t + Duration::from_secs(30), budget));
        // A contact after `now` (clock read races) is no silence.
        assert!(!master_lost(t + Duration::from_secs(1), t, budget));
        // A tiny init timeout still leaves a few asks' worth.
        assert_eq!(silence_budget(Duration::from_millis(100)), ASK_EVERY * 4);
    }

    #[test]
    fn ranks_bind_the_address_that_routes_to_the_root() {
        use chorus::launch::local_ip_toward;
        assert_eq!(local_ip_toward("127.0.0.1:29500".parse().unwrap()), None);
        // A root on this host's own non-loopback address (if it has one) is reached from it.
        let here = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        if here.connect("10.255.255.1:9").is_ok()
            && let Ok(local) = here.local_addr()
            && !local.ip().is_unspecified()
        {
            let root = SocketAddr::new(local.ip(), 29500);
            assert_eq!(local_ip_toward(root), Some(local.ip()));
        }
    }

    #[test]
    fn a_joined_launcher_that_never_reaches_the_master_says_so_in_time() {
        // A token for a root that is gone: its port answers nothing.
        let mut config = chorus::Config::default();
        config.init_timeout = Duration::from_millis(800);
        let id = {
            let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
            RootHost::start(addr, 1, &config)
                .unwrap()
                .unique_id()
                .clone()
        };
        let plan = RootPlan::Join {
            master: id.root,
            token: TokenSource::Given(Box::new(id.clone())),
        };
        let started = Instant::now();
        let err = JobRoot::start(&plan, 2, &config).err().unwrap();
        assert!(matches!(err, LaunchError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains(&id.root.to_string()), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
    }
}
