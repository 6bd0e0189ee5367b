//! The chorus wire protocol, sans-IO.
//!
//! Floor 1 of the house (`docs/ARCHITECTURE.md`): every other crate speaks through the types here,
//! and this crate depends on nothing of ours. It must never depend on tokio, quinn, io-uring,
//! cudarc, a clock, a socket or a thread: bytes go in, typed messages or typed errors come out.
//! `SPEC.md` beside this crate is normative; the code follows it.
//!
//! The pieces a transport uses: an [`Encoder`] and a [`Decoder`] per byte stream, and the
//! handshake state machines [`Connector`] and [`Acceptor`]. The control plane and runtime
//! use the [`message`] bodies, [`CloseCode`]s and the identifier newtypes. The non-default
//! `testkit` feature adds `samples`: one valid frame of every kind, the golden vectors'
//! sources, for tests and benches only (never enable it in a library or binary).
//!
//! # A stream, end to end
//!
//! ```
//! use std::time::{Duration, Instant};
//! use bytes::BytesMut;
//! use chorus_protocol::message::{Heartbeat, Role};
//! use chorus_protocol::*;
//!
//! let secret = JobSecret::new([7; 32]);
//! let deadline = Instant::now() + Duration::from_secs(5);
//! let me = Envelope::new(CommId(1), Epoch(0), Rank(1));
//!
//! // Connector: write the Hello (nonces come from the caller's CSPRNG).
//! let mut to_acceptor = BytesMut::new();
//! let cfg = ConnectorConfig::new(secret.clone(), me, Role::Member, Nonce([1; 32]), deadline);
//! let mut connector = Connector::new(cfg, &mut to_acceptor)?;
//! let mut conn_rx = Decoder::new(Side::Connector, Limits::DEFAULT);
//!
//! // Acceptor: decode, verify, apply policy, answer.
//! let mut acc_rx = Decoder::new(Side::Acceptor, Limits::DEFAULT);
//! acc_rx.push(&to_acceptor); // or read the socket into `acc_rx.recv_buf()`
//! let hello = acc_rx.next()?.expect("a whole frame");
//! let mut acceptor = Acceptor::new(AcceptorConfig::new(secret, Nonce([2; 32]), deadline));
//! let mut to_connector = BytesMut::new();
//! let peer = acceptor.handle(&hello, &mut to_connector)?; // Err: a Reject was written
//! assert_eq!(peer.sender, Rank(1));
//! let a = acceptor.accept(Epoch(0), Rank(0), &mut to_connector)?;
//! a.apply(&mut acc_rx);
//!
//! // Connector: verify the answer; both ends now use their stream's encoder.
//! conn_rx.push(&to_connector);
//! let c = connector.handle(&conn_rx.next()?.expect("a whole frame"))?;
//! c.apply(&mut conn_rx);
//! let mut enc = connector.into_encoder();
//! let mut wire = BytesMut::new();
//! enc.encode(&me, &Message::Heartbeat(Heartbeat { seq: 0, digest: 0 }), &mut wire)?;
//! acc_rx.push(&wire);
//! let frame = acc_rx.next()?.expect("a whole frame");
//! assert_eq!(frame.message, Message::Heartbeat(Heartbeat { seq: 0, digest: 0 }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
pub mod caps;
mod chunk;
pub mod code;
pub mod decoder;
pub mod dtype;
pub mod error;
pub mod frame;
pub mod gate;
pub mod handshake;
pub mod header;
pub mod ids;
pub mod limits;
pub mod message;
#[cfg(feature = "testkit")]
pub mod samples;
pub mod validation;

pub use code::CloseCode;
pub use decoder::{ChunkHead, Decoder};
pub use dtype::{Collective, DType, ReduceOp};
pub use error::{DecodeError, EncodeError};
pub use frame::{Encoder, Frame};
pub use gate::{Gate, Side};
pub use handshake::{
    Acceptor, AcceptorConfig, ChannelBinding, Connector, ConnectorConfig, Established,
    HandshakeError, JobSecret, Nonce, PeerHello, VersionRange,
};
pub use header::{Envelope, HEADER_LEN, Header};
pub use ids::{CommId, Epoch, OpSeq, Rank};
pub use limits::Limits;
pub use message::{Kind, Message};
pub use validation::Invalid;
