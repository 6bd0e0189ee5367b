//! Worlds of host engines, ranks as threads over in-process links, under a watchdog.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use chorus_protocol::Rank;

use crate::{AbortReason, Context, Engine, EngineConfig, HeldLimit, HostDevice, LocalLink};

/// The engine the host tests drive.
pub type HostEngine = Engine<HostDevice, LocalLink<Bytes>>;

/// Run `f` on every rank of a world of `n` threads. Each rank gets one engine per config,
/// each over its own mesh, all under one root context. If the world has not finished within
/// `limit`, the root is aborted (so nothing hangs) and the test fails.
pub fn run_world<R: Send>(
    n: u32,
    configs: &[EngineConfig],
    limit: Duration,
    f: impl Fn(&[HostEngine]) -> R + Send + Sync,
) -> Vec<R> {
    let root = Context::root();
    let dev = Arc::new(HostDevice);
    let mut per_rank: Vec<Vec<HostEngine>> = (0..n).map(|_| Vec::new()).collect();
    for config in configs {
        let mesh = crate::local::mesh::<Bytes>(n, HeldLimit::bytes(64 << 20));
        for (r, links) in mesh.into_iter().enumerate() {
            let e = Engine::new(Rank(r as u32), n, links, dev.clone(), &root, config.clone())
                .expect("engine");
            per_rank[r].push(e);
        }
    }
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        let handles: Vec<_> = per_rank
            .iter()
            .map(|engines| {
                let tx = tx.clone();
                let f = &f;
                s.spawn(move || {
                    let r = f(engines);
                    let _ = tx.send(());
                    r
                })
            })
            .collect();
        let mut done = 0;
        let mut timed_out = false;
        while done < n {
            match rx.recv_timeout(limit) {
                Ok(()) => done += 1,
                Err(_) => {
                    root.abort(AbortReason::requested("test watchdog"));
                    timed_out = true;
                    break;
                }
            }
        }
        let results: Vec<R> = handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect();
        assert!(!timed_out, "world of {n} did not finish within {limit:?}");
        results
    })
}
