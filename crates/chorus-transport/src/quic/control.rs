//! The control plane's message channel to one peer: whole protocol `Message`s in and out
//! over a QUIC stream (heartbeats, notices, agreement), and a close that carries a
//! `CloseCode` as the QUIC application error code.

use std::sync::Arc;

use bytes::BytesMut;
use chorus_engine::link::LinkError;
use chorus_protocol::gate::permitted;
use chorus_protocol::message::{Depart, Message, Role};
use chorus_protocol::{CloseCode, Decoder, Encoder, Envelope, Frame, Rank, Side};
use quinn::{Connection, RecvStream, SendStream};
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex as AsyncMutex;

use super::{Inner, code_of, connection_error, io_read_error, write_error};

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
    send: AsyncMutex<(SendStream, Encoder)>,
    recv: AsyncMutex<(RecvStream, Decoder)>,
    me: Envelope,
    peer: Envelope,
    /// The stream's role and our end of it: which kinds we may send (the peer's gate
    /// refuses the rest, so sending one would only close the channel).
    role: Role,
    local: Side,
    /// Datagrams the connection had sent when we closed it (see `close_sent`).
    sent_at_close: std::sync::OnceLock<u64>,
}

impl ControlChannel {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        endpoint: Arc<Inner>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        encoder: Encoder,
        decoder: Decoder,
        me: Envelope,
        peer: Envelope,
        role: Role,
        local: Side,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                endpoint,
                conn,
                send: AsyncMutex::new((send, encoder)),
                recv: AsyncMutex::new((recv, decoder)),
                me,
                peer,
                role,
                local,
                sent_at_close: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The peer's rank, as the handshake established it.
    pub fn peer_rank(&self) -> Rank {
        self.shared.peer.sender
    }

    /// Sends `message` under our envelope (comm, epoch, rank) as the stream's next frame.
    /// A message the codec refuses (a bound, a rule of the spec) or the stream's role does
    /// not let this end send is an error here, and nothing is sent.
    pub async fn send(&self, message: Message) -> Result<(), LinkError> {
        let kind = message.kind();
        if !permitted(self.shared.role, self.shared.local, kind) {
            return Err(LinkError::Protocol {
                code: CloseCode::PROTOCOL_VIOLATION,
                detail: format!(
                    "cannot send: a {kind} frame is not allowed from this end of a {:?} stream",
                    self.shared.role
                ),
            });
        }
        let shared = self.shared.clone();
        self.run(async move {
            let mut guard = shared.send.lock().await;
            let (stream, encoder) = &mut *guard;
            let mut bytes = BytesMut::new();
            encoder
                .encode(&shared.me, &message, &mut bytes)
                .map_err(|e| LinkError::Protocol {
                    code: CloseCode::PROTOCOL_VIOLATION,
                    detail: format!("cannot send: {e}"),
                })?;
            stream.write_all(&bytes).await.map_err(write_error)
        })
        .await
    }

    /// The next message from the peer. A `Depart` (or the peer's application close)
    /// arrives as `Err(PeerDeparted)`; a frame that fails the codec or the role's gate (a
    /// kind this role may not send, another communicator, another sender) closes the
    /// channel with the spec's code. Epochs are not checked here: the control plane
    /// outlives them and checks them itself.
    pub async fn recv(&self) -> Result<Frame, LinkError> {
        let shared = self.shared.clone();
        self.run(async move {
            let mut guard = shared.recv.lock().await;
            let (stream, decoder) = &mut *guard;
            loop {
                match decoder.next() {
                    Ok(Some(frame)) => {
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
                match stream.read_buf(decoder.recv_buf()).await {
                    Ok(0) => {
                        return Err(LinkError::ConnectionLost {
                            detail: "peer finished the control stream".into(),
                        });
                    }
                    Ok(_) => {}
                    Err(e) => return Err(io_read_error(&e)),
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
                let _ = tokio::time::timeout(budget, async {
                    let mut guard = shared.send.lock().await;
                    let (stream, encoder) = &mut *guard;
                    let depart = Message::Depart(Depart::new(code, detail.as_str()));
                    let mut bytes = BytesMut::new();
                    if encoder.encode(&shared.me, &depart, &mut bytes).is_ok() {
                        let _ = stream.write_all(&bytes).await;
                    }
                })
                .await;
                shared.close_now(code, &detail);
                Ok(())
            })
            .await;
    }

    /// `CONNECTION_CLOSE` with `code` now, without a departure frame.
    pub fn close(&self, code: CloseCode, detail: &str) {
        self.shared.close_now(code, detail);
    }

    /// True once the connection's end is settled on the wire: our `CONNECTION_CLOSE`
    /// was transmitted, or the peer closed it first. A process about to exit waits for it
    /// (bounded), or its departure dies with it.
    pub fn close_sent(&self) -> bool {
        let conn = &self.shared.conn;
        // Once closed, a connection sends nothing but its close: any datagram built after
        // the close call carries it.
        let sent = self
            .shared
            .sent_at_close
            .get()
            .is_some_and(|before| conn.stats().udp_tx.datagrams > *before);
        sent || matches!(
            conn.close_reason(),
            Some(reason) if !matches!(reason, quinn::ConnectionError::LocallyClosed)
        )
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

/// A channel dropped without a close (its last handle gone) ends with a code of ours,
/// not quinn's implicit 0, which the peer would read as a graceful departure (see
/// `unclaimed.rs`).
impl Drop for Shared {
    fn drop(&mut self) {
        self.close_now(crate::GIVEN_UP, "control channel dropped");
    }
}

impl Shared {
    fn close_now(&self, code: CloseCode, detail: &str) {
        // Datagrams built before the close; the next one carries the CONNECTION_CLOSE.
        let before = self.conn.stats().udp_tx.datagrams;
        self.sent_at_close.get_or_init(|| before);
        self.conn.close(code_of(code), detail.as_bytes());
    }
}
