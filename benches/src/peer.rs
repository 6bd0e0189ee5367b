//! The side-by-side all-reduce comparison of chorus with Gloo and Open MPI (issue 7, item 4).
//!
//! `benches/peer/run.sh` installs the peers, builds everything and runs `peer-run`, which
//! measures the machine's limits and every system's sweep in interleaved rounds, appending
//! raw [`record`]s as it goes; [`report::write`] then reduces them ([`summary`]) to a
//! markdown table ([`markdown`]), a JSON file and a PNG plot ([`plot`]). `peer-report`
//! redoes that last step from a run's raw folder.
//!
//! Every system prints the same [`bench_doc`] (the `chorus_bench` schema agreed for
//! `chorus bench --json`), and every program runs under [`session`], which bounds it by a
//! deadline and leaves no process of it behind.

pub mod bench_doc;
mod error;
pub mod loopback;
pub mod markdown;
pub mod memcpy;
pub mod plane_targets;
pub mod plot;
pub mod py_targets;
pub mod record;
pub mod report;
pub mod runner;
pub mod session;
pub mod stop;
pub mod summary;
pub mod sweep;
pub mod system;

pub use error::PeerError;
