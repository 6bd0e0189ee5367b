//! The engine's correctness matrix over shm links: every collective, forced algorithm set,
//! dtype and reduction against the sequential reference, in worlds of 2, 3, 4 and 8 ranks
//! (threads of this process, each pair of ranks sharing a segment).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_engine::testkit::{Host, assert_clean, every_case, large_cases, matrix_configs, sweep};
use chorus_engine::{AbortReason, Context, Engine, HostDevice};
use chorus_protocol::Rank;
use chorus_protocol::message::Role;
use chorus_transport::{ShmLink, ShmTransport, TransportConfig, admit_all, fresh};
use common::route;

const WAIT: Duration = Duration::from_secs(10);

/// Every rank's shm links to every other, over one transport and listener per rank.
fn shm_mesh(n: u32) -> (Vec<ShmTransport>, Vec<Vec<Arc<ShmLink>>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let secret = fresh::job_secret();
    // Small rings: large operations stream through them many times over.
    let cfg = TransportConfig {
        shm_ring: 64 << 10,
        handshake_timeout: Duration::from_secs(5),
        ..TransportConfig::default()
    };
    let ts: Vec<ShmTransport> = (0..n)
        .map(|_| ShmTransport::new(cfg.clone(), secret.clone()).unwrap())
        .collect();
    let mut links: Vec<Vec<Arc<ShmLink>>> = (0..n).map(|_| Vec::new()).collect();
    rt.block_on(async {
        let mut ls = Vec::new();
        for (r, t) in ts.iter().enumerate() {
            ls.push(t.listen(admit_all(Rank(r as u32))).await.unwrap());
        }
        for a in 0..n as usize {
            for b in a + 1..n as usize {
                let name = ls[a].name().to_owned();
                let (c, acc) = tokio::join!(
                    ts[b].connect(&name, Role::Data, route(b as u32), Rank(a as u32)),
                    ls[a].accept(WAIT)
                );
                links[b].push(Arc::new(c.unwrap().into_link().unwrap()));
                links[a].push(Arc::new(acc.unwrap().into_link().unwrap()));
            }
        }
    });
    (ts, links)
}

/// The engine's matrix (every collective, forced algorithm set and dtype, and with `large`
/// operations many rings long) over shm links in a world of `n` ranks, each a thread.
fn matrix(n: u32, large: bool) {
    let root = Context::root();
    let dev = Arc::new(HostDevice);
    let mut cases = every_case(n);
    if large {
        cases.extend(large_cases(n));
    }
    let mut failures = Vec::new();
    for config in matrix_configs() {
        let (_ts, mesh) = shm_mesh(n);
        let engines: Vec<_> = mesh
            .into_iter()
            .enumerate()
            .map(|(r, links)| {
                Engine::new(Rank(r as u32), n, links, dev.clone(), &root, config.clone()).unwrap()
            })
            .collect();
        let watchdog = root.clone();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dog = std::thread::spawn({
            let done = done.clone();
            move || {
                let deadline = Instant::now() + Duration::from_secs(300);
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    if Instant::now() >= deadline {
                        watchdog.abort(AbortReason::requested("test watchdog"));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        std::thread::scope(|s| {
            let handles: Vec<_> = engines
                .iter()
                .map(|e| s.spawn(|| sweep(&Host, e, &cases).err()))
                .collect();
            for h in handles {
                failures.extend(h.join().unwrap());
            }
        });
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        dog.join().unwrap();
    }
    assert_clean(failures);
}

#[test]
fn matrix_over_shm_in_worlds_of_2_and_3() {
    matrix(2, true);
    matrix(3, true);
}

#[test]
fn matrix_over_shm_in_a_world_of_4() {
    matrix(4, true);
}

/// 56 links and 56 pump threads; the large operations are covered at 2 to 4.
#[test]
fn matrix_over_shm_in_a_world_of_8() {
    matrix(8, false);
}
