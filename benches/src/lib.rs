//! chorus-benches (floor 5): criterion micro-benchmarks and the side-by-side comparisons
//! against Gloo, Open MPI and NCCL. Nothing imports it.
//!
//! [`peer`] is the all-reduce comparison with Gloo and Open MPI that `benches/peer/run.sh`
//! drives through the `peer-run` and `peer-report` binaries. It runs chorus only as a
//! separate program (`chorus bench`), like the peers, so it needs nothing from the library.

pub mod peer;
