//! chorus-control: the sans-IO control plane.
//!
//! Floor 2 of the house (`docs/ARCHITECTURE.md`). It decides who is alive, who left, who is dead
//! and what the next communicator looks like: membership ledger, liveness detector, departure,
//! revoke, agreement, shrink/grow planning and bootstrap, plus (with the `testkit` feature)
//! `sim`, a seeded deterministic simulator of many ranks on a faulty network.
//!
//! Time and messages are inputs. This crate must never depend on tokio, quinn, io-uring,
//! cudarc or `chorus-engine`, and never read a clock, spawn a thread or touch a socket: the
//! runtime in `chorus` drives it, the simulator drives it in tests.
//!
//! # Map
//!
//! - [`Node`]: one member. `handle(now, input)`, then drain `poll_transmit`,
//!   `poll_intent`, `poll_event`, and call again at `poll_timeout`.
//! - [`Rendezvous`]: the bootstrap root. Collects `Join`s, answers `Welcome`.
//! - [`plan`]: pure shrink/grow layout planning.
//! - [`Ledger`], [`overlay`], [`broadcast`]: what a member believes, who watches whom, how
//!   news spreads.
//! - `sim` (non-default `testkit` feature): the deterministic simulator and its property
//!   checks. A cargo feature rather than `cfg(test)` so the crate's integration tests and
//!   examples can drive it; test support only, never enabled by a library or binary.
//!
//! # Who sends what to whom
//!
//! - **Liveness.** Ranks sit on a ring of present members. Every rank sends `Heartbeat`
//!   (with a digest of what it knows) to its `k` successors every heartbeat interval, and
//!   declares a predecessor dead after `deadline` of silence (its own stalls excluded).
//!   Conclusive evidence (a `Depart`, a departure close code, a lost connection, a process
//!   exit seen on the host) is acted on at once. Steady-state cost: `k / interval` frames
//!   per rank per second, whatever the world size.
//! - **Notices.** A verdict becomes a `Notice` flooded over fingers (ranks 1, 2, 4, ...
//!   ahead): ⌈log2 N⌉ hops, every member receives it from several predecessors, and a
//!   heartbeat whose digest differs triggers a push of what the receiver knows
//!   (anti-entropy), so losses and healed partitions are repaired. "Absent" means dead or
//!   departed, never suspect.
//! - **Revoke.** `Revoke` floods the same way; idempotent per epoch.
//! - **Agreement.** Single-decree Paxos per epoch: the lowest present rank (or the rank
//!   admitting joiners) sends `Prepare` to every present member, collects `Promise`s (with
//!   accepted proposals and known absences), sends `Propose` (removed ranks + joiners),
//!   collects `Accept`s from a quorum ([`Quorum`]) and floods `Commit`. A silent or absent
//!   coordinator is replaced by a higher ballot; a value accepted before a crash is the
//!   one re-proposed. Members that missed the commit get it back when they next send a
//!   frame of the old epoch.
//! - **Giving up.** A member whose own view holds fewer live members than the quorum needs
//!   fails its shrink at once with [`Event::AgreementFailed`] ([`NoQuorum`]) and starts no
//!   round; any other request fails at its one deadline ([`Config::request_timeout`]).
//! - **Eviction.** A rank that learns it was removed, or declared dead while it was
//!   stalled, gets [`Event::Evicted`] and goes inert. A member of a newer epoch answers a
//!   stale frame from a rank it removed with `Depart{evicted}` and a close with `evicted`;
//!   a member whose own view has no quorum (a partitioned minority) knocks on the members
//!   it holds dead, one heartbeat per interval (`knock`), so once a cut heals it hears it
//!   was removed.

#![forbid(unsafe_code)]

mod agreement;
pub mod bootstrap;
pub mod broadcast;
pub mod config;
mod detector;
pub mod error;
pub mod event;
pub mod input;
mod knock;
pub mod lateness;
pub mod ledger;
pub mod node;
mod outbox;
pub mod overlay;
pub mod plan;
pub mod quorum;
mod request;
mod revoke;
#[cfg(feature = "testkit")]
pub mod sim;
pub mod time;
pub mod transmit;
pub mod view;

pub use bootstrap::{BootstrapError, JoinError, Rendezvous};
pub use config::{Config, ConfigError, Quorum};
pub use error::InputError;
pub use event::{Agreed, AgreementFailure, Event, Eviction};
pub use input::{Command, Input, Received, Witness};
pub use lateness::Lateness;
pub use ledger::{Ledger, PeerRecord};
pub use node::{Node, Stats, Status};
pub use plan::{Plan, PlanError};
pub use quorum::NoQuorum;
pub use time::Instant;
pub use transmit::{ConnectionIntent, Transmit};
pub use view::{View, ViewError};
