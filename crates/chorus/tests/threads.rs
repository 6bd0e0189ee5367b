#![allow(clippy::unwrap_used)]

//! Ranks as threads of one process: init, collectives, destroy, through the real runtime
//! (QUIC control plane, TCP data links on loopback).

use std::thread;
use std::time::Duration;

use chorus::{Comm, Config, Reduction, RootHost};

fn config() -> Config {
    let mut config = Config::default();
    config.init_timeout = Duration::from_secs(30);
    config
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

/// Ranks 0 and 1 of a world of 3 call init under `root` while `meanwhile` runs; what each
/// init returned and how long after the start it returned.
fn init_two_of_three(
    root: &RootHost,
    config: &Config,
    meanwhile: impl FnOnce(&RootHost),
) -> Vec<(chorus::Result<()>, Duration)> {
    let id = root.unique_id().clone();
    let started = std::time::Instant::now();
    thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                let (id, config) = (id.clone(), config.clone());
                s.spawn(move || {
                    let got = Comm::init_blocking(&id, r, 3, config);
                    (got.map(|_| ()), started.elapsed())
                })
            })
            .collect();
        meanwhile(root);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn four_ranks_all_reduce_and_destroy() {
    let out = run_ranks(4, |comm| {
        let r = comm.rank() as f32;
        let send = vec![r + 1.0; 1000];
        let mut recv = vec![0.0f32; 1000];
        comm.blocking()
            .all_reduce(&send, &mut recv, Reduction::Sum)
            .unwrap();
        let mut big = vec![1u64; 1 << 18];
        comm.blocking()
            .all_reduce_in_place(&mut big, Reduction::Sum)
            .unwrap();
        assert!(big.iter().all(|&v| v == 4));
        comm.destroy_blocking().unwrap();
        recv[0]
    });
    assert_eq!(out, vec![10.0; 4]);
}

/// `Comm::run` submits an operation when it is called, not when its future is first
/// polled: two ranks that make the same two operations in the same order, then drive them
/// together in opposite orders, still pair each with its own (polled first, the second
/// would have taken the first's place on one rank: a size mismatch, or the wrong data).
#[test]
fn operations_are_numbered_when_called_not_when_first_polled() {
    use chorus::{Buffer, DType, Op};
    use futures::executor::block_on;
    use futures::future::join;
    let out = run_ranks(2, |comm| {
        let mut a = [1.0f32; 4];
        let mut b = [10.0f32; 8];
        let (fa, fb) = (
            comm.run(Op::AllReduce {
                buf: Buffer::in_place(bytemuck::cast_slice_mut(&mut a)),
                count: 4,
                dtype: DType::F32,
                reduction: Reduction::Sum,
            }),
            comm.run(Op::AllReduce {
                buf: Buffer::in_place(bytemuck::cast_slice_mut(&mut b)),
                count: 8,
                dtype: DType::F32,
                reduction: Reduction::Sum,
            }),
        );
        let (ra, rb) = if comm.rank() == 0 {
            block_on(join(fa, fb))
        } else {
            let (rb, ra) = block_on(join(fb, fa));
            (ra, rb)
        };
        ra.unwrap();
        rb.unwrap();
        comm.destroy_blocking().unwrap();
        (a, b)
    });
    for (a, b) in out {
        assert_eq!(a, [2.0; 4]);
        assert_eq!(b, [20.0; 8]);
    }
}

#[test]
fn an_aborting_rank_fails_the_others_and_the_survivors_shrink() {
    use std::time::Instant;
    let out = run_ranks(4, |comm| {
        let mut buf = vec![1.0f32; 64];
        comm.blocking()
            .all_reduce_in_place(&mut buf, Reduction::Sum)
            .unwrap();
        if comm.rank() == 3 {
            thread::sleep(Duration::from_millis(200));
            comm.abort("test abort");
            let err = comm.blocking().barrier().unwrap_err();
            assert_eq!(err.kind(), chorus::ErrorKind::Destroyed, "{err}");
            return (3, 0.0, Duration::ZERO);
        }
        // Blocked: rank 3 never joins this one.
        let start = Instant::now();
        let err = comm
            .blocking()
            .all_reduce_in_place(&mut buf, Reduction::Sum)
            .unwrap_err();
        let waited = start.elapsed();
        assert!(
            err.to_string().starts_with("[chorus:peer-departed]"),
            "{err}"
        );
        assert_eq!(err.peer, Some(3), "{err}");
        let small = comm.blocking().shrink().unwrap();
        assert_eq!(small.size(), 3);
        assert_eq!(small.rank(), comm.rank());
        let mut v = vec![small.rank() as f32 + 1.0; 10];
        small
            .blocking()
            .all_reduce_in_place(&mut v, Reduction::Sum)
            .unwrap();
        small.destroy_blocking().unwrap();
        (comm.rank(), v[0], waited)
    });
    for (rank, sum, waited) in out {
        if rank != 3 {
            assert_eq!(sum, 6.0);
            assert!(waited < Duration::from_secs(5), "released after {waited:?}");
        }
    }
}

#[test]
fn split_children_work_and_parent_abort_releases_them() {
    use std::time::Instant;
    run_ranks(4, |comm| {
        let color = comm.rank() % 2;
        let child = comm
            .blocking()
            .split(Some(color), comm.rank())
            .unwrap()
            .unwrap();
        assert_eq!(child.size(), 2);
        assert_eq!(child.rank(), comm.rank() / 2);
        let mut v = vec![comm.rank(); 4];
        child
            .blocking()
            .all_reduce_in_place(&mut v, Reduction::Sum)
            .unwrap();
        assert_eq!(v[0], if color == 0 { 2 } else { 4 });
        // Seed 001: an operation blocked on the child is released by aborting the parent.
        if child.rank() == 0 {
            let start = Instant::now();
            thread::scope(|s| {
                s.spawn(|| {
                    thread::sleep(Duration::from_millis(100));
                    comm.abort("parent aborted");
                });
                let mut w = vec![0u32; 4];
                // The child's rank 1 never calls this.
                let err = child
                    .blocking()
                    .all_reduce_in_place(&mut w, Reduction::Sum)
                    .unwrap_err();
                assert_eq!(err.kind(), chorus::ErrorKind::Aborted, "{err}");
            });
            assert!(start.elapsed() < Duration::from_secs(5));
        } else {
            // Stay a member (dropping would depart) until the other side has aborted.
            thread::sleep(Duration::from_secs(2));
        }
    });
}

#[test]
fn a_new_process_grows_the_communicator() {
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 3, &config()).unwrap();
    let id = root.unique_id().clone();
    let (token_tx, token_rx) = std::sync::mpsc::channel();
    let token_tx = std::sync::Mutex::new(Some(token_tx));
    thread::scope(|s| {
        for r in 0..3 {
            let (id, token_tx) = (id.clone(), &token_tx);
            s.spawn(move || {
                let comm = Comm::init_blocking(&id, r, 3, config()).unwrap();
                if r == 0 {
                    let tx = token_tx.lock().unwrap().take().unwrap();
                    tx.send(comm.grow_token()).unwrap();
                }
                let big = comm.blocking().grow(1).unwrap();
                assert_eq!(big.size(), 4);
                assert_eq!(big.rank(), r);
                let mut v = vec![1i32; 100];
                big.blocking()
                    .all_reduce_in_place(&mut v, Reduction::Sum)
                    .unwrap();
                assert_eq!(v[0], 4);
                big.destroy_blocking().unwrap();
            });
        }
        s.spawn(move || {
            let token = token_rx.recv().unwrap();
            let comm = Comm::join_blocking(&token, config()).unwrap();
            assert_eq!((comm.rank(), comm.size()), (3, 4));
            let mut v = vec![1i32; 100];
            comm.blocking()
                .all_reduce_in_place(&mut v, Reduction::Sum)
                .unwrap();
            assert_eq!(v[0], 4);
            comm.destroy_blocking().unwrap();
        });
    });
}

#[test]
fn revoke_fails_everyone_then_shrink_continues() {
    run_ranks(3, |comm| {
        if comm.rank() == 1 {
            comm.blocking().revoke().unwrap();
        }
        let mut v = vec![1u8; 8];
        let err = loop {
            // Operations keep failing once the revoke has spread.
            match comm.blocking().all_reduce_in_place(&mut v, Reduction::Sum) {
                Ok(()) => thread::sleep(Duration::from_millis(10)),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(
                err.kind(),
                chorus::ErrorKind::Revoked | chorus::ErrorKind::Aborted
            ),
            "{err}"
        );
        let next = comm.blocking().shrink().unwrap();
        assert_eq!(next.size(), 3);
        next.blocking().barrier().unwrap();
    });
}

/// Init waits for every member; a member that never arrives ends it by the init deadline
/// on every rank that came, with a named error, not a hang. The bound is the feature, so it
/// is asserted, with room for a loaded machine.
#[test]
fn init_without_every_member_fails_by_the_init_deadline() {
    let mut short = Config::default();
    short.init_timeout = Duration::from_millis(1500);
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 3, &short).unwrap();
    let out = init_two_of_three(&root, &short, |_| {});
    for (rank, (got, took)) in out.into_iter().enumerate() {
        let e = got.expect_err("init cannot succeed without rank 2");
        assert!(
            matches!(
                e.kind(),
                chorus::ErrorKind::Timeout | chorus::ErrorKind::Bootstrap
            ),
            "rank {rank}: {e}"
        );
        assert!(
            e.to_string().contains("deadline") || e.to_string().contains("time"),
            "rank {rank}: the error should say a deadline passed: {e}"
        );
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(6),
            "rank {rank}: init ended after {took:?}, deadline 1.5 s"
        );
    }
}

/// A root that never answers (a UDP port nobody serves) ends init by the deadline too.
#[test]
fn init_against_a_silent_root_fails_by_the_init_deadline() {
    use std::time::Instant;
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 1, &config()).unwrap();
    let mut id = root.unique_id().clone();
    id.root = silent.local_addr().unwrap();
    let mut short = Config::default();
    short.init_timeout = Duration::from_millis(1000);
    let started = Instant::now();
    let e = Comm::init_blocking(&id, 0, 1, short).expect_err("nobody answers at that address");
    let took = started.elapsed();
    assert!(
        matches!(
            e.kind(),
            chorus::ErrorKind::Timeout | chorus::ErrorKind::Bootstrap
        ),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "init ended after {took:?}, deadline 1 s: {e}"
    );
}

/// Arguments no communicator can have are refused before anything is started.
#[test]
fn init_refuses_a_rank_outside_the_world() {
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 2, &config()).unwrap();
    let id = root.unique_id().clone();
    let e = Comm::init_blocking(&id, 2, 2, config()).expect_err("rank 2 of 2");
    assert_eq!(e.kind(), chorus::ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("rank 2"), "{e}");
}

/// A peer that is alive but never calls the collective cannot be caught by liveness; the
/// per-operation deadline ends the wait, and the error names the peer being waited on.
#[test]
fn a_collective_a_peer_never_joins_ends_by_the_operation_deadline() {
    use std::sync::mpsc;
    use std::time::Instant;
    let mut short = Config::default();
    short.init_timeout = Duration::from_secs(30);
    short.op_timeout = Duration::from_millis(1000);
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 2, &short).unwrap();
    let id = root.unique_id().clone();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_rx = std::sync::Mutex::new(done_rx);
    thread::scope(|s| {
        for r in 0..2u32 {
            let (id, short, done_tx, done_rx) =
                (id.clone(), short.clone(), done_tx.clone(), &done_rx);
            s.spawn(move || {
                let comm = Comm::init_blocking(&id, r, 2, short).unwrap();
                if r == 0 {
                    let mut buf = vec![1.0f32; 16];
                    let started = Instant::now();
                    let e = comm
                        .blocking()
                        .all_reduce_in_place(&mut buf, Reduction::Sum)
                        .expect_err("rank 1 never joins");
                    let took = started.elapsed();
                    done_tx.send(()).unwrap();
                    println!("rank 0 after {took:?}: {e}");
                    assert_eq!(e.kind(), chorus::ErrorKind::Timeout, "{e}");
                    assert!(e.to_string().contains("r1"), "should name rank 1: {e}");
                    assert!(
                        took >= Duration::from_millis(950) && took < Duration::from_secs(5),
                        "ended after {took:?}, deadline 1 s: {e}"
                    );
                } else {
                    // Alive, heartbeating, but busy elsewhere until rank 0 has given up.
                    done_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(20))
                        .unwrap();
                }
                let started = Instant::now();
                let _ = comm.destroy_blocking();
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "destroy is bounded"
                );
            });
        }
    });
}

/// A rank whose process the launcher saw exit before every rank joined will never join:
/// the ranks already waiting in init fail at once with an error naming it, instead of at
/// the init deadline (a crash at start-up is the most common failure of all).
#[test]
fn a_rank_that_exits_before_joining_fails_init_at_once_naming_it() {
    let mut long = Config::default();
    long.init_timeout = Duration::from_secs(60);
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), 3, &long).unwrap();
    let out = init_two_of_three(&root, &long, |root| {
        // As `chorus run` does when it reaps rank 2, killed by SIGKILL at start-up.
        thread::sleep(Duration::from_millis(300));
        root.witness_exit(2, -9);
    });
    for (rank, (got, took)) in out.into_iter().enumerate() {
        let e = got.expect_err("rank 2 never joins");
        println!("rank {rank} after {took:?}: {e}");
        assert_eq!(e.kind(), chorus::ErrorKind::Bootstrap, "rank {rank}: {e}");
        let text = e.to_string();
        assert!(
            text.contains("r2") && text.contains("signal 9"),
            "rank {rank}: the error should name r2 and how it ended: {e}"
        );
        assert!(
            took < Duration::from_secs(10),
            "rank {rank}: init ended after {took:?}, not at once"
        );
    }
}
