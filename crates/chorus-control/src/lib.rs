//! chorus-control: the sans-IO control plane.
//!
//! Floor 2 of the house (`DESIGN.md`). It decides who is alive, who left, who is dead and
//! what the next communicator looks like: membership ledger, liveness detector, departure,
//! revoke, agreement, shrink/grow planning and bootstrap, plus `sim`, a seeded deterministic
//! simulator of many ranks on a faulty network.
//!
//! Time and messages are inputs. This crate must never depend on tokio, quinn, io-uring,
//! cudarc or `chorus-engine`, and never read a clock, spawn a thread or touch a socket: the
//! runtime in `chorus` drives it, the simulator drives it in tests.
//!
//! # Map
//!
//! - [`Node`] — one member: `handle(now, input)`, then `poll_transmit`, `poll_intent`,
//!   `poll_event`, `poll_timeout`.
//! - [`Rendezvous`] — the bootstrap root: collects `Join`s, answers `Welcome`.
//! - [`plan`] — pure shrink/grow layout planning.
//! - [`Ledger`], [`overlay`], [`broadcast`] — what a member believes, who watches whom,
//!   how news spreads.
//! - [`sim`] — the deterministic simulator and its property checks.

#![forbid(unsafe_code)]

mod agreement;
pub mod bootstrap;
pub mod broadcast;
pub mod config;
mod detector;
pub mod error;
pub mod event;
pub mod input;
pub mod ledger;
pub mod node;
mod outbox;
pub mod overlay;
pub mod plan;
mod revoke;
pub mod sim;
pub mod time;
pub mod transmit;
pub mod view;

pub use bootstrap::{BootstrapError, JoinError, Rendezvous};
pub use config::{Config, ConfigError, Quorum};
pub use error::InputError;
pub use event::{Agreed, Event, Eviction};
pub use input::{Command, Frame, Input, Witness};
pub use ledger::{Ledger, PeerRecord};
pub use node::{Node, Stats, Status};
pub use plan::{Plan, PlanError};
pub use time::Instant;
pub use transmit::{ConnectionIntent, Transmit};
pub use view::{View, ViewError};
