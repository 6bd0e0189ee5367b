//! The chorus wire protocol, sans-IO.
//!
//! Floor 1 of the house (`DESIGN.md`): every other crate speaks through the types here, and
//! this crate depends on nothing of ours. It must never depend on tokio, quinn, io-uring,
//! cudarc, a clock, a socket or a thread: bytes go in, typed messages or typed errors come
//! out. `SPEC.md` beside this crate is normative; the code follows it.
//!
//! The pieces a transport uses: an [`Encoder`] and a [`Decoder`] per byte stream, and the
//! handshake state machines [`Connector`] and [`Acceptor`]. The control plane and runtime
//! use the [`message`] bodies, [`CloseCode`]s and the identifier newtypes.

#![forbid(unsafe_code)]

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
pub mod samples;
pub mod validation;

pub use code::CloseCode;
pub use decoder::Decoder;
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
