//! The errors of the peer comparison: short, lowercase, naming the file or program involved.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("bad sweep: {0}")]
    BadSweep(String),
    #[error("bad chorus_bench document: {0}")]
    BadDoc(String),
    #[error("bad results file {path}: {why}")]
    BadResults { path: String, why: String },
    #[error("cannot draw the plot: {0}")]
    Plot(String),
}

impl PeerError {
    /// An I/O failure while trying to `what` (a lowercase verb phrase: "read meta.json").
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
