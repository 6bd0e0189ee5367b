//! The lineage's control-stream pool: the streams open to peers (each with a reader and a
//! writer task), the ones being opened, the frames waiting for them, and the bounded
//! close-after-flush every stream ends with.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chorus_control::Input;
use chorus_engine::LinkError;
use chorus_protocol::message::{Message, PeerInfo, Role};
use chorus_protocol::{CloseCode, CommId, Epoch, Rank};
use chorus_transport::{ControlChannel, Fingerprint, QuicEndpoint};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::runtime::Clock;
use crate::runtime::mailbox::{LineageMsg, not_yet};
use crate::runtime::socket_addr;

/// How many frames wait for a stream to a peer being opened: a peer we cannot reach does
/// not grow our memory.
const MAX_PENDING: usize = 1024;

/// One open control stream.
struct Chan {
    peer: Rank,
    epoch: Epoch,
    role: Role,
    channel: Arc<ControlChannel>,
    out: mpsc::UnboundedSender<Outgoing>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
}

/// Where a control stream to a peer goes: the communicator and this member's rank at the
/// stream's epoch, and the peer's entry in that epoch's table.
pub(super) struct Route {
    pub(super) comm: CommId,
    pub(super) me: Rank,
    pub(super) peer: PeerInfo,
}

/// What a stream's writer task does next, in order.
enum Outgoing {
    Send(Message),
    /// Close the stream with this code once everything queued before it is written.
    Close(CloseCode, String),
}

impl Chan {
    fn is_member(&self, peer: Rank, epoch: Epoch) -> bool {
        self.role == Role::Member && self.peer == peer && self.epoch == epoch
    }

    fn send(&self, message: Message) {
        let _ = self.out.send(Outgoing::Send(message));
    }

    /// Closes after the writer flushed what is queued (see [`close_after_flush`]).
    fn close(
        mut self,
        clock: Clock,
        code: CloseCode,
        detail: &str,
        budget: Duration,
    ) -> JoinHandle<()> {
        let _ = self.out.send(Outgoing::Close(code, detail.to_owned()));
        let writer = self.writer.take();
        close_after_flush(clock, self.channel.clone(), writer, code, detail, budget)
    }
}

impl Drop for Chan {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(w) = &self.writer {
            w.abort();
        }
    }
}

/// What became of a stream handed to the pool.
pub(super) enum Added {
    /// Closed at once: the lineage is over.
    Refused,
    /// The lineage is leaving: the stream carries the departure queued for it and closes;
    /// the handle resolves once the close left.
    Departing(JoinHandle<()>),
    /// Open: frames read from it arrive as [`LineageMsg::Frame`]s.
    Open,
}

/// The pool; see the module docs.
pub(super) struct Channels {
    clock: Clock,
    quic: QuicEndpoint,
    /// Where the streams' readers (and openers) report.
    me: mpsc::UnboundedSender<LineageMsg>,
    /// The bound on each stream's close.
    close_budget: Duration,
    /// How long an opener keeps trying.
    give_up: Duration,
    chans: HashMap<u64, Chan>,
    next_chan: u64,
    connecting: HashSet<(Epoch, Rank)>,
    pending: HashMap<(Epoch, Rank), VecDeque<Message>>,
    /// The lineage is over: no stream opens any more.
    closed: bool,
}

impl Channels {
    pub(super) fn new(
        clock: Clock,
        quic: QuicEndpoint,
        me: mpsc::UnboundedSender<LineageMsg>,
        close_budget: Duration,
        give_up: Duration,
    ) -> Channels {
        Channels {
            clock,
            quic,
            me,
            close_budget,
            give_up,
            chans: HashMap::new(),
            next_chan: 0,
            connecting: HashSet::new(),
            pending: HashMap::new(),
            closed: false,
        }
    }

    /// Streams to members being opened.
    pub(super) fn connecting(&self) -> impl Iterator<Item = &(Epoch, Rank)> {
        self.connecting.iter()
    }

    /// The lineage is over: streams handed in from now on are closed at once.
    pub(super) fn close(&mut self) {
        self.closed = true;
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Takes a stream (accepted, or opened by [`Channels::ensure`]). While `departing`
    /// (with its code and detail), a stream this member opened before it left carries the
    /// departure queued for it, then closes; a stream a peer opens now is closed with the
    /// code at once.
    pub(super) fn add(
        &mut self,
        peer: Rank,
        epoch: Epoch,
        role: Role,
        channel: Arc<ControlChannel>,
        departing: Option<(CloseCode, &str)>,
    ) -> Added {
        if self.closed {
            channel.close(CloseCode::NORMAL, "member left");
            return Added::Refused;
        }
        if let Some((code, detail)) = departing {
            let queued = if role == Role::Member {
                self.connecting.remove(&(epoch, peer));
                self.pending.remove(&(epoch, peer)).unwrap_or_default()
            } else {
                VecDeque::new()
            };
            let writer = {
                let channel = channel.clone();
                tokio::spawn(async move {
                    for m in queued {
                        if channel.send(m).await.is_err() {
                            break;
                        }
                    }
                })
            };
            let closing = close_after_flush(
                self.clock,
                channel,
                Some(writer),
                code,
                detail,
                self.close_budget,
            );
            return Added::Departing(closing);
        }
        let id = self.next_chan;
        self.next_chan += 1;
        let (out, rx) = mpsc::unbounded_channel::<Outgoing>();
        let writer = tokio::spawn(write(channel.clone(), rx));
        let reader = tokio::spawn(read(channel.clone(), id, role, self.me.clone()));
        if role == Role::Member {
            self.connecting.remove(&(epoch, peer));
            if let Some(queued) = self.pending.remove(&(epoch, peer)) {
                for m in queued {
                    let _ = out.send(Outgoing::Send(m));
                }
            }
        }
        self.chans.insert(
            id,
            Chan {
                peer,
                epoch,
                role,
                channel,
                out,
                reader,
                writer: Some(writer),
            },
        );
        Added::Open
    }

    /// Stream `id` ended with `error`: what the node learns of it, if anything (only the
    /// last member stream to a peer at an epoch speaks for the peer).
    pub(super) fn down(&mut self, id: u64, error: LinkError) -> Option<Input> {
        let chan = self.chans.remove(&id)?;
        if chan.role != Role::Member {
            return None;
        }
        let (peer, epoch) = (chan.peer, chan.epoch);
        if self.chans.values().any(|c| c.is_member(peer, epoch)) {
            return None;
        }
        match error {
            LinkError::PeerDeparted { code, .. } => {
                Some(Input::ConnectionClosed { peer, epoch, code })
            }
            LinkError::Cancelled(_) => None,
            LinkError::Protocol { code, .. } => Some(Input::ConnectionLost { peer, epoch, code }),
            error => {
                // A QUIC connection ends without a close only by silence: its idle timeout,
                // which is longer than the heartbeat deadline (the detector has judged the
                // peer already), or this process's own freeze, after which every timer
                // expires at once on resume and would condemn every peer of a member that
                // was itself frozen (and is about to learn it was evicted). Silence is the
                // detector's to weigh; the stream is reopened when next needed.
                tracing::debug!(%peer, %epoch, %error, "control stream lost");
                None
            }
        }
    }

    /// An attempt to open a stream to `peer` at `epoch` gave up: what waited for it goes.
    pub(super) fn connect_failed(&mut self, peer: Rank, epoch: Epoch) {
        self.connecting.remove(&(epoch, peer));
        self.pending.remove(&(epoch, peer));
    }

    /// Sends `message` on stream `id` (a status reply, a welcome), if it is open.
    pub(super) fn send_on(&self, id: u64, message: Message) {
        if let Some(c) = self.chans.get(&id) {
            c.send(message);
        }
    }

    /// Sends `message` to member `to` at `epoch`, queueing it (bounded) while the stream is
    /// opened; `route` says where to open it.
    pub(super) fn send(
        &mut self,
        to: Rank,
        epoch: Epoch,
        message: Message,
        route: impl FnOnce() -> Option<Route>,
    ) {
        match self.chans.values().find(|c| c.is_member(to, epoch)) {
            Some(c) => c.send(message),
            None => {
                let queue = self.pending.entry((epoch, to)).or_default();
                if queue.len() >= MAX_PENDING {
                    queue.pop_front();
                }
                queue.push_back(message);
                self.ensure(to, epoch, route);
            }
        }
    }

    /// Opens a control stream to `peer` at `epoch` unless one is open or opening.
    pub(super) fn ensure(
        &mut self,
        peer: Rank,
        epoch: Epoch,
        route: impl FnOnce() -> Option<Route>,
    ) {
        if self.closed
            || self.connecting.contains(&(epoch, peer))
            || self.chans.values().any(|c| c.is_member(peer, epoch))
        {
            return;
        }
        let Some(route) = route() else { return };
        self.connecting.insert((epoch, peer));
        let (clock, quic, tx) = (self.clock, self.quic.clone(), self.me.clone());
        // Give up after a deadline's worth of trying: by then the detector has decided.
        let give_up = clock.now() + self.give_up;
        tokio::spawn(async move {
            let envelope = chorus_protocol::Envelope::new(route.comm, epoch, route.me);
            let addr = socket_addr(&route.peer.control);
            let mut pause = Duration::from_millis(5);
            let mut refused = None;
            loop {
                let attempt = quic.connect(
                    addr,
                    Fingerprint(route.peer.fingerprint),
                    Role::Member,
                    envelope,
                    peer,
                );
                match tokio::time::timeout_at(clock.tokio(give_up), attempt).await {
                    Ok(Ok(conn)) => {
                        let channel = Arc::new(conn.into_control());
                        let _ = tx.send(LineageMsg::Channel {
                            peer,
                            epoch,
                            role: Role::Member,
                            channel,
                        });
                        return;
                    }
                    Ok(Err(e)) if not_yet(&e) && clock.now() + pause < give_up => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, %epoch, error = %e, "control stream not opened");
                        // A member that removed this one refuses it with `evicted`: the
                        // node must hear that (it is how a healed minority learns).
                        refused = (e.code() == CloseCode::EVICTED).then_some(CloseCode::EVICTED);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(LineageMsg::ConnectFailed {
                peer,
                epoch,
                refused,
            });
        });
    }

    /// Closes the member streams to `peer` at `epoch` with `code` (after a flush).
    pub(super) fn close_peer(&mut self, peer: Rank, epoch: Epoch, code: CloseCode) {
        let ids: Vec<u64> = self
            .chans
            .iter()
            .filter(|(_, c)| c.is_member(peer, epoch))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(c) = self.chans.remove(&id) {
                drop(c.close(self.clock, code, code.name(), self.close_budget));
            }
        }
    }

    /// Closes every stream after flushing it (bounded); the handles resolve when closed.
    pub(super) fn close_all(&mut self, code: CloseCode, detail: &str) -> Vec<JoinHandle<()>> {
        let (clock, budget) = (self.clock, self.close_budget);
        self.chans
            .drain()
            .map(|(_, c)| c.close(clock, code, detail, budget))
            .collect()
    }
}

/// Closes `channel` with `code` once `writer` has written what was queued for it, giving up
/// on the writer and closing at once after `budget` (a frozen peer's flow control cannot
/// hold the close back). The handle resolves once the close left this process (within the
/// same budget): the close is the departure (principle 1), and the endpoint sends it at its
/// next turn, so a process that exits right after its teardown must not take it along.
fn close_after_flush(
    clock: Clock,
    channel: Arc<ControlChannel>,
    writer: Option<JoinHandle<()>>,
    code: CloseCode,
    detail: &str,
    budget: Duration,
) -> JoinHandle<()> {
    let detail = detail.to_owned();
    tokio::spawn(async move {
        let until = clock.now() + budget;
        if let Some(writer) = writer {
            let abort = writer.abort_handle();
            if tokio::time::timeout_at(clock.tokio(until), writer)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        // Idempotent when the writer already closed it.
        channel.close(code, &detail);
        while !channel.close_sent() && clock.now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

/// A stream's writer task: sends what is queued, in order, until told to close.
async fn write(channel: Arc<ControlChannel>, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(next) = rx.recv().await {
        match next {
            Outgoing::Send(m) => {
                if channel.send(m).await.is_err() {
                    break;
                }
            }
            Outgoing::Close(code, detail) => {
                channel.close(code, &detail);
                break;
            }
        }
    }
}

/// A stream's reader task: hands every frame to the lineage, then the end of the stream.
async fn read(
    channel: Arc<ControlChannel>,
    id: u64,
    role: Role,
    me: mpsc::UnboundedSender<LineageMsg>,
) {
    loop {
        match channel.recv().await {
            Ok(frame) => {
                let msg = LineageMsg::Frame {
                    id,
                    peer: frame.header.sender,
                    epoch: frame.header.epoch,
                    role,
                    message: frame.message,
                };
                if me.send(msg).is_err() {
                    break;
                }
            }
            Err(error) => {
                let _ = me.send(LineageMsg::ChannelDown { id, error });
                break;
            }
        }
    }
}
