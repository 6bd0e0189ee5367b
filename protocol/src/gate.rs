//! Which frames a receiver admits on a stream, by phase and role (SPEC.md, "Roles").
//!
//! Before the handshake completes only handshake frames pass, so a stranger who does not
//! know the job secret can make a receiver buffer at most one fixed-size `Hello`. After it,
//! the role chosen in the `Hello` decides which kinds each side may send.

use crate::ids::{CommId, Rank};
use crate::message::{Kind, Role};

/// Which end of a stream: the one that opened it (and sent `Hello`) or the one that
/// accepted it.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Side {
    /// The end that opened the stream and sent `Hello`.
    Connector,
    /// The end that accepted the stream and answers with `HelloAck` or `Reject`.
    Acceptor,
}

impl Side {
    /// The other end.
    pub const fn peer(self) -> Side {
        match self {
            Side::Connector => Side::Acceptor,
            Side::Acceptor => Side::Connector,
        }
    }
}

/// The receiving rule a decoder applies to each frame header.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Gate {
    /// Every kind, from anyone: for tests, tools and fuzzing, never for a live stream.
    Open,
    /// Handshake in progress at `local`'s end: an acceptor admits only `Hello`; a connector
    /// only `HelloAck` or `Reject`.
    Handshake {
        /// This end of the stream, whose admissible handshake kinds apply.
        local: Side,
    },
    /// Handshake done: the kinds `role` lets the peer's side send, and only from the
    /// communicator and sender rank the handshake authenticated.
    Established {
        /// The role the connector chose in its `Hello`.
        role: Role,
        /// This end of the stream (the receiver): the peer sends as the other side.
        local: Side,
        /// The only communicator frames may name.
        comm: CommId,
        /// The only sender rank frames may name (the rank the handshake authenticated).
        peer: Rank,
    },
}

impl Gate {
    /// True if a frame of `kind` may arrive through this gate.
    pub fn admits(&self, kind: Kind) -> bool {
        match *self {
            Gate::Open => true,
            Gate::Handshake {
                local: Side::Acceptor,
            } => kind == Kind::Hello,
            Gate::Handshake {
                local: Side::Connector,
            } => matches!(kind, Kind::HelloAck | Kind::Reject),
            Gate::Established { role, local, .. } => permitted(role, local.peer(), kind),
        }
    }

    /// A short name of the phase, for errors.
    pub fn phase(&self) -> &'static str {
        match self {
            Gate::Open => "open",
            Gate::Handshake { .. } => "during the handshake",
            Gate::Established { role, .. } => match role {
                Role::Member => "on a member stream",
                Role::Data => "on a data stream",
                Role::Bootstrap => "on a bootstrap stream",
                Role::Joiner => "on a joiner stream",
                Role::Status => "on a status stream",
                Role::Launcher => "on a launcher stream",
            },
        }
    }
}

/// True if, after the handshake, the `from` side of a stream with `role` may send `kind`.
/// This is SPEC.md's role table; `Depart` is allowed everywhere (principle 1).
pub fn permitted(role: Role, from: Side, kind: Kind) -> bool {
    use Kind::*;
    if kind == Depart {
        return true;
    }
    match (role, from) {
        (Role::Member, _) => matches!(
            kind,
            Heartbeat
                | Notice
                | Revoke
                | Prepare
                | Promise
                | Propose
                | Accept
                | Commit
                | Join
                | StatusRequest
                | StatusReply
        ),
        (Role::Data, _) => kind == Chunk,
        (Role::Bootstrap | Role::Joiner, Side::Connector) => matches!(kind, Join | Heartbeat),
        (Role::Bootstrap | Role::Joiner, Side::Acceptor) => {
            matches!(kind, Welcome | Reject | Heartbeat)
        }
        (Role::Status, Side::Connector) => kind == StatusRequest,
        (Role::Launcher, Side::Connector) => matches!(kind, StatusRequest | Notice),
        (Role::Status | Role::Launcher, Side::Acceptor) => matches!(kind, StatusReply | Reject),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stranger_can_only_send_hello_to_an_acceptor() {
        let g = Gate::Handshake {
            local: Side::Acceptor,
        };
        for k in Kind::ALL {
            assert_eq!(g.admits(k), k == Kind::Hello, "{k}");
        }
        let g = Gate::Handshake {
            local: Side::Connector,
        };
        assert!(g.admits(Kind::HelloAck) && g.admits(Kind::Reject));
        assert!(!g.admits(Kind::Welcome));
    }

    #[test]
    fn data_streams_carry_only_chunks_and_departures() {
        for k in Kind::ALL {
            let ok = permitted(Role::Data, Side::Connector, k);
            assert_eq!(ok, matches!(k, Kind::Chunk | Kind::Depart), "{k}");
        }
    }

    #[test]
    fn status_clients_may_only_ask() {
        assert!(permitted(
            Role::Status,
            Side::Connector,
            Kind::StatusRequest
        ));
        assert!(!permitted(Role::Status, Side::Connector, Kind::Notice));
        assert!(!permitted(Role::Status, Side::Connector, Kind::Revoke));
        assert!(permitted(Role::Launcher, Side::Connector, Kind::Notice));
        assert!(permitted(Role::Status, Side::Acceptor, Kind::StatusReply));
    }

    #[test]
    fn handshake_frames_never_pass_after_the_handshake() {
        for role in [
            Role::Member,
            Role::Data,
            Role::Bootstrap,
            Role::Joiner,
            Role::Status,
            Role::Launcher,
        ] {
            for from in [Side::Connector, Side::Acceptor] {
                assert!(!permitted(role, from, Kind::Hello));
                assert!(!permitted(role, from, Kind::HelloAck));
            }
        }
    }
}
