//! Same-host process exits: pidfd watches on every same-host peer of the current epoch
//! (the fastest death evidence), and settling an exit against the peer's data link (a
//! member that left exits too, and must not read as a death).

use std::time::Duration;

use chorus_engine::LinkError;
use chorus_protocol::message::PeerInfo;
use chorus_protocol::{Epoch, Rank};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::runtime::Clock;
use crate::runtime::mailbox::{DataLink, LineageMsg};
use crate::watch::ProcessWatch;

/// How long a same-host peer's exit waits for its data link to say whether it departed
/// first (see [`settle`]); a crash settles the link sooner (the kernel closes a dead
/// process's sockets), so this bounds only the case of no link news at all.
const EXIT_GRACE: Duration = Duration::from_millis(20);

/// The watches on one epoch's same-host peers.
#[derive(Default)]
pub(super) struct Watches(Vec<JoinHandle<()>>);

impl Watches {
    /// Watches every peer of `epoch`'s `table` on this host (`host`) by process id,
    /// replacing the watches of earlier epochs; an exit arrives as [`LineageMsg::Exited`].
    /// The watches run on `runtime` (the first epoch's are set up on the application's
    /// thread, which has none).
    pub(super) fn watch(
        &mut self,
        runtime: &tokio::runtime::Handle,
        host: &str,
        table: &[PeerInfo],
        epoch: Epoch,
        tx: &mpsc::UnboundedSender<LineageMsg>,
    ) {
        self.stop();
        let me = std::process::id();
        for peer in table
            .iter()
            .filter(|p| p.pid != me && crate::host::is_local(host, &p.host))
        {
            let (rank, pid, tx) = (peer.rank, peer.pid, tx.clone());
            self.0.push(runtime.spawn(async move {
                match ProcessWatch::open(pid) {
                    Ok(watch) => {
                        if watch.exited().await.is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::debug!(pid, error = %e, "cannot watch a same-host peer");
                        return;
                    }
                }
                let _ = tx.send(LineageMsg::Exited { peer: rank, epoch });
            }));
        }
    }

    /// Stops every watch.
    pub(super) fn stop(&mut self) {
        for w in self.0.drain(..) {
            w.abort();
        }
    }
}

/// A same-host peer's process exited. A member that left sent its departure on its data
/// links before it exited, but the control stream's may still be in flight (or only
/// relayed), so its `link` says how it ended: a departure, or a crash (the kernel closed
/// the sockets without one). The link settles within the time the receiving thread takes
/// to read what already arrived; past `EXIT_GRACE` the exit is a death. The answer
/// arrives as [`LineageMsg::ExitedAs`].
pub(super) fn settle(
    clock: Clock,
    link: Option<DataLink>,
    peer: Rank,
    epoch: Epoch,
    tx: mpsc::UnboundedSender<LineageMsg>,
) {
    tokio::spawn(async move {
        let until = clock.now() + EXIT_GRACE;
        let end = loop {
            let seen = link.as_ref().and_then(|l| l.failure());
            match seen {
                Some(LinkError::PeerDeparted { code, .. }) => break Some(code),
                Some(_) => break None,
                None if link.is_none() || clock.now() >= until => {
                    break None;
                }
                None => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let _ = tx.send(LineageMsg::ExitedAs { peer, epoch, end });
    });
}
