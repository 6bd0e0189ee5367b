//! The frames two ranks of a device link exchange over their host socket.
//!
//! The data itself moves through device memory; the socket carries what the host sides need
//! to agree on: who is at the other end and where its slots are (`Hello`, `Region`), that a
//! payload was announced (`Sent`: its tag and length) and how far its slot messages have
//! been queued (`Queued`) and taken out again (`Credit`), and that a side is leaving
//! (`Depart`). Fixed little-endian layouts, each frame led by its kind byte; every field is
//! checked as it is read and a bad one is a [`HostFrameError`], never a panic.
//!
//! This is the device-link protocol, version 2 (a wire of its own, not `protocol/SPEC.md`'s).
//! Byte layouts after the kind byte (`u16`, `u32`, `u64` little-endian):
//!
//! | kind | frame    | fields |
//! |------|----------|--------|
//! | 1    | `Hello`  | magic `CHRSDLNK` (8), version `u16`, process nonce (16), rank `u32`, GPU UUID (16), slot bytes `u64`, slots `u32` |
//! | 2    | `Region` | token `u64`, has-IPC flag (1: 0 or 1), IPC handle (64, zeros without) |
//! | 3    | `Sent`   | collective (1), op `u64`, step `u32`, offset `u64`, dtype (1), length `u64` |
//! | 4    | `Depart` | close code `u16`, detail length `u16` (at most 256), detail (UTF-8) |
//! | 5    | `Queued` | slot messages queued so far `u64` |
//! | 6    | `Credit` | slot messages taken out so far `u64` |
//!
//! Version 2 changed `Hello`: a random per-process nonce (16 bytes) replaced the process id
//! (`u32`), since PIDs are equal across PID namespaces and "same process" decides whether
//! the peer's region is shared directly or mapped through IPC; and it added `Queued` and
//! `Credit`, so that slot credit is kept on the host (`credit.rs`). Each payload is cut into
//! slot messages of at most one slot; the sender announces it (`Sent`), queues the parts the
//! receiver's `Credit` leaves room for and says so (`Queued`); the receiver queues taking
//! each part out only once `Queued` covers it, and answers with `Credit`. So no device wait
//! is ever queued before the work that ends it, whatever the hardware queues.

use std::io::{self, Read, Write};

use chorus_engine::link::Tag;
use chorus_protocol::{CloseCode, Collective, DType, OpSeq, Rank};

/// Identifies the device-link protocol in `Hello`.
pub const MAGIC: [u8; 8] = *b"CHRSDLNK";
/// This version of the device-link protocol.
pub const VERSION: u16 = 2;
/// Longest departure detail carried, in bytes.
pub const MAX_DETAIL: usize = 256;

/// One frame on a device link's host socket (not the wire protocol's `chorus_protocol::Frame`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum HostFrame {
    /// First frame each way: identity and slot geometry.
    Hello(Hello),
    /// Second frame each way: where the sender's region is.
    Region(RegionInfo),
    /// A payload of `len` bytes under `tag` comes next, in the next `len / slot_bytes`
    /// (rounded up) slot messages.
    Sent { tag: Tag, len: u64 },
    /// The sender is leaving; its streams are drained.
    Depart { code: CloseCode, detail: String },
    /// The sender has queued the puts and signals of its first `upto` slot messages.
    Queued { upto: u64 },
    /// The receiver has queued taking the first `upto` slot messages out of the sender's
    /// slots: the sender may queue up to `upto + slots`.
    Credit { upto: u64 },
}

/// Identity and slot geometry, checked against the peer's before anything is shared.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    pub version: u16,
    /// Random, one per process ([`process_nonce`]): equal nonces mean one process.
    pub nonce: [u8; 16],
    pub rank: Rank,
    /// The GPU's UUID: both ends must be on the same one.
    pub uuid: [u8; 16],
    pub slot_bytes: u64,
    pub slots: u32,
}

/// Where the sender's region lives.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegionInfo {
    /// The region's device address: the key of the in-process registry when both ends
    /// share a process.
    pub token: u64,
    /// The CUDA IPC handle of the region, for a peer in another process.
    pub ipc: Option<[u8; 64]>,
}

/// A frame that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum HostFrameError {
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("bad magic")]
    Magic,
    #[error("unknown {what} code {code}")]
    Code { what: &'static str, code: u8 },
    #[error("departure detail of {0} bytes exceeds {MAX_DETAIL}")]
    Detail(usize),
    #[error("flag byte {0} is neither 0 nor 1")]
    Flag(u8),
    #[error(transparent)]
    Io(#[from] io::Error),
}

const HELLO: u8 = 1;
const REGION: u8 = 2;
const SENT: u8 = 3;
const DEPART: u8 = 4;
const QUEUED: u8 = 5;
const CREDIT: u8 = 6;

/// This process's nonce: random, drawn once, the same for every link of the process.
pub fn process_nonce() -> [u8; 16] {
    static NONCE: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *NONCE.get_or_init(rand::random)
}

impl HostFrame {
    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(96);
        match self {
            HostFrame::Hello(h) => {
                b.push(HELLO);
                b.extend_from_slice(&MAGIC);
                b.extend_from_slice(&h.version.to_le_bytes());
                b.extend_from_slice(&h.nonce);
                b.extend_from_slice(&h.rank.get().to_le_bytes());
                b.extend_from_slice(&h.uuid);
                b.extend_from_slice(&h.slot_bytes.to_le_bytes());
                b.extend_from_slice(&h.slots.to_le_bytes());
            }
            HostFrame::Region(r) => {
                b.push(REGION);
                b.extend_from_slice(&r.token.to_le_bytes());
                b.push(u8::from(r.ipc.is_some()));
                b.extend_from_slice(&r.ipc.unwrap_or([0; 64]));
            }
            HostFrame::Sent { tag, len } => {
                b.push(SENT);
                b.push(tag.collective.code());
                b.extend_from_slice(&tag.op.get().to_le_bytes());
                b.extend_from_slice(&tag.step.to_le_bytes());
                b.extend_from_slice(&tag.offset.to_le_bytes());
                b.push(tag.dtype.code());
                b.extend_from_slice(&len.to_le_bytes());
            }
            HostFrame::Depart { code, detail } => {
                b.push(DEPART);
                b.extend_from_slice(&code.0.to_le_bytes());
                let d = truncate(detail, MAX_DETAIL);
                b.extend_from_slice(&(d.len() as u16).to_le_bytes());
                b.extend_from_slice(d.as_bytes());
            }
            HostFrame::Queued { upto } => {
                b.push(QUEUED);
                b.extend_from_slice(&upto.to_le_bytes());
            }
            HostFrame::Credit { upto } => {
                b.push(CREDIT);
                b.extend_from_slice(&upto.to_le_bytes());
            }
        }
        b
    }

    /// Write the frame.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())
    }

    /// Read one frame; `Ok(None)` at a clean end of stream (before a kind byte).
    pub fn read_from(r: &mut impl Read) -> Result<Option<HostFrame>, HostFrameError> {
        let mut kind = [0u8; 1];
        loop {
            match r.read(&mut kind) {
                Ok(0) => return Ok(None),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let frame = match kind[0] {
            HELLO => {
                let magic: [u8; 8] = array(r)?;
                if magic != MAGIC {
                    return Err(HostFrameError::Magic);
                }
                HostFrame::Hello(Hello {
                    version: u16::from_le_bytes(array(r)?),
                    nonce: array(r)?,
                    rank: Rank(u32::from_le_bytes(array(r)?)),
                    uuid: array(r)?,
                    slot_bytes: u64::from_le_bytes(array(r)?),
                    slots: u32::from_le_bytes(array(r)?),
                })
            }
            REGION => {
                let token = u64::from_le_bytes(array(r)?);
                let [flag] = array(r)?;
                let handle: [u8; 64] = array(r)?;
                let ipc = match flag {
                    0 => None,
                    1 => Some(handle),
                    f => return Err(HostFrameError::Flag(f)),
                };
                HostFrame::Region(RegionInfo { token, ipc })
            }
            SENT => {
                let [c] = array(r)?;
                let collective = Collective::from_code(c).ok_or(HostFrameError::Code {
                    what: "collective",
                    code: c,
                })?;
                let op = OpSeq(u64::from_le_bytes(array(r)?));
                let step = u32::from_le_bytes(array(r)?);
                let offset = u64::from_le_bytes(array(r)?);
                let [d] = array(r)?;
                let dtype = DType::from_code(d).ok_or(HostFrameError::Code {
                    what: "dtype",
                    code: d,
                })?;
                let len = u64::from_le_bytes(array(r)?);
                HostFrame::Sent {
                    tag: Tag {
                        collective,
                        op,
                        step,
                        offset,
                        dtype,
                    },
                    len,
                }
            }
            DEPART => {
                let code = CloseCode(u16::from_le_bytes(array(r)?));
                let n = u16::from_le_bytes(array(r)?) as usize;
                if n > MAX_DETAIL {
                    return Err(HostFrameError::Detail(n));
                }
                let mut detail = vec![0u8; n];
                r.read_exact(&mut detail)?;
                HostFrame::Depart {
                    code,
                    detail: String::from_utf8_lossy(&detail).into_owned(),
                }
            }
            QUEUED => HostFrame::Queued {
                upto: u64::from_le_bytes(array(r)?),
            },
            CREDIT => HostFrame::Credit {
                upto: u64::from_le_bytes(array(r)?),
            },
            k => return Err(HostFrameError::Kind(k)),
        };
        Ok(Some(frame))
    }
}

fn array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut a = [0u8; N];
    r.read_exact(&mut a)?;
    Ok(a)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> Tag {
        Tag {
            collective: Collective::AllReduce,
            op: OpSeq(7),
            step: 3,
            offset: 4096,
            dtype: DType::BF16,
        }
    }

    fn roundtrip(f: HostFrame) {
        let bytes = f.encode();
        let back = HostFrame::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn every_frame_roundtrips() {
        roundtrip(HostFrame::Hello(Hello {
            version: VERSION,
            nonce: [7; 16],
            rank: Rank(3),
            uuid: [9; 16],
            slot_bytes: 1 << 23,
            slots: 4,
        }));
        roundtrip(HostFrame::Region(RegionInfo {
            token: 0xdead_beef,
            ipc: None,
        }));
        roundtrip(HostFrame::Region(RegionInfo {
            token: 1,
            ipc: Some([5; 64]),
        }));
        roundtrip(HostFrame::Sent {
            tag: tag(),
            len: 1 << 30,
        });
        roundtrip(HostFrame::Depart {
            code: CloseCode::ABORTED,
            detail: "bye".into(),
        });
        roundtrip(HostFrame::Queued { upto: 1 << 40 });
        roundtrip(HostFrame::Credit { upto: 3 });
    }

    #[test]
    fn the_hello_layout_is_the_documented_one() {
        let hello = Hello {
            version: VERSION,
            nonce: [0xab; 16],
            rank: Rank(5),
            uuid: [0xcd; 16],
            slot_bytes: 1 << 20,
            slots: 4,
        };
        let b = HostFrame::Hello(hello).encode();
        assert_eq!(b.len(), 1 + 8 + 2 + 16 + 4 + 16 + 8 + 4);
        assert_eq!(&b[1..9], b"CHRSDLNK");
        assert_eq!(&b[9..11], &2u16.to_le_bytes());
        assert_eq!(&b[11..27], &[0xab; 16]);
        assert_eq!(&b[27..31], &5u32.to_le_bytes());
        let q = HostFrame::Queued { upto: 9 }.encode();
        assert_eq!(q, [&[QUEUED][..], &9u64.to_le_bytes()].concat());
    }

    #[test]
    fn the_nonce_is_one_per_process_and_random() {
        assert_eq!(process_nonce(), process_nonce());
        assert_ne!(process_nonce(), [0; 16]);
        // Another draw is another process's: 128 random bits never collide in a test.
        assert_ne!(process_nonce(), rand::random::<[u8; 16]>());
    }

    #[test]
    fn end_of_stream_before_a_frame_is_clean_and_inside_one_is_an_error() {
        assert!(HostFrame::read_from(&mut [].as_slice()).unwrap().is_none());
        let bytes = HostFrame::Sent { tag: tag(), len: 5 }.encode();
        let err = HostFrame::read_from(&mut &bytes[..10]).unwrap_err();
        assert!(matches!(err, HostFrameError::Io(_)), "{err}");
    }

    #[test]
    fn bad_fields_are_named() {
        assert!(matches!(
            HostFrame::read_from(&mut [99u8].as_slice()),
            Err(HostFrameError::Kind(99))
        ));
        let mut bytes = HostFrame::Sent { tag: tag(), len: 5 }.encode();
        bytes[1] = 200;
        assert!(matches!(
            HostFrame::read_from(&mut bytes.as_slice()),
            Err(HostFrameError::Code {
                what: "collective",
                code: 200
            })
        ));
        let mut bytes = HostFrame::Sent { tag: tag(), len: 5 }.encode();
        bytes[22] = 77;
        assert!(matches!(
            HostFrame::read_from(&mut bytes.as_slice()),
            Err(HostFrameError::Code {
                what: "dtype",
                code: 77
            })
        ));
        let mut bytes = HostFrame::Region(RegionInfo {
            token: 1,
            ipc: None,
        })
        .encode();
        bytes[9] = 2;
        assert!(matches!(
            HostFrame::read_from(&mut bytes.as_slice()),
            Err(HostFrameError::Flag(2))
        ));
        let mut bytes = HostFrame::Hello(Hello {
            version: 1,
            nonce: [1; 16],
            rank: Rank(0),
            uuid: [0; 16],
            slot_bytes: 1,
            slots: 1,
        })
        .encode();
        bytes[1] = b'X';
        assert!(matches!(
            HostFrame::read_from(&mut bytes.as_slice()),
            Err(HostFrameError::Magic)
        ));
    }

    #[test]
    fn departure_details_are_bounded_both_ways() {
        let long = "é".repeat(300);
        let bytes = HostFrame::Depart {
            code: CloseCode::LEFT,
            detail: long,
        }
        .encode();
        let Some(HostFrame::Depart { detail, .. }) =
            HostFrame::read_from(&mut bytes.as_slice()).unwrap()
        else {
            panic!("not a departure");
        };
        assert!(detail.len() <= MAX_DETAIL);
        let mut forged = vec![DEPART, 0, 0];
        forged.extend_from_slice(&1000u16.to_le_bytes());
        assert!(matches!(
            HostFrame::read_from(&mut forged.as_slice()),
            Err(HostFrameError::Detail(1000))
        ));
    }
}
