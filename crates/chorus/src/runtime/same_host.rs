//! Same-host data links through shared memory (`CHORUS_TRANSPORT` `auto`, the default, or
//! `shm`): where a peer's listener is, the connect, and the accept loop. Which peers get
//! one is `carrier.rs`'s decision: peers on other hosts (or in other network namespaces)
//! keep TCP, so a mixed world uses shm within each host and TCP across.
//!
//! The listener's abstract name is derived from the member's certificate fingerprint, which
//! every peer table already carries, so the wire needs no new field. A peer qualifies when
//! it advertises `caps::SHM` and `host_identity::same_network` says it runs under this
//! kernel boot, pid and network namespace. The connect checks the namespace once more:
//! abstract names live in one network namespace, and the listener is bound before this
//! member's peer-table entry exists, so a refused connect means "another namespace" and the
//! link falls back to TCP.

use std::sync::Arc;
use std::time::Duration;

use chorus_protocol::Envelope;
use chorus_protocol::message::{PeerInfo, Role};
use chorus_transport::{
    Admission, JobSecret, ShmListener, ShmTransport, TransportConfig, TransportError,
};

use super::Session;
use super::carrier::Carriers;
use super::mailbox::DataLink;

/// How long a same-host connect is retried before the peer is taken to live in another
/// network namespace (its listener has existed since before we learned of it).
const REACH: Duration = Duration::from_millis(250);

/// The abstract socket name of the shm listener of the member whose certificate has
/// `fingerprint`.
pub(crate) fn listener_name(fingerprint: &[u8; 32]) -> String {
    format!("chorus-shm.{}", hex::encode(&fingerprint[..16]))
}

/// Starts the shm transport and its listener, named after `fingerprint`.
pub(crate) async fn listen(
    tcfg: &TransportConfig,
    secret: &JobSecret,
    fingerprint: &[u8; 32],
    admission: Admission,
) -> Result<(ShmTransport, ShmListener), TransportError> {
    let cfg = TransportConfig {
        connect_timeout: tcfg.connect_timeout.min(REACH),
        ..tcfg.clone()
    };
    let shm = ShmTransport::new(cfg, secret.clone())?;
    let listener = shm.listen_at(listener_name(fingerprint), admission).await?;
    Ok((shm, listener))
}

/// What `session` serves, for `carrier.rs`'s per-peer choice.
pub(crate) fn carriers(session: &Session) -> Carriers<'_> {
    Carriers {
        shm: session.shm.is_some(),
        tcp: session.tcp.is_some(),
        host: &session.host,
    }
}

/// The shm data link to `peer`, as `route`.
pub(crate) async fn connect(
    shm: &ShmTransport,
    route: Envelope,
    peer: &PeerInfo,
) -> Result<DataLink, TransportError> {
    let conn = shm
        .connect(
            &listener_name(&peer.fingerprint),
            Role::Data,
            route,
            peer.rank,
        )
        .await?;
    Ok(Arc::new(conn.into_link()?) as DataLink)
}

/// Whether a failed shm connect means the peer cannot be reached this way at all (its
/// listener is not in our network namespace): fall back to TCP.
pub(crate) fn unreachable(e: &TransportError) -> bool {
    matches!(e, TransportError::ConnectTimeout { .. })
}

/// Serves the session's shm listener: every authenticated data connection becomes a link
/// handed to the registry, as the TCP listener's do.
pub(crate) fn spawn_accept_loop(session: &Arc<Session>, mut listener: ShmListener) {
    let weak = Arc::downgrade(session);
    session.handle.spawn(async move {
        loop {
            match listener.accept(Duration::from_secs(3600)).await {
                Ok(conn) => {
                    let Some(session) = weak.upgrade() else { break };
                    let (comm, epoch, peer) = (conn.comm(), conn.epoch(), conn.peer_rank());
                    match conn.into_link() {
                        Ok(link) => session.registry.deliver(comm, epoch, peer, Arc::new(link)),
                        Err(e) => tracing::debug!(error = %e, "refused an shm data connection"),
                    }
                }
                Err(TransportError::Shutdown) => break,
                Err(e) => {
                    if weak.strong_count() == 0 {
                        break;
                    }
                    tracing::trace!(error = %e, "shm data accept");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_name_is_the_fingerprints_and_fits_an_abstract_address() {
        let a = listener_name(&[0xab; 32]);
        assert_eq!(a, format!("chorus-shm.{}", "ab".repeat(16)));
        assert_ne!(a, listener_name(&[0xac; 32]));
        // sun_path holds 108 bytes, the leading NUL included.
        assert!(a.len() < 107);
    }
}
