//! The shm ring's reader against a hostile peer: a segment header it wrote, and any
//! interleaving of bytes written into the ring and tail indices published, fed through the
//! ring arithmetic into the protocol decoder of a data stream, as the link's reader does.
//!
//! Beside the ring, the mailbox: the peer writes any of a slot's bytes, and the reader
//! sweeps every slot whose count moved, as `mailbox.rs` does.
//!
//! Input: byte 0 picks the ring capacity (4 KiB to 64 KiB); then records of 9 bytes, an op
//! and a little-endian value: op 0 mod 4, the peer writes up to 511 of the following input
//! bytes at some place in the ring; op 2 mod 4, it writes up to 255 of them at some place in
//! the slot the value picks, and the reader sweeps; op odd, it publishes a tail (near our head, or
//! any value). The last 32 bytes are also parsed as a segment header. Oracles: no panic;
//! every span lies inside the ring and holds at most a ring; a refused index, slot or
//! frame ends the stream (the link closes); a slot's payload is read from inside its slot;
//! and the decoder never holds more than the frame in progress allows.
#![no_main]

use chorus_protocol::message::Role;
use chorus_protocol::{Collective, CommId, DType, Decoder, Gate, HEADER_LEN, Limits, Rank, Side};
use libfuzzer_sys::fuzz_target;

// The ring's format is plain `std` code in the transport crate; built here alone so this
// workspace keeps depending on `chorus-protocol` only.
#[allow(dead_code, unreachable_pub)]
#[path = "../../crates/chorus-transport/src/shm/ring.rs"]
mod ring;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut input)) = data.split_first() else {
        return;
    };
    if let Some(tail) = data.len().checked_sub(32).and_then(|at| data.get(at..)) {
        let len = u64::from_le_bytes(tail[24..32].try_into().unwrap_or_default());
        if let Ok(layout) = ring::Layout::parse(&tail[..24], len) {
            assert_eq!(layout.size() as u64, len);
            for s in [ring::Side::Connector, ring::Side::Acceptor] {
                assert!(layout.data(s).end <= layout.size());
            }
        }
    }
    let layout = ring::Layout::new(4096 << (mode % 5));
    let cap = layout.capacity() as usize;
    let limits = Limits {
        max_small_body: 512,
        max_table_body: 4096,
        max_chunk_payload: 2048,
        max_members: 16,
        max_ops: 8,
    };
    let mut decoder = Decoder::with_gate(
        Gate::Established {
            role: Role::Data,
            local: Side::Acceptor,
            comm: CommId(1),
            peer: Rank(2),
        },
        limits,
    );
    let mut bytes = vec![0u8; cap];
    let mut consumer = ring::Consumer::new(&layout);
    // The peer's mailbox: each slot as the peer left it, and our counts.
    let mut slots = [[0u8; SLOT]; ring::SLOTS];
    let mut took = [0u32; ring::SLOTS];
    for k in 0..ring::SLOTS {
        let at = layout.slot(ring::Side::Connector, k);
        assert!(at >= layout.head(ring::Side::Acceptor) + 8 && at + SLOT <= ring::DATA_OFFSET);
        assert!(layout.took(ring::Side::Connector, k) + 4 <= ring::DATA_OFFSET);
    }
    while let Some((record, rest)) = input.split_at_checked(9) {
        input = rest;
        let value = u64::from_le_bytes(record[1..9].try_into().unwrap_or_default());
        if record[0] % 4 == 2 {
            let k = ring::slot_of(value, (value >> 32) as u32);
            let n = (value as usize >> 8 & 255).min(input.len());
            let at = (value as usize >> 16 & 0xffff) % SLOT;
            for (i, b) in input[..n].iter().enumerate() {
                slots[k][(at + i) % SLOT] = *b;
            }
            input = &input[n..];
            if sweep(&slots, &mut took).is_err() {
                return; // a protocol violation: the link closes
            }
            continue;
        }
        if record[0] % 2 == 0 {
            let n = (value as usize % 512).min(input.len());
            let at = (value >> 16) as usize;
            for (i, b) in input[..n].iter().enumerate() {
                bytes[(at + i) % cap] = *b;
            }
            input = &input[n..];
            continue;
        }
        let tail = if value & 1 == 0 {
            consumer
                .head()
                .wrapping_add((value >> 1) % (2 * cap as u64))
        } else {
            value
        };
        let spans = match consumer.readable(tail, usize::MAX) {
            Ok(spans) => spans,
            Err(_) => return, // a protocol violation: the link closes
        };
        assert!(spans.len() <= cap);
        assert!(spans.first.end <= cap && spans.second.end <= cap);
        assert!(spans.second.is_empty() || spans.first.end == cap);
        decoder.push(&bytes[spans.first.clone()]);
        decoder.push(&bytes[spans.second.clone()]);
        consumer.consume(spans.len());
        loop {
            match decoder.next() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return, // a protocol violation: the link closes
            }
        }
        // Bounded whatever a frame claims: at most the largest admissible frame.
        let frame_max = HEADER_LEN + 24 + limits.max_chunk_payload as usize;
        assert!(decoder.buffered() < frame_max + cap);
    }
});

/// A slot's bytes: its fields and its payload, up to the next slot.
const SLOT: usize = ring::offsets::SLOT_STRIDE;

/// The reader's sweep of the mailbox (`mailbox.rs`): every slot whose count moved is
/// checked and its payload copied out of the slot, or the stream ends.
fn sweep(slots: &[[u8; SLOT]; ring::SLOTS], took: &mut [u32; ring::SLOTS]) -> Result<(), ()> {
    use ring::offsets::{SLOT_CODES, SLOT_LEN, SLOT_PAYLOAD, SLOT_PUT};
    let word = |line: &[u8; SLOT], at: usize| {
        u32::from_le_bytes(line[at..at + 4].try_into().unwrap_or_default())
    };
    for (k, line) in slots.iter().enumerate() {
        let put = word(line, SLOT_PUT);
        if put == took[k] {
            continue;
        }
        let (len, collective, dtype) =
            ring::check_slot(word(line, SLOT_LEN), word(line, SLOT_CODES)).map_err(|_| ())?;
        if Collective::from_code(collective).is_none() || DType::from_code(dtype).is_none() {
            return Err(());
        }
        assert!(len <= ring::SLOT_BYTES && SLOT_PAYLOAD + len <= line.len());
        let payload = line[SLOT_PAYLOAD..SLOT_PAYLOAD + len].to_vec();
        assert_eq!(payload.len(), len);
        took[k] = put;
    }
    Ok(())
}
