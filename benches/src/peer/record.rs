//! The raw results of a run, as `peer-run` writes them and `peer-report` reads them:
//! `raw/meta.json` (what was run, where) and `raw/records.jsonl` (one line per measurement
//! or failure, appended as the run goes, so an interrupted run keeps what it measured).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::peer::PeerError;
use crate::peer::bench_doc::BenchDoc;
use crate::peer::loopback::TcpLimit;
use crate::peer::memcpy::MemcpyPoint;
use crate::peer::sweep::Bytes;
use crate::peer::system::System;

/// What was run, on what, with which versions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
    pub quick: bool,
    pub min: Bytes,
    pub max: Bytes,
    pub factor: u32,
    pub warmup: u32,
    pub iters: u32,
    /// Whether the sizes up to `small_up_to` made `small_calls` times the calls (absent in
    /// older runs: no).
    #[serde(default)]
    pub scaled: bool,
    /// A scaled sweep's factor on the calls ([`crate::peer::sweep::SMALL_CALLS`]), written
    /// down so that readers of the report (`readme_table.py`) need not know it.
    #[serde(default = "small_calls")]
    pub small_calls: u32,
    /// The largest size a scaled sweep gives more calls ([`crate::peer::sweep::SMALL_UP_TO`]).
    #[serde(default = "small_up_to")]
    pub small_up_to: Bytes,
    pub rounds: u32,
    pub ranks: Vec<u32>,
    /// The systems the run was asked to measure.
    #[serde(default = "all_systems")]
    pub systems: Vec<System>,
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    /// Open MPI's version, torch's, chorus's git revision: whatever could be read.
    pub versions: Vec<(String, String)>,
}

fn small_calls() -> u32 {
    crate::peer::sweep::SMALL_CALLS
}

fn small_up_to() -> Bytes {
    crate::peer::sweep::SMALL_UP_TO
}

fn all_systems() -> Vec<System> {
    System::ALL.to_vec()
}

/// One line of `records.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// One system's sweep at one rank count in one round.
    Run(RunRecord),
    /// The memcpy limit measured in one round.
    Memcpy {
        round: u32,
        points: Vec<MemcpyPoint>,
    },
    /// The loopback TCP limit measured in one round.
    Tcp { round: u32, limit: TcpLimit },
    /// A limit that could not be measured in one round.
    LimitFailed {
        round: u32,
        which: String,
        reason: String,
    },
}

/// One system's sweep at one rank count in one round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub round: u32,
    pub system: System,
    pub ranks: u32,
    /// Wall time of the whole sweep, process start-up included.
    pub elapsed_s: f64,
    pub outcome: RunOutcome,
}

/// What came of one sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunOutcome {
    Measured {
        doc: BenchDoc,
    },
    /// It ran and failed: a non-zero exit, a timeout, or output that is not a valid document.
    Failed {
        reason: String,
    },
    /// It could not be started: not installed, not built.
    Unavailable {
        reason: String,
    },
    /// It was not started: an earlier round failed, or the run's time budget was spent.
    Skipped {
        reason: String,
    },
}

/// The raw results folder of one run.
#[derive(Clone, Debug)]
pub struct RawDir {
    dir: PathBuf,
}

impl RawDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where one sweep's stdout and stderr go.
    pub fn log_paths(&self, round: u32, system: &str, ranks: u32) -> (PathBuf, PathBuf) {
        let stem = self
            .dir
            .join("logs")
            .join(format!("r{round}-{system}-n{ranks}"));
        (stem.with_extension("out"), stem.with_extension("err"))
    }

    /// Starts a fresh run: empties the folder's records and logs, writes `meta`.
    pub fn start(&self, meta: &Meta) -> Result<(), PeerError> {
        let logs = self.dir.join("logs");
        if logs.exists() {
            fs::remove_dir_all(&logs)
                .map_err(|e| PeerError::io(format!("clear {}", logs.display()), e))?;
        }
        fs::create_dir_all(&logs)
            .map_err(|e| PeerError::io(format!("create {}", logs.display()), e))?;
        let records = self.records_path();
        File::create(&records)
            .map_err(|e| PeerError::io(format!("create {}", records.display()), e))?;
        let text = serde_json::to_string_pretty(meta).map_err(|e| PeerError::BadResults {
            path: self.meta_path().display().to_string(),
            why: e.to_string(),
        })?;
        fs::write(self.meta_path(), text)
            .map_err(|e| PeerError::io(format!("write {}", self.meta_path().display()), e))
    }

    /// Appends one record (one line), flushed at once.
    pub fn append(&self, record: &Record) -> Result<(), PeerError> {
        let path = self.records_path();
        let line = serde_json::to_string(record).map_err(|e| PeerError::BadResults {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| PeerError::io(format!("open {}", path.display()), e))?;
        writeln!(file, "{line}")
            .map_err(|e| PeerError::io(format!("append to {}", path.display()), e))
    }

    /// Reads a run back: its meta and every record, in order.
    pub fn read(&self) -> Result<(Meta, Vec<Record>), PeerError> {
        let meta_path = self.meta_path();
        let text = fs::read_to_string(&meta_path)
            .map_err(|e| PeerError::io(format!("read {}", meta_path.display()), e))?;
        let meta = serde_json::from_str(&text).map_err(|e| PeerError::BadResults {
            path: meta_path.display().to_string(),
            why: e.to_string(),
        })?;
        let path = self.records_path();
        let file =
            File::open(&path).map_err(|e| PeerError::io(format!("read {}", path.display()), e))?;
        let mut records = Vec::new();
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| PeerError::io(format!("read {}", path.display()), e))?;
            if line.trim().is_empty() {
                continue;
            }
            let record = serde_json::from_str(&line).map_err(|e| PeerError::BadResults {
                path: path.display().to_string(),
                why: format!("line {}: {e}", n + 1),
            })?;
            records.push(record);
        }
        Ok((meta, records))
    }

    fn meta_path(&self) -> PathBuf {
        self.dir.join("meta.json")
    }

    fn records_path(&self) -> PathBuf {
        self.dir.join("records.jsonl")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn meta() -> Meta {
        Meta {
            started_unix_s: 1_700_000_000,
            quick: true,
            min: Bytes(8),
            max: Bytes(128 << 20),
            factor: 8,
            warmup: 2,
            iters: 5,
            scaled: false,
            small_calls: crate::peer::sweep::SMALL_CALLS,
            small_up_to: crate::peer::sweep::SMALL_UP_TO,
            rounds: 2,
            ranks: vec![2, 4],
            systems: System::ALL.to_vec(),
            cpu: "AMD EPYC".to_owned(),
            cores: 2,
            kernel: "6.1".to_owned(),
            versions: vec![("Open MPI".to_owned(), "4.1.4".to_owned())],
        }
    }

    pub(crate) fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("chorus-peer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn records_written_are_read_back_in_order() {
        let raw = RawDir::new(temp_dir("records"));
        raw.start(&meta()).unwrap();
        let records = vec![
            Record::Tcp {
                round: 1,
                limit: TcpLimit {
                    stream_gbs: 3.5,
                    pingpong_8b_us: 12.0,
                },
            },
            Record::Run(RunRecord {
                round: 1,
                system: System::GlooTcp,
                ranks: 2,
                elapsed_s: 1.5,
                outcome: RunOutcome::Failed {
                    reason: "timed out after 60 s".to_owned(),
                },
            }),
            Record::LimitFailed {
                round: 1,
                which: "memcpy".to_owned(),
                reason: "x".to_owned(),
            },
        ];
        for r in &records {
            raw.append(r).unwrap();
        }
        let (read_meta, read) = raw.read().unwrap();
        assert_eq!(read_meta, meta());
        assert_eq!(read, records);
        let _ = fs::remove_dir_all(raw.path());
    }

    #[test]
    fn a_corrupt_line_is_reported_with_its_number() {
        let raw = RawDir::new(temp_dir("corrupt"));
        raw.start(&meta()).unwrap();
        raw.append(&Record::LimitFailed {
            round: 1,
            which: "tcp".to_owned(),
            reason: "r".to_owned(),
        })
        .unwrap();
        fs::write(
            raw.path().join("records.jsonl"),
            "{\"kind\":\"limit_failed\",\"round\":1,\"which\":\"t\",\"reason\":\"r\"}\n{oops\n",
        )
        .unwrap();
        let err = raw.read().unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        let _ = fs::remove_dir_all(raw.path());
    }

    #[test]
    fn a_missing_run_names_the_file() {
        let err = RawDir::new("/nonexistent/raw")
            .read()
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/raw/meta.json"), "{err}");
    }
}
