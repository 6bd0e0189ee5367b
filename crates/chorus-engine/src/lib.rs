//! chorus-engine: the transport-independent collective engine.
//!
//! Floor 2 of the house (`DESIGN.md`). Algorithms (ring, recursive halving/doubling, trees),
//! chunk pipelining, operation contexts and the abort tree; it owns the two ports through
//! which it touches the world: [`link::Link`] (one peer) and [`device::Device`] (memory and
//! reductions).
//!
//! It must never depend on tokio, quinn, io-uring, cudarc, sockets or `chorus-control`: its
//! async code runs on any executor, and it learns about failures only through its operation
//! contexts and its links. Deadlines come from whoever owns a clock, through an abort.

#![forbid(unsafe_code)]

pub mod device;
pub mod link;
