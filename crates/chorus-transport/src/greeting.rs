//! The IO half of the handshake over any ordered byte stream (a TCP socket, a QUIC stream):
//! read exactly the frames the handshake needs, under the handshake limits, and answer a
//! bad peer with `Reject` and the spec's code.

use std::net::SocketAddr;
use std::sync::Arc;

use chorus_protocol::message::{Message, Reject, Role};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::TransportError;
use crate::handshake::{self, Refusal};
use crate::secret::JobSecret;
use crate::wire::{self, Decoder, Frame, Limits, Route};

/// Tells an acceptor which rank it is in the communicator a `Hello` names, or why it
/// refuses the connection (an unknown communicator, a stale epoch, a role it does not serve).
pub type Admission =
    Arc<dyn Fn(CommId, Epoch, Role) -> Result<Rank, (CloseCode, String)> + Send + Sync>;

/// An admission that accepts every communicator and role as `rank` (tests, single-comm use).
pub fn admit_all(rank: Rank) -> Admission {
    Arc::new(move |_, _, _| Ok(rank))
}

/// What a finished handshake established.
#[derive(Debug)]
pub(crate) struct Greeted {
    pub(crate) role: Role,
    pub(crate) version: u16,
    /// Our route on this connection (what we put in headers).
    pub(crate) me: Route,
    /// The peer's route (what its headers must carry).
    pub(crate) peer: Route,
    /// The decoder, with any bytes read past the handshake still buffered.
    pub(crate) decoder: Decoder,
}

/// Connector side: send `Hello`, wait for `HelloAck` from `peer_rank`. The caller bounds
/// the whole exchange with the handshake deadline.
pub(crate) async fn connect<R, W>(
    r: &mut R,
    w: &mut W,
    addr: SocketAddr,
    secret: &JobSecret,
    role: Role,
    me: Route,
    peer_rank: Rank,
) -> Result<Greeted, TransportError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hello = handshake::hello(secret, role, me);
    let bytes = wire::encode(me, 0, &Message::Hello(hello.clone()))
        .map_err(|source| TransportError::Wire { addr, source })?;
    w.write_all(&bytes)
        .await
        .map_err(TransportError::io("send hello"))?;
    w.flush().await.map_err(TransportError::io("send hello"))?;
    let mut decoder = Decoder::new(Limits::HANDSHAKE);
    let frame = read_frame(r, &mut decoder, addr).await?;
    let peer = frame.header.route;
    let refuse = |code: CloseCode, detail: String| TransportError::Rejected { addr, code, detail };
    match frame.message {
        Message::HelloAck(ack) => {
            if peer.comm != me.comm || peer.epoch != me.epoch || peer.sender != peer_rank {
                return Err(refuse(
                    CloseCode::PROTOCOL_VIOLATION,
                    format!(
                        "acceptor answered as {} of {} {}, expected {} of {} {}",
                        peer.sender, peer.comm, peer.epoch, peer_rank, me.comm, me.epoch
                    ),
                ));
            }
            let version = handshake::confirm(secret, &hello, &ack, peer)
                .map_err(|Refusal { code, detail }| refuse(code, detail))?;
            Ok(Greeted {
                role,
                version,
                me,
                peer,
                decoder,
            })
        }
        Message::Reject(Reject { code, detail }) => Err(refuse(code, detail)),
        other => Err(refuse(
            CloseCode::PROTOCOL_VIOLATION,
            format!("expected hello-ack, got {:?}", other.kind()),
        )),
    }
}

/// Acceptor side: read `Hello`, check it, answer `HelloAck` or `Reject`.
pub(crate) async fn accept<R, W>(
    r: &mut R,
    w: &mut W,
    addr: SocketAddr,
    secret: &JobSecret,
    admission: &Admission,
) -> Result<Greeted, TransportError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut decoder = Decoder::new(Limits::HANDSHAKE);
    let frame = match read_frame(r, &mut decoder, addr).await {
        Ok(f) => f,
        Err(e) => {
            if matches!(e, TransportError::Wire { .. }) {
                reject(w, Route::UNKNOWN, e.code(), &e.to_string()).await;
            }
            return Err(e);
        }
    };
    let peer = frame.header.route;
    let result = match frame.message {
        Message::Hello(hello) => match admission(peer.comm, peer.epoch, hello.role) {
            Ok(rank) => {
                let me = Route {
                    sender: rank,
                    ..peer
                };
                match handshake::accept(secret, &hello, peer, me) {
                    Ok(ack) => Ok((hello.role, ack, me)),
                    Err(Refusal { code, detail }) => Err((code, detail, me)),
                }
            }
            Err((code, detail)) => Err((code, detail, Route::UNKNOWN)),
        },
        other => Err((
            CloseCode::PROTOCOL_VIOLATION,
            format!("expected hello, got {:?}", other.kind()),
            Route::UNKNOWN,
        )),
    };
    match result {
        Ok((role, ack, me)) => {
            let version = ack.version;
            let bytes = wire::encode(me, 0, &Message::HelloAck(ack))
                .map_err(|source| TransportError::Wire { addr, source })?;
            w.write_all(&bytes)
                .await
                .map_err(TransportError::io("send hello-ack"))?;
            w.flush()
                .await
                .map_err(TransportError::io("send hello-ack"))?;
            Ok(Greeted {
                role,
                version,
                me,
                peer,
                decoder,
            })
        }
        Err((code, detail, me)) => {
            reject(w, me, code, &detail).await;
            Err(TransportError::Rejected { addr, code, detail })
        }
    }
}

/// Best effort: the caller closes the connection right after, whatever happens here.
async fn reject<W: AsyncWrite + Unpin>(w: &mut W, me: Route, code: CloseCode, detail: &str) {
    let msg = Message::Reject(Reject {
        code,
        detail: detail.chars().take(256).collect(),
    });
    if let Ok(bytes) = wire::encode(me, 0, &msg) {
        let _ = w.write_all(&bytes).await;
        let _ = w.flush().await;
    }
}

/// Reads until one whole frame is decoded.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    decoder: &mut Decoder,
    addr: SocketAddr,
) -> Result<Frame, TransportError> {
    loop {
        match decoder.decode() {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(source) => return Err(TransportError::Wire { addr, source }),
        }
        let want = decoder.wanted();
        let buf = decoder.buffer();
        buf.reserve(want);
        let n = r
            .read_buf(buf)
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

impl Route {
    /// The route of a refusal sent before we know who we are to the peer.
    pub(crate) const UNKNOWN: Route = Route {
        comm: CommId(0),
        epoch: Epoch(0),
        sender: Rank(u32::MAX),
    };
}
