//! The handshake's IO half over any ordered byte stream (a TCP socket, a QUIC stream).
//!
//! The protocol's [`Connector`] and [`Acceptor`] decide everything: proofs, versions, the
//! `Reject` and its code. This file only moves their frames, reads with the protocol
//! [`Decoder`] under the handshake gate (so a stranger can make us hold one fixed-size
//! `Hello` at most), and bounds the exchange by the state machines' deadlines. The result
//! is the stream's framing state: the encoder that continues the sequence after the
//! handshake frame, and the decoder switched to the established role.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::message::{Depart, Message, Role};
use chorus_protocol::{
    Acceptor, AcceptorConfig, Connector, ConnectorConfig, Decoder, Encoder, Envelope, Established,
    Frame, HandshakeError, Rank, Side,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::admission::Admission;
use crate::error::TransportError;

/// How long a refusal (`Reject`, or the connector's `Depart`) may take to leave before the
/// stream is closed regardless.
const REFUSAL_BUDGET: Duration = Duration::from_millis(50);

/// A finished handshake: what it established and the stream's framing state.
#[derive(Debug)]
pub(crate) struct Greeted {
    pub(crate) established: Established,
    /// Our envelope on this stream (what our headers carry).
    pub(crate) me: Envelope,
    /// The sending half, continuing after our handshake frame.
    pub(crate) encoder: Encoder,
    /// The receiving half, past the handshake, with any bytes read beyond it buffered.
    pub(crate) decoder: Decoder,
}

impl Greeted {
    pub(crate) fn role(&self) -> Role {
        self.established.role
    }

    /// The peer's envelope: the communicator, its epoch as its handshake frame stated it,
    /// and its rank. Every frame it sends after the handshake carries these.
    pub(crate) fn peer(&self) -> Envelope {
        let e = &self.established;
        Envelope::new(e.comm, e.peer_epoch, e.peer)
    }
}

/// Connector side: send `Hello`, take the answer. On any failure the caller closes the
/// stream (with [`TransportError::code`] where the transport carries codes).
pub(crate) async fn connect<R, W>(
    r: &mut R,
    w: &mut W,
    addr: SocketAddr,
    config: ConnectorConfig,
) -> Result<Greeted, TransportError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let me = config.envelope;
    let limits = config.limits;
    let deadline = config.deadline;
    let timeout = deadline.saturating_duration_since(Instant::now());
    let mut out = BytesMut::new();
    let mut connector = Connector::new(config, &mut out)
        .map_err(|source| TransportError::Encode { addr, source })?;
    let mut decoder = Decoder::new(Side::Connector, limits);
    let exchange = async {
        write_all(w, &out, "send hello").await?;
        let frame = read_frame(r, &mut decoder, addr).await?;
        connector
            .handle(&frame)
            .map_err(|source| TransportError::Handshake { addr, source })
    };
    let result = match tokio::time::timeout_at(deadline.into(), exchange).await {
        Ok(result) => result,
        Err(_) => {
            // The state machine agrees the deadline passed; its error is ours.
            let _ = connector.handle_timeout(Instant::now().max(deadline));
            Err(TransportError::HandshakeTimeout { addr, timeout })
        }
    };
    let established = match result {
        Ok(established) => established,
        Err(e) => {
            // An answer that fails our checks (a forged proof, the wrong rank, a version we
            // did not offer) came from an acceptor that now takes us for established: tell
            // it why we leave, in the only way a byte stream carries a code.
            let answered = matches!(
                &e,
                TransportError::Handshake { source, .. }
                    if !matches!(source, HandshakeError::Rejected { .. })
            );
            if answered {
                let mut encoder = connector.into_encoder();
                let depart = Message::Depart(Depart::new(e.code(), e.to_string()));
                let mut bytes = BytesMut::new();
                if encoder.encode(&me, &depart, &mut bytes).is_ok() {
                    let _ = tokio::time::timeout(REFUSAL_BUDGET, w.write_all(&bytes)).await;
                }
            }
            return Err(e);
        }
    };
    established.apply(&mut decoder);
    Ok(Greeted {
        established,
        me,
        encoder: connector.into_encoder(),
        decoder,
    })
}

/// Acceptor side: take the `Hello` by the deadline, let `admission` decide, answer
/// `HelloAck` or `Reject` with the spec's code.
pub(crate) async fn accept<R, W>(
    r: &mut R,
    w: &mut W,
    addr: SocketAddr,
    config: AcceptorConfig,
    admission: &Admission,
) -> Result<Greeted, TransportError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let limits = config.limits;
    let deadline = config.deadline;
    let timeout = deadline.saturating_duration_since(Instant::now());
    let mut acceptor = Acceptor::new(config);
    let mut decoder = Decoder::new(Side::Acceptor, limits);
    let mut out = BytesMut::new();
    let read = tokio::time::timeout_at(deadline.into(), read_frame(r, &mut decoder, addr)).await;
    let result = match read {
        Err(_) => {
            // Appends the `Reject` with `DEADLINE`.
            let _ = acceptor.handle_timeout(Instant::now().max(deadline), &mut out);
            Err(TransportError::HandshakeTimeout { addr, timeout })
        }
        Ok(Err(TransportError::Decode { addr, source })) => {
            // A stream is never resynchronised: refuse with the decode error's code.
            let _ = acceptor.reject(source.code(), source.to_string(), &mut out);
            Err(TransportError::Decode { addr, source })
        }
        Ok(Err(e)) => Err(e),
        Ok(Ok(frame)) => decide(&mut acceptor, &frame, admission, &mut out)
            .map_err(|source| TransportError::Handshake { addr, source }),
    };
    if !out.is_empty() {
        let budget = match result {
            Ok(_) => deadline.saturating_duration_since(Instant::now()),
            Err(_) => REFUSAL_BUDGET,
        };
        let sent = tokio::time::timeout(budget, write_all(w, &out, "send hello-ack")).await;
        if result.is_ok() {
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(TransportError::HandshakeTimeout { addr, timeout }),
            }
        }
    }
    let (established, me) = result?;
    established.apply(&mut decoder);
    Ok(Greeted {
        established,
        me,
        encoder: acceptor.into_encoder(),
        decoder,
    })
}

/// Verifies the `Hello`, asks the policy, and writes the answer into `out`.
fn decide(
    acceptor: &mut Acceptor,
    frame: &Frame,
    admission: &Admission,
    out: &mut BytesMut,
) -> Result<(Established, Envelope), HandshakeError> {
    let hello = acceptor.handle(frame, out)?;
    let rank: Rank = match admission(hello.comm, hello.epoch, hello.sender, hello.role) {
        Ok(rank) => rank,
        Err((code, detail)) => return Err(acceptor.reject(code, detail, out)),
    };
    // Admitting the connector's epoch means serving it at that epoch.
    let established = acceptor.accept(hello.epoch, rank, out)?;
    Ok((established, Envelope::new(hello.comm, hello.epoch, rank)))
}

/// Reads until one whole frame is decoded, straight into the decoder's buffer.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    decoder: &mut Decoder,
    addr: SocketAddr,
) -> Result<Frame, TransportError> {
    loop {
        match decoder.next() {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(source) => return Err(TransportError::Decode { addr, source }),
        }
        let n = r
            .read_buf(decoder.recv_buf())
            .await
            .map_err(TransportError::io("read handshake"))?;
        if n == 0 {
            return Err(TransportError::Closed {
                addr,
                detail: "end of stream before the handshake finished".into(),
            });
        }
    }
}

async fn write_all<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), TransportError> {
    w.write_all(bytes).await.map_err(TransportError::io(what))?;
    w.flush().await.map_err(TransportError::io(what))
}
