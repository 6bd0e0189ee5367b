//! The connecting end: sends `Hello`, expects `HelloAck` or `Reject`.

use std::time::Instant;

use bytes::BytesMut;

use super::proof::{ChannelBinding, JobSecret, Nonce, hello_proof, verify_ack};
use super::version::VersionRange;
use super::{Established, HandshakeError};
use crate::error::EncodeError;
use crate::frame::{Encoder, Frame};
use crate::gate::Side;
use crate::header::Envelope;
use crate::ids::Rank;
use crate::limits::Limits;
use crate::message::{Hello, Message, PROOF_LEN, Role};

/// What a connector needs to open a stream.
#[derive(Clone, Debug)]
pub struct ConnectorConfig {
    /// The job secret the proofs are made under.
    pub secret: JobSecret,
    /// This end's communicator, epoch (0 if it has none yet) and rank (`Rank::NONE` if it is
    /// not a member: status client, launcher, grow joiner).
    pub envelope: Envelope,
    /// What the stream is for; fixes which kinds each side may send afterwards.
    pub role: Role,
    /// Fresh random bytes, never reused.
    pub nonce: Nonce,
    /// The rank being dialled: a `HelloAck` from any other sender fails with `WrongPeer`.
    /// `None` when the caller does not know it (the bootstrap root, a status target).
    pub peer: Option<Rank>,
    /// What the proofs are bound to: `ChannelBinding::Tls` on QUIC, `None` on plain TCP.
    pub binding: ChannelBinding,
    /// The versions this end offers in its `Hello`.
    pub versions: VersionRange,
    /// When to give up waiting for the answer.
    pub deadline: Instant,
    /// The decoding limits of the stream once established.
    pub limits: Limits,
}

impl ConnectorConfig {
    /// A configuration with the defaults: no channel binding, this build's versions, the
    /// default limits, peer not checked.
    pub fn new(
        secret: JobSecret,
        envelope: Envelope,
        role: Role,
        nonce: Nonce,
        deadline: Instant,
    ) -> Self {
        ConnectorConfig {
            secret,
            envelope,
            role,
            nonce,
            peer: None,
            binding: ChannelBinding::None,
            versions: VersionRange::SUPPORTED,
            deadline,
            limits: Limits::DEFAULT,
        }
    }
}

/// The connecting end of a handshake.
#[derive(Debug)]
pub struct Connector {
    config: ConnectorConfig,
    hello: Hello,
    encoder: Encoder,
    done: bool,
}

impl Connector {
    /// Starts a handshake: appends the `Hello` frame to `out`.
    pub fn new(config: ConnectorConfig, out: &mut BytesMut) -> Result<Connector, EncodeError> {
        let mut hello = Hello {
            version_min: config.versions.min,
            version_max: config.versions.max,
            role: config.role,
            nonce: config.nonce.0,
            proof: [0; PROOF_LEN],
        };
        hello.proof = hello_proof(&config.secret, &config.envelope, &hello, &config.binding);
        let mut encoder = Encoder::new(config.limits);
        encoder.encode(&config.envelope, &Message::Hello(hello.clone()), out)?;
        Ok(Connector {
            config,
            hello,
            encoder,
            done: false,
        })
    }

    /// When the caller must call [`Connector::handle_timeout`] if no answer has come.
    pub fn deadline(&self) -> Instant {
        self.config.deadline
    }

    /// Takes the acceptor's answer. `Ok` means the acceptor proved the secret and chose a
    /// version this end speaks; on `Err` the caller closes the stream with its code.
    pub fn handle(&mut self, frame: &Frame) -> Result<Established, HandshakeError> {
        if std::mem::replace(&mut self.done, true) {
            return Err(HandshakeError::Finished);
        }
        let ack = match &frame.message {
            Message::HelloAck(ack) => ack,
            Message::Reject(r) => {
                return Err(HandshakeError::Rejected {
                    code: r.code,
                    detail: r.detail.clone(),
                });
            }
            other => return Err(HandshakeError::Unexpected { kind: other.kind() }),
        };
        let route = frame.header.envelope();
        if route.comm != self.config.envelope.comm {
            return Err(HandshakeError::WrongComm {
                expected: self.config.envelope.comm,
                found: route.comm,
            });
        }
        if let Some(expected) = self.config.peer
            && route.sender != expected
        {
            return Err(HandshakeError::WrongPeer {
                expected,
                found: route.sender,
            });
        }
        // Authenticate before believing anything else the answer says.
        if !verify_ack(
            &self.config.secret,
            &self.hello,
            &route,
            ack,
            &self.config.binding,
        ) {
            return Err(HandshakeError::AuthFailed);
        }
        let version = u8::try_from(ack.version)
            .ok()
            .filter(|_| self.config.versions.contains(ack.version))
            .ok_or_else(|| HandshakeError::VersionMismatch {
                ours_min: self.config.versions.min,
                ours_max: self.config.versions.max,
                theirs: ack.version.to_string(),
            })?;
        self.encoder.set_version(version);
        Ok(Established {
            version,
            role: self.config.role,
            comm: route.comm,
            peer_epoch: route.epoch,
            peer: route.sender,
            local: Side::Connector,
        })
    }

    /// Fails the handshake if `now` is past the deadline and no answer was handled.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<HandshakeError> {
        if self.done || now < self.config.deadline {
            return None;
        }
        self.done = true;
        Some(HandshakeError::Deadline)
    }

    /// The stream's encoder, continuing after the `Hello`, at the negotiated version.
    pub fn into_encoder(self) -> Encoder {
        self.encoder
    }
}
