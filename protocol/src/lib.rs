//! The chorus wire protocol, sans-IO.
//!
//! Floor 1 of the house (`DESIGN.md`): every other crate speaks through the types here, and
//! this crate depends on nothing of ours. It must never depend on tokio, quinn, io-uring,
//! cudarc, a clock, a socket or a thread: bytes go in, typed messages or typed errors come
//! out. `SPEC.md` beside this crate is normative; the code follows it.

#![forbid(unsafe_code)]

pub mod code;
pub mod dtype;
pub mod ids;
pub mod message;

pub use code::CloseCode;
pub use dtype::{Collective, DType, ReduceOp};
pub use ids::{CommId, Epoch, OpSeq, Rank};
