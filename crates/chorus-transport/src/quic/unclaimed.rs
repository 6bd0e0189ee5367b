//! A QUIC connection that nobody has claimed yet, closed with a code of ours if it is
//! dropped so.
//!
//! quinn closes a connection whose every handle is dropped with application code 0, and 0
//! is chorus's `normal`: a graceful departure (SPEC 6). A connection given up before
//! anyone used it — a connect whose caller stopped waiting in the middle of its `Hello`
//! exchange (a control stream opener past its deadline, or replaced by a fresher attempt),
//! a connected one nobody claims, an accepted one nobody takes — would tell the peer,
//! which may already have admitted it, that this member left. It is closed with
//! `deadline` instead: a live peer's refusal, not evidence that it is gone.

use quinn::Connection;

use super::code_of;
use crate::{GIVEN_UP, GIVEN_UP_DETAIL};

/// See the module docs.
#[derive(Debug)]
pub(super) struct Unclaimed {
    conn: Connection,
    claimed: bool,
}

impl Unclaimed {
    pub(super) fn new(conn: Connection) -> Self {
        Unclaimed {
            conn,
            claimed: false,
        }
    }

    pub(super) fn get(&self) -> &Connection {
        &self.conn
    }

    /// Hands the connection to its owner, who closes it from now on.
    pub(super) fn claim(mut self) -> Connection {
        self.claimed = true;
        self.conn.clone()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if !self.claimed {
            // A no-op if it is closed already (the first close wins).
            self.conn
                .close(code_of(GIVEN_UP), GIVEN_UP_DETAIL.as_bytes());
        }
    }
}
