//! Data links: one per pair of members at each epoch, all built before a communicator is
//! handed to the application, within the caller's deadline.
//!
//! The lower rank of each pair connects and the higher accepts, so every pair has exactly
//! one connection. A peer that has not yet set up the epoch (it learned of it a moment
//! later) refuses with `unknown-comm`; the connector retries until the deadline, which is
//! what turns "not yet" into "not at all". A peer that dies meanwhile is declared absent by
//! the control plane, which aborts the build (the caller races it with the epoch's
//! context) rather than letting it wait for the deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_protocol::message::{PeerInfo, Role};
use chorus_protocol::{CloseCode, CommId, Envelope, Epoch, Rank};
use chorus_transport::{Fingerprint, TransportError};
use futures::future::try_join_all;

use super::carrier::Carrier;
use super::mailbox::{DataLink, not_yet};
use super::{Session, millis, same_host, socket_addr, tokio_instant};
use crate::error::{Error, ErrorKind};

/// Links from `me` to every other member of `members` (ordered by rank) for `comm` at
/// `epoch`. Runs on the control thread.
pub(crate) async fn mesh(
    session: Arc<Session>,
    comm: CommId,
    epoch: Epoch,
    me: Rank,
    members: Vec<PeerInfo>,
    deadline: Instant,
) -> Result<Vec<DataLink>, Error> {
    let started = Instant::now();
    let waits = members.iter().filter(|p| p.rank != me).map(|peer| {
        let session = session.clone();
        let peer = peer.clone();
        async move {
            let link = if me < peer.rank {
                connect(&session, comm, epoch, me, &peer, deadline).await
            } else {
                accept(&session, comm, epoch, peer.rank, deadline).await
            };
            link.map_err(|e| e.with_peer(peer.rank))
        }
    });
    let links = try_join_all(waits).await?;
    tracing::debug!(%comm, %epoch, rank = %me, links = links.len(),
        ms = millis(started.elapsed()), "data links up");
    Ok(links)
}

async fn connect(
    session: &Session,
    comm: CommId,
    epoch: Epoch,
    me: Rank,
    peer: &PeerInfo,
    deadline: Instant,
) -> Result<DataLink, Error> {
    let addr = socket_addr(&peer.data);
    let route = Envelope::new(comm, epoch, me);
    let mut pause = Duration::from_millis(2);
    // Shared memory with a peer on this host, until it proves unreachable that way.
    let carriers = same_host::carriers(session);
    let mut carrier = carriers.for_peer(peer);
    loop {
        let attempt = async {
            match (carrier, &session.shm, &session.tcp) {
                (Carrier::Shm, Some(shm), _) => same_host::connect(shm, route, peer).await,
                (Carrier::Shm | Carrier::Tcp, _, Some(tcp)) => tcp
                    .connect(addr, Role::Data, route, peer.rank)
                    .await
                    .and_then(|c| c.into_link())
                    .map(|l| Arc::new(l) as DataLink),
                _ => session
                    .quic
                    .connect(
                        addr,
                        Fingerprint(peer.fingerprint),
                        Role::Data,
                        route,
                        peer.rank,
                    )
                    .await
                    .and_then(|c| c.into_link())
                    .map(|l| Arc::new(l) as DataLink),
            }
        };
        let result = tokio::time::timeout_at(tokio_instant(deadline), attempt).await;
        match result {
            Ok(Ok(link)) => return Ok(link),
            Ok(Err(e)) if carrier == Carrier::Shm && same_host::unreachable(&e) => {
                tracing::debug!(peer = %peer.rank, "shm listener unreachable (another network namespace); using the network");
                carrier = carriers.across();
            }
            Ok(Err(e)) if retryable(&e) && Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Ok(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::Transport,
                    format!("data link to {} at {addr}: {e}", peer.rank),
                ));
            }
            Err(_) => return Err(timeout(comm, epoch, peer.rank, "connecting")),
        }
    }
}

async fn accept(
    session: &Session,
    comm: CommId,
    epoch: Epoch,
    peer: Rank,
    deadline: Instant,
) -> Result<DataLink, Error> {
    let claim = session.registry.claim(comm, epoch, peer);
    match tokio::time::timeout_at(tokio_instant(deadline), claim).await {
        Ok(Ok(link)) => Ok(link),
        Ok(Err(_)) => Err(Error::new(
            ErrorKind::Aborted,
            format!("{comm}@{epoch} was retired while waiting for {peer}'s data link"),
        )),
        Err(_) => Err(timeout(comm, epoch, peer, "waiting for")),
    }
}

/// Worth another try: the peer does not serve the epoch yet, or the connection failed
/// below the protocol (refused, reset: the peer is not listening yet, or died — which the
/// control plane decides, aborting the build if so; see `build_epoch`).
fn retryable(e: &TransportError) -> bool {
    not_yet(e) || matches!(e.code(), CloseCode::INTERNAL)
}

fn timeout(comm: CommId, epoch: Epoch, peer: Rank, what: &str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("{what} the data link with {peer} for {comm}@{epoch} passed the deadline"),
    )
}
