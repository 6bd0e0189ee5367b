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

#![forbid(unsafe_code)]
