//! Ranks as threads of one process: init, collectives, destroy, through the real runtime
//! (QUIC control plane, TCP data links on loopback).

use std::thread;
use std::time::Duration;

use chorus::{Comm, Config, Reduction, RootHost};

fn config() -> Config {
    Config {
        init_timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

fn run_ranks<T: Send>(world: u32, f: impl Fn(Comm) -> T + Sync) -> Vec<T> {
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &config()).unwrap();
    let id = root.unique_id().clone();
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (id, f) = (id.clone(), &f);
                s.spawn(move || f(Comm::init_blocking(&id, r, world, config()).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn four_ranks_all_reduce_and_destroy() {
    let out = run_ranks(4, |comm| {
        let r = comm.rank() as f32;
        let send = vec![r + 1.0; 1000];
        let mut recv = vec![0.0f32; 1000];
        comm.blocking().all_reduce(&send, &mut recv, Reduction::Sum).unwrap();
        let mut big = vec![1u64; 1 << 18];
        comm.blocking().all_reduce_in_place(&mut big, Reduction::Sum).unwrap();
        assert!(big.iter().all(|&v| v == 4));
        comm.destroy_blocking().unwrap();
        recv[0]
    });
    assert_eq!(out, vec![10.0; 4]);
}
