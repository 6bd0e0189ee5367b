//! Every validated body: byte 0 picks the kind, the rest is its body, behind a valid header.
//!
//! Oracles: no panic; an accepted body is the canonical encoding of the decoded message
//! and passes the same validation the encoder applies.
#![no_main]

use bytes::BytesMut;
use chorus_protocol::header::{HEADER_LEN, Header};
use chorus_protocol::{CommId, Decoder, Encoder, Epoch, Gate, Kind, Limits, Rank};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [pick, body @ ..] = data else {
        return;
    };
    let kind = Kind::ALL[usize::from(*pick) % Kind::ALL.len()];
    let Ok(body_len) = u32::try_from(body.len()) else {
        return;
    };
    let header = Header {
        version: 1,
        kind,
        flags: 0,
        comm: CommId(7),
        epoch: Epoch(1),
        sender: Rank(0),
        body_len,
        seq: 0,
    };
    let mut d = Decoder::with_gate(Gate::Open, Limits::DEFAULT);
    d.push(&header.to_bytes());
    d.push(body);
    match d.next() {
        Ok(Some(frame)) => {
            assert_eq!(frame.message.kind(), kind);
            frame
                .message
                .validate(&Limits::DEFAULT)
                .expect("accepted means valid");
            let mut again = BytesMut::new();
            Encoder::default()
                .encode(&frame.header.envelope(), &frame.message, &mut again)
                .expect("an accepted message encodes");
            assert_eq!(&again[HEADER_LEN..], body, "accepted body is not canonical");
        }
        Ok(None) => panic!("a complete frame must decode or fail"),
        Err(e) => {
            let _ = e.code();
        }
    }
});
