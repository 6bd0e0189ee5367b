//! The `chorus_bench` JSON document (schema 1, `benches/peer/README.md`): what `chorus bench
//! --json` prints, one document on stdout, and what the peer comparison parses. Beyond the
//! schema, each row names the world it was measured on (`ranks`) and `incidents` lists the
//! failures the sweep went through (`--inject`), with their detection and shrink times.

use serde::Serialize;

/// The schema version.
pub(crate) const SCHEMA: u32 = 1;

/// The whole document.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Doc {
    pub(crate) chorus_bench: u32,
    pub(crate) collective: String,
    /// The rank count the sweep started with (`-n`).
    pub(crate) ranks: u32,
    pub(crate) transport: String,
    pub(crate) dtype: String,
    pub(crate) op: String,
    pub(crate) warmup: u32,
    pub(crate) iters: u32,
    pub(crate) library: String,
    pub(crate) rows: Vec<Row>,
    pub(crate) avg_busbw_gbs: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) incidents: Vec<Incident>,
}

/// One size of the sweep.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) size: u64,
    pub(crate) count: u64,
    #[serde(rename = "type")]
    pub(crate) dtype: String,
    pub(crate) redop: String,
    pub(crate) root: i64,
    pub(crate) out_of_place: Option<Measure>,
    pub(crate) in_place: Option<Measure>,
    /// The world this row was measured on (smaller than `ranks` after a shrink).
    pub(crate) ranks: u32,
}

/// One mode's figures.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measure {
    pub(crate) time_us: f64,
    pub(crate) algbw_gbs: f64,
    pub(crate) busbw_gbs: f64,
    /// Wrong elements summed over ranks; `null` with `-c 0`.
    pub(crate) wrong: Option<u64>,
}

/// A failure the sweep went through.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(crate) struct Incident {
    /// `kill` or `stop` (injected), or `failure` (not injected).
    pub(crate) kind: String,
    /// The rank that was killed or frozen (launch numbering), if known.
    pub(crate) rank: Option<u32>,
    /// The timed call it happened before (`--inject`).
    pub(crate) iter: Option<u64>,
    /// The size and mode being measured.
    pub(crate) size: u64,
    pub(crate) mode: Option<String>,
    pub(crate) world_before: u32,
    /// Each survivor's time from the injection to its error, in ms.
    pub(crate) detect_ms: Vec<RankMs>,
    /// Each survivor's time spent in `shrink`, in ms.
    pub(crate) shrink_ms: Vec<RankMs>,
    pub(crate) world_after: Option<u32>,
    pub(crate) epoch_after: Option<u64>,
    /// The first error a survivor reported.
    pub(crate) error: Option<String>,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub(crate) struct RankMs {
    pub(crate) rank: u32,
    pub(crate) ms: f64,
}

impl Doc {
    /// nccl-tests' "Avg bus bandwidth": the mean over every row and mode measured.
    pub(crate) fn average_busbw(rows: &[Row]) -> f64 {
        let all: Vec<f64> = rows
            .iter()
            .flat_map(|r| [r.out_of_place, r.in_place])
            .flatten()
            .map(|m| m.busbw_gbs)
            .collect();
        if all.is_empty() {
            0.0
        } else {
            all.iter().sum::<f64>() / all.len() as f64
        }
    }

    /// Wrong elements over the whole sweep.
    pub(crate) fn wrong(rows: &[Row]) -> u64 {
        rows.iter()
            .flat_map(|r| [r.out_of_place, r.in_place])
            .flatten()
            .filter_map(|m| m.wrong)
            .sum()
    }
}

/// `(min, max)` of the figures.
pub(crate) fn range(values: &[RankMs]) -> Option<(f64, f64)> {
    let min = values.iter().map(|v| v.ms).reduce(f64::min)?;
    let max = values.iter().map(|v| v.ms).reduce(f64::max)?;
    Some((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_has_the_agreed_shape() {
        let m = Measure {
            time_us: 10.0,
            algbw_gbs: 0.1,
            busbw_gbs: 0.15,
            wrong: Some(0),
        };
        let rows = vec![Row {
            size: 1 << 20,
            count: 262144,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: Some(m),
            in_place: Some(Measure {
                busbw_gbs: 0.25,
                ..m
            }),
            ranks: 4,
        }];
        let doc = Doc {
            chorus_bench: SCHEMA,
            collective: "all-reduce".into(),
            ranks: 4,
            transport: "tcp".into(),
            dtype: "float".into(),
            op: "sum".into(),
            warmup: 5,
            iters: 20,
            library: "chorus".into(),
            avg_busbw_gbs: Doc::average_busbw(&rows),
            rows,
            incidents: Vec::new(),
        };
        let v: serde_json::Value = serde_json::to_value(&doc).unwrap();
        assert_eq!(v["chorus_bench"], 1);
        assert_eq!(v["rows"][0]["type"], "float");
        assert_eq!(v["rows"][0]["out_of_place"]["wrong"], 0);
        assert!((v["avg_busbw_gbs"].as_f64().unwrap() - 0.2).abs() < 1e-12);
        assert!(v.get("incidents").is_none(), "empty incidents are left out");
        assert_eq!(
            range(&[RankMs { rank: 0, ms: 3.0 }, RankMs { rank: 1, ms: 1.0 }]),
            Some((1.0, 3.0))
        );
    }
}
