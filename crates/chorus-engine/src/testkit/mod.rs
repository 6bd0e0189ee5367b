//! Test support, behind the non-default `testkit` feature: the collective matrix's cases,
//! deterministic inputs and sequential reference, forced algorithm configurations, and
//! worlds of host engines as threads. The engine's own tests and every device crate's tests
//! (chorus-cuda's GPU matrix) run the same cases against the same oracle through it, so a
//! difference on a device can only be the device's. Also [`skip`], the one way a test of a
//! crate above the engine says it could not run here.
//!
//! Inputs are integers over their whole range, and floats from small sets on which every
//! partial result is exact in every float type, so the expected results do not depend on
//! the order in which an algorithm combines the ranks.
//!
//! Test support only: these functions panic or return `Err(String)` on a wrong result,
//! which is what a test wants; nothing in the library uses them.

mod case;
mod config;
mod reference;
mod rig;
mod skip;
mod world;

pub use case::{Case, collectives, every_case, large_cases, layout};
pub use config::{forced, matrix_configs};
pub use reference::{garbage, input, reduced, reductions};
pub use rig::{Host, Rig, assert_clean, check, ring_exchange, sweep};
pub use skip::skip;
pub use world::{HostEngine, run_world};
