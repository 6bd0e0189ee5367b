//! `Config`: every knob of a communicator, with documented defaults and `CHORUS_*`
//! overrides parsed in one place. An invalid value is an error naming the variable.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use chorus_protocol::Collective;

/// Knobs of a communicator. `Config::default()` is what a job gets without any `CHORUS_*`
/// variable; [`Config::from_env`] applies the overrides.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// How often a member sends a heartbeat to each of its observers.
    /// `CHORUS_HEARTBEAT_INTERVAL` (default 200ms; 1ms to 1m).
    pub heartbeat_interval: Duration,
    /// Silence after which an observer declares a member dead (principle 2).
    /// `CHORUS_HEARTBEAT_DEADLINE` (default 2s: ten missed heartbeats, so a loaded machine
    /// delaying the control thread by a few hundred milliseconds is not a death, yet far below
    /// the 10–60 s of Open MPI's and NCCL's detectors; at most 1h).
    pub heartbeat_deadline: Duration,
    /// How many members watch each member. `CHORUS_OBSERVERS` (default 2).
    pub observers: u32,
    /// Default deadline of one collective, a backstop behind failure detection.
    /// `CHORUS_OP_TIMEOUT` (default 5m; every timeout is 1ms to 7 days).
    pub op_timeout: Duration,
    /// Deadline for `init` (bootstrap, peer table, links). `CHORUS_INIT_TIMEOUT` (default 60s).
    pub init_timeout: Duration,
    /// Deadline for shrink and grow agreement. `CHORUS_AGREE_TIMEOUT` (default 30s).
    pub agree_timeout: Duration,
    /// Budget of `destroy` and `abort` teardown: departures, closes, thread joins.
    /// `CHORUS_TEARDOWN_BUDGET` (default 2s; at most 1h).
    pub teardown_budget: Duration,
    /// Data-plane transport. `CHORUS_TRANSPORT` = `auto` (default: shared memory with peers
    /// on this host and network namespace where the shm listener starts, `tcp` with the
    /// others), `tcp` (io_uring, falling back to epoll; everywhere, same-host peers too),
    /// `tcp-uring`, `tcp-epoll`, `quic`, or `shm` (as `auto`, but init fails without shm).
    pub transport: TransportChoice,
    /// Whether same-host peers are watched by process id (pidfd), the fastest death evidence.
    /// `CHORUS_SAME_HOST_EVIDENCE` (default on).
    pub same_host_evidence: bool,
    /// Address this member's endpoints bind to. `CHORUS_BIND` (default `127.0.0.1`).
    pub bind: IpAddr,
    /// Send departures when SIGTERM/SIGINT arrive, before the default action.
    /// `CHORUS_DEPART_ON_SIGNAL` (default off; `chorus run` turns it on).
    pub depart_on_signal: bool,
    /// How many operations the flight recorder keeps. `CHORUS_RECORDER_OPS` (default 64;
    /// at most [`MAX_RECORDER_OPS`]).
    pub recorder_ops: usize,
    /// Per-collective algorithm overrides, e.g. `CHORUS_ALGO=all-reduce=ring,broadcast=tree`.
    pub algorithms: AlgorithmOverrides,
    /// Votes a shrink or grow needs. `CHORUS_QUORUM` = `majority` (default: a partition can
    /// never split the communicator, but half the members or fewer cannot shrink) or
    /// `survivors` (every member not known absent: any number of failures survived, at the
    /// risk of two sides of a long partition each continuing).
    pub quorum: chorus_control::Quorum,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(200),
            heartbeat_deadline: Duration::from_secs(2),
            observers: 2,
            op_timeout: Duration::from_secs(300),
            init_timeout: Duration::from_secs(60),
            agree_timeout: Duration::from_secs(30),
            teardown_budget: Duration::from_secs(2),
            transport: TransportChoice::Auto,
            same_host_evidence: true,
            bind: IpAddr::from([127, 0, 0, 1]),
            depart_on_signal: false,
            recorder_ops: 64,
            algorithms: AlgorithmOverrides::default(),
            quorum: chorus_control::Quorum::Majority,
        }
    }
}

/// The data-plane transport a communicator uses between its members.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportChoice {
    /// Shared memory with peers on this host (as `Shm`) where it can start, `Tcp` with the
    /// others and, if it cannot, with every peer.
    Auto,
    /// TCP over io_uring, or epoll where io_uring is refused.
    Tcp,
    /// TCP over io_uring only; init fails where io_uring is refused.
    TcpUring,
    /// TCP over epoll (tokio).
    TcpEpoll,
    /// QUIC (encrypted).
    Quic,
    /// Shared memory with peers on this host (same kernel boot and pid and network
    /// namespaces), TCP (as `Tcp`) with the others.
    Shm,
}

impl TransportChoice {
    /// The name `CHORUS_TRANSPORT` and `--transport` accept.
    pub const fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::TcpUring => "tcp-uring",
            TransportChoice::TcpEpoll => "tcp-epoll",
            TransportChoice::Quic => "quic",
            TransportChoice::Shm => "shm",
        }
    }
}

impl fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(TransportChoice::Auto),
            "tcp" => Ok(TransportChoice::Tcp),
            "tcp-uring" | "uring" => Ok(TransportChoice::TcpUring),
            "tcp-epoll" | "epoll" => Ok(TransportChoice::TcpEpoll),
            "quic" => Ok(TransportChoice::Quic),
            "shm" => Ok(TransportChoice::Shm),
            _ => Err("expected one of auto, tcp, tcp-uring, tcp-epoll, quic, shm".into()),
        }
    }
}

/// Algorithm names forced per collective; names are checked against the engine's at init.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgorithmOverrides(pub Vec<(Collective, String)>);

impl AlgorithmOverrides {
    /// The forced algorithm for `collective`, if any.
    pub fn get(&self, collective: Collective) -> Option<&str> {
        self.0
            .iter()
            .find(|(c, _)| *c == collective)
            .map(|(_, a)| a.as_str())
    }
}

impl FromStr for AlgorithmOverrides {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, algo) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not COLLECTIVE=ALGORITHM"))?;
            let collective = Collective::ALL
                .into_iter()
                .find(|c| c.name() == name.trim())
                .ok_or_else(|| format!("'{}' is not a collective", name.trim()))?;
            let algo = algo.trim();
            if algo.is_empty() || !algo.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(format!("'{algo}' is not an algorithm name"));
            }
            if out.iter().any(|(c, _)| *c == collective) {
                return Err(format!("{collective} is given twice"));
            }
            out.push((collective, algo.to_owned()));
        }
        Ok(AlgorithmOverrides(out))
    }
}

/// A `CHORUS_*` variable with a value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// Why it cannot be used.
    pub reason: String,
}

impl Config {
    /// Defaults with the process environment's `CHORUS_*` overrides applied.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::default().with_overrides(|var| std::env::var(var).ok())
    }

    /// `self` with overrides read through `lookup` (a variable name to its value), then
    /// checked for consistency. Tests pass a map instead of mutating the environment.
    pub fn with_overrides(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let get = |var: &'static str| lookup(var).map(|v| (var, v));
        if let Some((var, v)) = get("CHORUS_HEARTBEAT_INTERVAL") {
            self.heartbeat_interval = duration(var, &v, HEARTBEAT_INTERVAL)?;
        }
        if let Some((var, v)) = get("CHORUS_HEARTBEAT_DEADLINE") {
            self.heartbeat_deadline = duration(var, &v, HEARTBEAT_DEADLINE)?;
        }
        if let Some((var, v)) = get("CHORUS_OBSERVERS") {
            self.observers = parsed(var, &v, "a whole number of observers")?;
        }
        if let Some((var, v)) = get("CHORUS_OP_TIMEOUT") {
            self.op_timeout = duration(var, &v, WAIT)?;
        }
        if let Some((var, v)) = get("CHORUS_INIT_TIMEOUT") {
            self.init_timeout = duration(var, &v, WAIT)?;
        }
        if let Some((var, v)) = get("CHORUS_AGREE_TIMEOUT") {
            self.agree_timeout = duration(var, &v, WAIT)?;
        }
        if let Some((var, v)) = get("CHORUS_TEARDOWN_BUDGET") {
            self.teardown_budget = duration(var, &v, TEARDOWN_BUDGET)?;
        }
        if let Some((var, v)) = get("CHORUS_TRANSPORT") {
            self.transport = v
                .trim()
                .parse()
                .map_err(|reason| invalid(var, &v, reason))?;
        }
        if let Some((var, v)) = get("CHORUS_SAME_HOST_EVIDENCE") {
            self.same_host_evidence = flag(var, &v)?;
        }
        if let Some((var, v)) = get("CHORUS_BIND") {
            self.bind = parsed(var, &v, "an IP address")?;
        }
        if let Some((var, v)) = get("CHORUS_DEPART_ON_SIGNAL") {
            self.depart_on_signal = flag(var, &v)?;
        }
        if let Some((var, v)) = get("CHORUS_RECORDER_OPS") {
            self.recorder_ops = parsed(var, &v, "a whole number of operations")?;
        }
        if let Some((var, v)) = get("CHORUS_QUORUM") {
            self.quorum = match v.trim() {
                "majority" => chorus_control::Quorum::Majority,
                "survivors" => chorus_control::Quorum::Survivors,
                _ => return Err(invalid(var, &v, "expected majority or survivors")),
            };
        }
        if let Some((var, v)) = get("CHORUS_ALGO") {
            self.algorithms = v.parse().map_err(|reason| invalid(var, &v, reason))?;
        }
        self.check()?;
        Ok(self)
    }

    /// Consistency between knobs and the bounds of every duration ([`HEARTBEAT_INTERVAL`],
    /// [`HEARTBEAT_DEADLINE`], [`WAIT`], [`TEARDOWN_BUDGET`]); each failure names the
    /// variable that sets the knob. `init` checks the configuration it is given, so a
    /// `Config` built in code meets the same bounds as one read from the environment.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (var, d, bounds) in [
            (
                "CHORUS_HEARTBEAT_INTERVAL",
                self.heartbeat_interval,
                HEARTBEAT_INTERVAL,
            ),
            (
                "CHORUS_HEARTBEAT_DEADLINE",
                self.heartbeat_deadline,
                HEARTBEAT_DEADLINE,
            ),
            ("CHORUS_OP_TIMEOUT", self.op_timeout, WAIT),
            ("CHORUS_INIT_TIMEOUT", self.init_timeout, WAIT),
            ("CHORUS_AGREE_TIMEOUT", self.agree_timeout, WAIT),
            (
                "CHORUS_TEARDOWN_BUDGET",
                self.teardown_budget,
                TEARDOWN_BUDGET,
            ),
        ] {
            bounds.check(var, d)?;
        }
        // Both are bounded above, so three intervals cannot overflow.
        let three = self.heartbeat_interval.saturating_mul(3);
        if self.heartbeat_deadline < three {
            return Err(invalid(
                "CHORUS_HEARTBEAT_DEADLINE",
                &show(self.heartbeat_deadline),
                format!(
                    "must be at least three heartbeat intervals ({}), or one late heartbeat \
                     is a death",
                    show(three)
                ),
            ));
        }
        if self.observers == 0 {
            return Err(invalid(
                "CHORUS_OBSERVERS",
                "0",
                "at least one observer is needed",
            ));
        }
        if self.recorder_ops == 0 {
            return Err(invalid(
                "CHORUS_RECORDER_OPS",
                "0",
                "must keep at least one operation",
            ));
        }
        if self.recorder_ops > MAX_RECORDER_OPS {
            return Err(invalid(
                "CHORUS_RECORDER_OPS",
                &self.recorder_ops.to_string(),
                format!("at most {MAX_RECORDER_OPS} operations"),
            ));
        }
        Ok(())
    }
}

/// The most operations the flight recorder may keep (its memory grows with the count,
/// a few hundred bytes each).
pub const MAX_RECORDER_OPS: usize = 1 << 20;

/// The range a duration knob accepts, both ends included.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The shortest value accepted.
    pub min: Duration,
    /// The longest value accepted.
    pub max: Duration,
}

/// `CHORUS_HEARTBEAT_INTERVAL`: 1ms to 1 minute. Below a millisecond the control thread
/// would spin; above a minute heartbeats no longer say anything about liveness.
pub const HEARTBEAT_INTERVAL: Bounds = Bounds {
    min: Duration::from_millis(1),
    max: Duration::from_secs(60),
};

/// `CHORUS_HEARTBEAT_DEADLINE`: up to 1 hour (and at least three heartbeat intervals).
pub const HEARTBEAT_DEADLINE: Bounds = Bounds {
    min: Duration::from_millis(3),
    max: Duration::from_secs(3600),
};

/// `CHORUS_OP_TIMEOUT`, `CHORUS_INIT_TIMEOUT`, `CHORUS_AGREE_TIMEOUT`: 1ms to 7 days. Every
/// wait is bounded (principle 3), so "never" is not a value; the ceiling keeps deadline
/// arithmetic (`now + timeout`, and the control plane's multiples of it) far from overflow
/// and turns a typo such as `2000000h` into an error instead of a silent "never".
pub const WAIT: Bounds = Bounds {
    min: Duration::from_millis(1),
    max: Duration::from_secs(7 * 24 * 3600),
};

/// `CHORUS_TEARDOWN_BUDGET`: 1ms to 1 hour; `destroy` and `abort` block for up to this long.
pub const TEARDOWN_BUDGET: Bounds = Bounds {
    min: Duration::from_millis(1),
    max: Duration::from_secs(3600),
};

impl Bounds {
    /// `d` if it lies within the bounds, else an error naming `var`.
    pub fn check(self, var: &'static str, d: Duration) -> Result<Duration, ConfigError> {
        if d < self.min || d > self.max {
            let reason = if d.is_zero() {
                "must be positive".to_owned()
            } else {
                format!("must be between {} and {}", show(self.min), show(self.max))
            };
            return Err(invalid(var, &show(d), reason));
        }
        Ok(d)
    }
}

/// A duration as `humantime` writes it (`1m`, `7days`, `250ms`).
fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn invalid(var: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn duration(var: &'static str, value: &str, bounds: Bounds) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(value.trim()).map_err(|e| {
        invalid(
            var,
            value,
            format!("not a duration such as 500ms or 2s ({e})"),
        )
    })?;
    // The error shows the value as written, not as reformatted.
    bounds.check(var, d).map_err(|e| ConfigError {
        value: value.to_owned(),
        ..e
    })
}

fn flag(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(invalid(
            var,
            value,
            "expected 1/0, true/false, on/off or yes/no",
        )),
    }
}

fn parsed<T: FromStr>(var: &'static str, value: &str, what: &str) -> Result<T, ConfigError> {
    value
        .trim()
        .parse()
        .map_err(|_| invalid(var, value, format!("not {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::default().with_overrides(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_consistent() {
        assert_eq!(with(&[]).unwrap(), Config::default());
    }

    #[test]
    fn the_default_transport_is_auto_and_every_name_parses_back() {
        assert_eq!(Config::default().transport, TransportChoice::Auto);
        for t in [
            TransportChoice::Auto,
            TransportChoice::Tcp,
            TransportChoice::TcpUring,
            TransportChoice::TcpEpoll,
            TransportChoice::Quic,
            TransportChoice::Shm,
        ] {
            assert_eq!(t.name().parse::<TransportChoice>(), Ok(t));
        }
        let forced = with(&[("CHORUS_TRANSPORT", "tcp")]).unwrap();
        assert_eq!(forced.transport, TransportChoice::Tcp);
    }

    #[test]
    fn overrides_apply() {
        let c = with(&[
            ("CHORUS_HEARTBEAT_INTERVAL", "50ms"),
            ("CHORUS_HEARTBEAT_DEADLINE", "1s"),
            ("CHORUS_OBSERVERS", "3"),
            ("CHORUS_TRANSPORT", "quic"),
            ("CHORUS_SAME_HOST_EVIDENCE", "off"),
            ("CHORUS_BIND", "::1"),
            ("CHORUS_ALGO", "all-reduce=ring, broadcast=tree"),
        ])
        .unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(50));
        assert_eq!(c.heartbeat_deadline, Duration::from_secs(1));
        assert_eq!(c.observers, 3);
        assert_eq!(c.transport, TransportChoice::Quic);
        assert!(!c.same_host_evidence);
        assert_eq!(c.bind, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(c.algorithms.get(Collective::AllReduce), Some("ring"));
        assert_eq!(c.algorithms.get(Collective::Broadcast), Some("tree"));
        assert_eq!(c.algorithms.get(Collective::Gather), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("CHORUS_HEARTBEAT_INTERVAL", "fast"),
            ("CHORUS_OP_TIMEOUT", "-1s"),
            ("CHORUS_OBSERVERS", "two"),
            ("CHORUS_TRANSPORT", "carrier-pigeon"),
            ("CHORUS_SAME_HOST_EVIDENCE", "maybe"),
            ("CHORUS_BIND", "localhost:80"),
            ("CHORUS_ALGO", "all-reduce"),
            ("CHORUS_ALGO", "teleport=ring"),
            ("CHORUS_ALGO", "all-reduce=ring,all-reduce=tree"),
            ("CHORUS_RECORDER_OPS", "0"),
            ("CHORUS_QUORUM", "most"),
            ("CHORUS_TEARDOWN_BUDGET", "0s"),
        ] {
            let err = with(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var, "{err}");
            assert!(err.to_string().starts_with(var), "{err}");
        }
    }

    #[test]
    fn deadline_must_cover_several_heartbeats() {
        let err = with(&[
            ("CHORUS_HEARTBEAT_INTERVAL", "1s"),
            ("CHORUS_HEARTBEAT_DEADLINE", "2s"),
        ])
        .unwrap_err();
        assert_eq!(err.var, "CHORUS_HEARTBEAT_DEADLINE");
    }

    const DURATIONS: [&str; 6] = [
        "CHORUS_HEARTBEAT_INTERVAL",
        "CHORUS_HEARTBEAT_DEADLINE",
        "CHORUS_OP_TIMEOUT",
        "CHORUS_INIT_TIMEOUT",
        "CHORUS_AGREE_TIMEOUT",
        "CHORUS_TEARDOWN_BUDGET",
    ];

    #[test]
    fn huge_durations_are_errors_naming_the_variable() {
        for var in DURATIONS {
            for value in [
                "200000000000y",
                "18446744073709551615s",
                "8days",
                "0s",
                "1ns",
            ] {
                let err = with(&[(var, value)]).unwrap_err();
                assert_eq!(err.var, var, "{err}");
                assert_eq!(err.value, value, "the error shows what was written: {err}");
            }
        }
    }

    #[test]
    fn durations_built_in_code_are_bounded_too() {
        let huge = Duration::MAX;
        type Set = fn(&mut Config, Duration);
        let cases: [(&str, Set); 6] = [
            ("CHORUS_HEARTBEAT_INTERVAL", |c, d| c.heartbeat_interval = d),
            ("CHORUS_HEARTBEAT_DEADLINE", |c, d| c.heartbeat_deadline = d),
            ("CHORUS_OP_TIMEOUT", |c, d| c.op_timeout = d),
            ("CHORUS_INIT_TIMEOUT", |c, d| c.init_timeout = d),
            ("CHORUS_AGREE_TIMEOUT", |c, d| c.agree_timeout = d),
            ("CHORUS_TEARDOWN_BUDGET", |c, d| c.teardown_budget = d),
        ];
        for (var, set) in cases {
            let mut c = Config::default();
            set(&mut c, huge);
            assert_eq!(c.check().unwrap_err().var, var);
        }
        let c = Config {
            recorder_ops: usize::MAX,
            ..Config::default()
        };
        assert_eq!(c.check().unwrap_err().var, "CHORUS_RECORDER_OPS");
    }

    #[test]
    fn the_bounds_themselves_are_accepted() {
        let c = with(&[
            ("CHORUS_HEARTBEAT_INTERVAL", "1m"),
            ("CHORUS_HEARTBEAT_DEADLINE", "1h"),
            ("CHORUS_OP_TIMEOUT", "7days"),
            ("CHORUS_INIT_TIMEOUT", "1ms"),
            ("CHORUS_TEARDOWN_BUDGET", "1h"),
        ])
        .unwrap();
        assert_eq!(c.op_timeout, WAIT.max);
        assert_eq!(c.heartbeat_deadline, HEARTBEAT_DEADLINE.max);
    }

    const ALL_VARS: [&str; 14] = [
        "CHORUS_HEARTBEAT_INTERVAL",
        "CHORUS_HEARTBEAT_DEADLINE",
        "CHORUS_OBSERVERS",
        "CHORUS_OP_TIMEOUT",
        "CHORUS_INIT_TIMEOUT",
        "CHORUS_AGREE_TIMEOUT",
        "CHORUS_TEARDOWN_BUDGET",
        "CHORUS_TRANSPORT",
        "CHORUS_SAME_HOST_EVIDENCE",
        "CHORUS_BIND",
        "CHORUS_DEPART_ON_SIGNAL",
        "CHORUS_RECORDER_OPS",
        "CHORUS_QUORUM",
        "CHORUS_ALGO",
    ];

    /// Values near the edges of what each parser accepts, mixed with noise.
    fn value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<String>(),
            "[0-9]{1,25}(ns|us|ms|s|m|h|d|days|w|y|years)?",
            "[0-9 .,=a-z:-]{0,40}",
            Just("all-reduce=ring,broadcast=tree".to_owned()),
        ]
    }

    proptest::proptest! {
        #[test]
        fn any_environment_is_a_config_or_an_error_naming_a_variable(
            vars in proptest::collection::vec((0..ALL_VARS.len(), value()), 0..6),
        ) {
            let vars: Vec<(&str, &str)> =
                vars.iter().map(|(i, v)| (ALL_VARS[*i], v.as_str())).collect();
            match with(&vars) {
                Ok(c) => proptest::prop_assert!(c.check().is_ok()),
                Err(e) => proptest::prop_assert!(
                    ALL_VARS.contains(&e.var) && e.to_string().starts_with(e.var),
                    "{e}"
                ),
            }
        }
    }
}
