//! The accepting end: expects `Hello` by a deadline, verifies it, lets the caller's policy
//! decide, answers `HelloAck` or `Reject`.

use std::time::Instant;

use bytes::BytesMut;

use super::proof::{ChannelBinding, JobSecret, Nonce, ack_proof, verify_hello};
use super::version::VersionRange;
use super::{Established, HandshakeError};
use crate::code::CloseCode;
use crate::frame::{Encoder, Frame};
use crate::gate::Side;
use crate::header::Envelope;
use crate::ids::{CommId, Epoch, Rank};
use crate::limits::Limits;
use crate::message::{Hello, HelloAck, Message, PROOF_LEN, Reject, Role};

/// What an acceptor needs for one incoming stream.
#[derive(Clone, Debug)]
pub struct AcceptorConfig {
    /// The job secret the connector's proof must verify under.
    pub secret: JobSecret,
    /// Fresh random bytes for the `HelloAck`, never reused.
    pub nonce: Nonce,
    /// What the proofs are bound to: `ChannelBinding::Tls` on QUIC (a `Hello` recorded on one
    /// TLS session fails on any other), `None` on plain TCP.
    pub binding: ChannelBinding,
    /// The versions this end offers; the highest one in both ranges is chosen.
    pub versions: VersionRange,
    /// When a stream that has not sent a valid `Hello` is refused with `deadline`.
    pub deadline: Instant,
    /// The decoding limits of the stream once established (body sizes, table sizes).
    pub limits: Limits,
}

impl AcceptorConfig {
    /// A configuration with the defaults: no channel binding, this build's versions, the
    /// default limits.
    pub fn new(secret: JobSecret, nonce: Nonce, deadline: Instant) -> Self {
        AcceptorConfig {
            secret,
            nonce,
            binding: ChannelBinding::None,
            versions: VersionRange::SUPPORTED,
            deadline,
            limits: Limits::DEFAULT,
        }
    }
}

/// An authenticated `Hello`, for the caller's policy to admit or refuse.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct PeerHello {
    /// What the connector wants the stream for; the policy refuses roles it does not serve.
    pub role: Role,
    /// The communicator the connector names; refuse an unknown one with `unknown-comm`.
    pub comm: CommId,
    /// The connector's epoch (0 if it has none yet).
    pub epoch: Epoch,
    /// The connector's rank (`Rank::NONE` if it is not a member).
    pub sender: Rank,
    /// The version the stream will speak if admitted.
    pub version: u8,
}

#[derive(Debug)]
enum State {
    AwaitHello,
    Decide { hello: Box<Hello>, peer: PeerHello },
    Done,
}

/// The accepting end of a handshake.
#[derive(Debug)]
pub struct Acceptor {
    config: AcceptorConfig,
    encoder: Encoder,
    state: State,
}

impl Acceptor {
    /// An acceptor waiting for the connector's `Hello`.
    pub fn new(config: AcceptorConfig) -> Self {
        Acceptor {
            encoder: Encoder::new(config.limits),
            config,
            state: State::AwaitHello,
        }
    }

    /// When the caller must call [`Acceptor::handle_timeout`] if no `Hello` has come.
    pub fn deadline(&self) -> Instant {
        self.config.deadline
    }

    /// Takes the connector's `Hello`. `Ok` means it proved the secret and shares a version;
    /// the caller then calls [`Acceptor::accept`] or [`Acceptor::reject`]. On `Err` a
    /// `Reject` with the error's code has been appended to `out`: send it, then close.
    pub fn handle(
        &mut self,
        frame: &Frame,
        out: &mut BytesMut,
    ) -> Result<PeerHello, HandshakeError> {
        if !matches!(self.state, State::AwaitHello) {
            return Err(HandshakeError::Finished);
        }
        let hello = match &frame.message {
            Message::Hello(h) => h,
            other => {
                let e = HandshakeError::Unexpected { kind: other.kind() };
                return Err(self.refuse(e, frame.header.comm, out));
            }
        };
        let route = frame.header.envelope();
        // Authenticate before revealing anything about this end.
        if !verify_hello(&self.config.secret, &route, hello, &self.config.binding) {
            return Err(self.refuse(HandshakeError::AuthFailed, route.comm, out));
        }
        let theirs = VersionRange {
            min: hello.version_min,
            max: hello.version_max,
        };
        let Some(version) = self
            .config
            .versions
            .negotiate(theirs)
            .and_then(|v| u8::try_from(v).ok())
        else {
            let e = HandshakeError::VersionMismatch {
                ours_min: self.config.versions.min,
                ours_max: self.config.versions.max,
                theirs: format!("{}..={}", theirs.min, theirs.max),
            };
            return Err(self.refuse(e, route.comm, out));
        };
        let peer = PeerHello {
            role: hello.role,
            comm: route.comm,
            epoch: route.epoch,
            sender: route.sender,
            version,
        };
        self.state = State::Decide {
            hello: Box::new(hello.clone()),
            peer,
        };
        Ok(peer)
    }

    /// Admits the peer: appends the `HelloAck`, stamped with this end's `epoch` and `rank`
    /// in the peer's communicator (`Rank::NONE` if this end has none there). Every later
    /// frame this end sends on the stream must carry the same communicator and rank: the
    /// peer's decoder refuses any other sender.
    pub fn accept(
        &mut self,
        epoch: Epoch,
        rank: Rank,
        out: &mut BytesMut,
    ) -> Result<Established, HandshakeError> {
        let State::Decide { hello, peer } = std::mem::replace(&mut self.state, State::Done) else {
            return Err(HandshakeError::Finished);
        };
        let route = Envelope::new(peer.comm, epoch, rank);
        let mut ack = HelloAck {
            version: u16::from(peer.version),
            nonce: self.config.nonce.0,
            proof: [0; PROOF_LEN],
        };
        ack.proof = ack_proof(
            &self.config.secret,
            &hello,
            &route,
            &ack,
            &self.config.binding,
        );
        self.encoder
            .encode(&route, &Message::HelloAck(ack), out)
            .map_err(|e| HandshakeError::Refused {
                code: CloseCode::INTERNAL,
                detail: e.to_string(),
            })?;
        self.encoder.set_version(peer.version);
        Ok(Established {
            version: peer.version,
            role: peer.role,
            comm: peer.comm,
            peer_epoch: peer.epoch,
            peer: peer.sender,
            local: Side::Acceptor,
        })
    }

    /// Refuses the stream by policy (unknown communicator, duplicate rank, stale epoch,
    /// role not served, ...): appends a `Reject` and returns the error to close with.
    /// Also usable before a `Hello`, e.g. with a decode error's code.
    pub fn reject(
        &mut self,
        code: CloseCode,
        detail: impl Into<String>,
        out: &mut BytesMut,
    ) -> HandshakeError {
        let comm = match &self.state {
            State::Decide { peer, .. } => peer.comm,
            State::AwaitHello => CommId(0),
            State::Done => return HandshakeError::Finished,
        };
        let detail = detail.into();
        let e = HandshakeError::Refused {
            code,
            detail: detail.clone(),
        };
        self.write_reject(code, detail, comm, out);
        e
    }

    /// Refuses with `deadline` if `now` is past the deadline and the handshake is not done:
    /// appends the `Reject` and returns the error to close with.
    pub fn handle_timeout(&mut self, now: Instant, out: &mut BytesMut) -> Option<HandshakeError> {
        if matches!(self.state, State::Done) || now < self.config.deadline {
            return None;
        }
        Some(self.reject(
            CloseCode::DEADLINE,
            "no valid hello before the deadline",
            out,
        ))
    }

    /// The stream's encoder, continuing after the `HelloAck` or `Reject`.
    pub fn into_encoder(self) -> Encoder {
        self.encoder
    }

    fn refuse(&mut self, e: HandshakeError, comm: CommId, out: &mut BytesMut) -> HandshakeError {
        self.write_reject(e.code(), e.to_string(), comm, out);
        e
    }

    fn write_reject(&mut self, code: CloseCode, detail: String, comm: CommId, out: &mut BytesMut) {
        self.state = State::Done;
        let route = Envelope::new(comm, Epoch(0), Rank::NONE);
        // `Reject::new` bounds the detail, so encoding cannot fail on validation; if it
        // failed anyway the stream is closed with the code regardless.
        let _ = self
            .encoder
            .encode(&route, &Message::Reject(Reject::new(code, detail)), out);
    }
}
