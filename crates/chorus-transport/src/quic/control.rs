//! The control plane's message channel to one peer: whole protocol `Message`s in and out
//! over a QUIC stream (heartbeats, notices, agreement), and a close that carries a
//! `CloseCode` as the QUIC application error code.

use std::sync::Arc;

use chorus_engine::link::LinkError;
use chorus_protocol::message::{Depart, Message};
use chorus_protocol::{CloseCode, Rank};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::sync::Mutex as AsyncMutex;

use super::{Inner, connection_error, read_error, write_error};
use crate::wire::{self, Decoder, Frame, Route};

/// A message channel to one member. Every call runs on the QUIC progress thread, so the
/// runtime's control thread may call it from any executor.
#[derive(Clone, Debug)]
pub struct ControlChannel {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    endpoint: Arc<Inner>,
    conn: Connection,
    send: AsyncMutex<(SendStream, u64)>,
    recv: AsyncMutex<(RecvStream, Decoder)>,
    me: Route,
    peer: Route,
}

impl ControlChannel {
    pub(super) fn new(
        endpoint: Arc<Inner>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        decoder: Decoder,
        me: Route,
        peer: Route,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                endpoint,
                conn,
                send: AsyncMutex::new((send, 0)),
                recv: AsyncMutex::new((recv, decoder)),
                me,
                peer,
            }),
        }
    }

    /// The peer's rank, as the handshake established it.
    pub fn peer_rank(&self) -> Rank {
        self.shared.peer.sender
    }

    /// Sends `message` under our route (comm, epoch, rank) with the next sequence number.
    pub async fn send(&self, message: Message) -> Result<(), LinkError> {
        let shared = self.shared.clone();
        self.run(async move {
            let mut guard = shared.send.lock().await;
            let (stream, seq) = &mut *guard;
            *seq += 1;
            let bytes =
                wire::encode(shared.me, *seq, &message).map_err(|e| LinkError::Protocol {
                    code: e.code(),
                    detail: e.to_string(),
                })?;
            stream.write_all(&bytes).await.map_err(write_error)
        })
        .await
    }

    /// The next message from the peer. A `Depart` (or the peer's application close)
    /// arrives as `Err(PeerDeparted)`; a frame from anyone but the peer, or for another
    /// communicator, closes the channel with a protocol violation. Epochs are not checked
    /// here: the control plane outlives them and checks them itself.
    pub async fn recv(&self) -> Result<Frame, LinkError> {
        let shared = self.shared.clone();
        self.run(async move {
            let mut guard = shared.recv.lock().await;
            let (stream, decoder) = &mut *guard;
            loop {
                match decoder.decode() {
                    Ok(Some(frame)) => {
                        let r = frame.header.route;
                        if r.sender != shared.peer.sender || r.comm != shared.peer.comm {
                            let detail = format!("control frame from {} of {}", r.sender, r.comm);
                            shared.close_now(CloseCode::PROTOCOL_VIOLATION, &detail);
                            return Err(LinkError::Protocol {
                                code: CloseCode::PROTOCOL_VIOLATION,
                                detail,
                            });
                        }
                        if let Message::Depart(Depart { code, detail }) = frame.message {
                            return Err(LinkError::PeerDeparted { code, detail });
                        }
                        return Ok(frame);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        shared.close_now(e.code(), &e.to_string());
                        return Err(LinkError::Protocol {
                            code: e.code(),
                            detail: e.to_string(),
                        });
                    }
                }
                match stream
                    .read_chunk(decoder.wanted().max(16 << 10), true)
                    .await
                {
                    Ok(Some(chunk)) => decoder.buffer().extend_from_slice(&chunk.bytes),
                    Ok(None) => {
                        return Err(LinkError::ConnectionLost {
                            detail: "peer finished the control stream".into(),
                        });
                    }
                    Err(e) => return Err(read_error(e)),
                }
            }
        })
        .await
    }

    /// Leaves: a `Depart` frame (bounded by the departure budget), then
    /// `CONNECTION_CLOSE` with `code`.
    pub async fn depart(&self, code: CloseCode, detail: &str) {
        let shared = self.shared.clone();
        let detail = detail.to_owned();
        let budget = self.shared.endpoint.cfg.depart_timeout;
        let _ = self
            .run(async move {
                let msg = Message::Depart(Depart {
                    code,
                    detail: detail.chars().take(256).collect(),
                });
                if let Ok(bytes) = wire::encode(shared.me, 0, &msg) {
                    let _ = tokio::time::timeout(budget, async {
                        let mut guard = shared.send.lock().await;
                        guard.0.write_all(&bytes).await
                    })
                    .await;
                }
                shared.close_now(code, &detail);
                Ok(())
            })
            .await;
    }

    /// `CONNECTION_CLOSE` with `code` now, without a departure frame.
    pub fn close(&self, code: CloseCode, detail: &str) {
        self.shared.close_now(code, detail);
    }

    /// Why the connection ended, if it has.
    pub fn close_reason(&self) -> Option<LinkError> {
        self.shared
            .conn
            .close_reason()
            .map(|e| connection_error(&e))
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = Result<T, LinkError>> + Send + 'static,
    ) -> Result<T, LinkError> {
        self.shared
            .endpoint
            .progress
            .run(f)
            .await
            .unwrap_or_else(|_| {
                Err(LinkError::ConnectionLost {
                    detail: "quic progress thread has stopped".into(),
                })
            })
    }
}

impl Shared {
    fn close_now(&self, code: CloseCode, detail: &str) {
        self.conn
            .close(VarInt::from_u32(code.0.into()), detail.as_bytes());
    }
}
