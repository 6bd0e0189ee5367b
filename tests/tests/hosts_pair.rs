//! A pair of ranks on two hosts (network-namespace hosts joined through a bridge, as
//! `hosts.rs` builds them): both ends cut a large all-reduce into the network's smaller
//! chunks (`EngineConfig::network`), so they agree on every chunk's tag, and every result
//! is right. Each rank's flight recorder shows the choice: a ring all-reduce's last step is
//! `2k - 1` for `k` chunks per segment. Skips with one line where the bed cannot be built
//! (not root, no `ip`/`nft`/`unshare`, or no `chorus` binary: `cargo build -p chorus-cli`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::time::Duration;

use chorus_engine::{EngineConfig, NETWORK_CHUNK_BYTES};
use chorus_tests::Event;
use chorus_tests::bed::{Bed, BedJob};

const WAIT: Duration = Duration::from_secs(30);
/// Elements of each all-reduce (`f64`): 2 MiB, the ring's range for a pair.
const COUNT: u64 = 1 << 18;

fn expect(bed: &mut Bed, slot: usize, evs: &[&str]) -> Event {
    match bed.wait_any(slot, evs, WAIT) {
        Some(e) => e,
        None => panic!("slot {slot}: no {evs:?} within {WAIT:?}:{}", bed.diagnose()),
    }
}

/// The last step of a 2-rank ring all-reduce of `elems` `f64`s in chunks of `chunk` bytes.
fn last_ring_step(elems: u64, chunk: usize) -> u64 {
    let segment = elems.div_ceil(2);
    let k = segment.div_ceil((chunk / 8) as u64);
    2 * k - 1
}

#[test]
fn a_pair_on_two_hosts_cuts_its_operations_into_network_chunks_alike() {
    let Some(mut bed) = Bed::new_or_skip(2, "a pair on two hosts") else {
        return;
    };
    let env = [
        ("CT_START", "loop"),
        ("CT_SIZES", &COUNT.to_string()[..]),
        ("CT_LIFETIME_S", "120"),
    ];
    let job = BedJob {
        per_node: 1,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        host_env: Vec::new(),
        start_timeout: Duration::from_secs(60),
        rank: PathBuf::from(env!("CARGO_BIN_EXE_chorus-test-rank")),
    };
    if let Err(e) = bed.launch(&job) {
        panic!("the job did not start: {e}");
    }
    for s in 0..2 {
        expect(&mut bed, s, &["looping"]);
    }
    bed.send_all(&[0, 1], "finish");
    for s in 0..2 {
        let e = expect(&mut bed, s, &["finished", "failed", "error"]);
        assert_eq!(e.ev(), "finished", "slot {s}: {e}{}", bed.diagnose());
    }

    // The loop's all-reduces carry one more element, its finish flag.
    let elems = COUNT + 1;
    let network = last_ring_step(elems, NETWORK_CHUNK_BYTES);
    assert_ne!(
        network,
        last_ring_step(elems, EngineConfig::default().chunk_bytes),
        "the two chunkings must be told apart"
    );
    for s in 0..2 {
        bed.send(s, "recent 4");
        let e = expect(&mut bed, s, &["recent"]);
        let ops = e.0["ops"].as_array().unwrap();
        let ring: Vec<_> = ops
            .iter()
            .filter(|o| o["bytes"] == elems * 8 && o["phase"] == "Done")
            .collect();
        assert!(!ring.is_empty(), "slot {s}: no finished 2 MiB op: {e}");
        for o in &ring {
            assert_eq!(o["algorithm"], "ring", "slot {s}: {o}");
            assert_eq!(
                o["step"], network,
                "slot {s}: {o}: not cut into {NETWORK_CHUNK_BYTES}-byte chunks"
            );
        }
    }
}
