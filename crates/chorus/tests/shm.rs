#![allow(clippy::unwrap_used)]

//! `CHORUS_TRANSPORT=shm` and the default `auto` through the real runtime: ranks as threads
//! of one process (one host, one network namespace), so every data link between two ranks
//! that serve shared memory is a segment.

use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use chorus::{Comm, Config, Reduction, RootHost, TransportChoice};

fn config() -> Config {
    let mut config = Config::default();
    config.init_timeout = Duration::from_secs(30);
    config.transport = TransportChoice::Shm;
    config
}

/// The tests count this process's segments: one at a time.
static COUNTING: Mutex<()> = Mutex::new(());

/// Open descriptors of this process that are chorus shm segments.
fn segments() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().contains("memfd:chorus-shm"))
        })
        .count()
}

#[test]
fn four_ranks_all_reduce_over_shm_segments_and_destroy() {
    let _one = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let world = 4;
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &config()).unwrap();
    let id = root.unique_id().clone();
    let linked = Barrier::new(world as usize);
    let out: Vec<(f32, usize)> = thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (id, linked) = (id.clone(), &linked);
                s.spawn(move || {
                    let comm = Comm::init_blocking(&id, r, world, config()).unwrap();
                    let send = vec![comm.rank() as f32 + 1.0; 1000];
                    let mut recv = vec![0.0f32; 1000];
                    comm.blocking()
                        .all_reduce(&send, &mut recv, Reduction::Sum)
                        .unwrap();
                    let mut big = vec![1u64; 1 << 20];
                    comm.blocking()
                        .all_reduce_in_place(&mut big, Reduction::Sum)
                        .unwrap();
                    assert!(big.iter().all(|&v| v == 4));
                    linked.wait();
                    let seen = segments();
                    linked.wait();
                    comm.destroy_blocking().unwrap();
                    (recv[0], seen)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (sum, seen) in out {
        assert_eq!(sum, 10.0);
        // Six pairs, each segment mapped by both of its ends in this one process.
        assert!(
            seen >= 12,
            "{seen} shm segments open; the links are not shm"
        );
    }
}

/// The default transport in a mixed world: ranks 0–2 keep `auto`, rank 3 forces `tcp`. The
/// three pairs among 0–2 share segments (both ends of each mapped in this process: 6), and
/// no link to rank 3 does; the results are right on both kinds of link.
#[test]
fn by_default_shm_carries_exactly_the_links_whose_ends_both_serve_it() {
    let _one = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(Config::default().transport, TransportChoice::Auto);
    let world = 4;
    let rank_config = |r: u32| {
        let mut config = Config::default();
        config.init_timeout = Duration::from_secs(30);
        if r == 3 {
            config.transport = TransportChoice::Tcp;
        }
        config
    };
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &rank_config(0)).unwrap();
    let id = root.unique_id().clone();
    let linked = Barrier::new(world as usize);
    let before = segments();
    let seen: Vec<usize> = thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (id, linked) = (id.clone(), &linked);
                s.spawn(move || {
                    let comm = Comm::init_blocking(&id, r, world, rank_config(r)).unwrap();
                    let mut big = vec![u64::from(r) + 1; 1 << 18];
                    comm.blocking()
                        .all_reduce_in_place(&mut big, Reduction::Sum)
                        .unwrap();
                    assert!(big.iter().all(|&v| v == 10), "rank {r}");
                    linked.wait();
                    let seen = segments();
                    linked.wait();
                    comm.destroy_blocking().unwrap();
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for n in seen {
        assert_eq!(n - before, 6, "segments open while linked");
    }
}
