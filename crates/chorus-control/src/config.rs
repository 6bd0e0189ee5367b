//! Timing and topology knobs of the control plane, with the defaults and why they are what
//! they are.
//!
//! # The defaults: a 200 ms heartbeat and a 2 s deadline
//!
//! A peer is declared dead when its observer has heard nothing from it for `deadline`. The
//! observer's own stalls do not count (the node measures how late it was woken and credits
//! that time back to every peer it watches), so what the deadline must absorb is the
//! *sender's* worst delay: the heartbeat interval, plus however long its control thread is
//! kept off the CPU, plus network jitter. On the 2-core development machine, loaded by six
//! concurrent compilers and test suites (load average 4-9), a thread sleeping 200 ms at a
//! time woke late by p99 20-35 ms and at worst 64-196 ms (the `wakeup` example, 1 000
//! wake-ups); the 2 s deadline leaves 1.8 s of slack after the 200 ms interval, about nine
//! times the worst lateness seen, i.e. nine consecutive heartbeats must go missing. That
//! is 5x faster than Open MPI's 10 s default and 30x faster than NCCL RAS's 60 s, at a steady
//! cost of `observers / heartbeat_interval` = 10 tiny frames per second per rank, whatever
//! the world size. Detection of a silent (frozen, partitioned) rank then takes at most
//! `deadline` plus the notice's spread (a few network latencies), so a test may assert
//! "detected within deadline + 20 %". A crash with conclusive evidence (a departure, a lost
//! connection, a process exit seen on the host) is acted on at once, without waiting.
//!
//! Tests that want faster detection use [`Config::from_timing`] with smaller values; all
//! derived timeouts scale with it.

use std::time::Duration;

use thiserror::Error;

/// The default of [`Config::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How many votes an agreement needs.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub enum Quorum {
    /// A strict majority of the epoch's members must promise and accept. Two disjoint groups
    /// can never both commit, so a network partition cannot split the communicator; the
    /// price is that a side with half the members or fewer (including a 2-rank world that
    /// lost one) cannot shrink: a member whose own view is such a side fails its shrink at
    /// once with [`crate::NoQuorum`].
    #[default]
    Majority,
    /// Every member not known absent must promise and accept: any number of failures can be
    /// survived, but if a partition outlives the deadline, each side may commit its own
    /// membership. For jobs that prefer progress to partition safety (e.g. 2-rank worlds).
    Survivors,
}

/// Control-plane configuration. Build one with [`Config::default`] or
/// [`Config::from_timing`], adjust fields, and hand it to [`crate::Node::new`], which checks
/// it with [`Config::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How often a member sends a heartbeat to each of its observers. Default 200 ms.
    pub heartbeat_interval: Duration,
    /// Silence after which an observer declares a peer dead. Default 2 s (see the module
    /// docs for the reasoning).
    pub deadline: Duration,
    /// Silence after which the ledger shows a peer as `Suspect` (local only, never
    /// broadcast, never counted as absent). Default: half the deadline.
    pub suspect_after: Duration,
    /// How many peers watch each rank (`k`), the rank's successors on the ring of present
    /// members. Default 2: one observer may die with its subject and the other still sees it.
    pub observers: u32,
    /// Votes an agreement needs. Default [`Quorum::Majority`].
    pub quorum: Quorum,
    /// How long an agreement phase may wait for votes before the coordinator retries with a
    /// higher ballot, and how long a member waits for a silent coordinator before taking
    /// over. Longer than the deadline, so a member that died mid-round is normally declared
    /// dead (and stops being waited for) first. Default: one and a half deadlines (3 s).
    pub agreement_timeout: Duration,
    /// How long the local application's shrink request waits for a decision before the node
    /// gives up with [`crate::Event::AgreementFailed`] (timeout): one deadline from the
    /// request, never restarted by a round, a retransmit or a takeover. Default 30 s (the
    /// runtime sets it from `CHORUS_AGREE_TIMEOUT`).
    pub request_timeout: Duration,
    /// How often a coordinator resends its current phase to members that have not answered
    /// (covers lost frames). Default: two heartbeat intervals.
    pub retransmit: Duration,
    /// Lateness of a wake-up (beyond the deadline this node asked for) below which it is
    /// not treated as a stall of this node. Default: a quarter of the heartbeat interval.
    pub stall_tolerance: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config::from_timing(Duration::from_millis(200), Duration::from_secs(2))
    }
}

impl Config {
    /// A configuration with the given heartbeat interval and deadline and every other
    /// timeout derived from them as the defaults are.
    pub fn from_timing(heartbeat_interval: Duration, deadline: Duration) -> Config {
        Config {
            heartbeat_interval,
            deadline,
            suspect_after: deadline / 2,
            observers: 2,
            quorum: Quorum::Majority,
            agreement_timeout: deadline + deadline / 2,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            retransmit: heartbeat_interval * 2,
            stall_tolerance: heartbeat_interval / 4,
        }
    }

    /// Checks the relations the detector relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::ZeroInterval);
        }
        if self.deadline < self.heartbeat_interval * 2 {
            return Err(ConfigError::DeadlineTooShort {
                deadline: self.deadline,
                interval: self.heartbeat_interval,
            });
        }
        if self.suspect_after.is_zero() || self.suspect_after > self.deadline {
            return Err(ConfigError::SuspectAfter {
                suspect_after: self.suspect_after,
                deadline: self.deadline,
            });
        }
        if self.observers == 0 {
            return Err(ConfigError::NoObservers);
        }
        if self.agreement_timeout.is_zero() {
            return Err(ConfigError::ZeroAgreementTimeout);
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::ZeroRequestTimeout);
        }
        if self.retransmit.is_zero() {
            return Err(ConfigError::ZeroRetransmit);
        }
        Ok(())
    }
}

/// A configuration the detector cannot work with.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("heartbeat interval is zero")]
    ZeroInterval,
    #[error("deadline {deadline:?} is shorter than two heartbeat intervals ({interval:?})")]
    DeadlineTooShort {
        deadline: Duration,
        interval: Duration,
    },
    #[error(
        "suspect_after {suspect_after:?} must be nonzero and at most the deadline {deadline:?}"
    )]
    SuspectAfter {
        suspect_after: Duration,
        deadline: Duration,
    },
    #[error("observer count is zero")]
    NoObservers,
    #[error("agreement timeout is zero")]
    ZeroAgreementTimeout,
    #[error("request timeout is zero")]
    ZeroRequestTimeout,
    #[error("retransmit interval is zero")]
    ZeroRetransmit,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_far_below_the_anchors() {
        let c = Config::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.heartbeat_interval, Duration::from_millis(200));
        assert_eq!(c.deadline, Duration::from_secs(2));
        assert!(
            c.deadline < Duration::from_secs(10),
            "Open MPI's detector default"
        );
        assert_eq!(c.observers, 2);
        assert!(c.agreement_timeout > c.deadline);
    }

    #[test]
    fn rejects_a_deadline_that_a_single_late_heartbeat_would_miss() {
        let c = Config::from_timing(Duration::from_millis(100), Duration::from_millis(150));
        assert!(matches!(
            c.validate(),
            Err(ConfigError::DeadlineTooShort { .. })
        ));
        let c = Config {
            observers: 0,
            ..Config::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::NoObservers));
        let c = Config {
            suspect_after: Duration::from_secs(3),
            ..Config::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::SuspectAfter { .. })
        ));
        let c = Config::from_timing(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(c.validate(), Err(ConfigError::ZeroInterval));
    }
}
