//! One report line of a rank: a JSON object whose `ev` names what happened.

use serde_json::Value;

/// A parsed report line.
#[derive(Clone, Debug)]
pub struct Event(pub Value);

impl Event {
    /// The event's name (`ready`, `failed`, ...).
    pub fn ev(&self) -> &str {
        self.0.get("ev").and_then(Value::as_str).unwrap_or("")
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(Value::as_u64)
    }

    pub fn f64(&self, key: &str) -> Option<f64> {
        self.0.get(key).and_then(Value::as_f64)
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.0.get(key).and_then(Value::as_bool)
    }

    /// When the rank emitted it (`CLOCK_MONOTONIC` ns).
    pub fn t(&self) -> u64 {
        self.u64("t").unwrap_or(0)
    }

    /// The `kind` of a failure (`peer-failed`, `evicted`, ...).
    pub fn kind(&self) -> &str {
        self.str("kind").unwrap_or("")
    }

    /// The `peer` a failure names.
    pub fn peer(&self) -> Option<u64> {
        self.u64("peer")
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
