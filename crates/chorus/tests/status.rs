#![allow(clippy::unwrap_used)]

//! `chorus::status::query` against ranks as threads: every member answers through the
//! token alone (root first, then each member), and after a shrink the members are found
//! under their new ranks and reported under their first ones.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use chorus::status::{Answer, query};
use chorus::{Comm, Config, Epoch, Rank, Reduction, RootHost};

fn config() -> Config {
    let mut config = Config::default();
    config.init_timeout = Duration::from_secs(30);
    config
}

#[test]
fn every_member_answers_and_nobody_waits() {
    let world = 3;
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &config()).unwrap();
    let id = root.unique_id().clone();
    let (ready, done) = (
        Barrier::new(world as usize + 1),
        Barrier::new(world as usize + 1),
    );
    thread::scope(|s| {
        for r in 0..world {
            let (id, ready, done) = (id.clone(), &ready, &done);
            s.spawn(move || {
                let comm = Comm::init_blocking(&id, r, world, config()).unwrap();
                let mut v = [1u32; 8];
                comm.blocking()
                    .all_reduce_in_place(&mut v, Reduction::Sum)
                    .unwrap();
                ready.wait();
                done.wait();
                comm.destroy_blocking().unwrap();
            });
        }
        ready.wait();
        let status = query(&id, Duration::from_secs(5)).unwrap();
        done.wait();
        assert_eq!(status.world, world);
        assert_eq!(status.members.len(), world as usize);
        for (i, r) in status.ranks.iter().enumerate() {
            assert_eq!(r.rank, Rank(i as u32));
            let Answer::Replied(reply) = &r.answer else {
                panic!("rank {i} did not answer: {:?}", r.answer);
            };
            assert_eq!(reply.rank, Rank(i as u32));
            assert_eq!(reply.epoch, Epoch(0));
            assert_eq!(reply.peers.len(), world as usize);
            assert!(
                !reply.ops.is_empty(),
                "the all-reduce is in the flight recorder"
            );
        }
        assert_eq!(status.waiting_on(), None);
        assert!(status.elapsed < Duration::from_secs(5));
    });
}

#[test]
fn after_a_shrink_members_are_found_under_their_new_ranks() {
    let world = 4;
    let root = RootHost::start("127.0.0.1:0".parse().unwrap(), world, &config()).unwrap();
    let id = root.unique_id().clone();
    let (ready, done) = (Barrier::new(4), Barrier::new(4));
    thread::scope(|s| {
        for r in 0..world {
            let (id, ready, done) = (id.clone(), &ready, &done);
            s.spawn(move || {
                let comm = Comm::init_blocking(&id, r, world, config()).unwrap();
                if r == 1 {
                    // Rank 1 leaves; 0, 2, 3 become 0, 1, 2.
                    comm.abort("leaving for the test");
                    return;
                }
                let mut v = [1u32; 8];
                let _ = comm.blocking().all_reduce_in_place(&mut v, Reduction::Sum);
                let small = comm.blocking().shrink().unwrap();
                drop(comm);
                ready.wait();
                done.wait();
                small.destroy_blocking().unwrap();
            });
        }
        ready.wait();
        let status = query(&id, Duration::from_secs(3)).unwrap();
        done.wait();
        assert!(matches!(status.ranks[1].answer, Answer::Unreachable(_)));
        for (first, now) in [(0u32, 0u32), (2, 1), (3, 2)] {
            let reply = status.reply(Rank(first)).unwrap_or_else(|| {
                panic!("rank {first}: {:?}", status.ranks[first as usize].answer)
            });
            assert_eq!(reply.epoch, Epoch(1));
            assert_eq!(reply.rank, Rank(now));
            assert_eq!(reply.world, 3);
            assert_eq!(status.first_rank(reply, Rank(now)), Some(Rank(first)));
        }
    });
}
