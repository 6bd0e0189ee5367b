//! The `chorus_bench` JSON document: what `chorus bench all-reduce --json` prints, and what
//! the peers' programs (`mpi_allreduce.c`, `gloo_allreduce.py`) print too, so that every
//! system's output goes through one parser.
//!
//! The agreed schema, version 1 (one document on stdout; pretty-printed or one line):
//!
//! ```json
//! {"chorus_bench": 1, "collective": "all-reduce", "ranks": 4, "transport": "tcp",
//!  "dtype": "float", "op": "sum", "warmup": 5, "iters": 20,
//!  "rows": [{"size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": -1,
//!            "out_of_place": {"time_us": 812.5, "algbw_gbs": 1.29, "busbw_gbs": 1.94, "wrong": 0},
//!            "in_place":     {"time_us": 790.1, "algbw_gbs": 1.33, "busbw_gbs": 1.99, "wrong": 0}}],
//!  "avg_busbw_gbs": 1.96}
//! ```
//!
//! `size` is bytes per rank, `count` elements, `time_us` the mean time of one call in
//! microseconds (nccl-tests: averaged over the ranks), `algbw_gbs` = size / time in GB/s
//! (10^9 B/s), `busbw_gbs` = algbw × 2(n−1)/n for all-reduce, `wrong` the number of wrong
//! elements in the checked call (summed over ranks). Extra fields are ignored (the peers add
//! `library`). A peer that cannot run one of the two modes writes `null` there (Gloo through
//! torch.distributed is in-place only); chorus writes both.

use serde::{Deserialize, Serialize};

use crate::peer::PeerError;
use crate::peer::sweep::Bytes;

/// The schema version this parser reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One parsed and checked `chorus_bench` document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchDoc {
    pub chorus_bench: u32,
    pub collective: String,
    pub ranks: u32,
    pub transport: String,
    pub dtype: String,
    pub op: String,
    pub warmup: u32,
    pub iters: u32,
    /// Which library and version produced the numbers (peers only; chorus may omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    pub rows: Vec<Row>,
    pub avg_busbw_gbs: f64,
}

/// One size of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub size: Bytes,
    pub count: u64,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub out_of_place: Option<Measure>,
    pub in_place: Option<Measure>,
}

/// The figures of one mode (out-of-place or in-place) at one size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    pub wrong: u64,
}

impl BenchDoc {
    /// Finds the document in a program's stdout and checks it describes a float32 sum
    /// all-reduce on `ranks` ranks: the whole output as one JSON value, or else its last
    /// line that parses (so a banner before the document does not hide it).
    pub fn from_stdout(stdout: &str, ranks: u32) -> Result<Self, PeerError> {
        let doc = match serde_json::from_str::<Self>(stdout.trim()) {
            Ok(doc) => doc,
            Err(whole) => stdout
                .lines()
                .rev()
                .filter(|line| line.trim_start().starts_with('{'))
                .find_map(|line| serde_json::from_str::<Self>(line).ok())
                .ok_or_else(|| {
                    if stdout.trim().is_empty() {
                        PeerError::BadDoc("printed nothing on stdout".to_owned())
                    } else {
                        PeerError::BadDoc(format!(
                            "stdout holds no chorus_bench document ({whole})"
                        ))
                    }
                })?,
        };
        doc.check(ranks)?;
        Ok(doc)
    }

    /// Appends the rows of `next`, the document of the next leg of the same sweep (see
    /// [`crate::peer::sweep::Sweep::legs`]), refusing one that is not the same system's
    /// run or whose sizes do not come after this one's. `warmup` and `iters` stay the first
    /// leg's; the average bus bandwidth becomes the mean over both, weighted by rows.
    pub fn extend(&mut self, next: BenchDoc) -> Result<(), PeerError> {
        let bad = |why: String| Err(PeerError::BadDoc(why));
        if (next.ranks, &next.transport, &next.library)
            != (self.ranks, &self.transport, &self.library)
        {
            return bad(format!(
                "a later leg is {} ranks over {} ({:?}), the first {} over {} ({:?})",
                next.ranks, next.transport, next.library, self.ranks, self.transport, self.library
            ));
        }
        let last = self.rows.last().map(|r| r.size);
        if let (Some(last), Some(first)) = (last, next.rows.first().map(|r| r.size))
            && first <= last
        {
            return bad(format!(
                "a later leg starts at {first}, not after the earlier leg's {last}"
            ));
        }
        let (a, b) = (self.rows.len() as f64, next.rows.len() as f64);
        if a + b > 0.0 {
            self.avg_busbw_gbs = (self.avg_busbw_gbs * a + next.avg_busbw_gbs * b) / (a + b);
        }
        self.rows.extend(next.rows);
        Ok(())
    }

    /// The checks a document must pass before its numbers are compared with anyone's.
    fn check(&self, ranks: u32) -> Result<(), PeerError> {
        let bad = |why: String| Err(PeerError::BadDoc(why));
        if self.chorus_bench != SCHEMA_VERSION {
            return bad(format!(
                "schema version {} (this report reads {SCHEMA_VERSION})",
                self.chorus_bench
            ));
        }
        if self.collective != "all-reduce" || self.dtype != "float" || self.op != "sum" {
            return bad(format!(
                "document is {} {} {}, not all-reduce float sum",
                self.collective, self.dtype, self.op
            ));
        }
        if self.ranks != ranks {
            return bad(format!(
                "document is for {} ranks, asked for {ranks}",
                self.ranks
            ));
        }
        if self.rows.is_empty() {
            return bad("document has no rows".to_owned());
        }
        for row in &self.rows {
            if row.count.checked_mul(4) != Some(row.size.0) {
                return bad(format!(
                    "row of {} bytes claims {} float elements",
                    row.size.0, row.count
                ));
            }
            let modes = [row.out_of_place, row.in_place];
            if modes.iter().all(Option::is_none) {
                return bad(format!("row of {} has neither mode", row.size));
            }
            for m in modes.iter().flatten() {
                if !(m.time_us.is_finite() && m.time_us > 0.0) {
                    return bad(format!("row of {} has time {} µs", row.size, m.time_us));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of what `chorus bench all-reduce -n 2 -b 8 -e 1M -f 1024 --json` is agreed
    /// to print (pretty-printed, as serde_json's `to_string_pretty` would).
    const CHORUS_SAMPLE: &str = r#"{
  "chorus_bench": 1,
  "collective": "all-reduce",
  "ranks": 2,
  "transport": "tcp",
  "dtype": "float",
  "op": "sum",
  "warmup": 5,
  "iters": 20,
  "rows": [
    {
      "size": 8, "count": 2, "type": "float", "redop": "sum", "root": -1,
      "out_of_place": {"time_us": 21.5, "algbw_gbs": 0.00037, "busbw_gbs": 0.00037, "wrong": 0},
      "in_place": {"time_us": 20.9, "algbw_gbs": 0.00038, "busbw_gbs": 0.00038, "wrong": 0}
    },
    {
      "size": 8192, "count": 2048, "type": "float", "redop": "sum", "root": -1,
      "out_of_place": {"time_us": 40.0, "algbw_gbs": 0.2048, "busbw_gbs": 0.2048, "wrong": 0},
      "in_place": {"time_us": 39.0, "algbw_gbs": 0.21, "busbw_gbs": 0.21, "wrong": 0}
    },
    {
      "size": 8388608, "count": 2097152, "type": "float", "redop": "sum", "root": -1,
      "out_of_place": {"time_us": 4000.0, "algbw_gbs": 2.097, "busbw_gbs": 2.097, "wrong": 0},
      "in_place": {"time_us": 3900.0, "algbw_gbs": 2.15, "busbw_gbs": 2.15, "wrong": 0}
    }
  ],
  "avg_busbw_gbs": 0.78
}
"#;

    #[test]
    fn chorus_sample_parses_into_rows_with_both_modes() {
        let doc = BenchDoc::from_stdout(CHORUS_SAMPLE, 2).unwrap();
        assert_eq!(doc.transport, "tcp");
        assert_eq!(doc.rows.len(), 3);
        assert_eq!(doc.rows[2].size, Bytes(8 << 20));
        let ip = doc.rows[0].in_place.unwrap();
        assert_eq!(ip.time_us, 20.9);
        assert_eq!(ip.wrong, 0);
        assert!(doc.rows.iter().all(|r| r.out_of_place.is_some()));
        assert_eq!(doc.library, None);
    }

    #[test]
    fn a_progress_line_before_a_one_line_document_is_skipped() {
        let one_line =
            serde_json::to_string(&BenchDoc::from_stdout(CHORUS_SAMPLE, 2).unwrap()).unwrap();
        let stdout = format!("warming up\n{one_line}\n");
        assert_eq!(BenchDoc::from_stdout(&stdout, 2).unwrap().rows.len(), 3);
    }

    #[test]
    fn peer_documents_with_a_null_mode_and_a_library_parse() {
        let gloo = r#"{"chorus_bench":1,"collective":"all-reduce","ranks":4,"transport":"tcp",
            "dtype":"float","op":"sum","warmup":2,"iters":5,"library":"torch 2.15.0 gloo",
            "rows":[{"size":64,"count":16,"type":"float","redop":"sum","root":-1,
            "out_of_place":null,"in_place":{"time_us":150.0,"algbw_gbs":0.0004,"busbw_gbs":0.0006,"wrong":0}}],
            "avg_busbw_gbs":0.0006}"#;
        let doc = BenchDoc::from_stdout(gloo, 4).unwrap();
        assert_eq!(doc.rows[0].out_of_place, None);
        assert_eq!(doc.library.as_deref(), Some("torch 2.15.0 gloo"));
    }

    #[test]
    fn legs_join_in_size_order_and_only_from_the_same_run() {
        let doc = BenchDoc::from_stdout(CHORUS_SAMPLE, 2).unwrap();
        let mut first = doc.clone();
        first.rows.truncate(2);
        first.avg_busbw_gbs = 0.1;
        let mut second = doc.clone();
        second.rows.drain(..2);
        second.avg_busbw_gbs = 2.0;
        second.iters = 999;
        let mut joined = first.clone();
        joined.extend(second.clone()).unwrap();
        assert_eq!(joined.rows, doc.rows);
        assert_eq!(joined.iters, doc.iters, "the first leg's calls are kept");
        assert!((joined.avg_busbw_gbs - (0.1 * 2.0 + 2.0) / 3.0).abs() < 1e-12);
        // Out of order: refused, naming both sizes.
        let mut backwards = second.clone();
        let err = backwards.extend(first.clone()).unwrap_err().to_string();
        assert!(err.contains("8 B") && err.contains("8 MiB"), "{err}");
        // Another transport or library: refused.
        let mut other = second.clone();
        other.transport = "shm".to_owned();
        let mut base = first.clone();
        assert!(base.extend(other).unwrap_err().to_string().contains("shm"));
        let mut other = second;
        other.library = Some("torch 2.15.0 gloo".to_owned());
        assert!(first.clone().extend(other).is_err());
    }

    #[test]
    fn empty_or_foreign_output_says_what_was_wrong() {
        let err = BenchDoc::from_stdout("", 2).unwrap_err().to_string();
        assert!(err.contains("printed nothing"), "{err}");
        let err = BenchDoc::from_stdout("error: unrecognized subcommand 'bench'\n", 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no chorus_bench document"), "{err}");
    }

    #[test]
    fn documents_that_do_not_match_the_run_are_refused() {
        let wrong_ranks = BenchDoc::from_stdout(CHORUS_SAMPLE, 4)
            .unwrap_err()
            .to_string();
        assert!(wrong_ranks.contains("2 ranks"), "{wrong_ranks}");
        let future = CHORUS_SAMPLE.replace("\"chorus_bench\": 1", "\"chorus_bench\": 2");
        assert!(
            BenchDoc::from_stdout(&future, 2)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
        let broadcast = CHORUS_SAMPLE.replace("\"all-reduce\"", "\"broadcast\"");
        assert!(BenchDoc::from_stdout(&broadcast, 2).is_err());
        let bad_count = CHORUS_SAMPLE.replace("\"count\": 2048", "\"count\": 2047");
        assert!(
            BenchDoc::from_stdout(&bad_count, 2)
                .unwrap_err()
                .to_string()
                .contains("2047")
        );
        let zero_time = CHORUS_SAMPLE.replace("\"time_us\": 40.0", "\"time_us\": 0.0");
        assert!(BenchDoc::from_stdout(&zero_time, 2).is_err());
        let no_rows = r#"{"chorus_bench":1,"collective":"all-reduce","ranks":2,"transport":"tcp",
            "dtype":"float","op":"sum","warmup":1,"iters":1,"rows":[],"avg_busbw_gbs":0}"#;
        assert!(
            BenchDoc::from_stdout(no_rows, 2)
                .unwrap_err()
                .to_string()
                .contains("no rows")
        );
    }
}
