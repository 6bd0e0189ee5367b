//! The streaming decoder on arbitrary bytes, arbitrarily sliced, in every phase.
//!
//! Input: byte 0 picks the gate (open, acceptor handshake, connector handshake, an
//! established member or data stream) and whether bytes are pushed or read into the lent
//! buffer; byte 1 seeds the slice sizes; the rest is the stream. Oracles: no panic; a
//! poisoned decoder stays poisoned and holds nothing; every accepted frame is the canonical
//! encoding of what it decoded to.
#![no_main]

use bytes::BytesMut;
use chorus_protocol::message::Role;
use chorus_protocol::{CommId, Decoder, Encoder, Frame, Gate, HEADER_LEN, Limits, Rank, Side};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [mode, seed, stream @ ..] = data else {
        return;
    };
    let gate = match mode % 5 {
        0 => Gate::Open,
        1 => Gate::Handshake {
            local: Side::Acceptor,
        },
        2 => Gate::Handshake {
            local: Side::Connector,
        },
        3 => established(Role::Member),
        _ => established(Role::Data),
    };
    let lend = mode & 0x80 != 0;
    // Small limits so that oversize paths are reached by small inputs too.
    let limits = Limits {
        max_small_body: 512,
        max_table_body: 4096,
        max_chunk_payload: 2048,
        max_members: 16,
        max_ops: 8,
    };
    let mut d = Decoder::with_gate(gate, limits);
    let mut at = 0;
    let mut step = usize::from(*seed) + 1;
    let mut consumed = 0;
    while at < stream.len() {
        let end = (at + step).min(stream.len());
        if lend {
            d.recv_buf().extend_from_slice(&stream[at..end]);
        } else {
            d.push(&stream[at..end]);
        }
        at = end;
        step = step * 7 % 251 + 1;
        loop {
            match d.next() {
                Ok(Some(frame)) => {
                    let len = HEADER_LEN + frame.header.body_len as usize;
                    check_canonical(&frame, &stream[consumed..consumed + len], limits);
                    consumed += len;
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = e.code();
                    assert_eq!(d.next(), Err(e));
                    assert_eq!(d.buffered(), 0);
                    return;
                }
            }
        }
    }
});

fn established(role: Role) -> Gate {
    Gate::Established {
        role,
        local: Side::Acceptor,
        comm: CommId(1),
        peer: Rank(2),
    }
}

/// Re-encoding an accepted frame gives its bytes back (sequence number aside: a fresh
/// encoder starts at 0).
fn check_canonical(frame: &Frame, original: &[u8], limits: Limits) {
    let mut enc = Encoder::new(limits);
    enc.set_version(frame.header.version);
    let mut again = BytesMut::new();
    enc.encode(&frame.header.envelope(), &frame.message, &mut again)
        .expect("an accepted message encodes");
    assert_eq!(&again[..32], &original[..32], "header differs");
    assert_eq!(
        &again[HEADER_LEN..],
        &original[HEADER_LEN..],
        "body differs"
    );
}
