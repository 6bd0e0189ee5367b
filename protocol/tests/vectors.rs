//! Golden vectors: the exact bytes of one frame per sample in `chorus_protocol::samples`.
//!
//! For every sample, encoding must give the vector's bytes and decoding the vector must give
//! the sample back. Any change to the wire — a field moved, a type changed, an rkyv upgrade
//! that lays bytes out differently — fails here. To change the wire deliberately, bump what
//! SPEC.md says, then regenerate and review the diff:
//!
//! ```sh
//! CHORUS_BLESS_VECTORS=1 cargo test -p chorus-protocol --test vectors
//! git diff protocol/vectors/
//! ```

// Test code: a failed unwrap is a failed test, with its location.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use chorus_protocol::message::{Hello, Role};
use chorus_protocol::samples::{self, SECRET, Sample};
use chorus_protocol::{
    Acceptor, AcceptorConfig, Connector, ConnectorConfig, Decoder, Encoder, Gate, HEADER_LEN, Kind,
    Limits, Message, Nonce,
};

const BLESS: &str = "CHORUS_BLESS_VECTORS";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

fn encode(s: &Sample) -> Vec<u8> {
    let mut out = BytesMut::new();
    Encoder::default()
        .encode(&s.envelope, &s.message, &mut out)
        .unwrap_or_else(|e| panic!("{}: {e}", s.name));
    out.to_vec()
}

/// One manifest line: `name kind file length`.
#[derive(Debug, PartialEq)]
struct Entry {
    kind: String,
    file: String,
    len: usize,
}

fn parse_manifest(text: &str) -> BTreeMap<String, Entry> {
    let mut entries = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, kind, file, len] = fields[..] else {
            panic!("MANIFEST line {}: expected `name kind file length`", n + 1);
        };
        let len = len
            .parse()
            .unwrap_or_else(|_| panic!("MANIFEST line {}: bad length", n + 1));
        let entry = Entry {
            kind: kind.into(),
            file: file.into(),
            len,
        };
        assert!(
            entries.insert(name.to_string(), entry).is_none(),
            "MANIFEST: {name} twice"
        );
    }
    entries
}

/// Hex digits, whitespace and `#` comments to bytes.
fn parse_hex(text: &str) -> Vec<u8> {
    let digits: String = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// The header on its own line, then the body 32 bytes a line.
fn format_hex(s: &Sample, bytes: &[u8]) -> String {
    let mut t = format!(
        "# {}: {} frame, {}-byte header then {}-byte body\n",
        s.name,
        s.message.kind(),
        HEADER_LEN,
        bytes.len() - HEADER_LEN
    );
    let (header, body) = bytes.split_at(HEADER_LEN);
    t.push_str(&hex::encode(header));
    t.push('\n');
    for line in body.chunks(32) {
        t.push_str(&hex::encode(line));
        t.push('\n');
    }
    t
}

fn bless(samples: &[Sample]) {
    let mut manifest = String::from(
        "# chorus golden vectors (SPEC.md, \"Golden vectors\"): one frame per line.\n\
         # name kind file length-in-bytes\n",
    );
    for s in samples {
        let bytes = encode(s);
        let file = format!("{}.hex", s.name);
        std::fs::write(dir().join(&file), format_hex(s, &bytes)).unwrap();
        writeln!(
            manifest,
            "{:<18} {:<15} {:<22} {}",
            s.name,
            s.message.kind(),
            file,
            bytes.len()
        )
        .unwrap();
    }
    std::fs::write(dir().join("MANIFEST"), manifest).unwrap();
    eprintln!(
        "{BLESS}: rewrote {} vectors in {}",
        samples.len(),
        dir().display()
    );
}

#[test]
fn every_sample_matches_its_golden_vector_both_ways() {
    let samples = samples::all();
    if std::env::var_os(BLESS).is_some_and(|v| v == "1") {
        bless(&samples);
    }
    let manifest = parse_manifest(
        &std::fs::read_to_string(dir().join("MANIFEST"))
            .unwrap_or_else(|e| panic!("read vectors/MANIFEST: {e} (bless with {BLESS}=1)")),
    );
    let names: Vec<&str> = samples.iter().map(|s| s.name).collect();
    let listed: Vec<&str> = manifest.keys().map(String::as_str).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, listed, "MANIFEST and samples::all() disagree");

    for s in &samples {
        let entry = &manifest[s.name];
        assert_eq!(entry.kind, s.message.kind().name(), "{}: kind", s.name);
        let vector = parse_hex(&std::fs::read_to_string(dir().join(&entry.file)).unwrap());
        assert_eq!(vector.len(), entry.len, "{}: MANIFEST length", s.name);
        let encoded = encode(s);
        assert!(
            encoded == vector,
            "{}: encoding differs from the golden vector — the wire changed.\n\
             encoded: {}\nvector:  {}\n(if deliberate, run with {BLESS}=1 and review the diff)",
            s.name,
            hex::encode(&encoded),
            hex::encode(&vector)
        );
        let mut d = Decoder::with_gate(Gate::Open, Limits::DEFAULT);
        d.push(&vector);
        let frame = d
            .next()
            .unwrap_or_else(|e| panic!("{}: {e}", s.name))
            .unwrap_or_else(|| panic!("{}: incomplete", s.name));
        assert_eq!(frame.message, s.message, "{}", s.name);
        assert_eq!(frame.header.envelope(), s.envelope, "{}", s.name);
        assert_eq!(d.next(), Ok(None), "{}: bytes left over", s.name);
    }
}

#[test]
fn every_kind_has_a_golden_vector() {
    let samples = samples::all();
    for kind in Kind::ALL {
        assert!(samples.iter().any(|s| s.message.kind() == kind), "{kind}");
    }
}

/// The handshake vectors carry real proofs under `samples::SECRET`: another implementation
/// can check its transcript and HMAC against them.
#[test]
fn handshake_vectors_hold_valid_proofs() {
    let hello_sample = samples::named("hello").unwrap();
    let ack_sample = samples::named("hello-ack").unwrap();
    let Message::Hello(hello) = &hello_sample.message else {
        panic!("not a hello")
    };
    let deadline = Instant::now() + Duration::from_secs(60);

    // The acceptor verifies the vector's proof.
    let mut acc = Acceptor::new(AcceptorConfig::new(SECRET, Nonce([0; 32]), deadline));
    let frame = chorus_protocol::Frame {
        header: decode_header(&encode(&hello_sample)),
        message: hello_sample.message.clone(),
    };
    acc.handle(&frame, &mut BytesMut::new()).unwrap();

    // A connector given the same inputs writes the vector byte for byte, and accepts the
    // acceptor's vector.
    let mut wire = BytesMut::new();
    let mut conn = Connector::new(
        ConnectorConfig::new(
            SECRET,
            hello_sample.envelope,
            Role::Member,
            Nonce(hello.nonce),
            deadline,
        ),
        &mut wire,
    )
    .unwrap();
    assert_eq!(&wire[..], &encode(&hello_sample)[..]);
    let ack = chorus_protocol::Frame {
        header: decode_header(&encode(&ack_sample)),
        message: ack_sample.message.clone(),
    };
    let est = conn.handle(&ack).unwrap();
    assert_eq!(est.version, 1);
    let _: &Hello = hello;
}

fn decode_header(frame: &[u8]) -> chorus_protocol::Header {
    chorus_protocol::Header::parse(frame[..HEADER_LEN].try_into().unwrap()).unwrap()
}
