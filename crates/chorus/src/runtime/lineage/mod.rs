//! A communicator lineage (a communicator and the ones shrunk or grown from it), as the
//! control thread runs it: one [`task::LineageTask`] per lineage owns the control plane's
//! `Node` and everything around it, and the application reads what it publishes and talks
//! to the task through a [`LineageHandle`] (the messages are in [`crate::runtime::mailbox`]).
//!
//! One job per file:
//! - [`task`]: the task — its loop, and carrying out what the policy decides ([`action`]);
//! - [`policy`]: every decision, sans-IO (fed `now` from the runtime's `Clock`), in the
//!   manner of `chorus_control::Node`, with its parts: [`waiters`] (shrink and grow
//!   bookkeeping), [`joiners`] (joiner admission), [`departure`] (leaving), [`aborts`] (events
//!   turned into aborts);
//! - [`channels`]: the control-stream pool and its bounded close-after-flush;
//! - [`exits`]: same-host process exits (pidfd);
//! - [`handle`]: starting a lineage and the application's handle on it; [`published`]:
//!   what the task publishes for the application to read.

mod aborts;
mod action;
mod channels;
mod departure;
mod exits;
mod handle;
mod joiners;
mod policy;
mod published;
mod task;
#[cfg(test)]
mod tests;
mod waiters;

pub(crate) use handle::{LineageHandle, start};
