//! What a bench rank tells `chorus bench`: one JSON object per line on its stdout (which the
//! launcher captures), each line starting with [`PREFIX`] so stray output is never mistaken
//! for a result. Ranks are named by their launch rank (`CHORUS_RANK`), which a shrink does
//! not change; times are wall-clock nanoseconds, comparable between processes of one host.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Starts every line a rank reports.
pub(crate) const PREFIX: &str = "#chorus-bench ";

/// One mode's figures at one size, as the ranks measured them together.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub(crate) struct Timing {
    /// Mean time of one call, in µs, averaged over the ranks.
    pub(crate) time_us: f64,
    /// Wrong elements in the checked calls, summed over the ranks (`None`: not checked).
    pub(crate) wrong: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "ev", rename_all = "kebab-case")]
pub(crate) enum RankEvent {
    /// This rank's communicator is up (init done): from now on a failure of one rank no
    /// longer stops the others, who shrink and go on.
    Ready { rank: u32 },
    /// One size done (reported by the current rank 0).
    Row {
        size: u64,
        count: u64,
        world: u32,
        root: i64,
        out_of_place: Option<Timing>,
        in_place: Option<Timing>,
    },
    /// This rank is about to kill or freeze itself (`--inject`).
    Inject {
        rank: u32,
        kind: String,
        iter: u64,
        size: u64,
        mode: String,
        t_ns: u64,
    },
    /// A call failed on this rank; it will shrink and retry the size.
    Failed {
        rank: u32,
        world: u32,
        size: u64,
        t_ns: u64,
        error: String,
    },
    /// This rank is in the shrunk communicator.
    Shrunk {
        rank: u32,
        new_rank: u32,
        world: u32,
        epoch: u64,
        shrink_ms: f64,
        t_ns: u64,
    },
    /// This rank cannot go on.
    Fatal { rank: u32, error: String },
}

impl RankEvent {
    /// Writes the event as one line on stdout, flushed (the launcher reads it live; a rank
    /// about to kill itself must not leave it in a buffer).
    pub(crate) fn emit(&self) {
        if let Ok(json) = serde_json::to_string(self) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{PREFIX}{json}");
            let _ = out.flush();
        }
    }

    /// The event on a line a rank printed, if it is one.
    pub(crate) fn parse(line: &str) -> Option<RankEvent> {
        serde_json::from_str(line.strip_prefix(PREFIX)?).ok()
    }
}

/// Wall-clock nanoseconds since the epoch (shared by every process of the host).
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_a_line() {
        let ev = RankEvent::Row {
            size: 1024,
            count: 256,
            world: 3,
            root: -1,
            out_of_place: Some(Timing {
                time_us: 12.5,
                wrong: Some(0),
            }),
            in_place: None,
        };
        let line = format!("{PREFIX}{}", serde_json::to_string(&ev).unwrap());
        assert_eq!(RankEvent::parse(&line), Some(ev));
        assert_eq!(RankEvent::parse("hello"), None);
        assert_eq!(
            RankEvent::parse("#chorus-bench {\"ev\":\"nonsense\"}"),
            None
        );
    }
}
