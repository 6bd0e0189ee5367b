//! The fixed 40-byte frame header (SPEC.md, "Framing"). All integers little-endian.
//!
//! ```text
//! 0      4    5    6      8            16           24       28         32           40
//! | CHRS | ver| kind| flags| comm (u64) | epoch (u64)| sender | body_len | seq (u64)  |
//! ```

use bytes::BufMut;

use crate::error::DecodeError;
use crate::ids::{CommId, Epoch, Rank};
use crate::message::Kind;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"CHRS";
/// Length of the frame header in bytes.
pub const HEADER_LEN: usize = 40;
/// The protocol version handshake frames always carry (their layout never changes), and the
/// only version this implementation speaks so far.
pub const BASE_VERSION: u8 = 1;
/// The highest protocol version this implementation speaks.
pub const VERSION: u8 = 1;

/// A parsed frame header. `parse` guarantees the magic, a known kind and zero flags; the
/// decoder adds the version, length and sequence checks that need connection state.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Header {
    /// Protocol version of this frame: `BASE_VERSION` for handshake frames, the negotiated one
    /// after (checked by the decoder, not by `parse`).
    pub version: u8,
    /// What the body is.
    pub kind: Kind,
    /// Reserved; always zero in version 1.
    pub flags: u16,
    /// The communicator the frame belongs to.
    pub comm: CommId,
    /// The sender's epoch of that communicator; receivers fence frames of other epochs.
    pub epoch: Epoch,
    /// The sender's rank at that epoch, or `Rank::NONE` (a joiner, a status client, a launcher).
    pub sender: Rank,
    /// Length of the body that follows, in bytes; checked against the kind's limit before
    /// anything is reserved for it.
    pub body_len: u32,
    /// Position of this frame in its byte stream, from 0, one per frame.
    pub seq: u64,
}

/// The routing fields a sender chooses per frame: which communicator, at which epoch, from
/// whom. The encoder adds version, kind, length and sequence.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Envelope {
    /// The communicator the frames belong to.
    pub comm: CommId,
    /// The sender's epoch of that communicator.
    pub epoch: Epoch,
    /// The sender's rank at that epoch, or `Rank::NONE`.
    pub sender: Rank,
}

impl Envelope {
    /// The routing fields of frames from `sender` in `comm` at `epoch`.
    pub const fn new(comm: CommId, epoch: Epoch, sender: Rank) -> Self {
        Envelope {
            comm,
            epoch,
            sender,
        }
    }
}

impl Header {
    /// Parses a complete header: checks magic, kind and reserved flags.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Result<Header, DecodeError> {
        check_prefix(bytes)?;
        let kind = Kind::from_code(bytes[5]).ok_or(DecodeError::UnknownKind { code: bytes[5] })?;
        Ok(Header {
            version: bytes[4],
            kind,
            flags: u16_at(bytes, 6),
            comm: CommId(u64_at(bytes, 8)),
            epoch: Epoch(u64_at(bytes, 16)),
            sender: Rank(u32_at(bytes, 24)),
            body_len: u32_at(bytes, 28),
            seq: u64_at(bytes, 32),
        })
    }

    /// The header's 40 bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.version;
        b[5] = self.kind.code();
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.0.to_le_bytes());
        b[24..28].copy_from_slice(&self.sender.0.to_le_bytes());
        b[28..32].copy_from_slice(&self.body_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Appends the header's 40 bytes to `out`.
    pub fn put(&self, out: &mut impl BufMut) {
        out.put_slice(&self.to_bytes());
    }

    /// The routing fields.
    pub fn envelope(&self) -> Envelope {
        Envelope::new(self.comm, self.epoch, self.sender)
    }
}

/// Checks whatever part of the first eight bytes is present (magic, kind, flags), so garbage
/// is refused on the first byte that gives it away instead of after 40 bytes have arrived.
/// The version byte is the decoder's to judge.
pub(crate) fn check_prefix(bytes: &[u8]) -> Result<(), DecodeError> {
    let magic_len = bytes.len().min(4);
    if bytes[..magic_len] != MAGIC[..magic_len] {
        let mut found = [0u8; 4];
        found[..magic_len].copy_from_slice(&bytes[..magic_len]);
        return Err(DecodeError::BadMagic { found });
    }
    if let Some(&code) = bytes.get(5)
        && Kind::from_code(code).is_none()
    {
        return Err(DecodeError::UnknownKind { code });
    }
    if bytes.len() >= 8 {
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(DecodeError::ReservedFlags { flags });
        }
    }
    Ok(())
}

fn u16_at(b: &[u8; HEADER_LEN], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            version: 1,
            kind: Kind::Heartbeat,
            flags: 0,
            comm: CommId(0x0102_0304_0506_0708),
            epoch: Epoch(9),
            sender: Rank(3),
            body_len: 8,
            seq: 77,
        }
    }

    #[test]
    fn layout_is_little_endian_at_the_documented_offsets() {
        let b = sample().to_bytes();
        assert_eq!(&b[0..4], b"CHRS");
        assert_eq!(b[4], 1);
        assert_eq!(b[5], 0x20);
        assert_eq!(&b[6..8], &[0, 0]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..24], &9u64.to_le_bytes());
        assert_eq!(&b[24..28], &3u32.to_le_bytes());
        assert_eq!(&b[28..32], &8u32.to_le_bytes());
        assert_eq!(&b[32..40], &77u64.to_le_bytes());
    }

    #[test]
    fn parse_inverts_to_bytes() {
        let h = sample();
        assert_eq!(Header::parse(&h.to_bytes()), Ok(h));
    }

    #[test]
    fn bad_magic_is_refused_on_the_first_wrong_byte() {
        assert_eq!(
            check_prefix(b"X"),
            Err(DecodeError::BadMagic {
                found: [b'X', 0, 0, 0]
            })
        );
        assert_eq!(check_prefix(b"CH"), Ok(()));
        let mut b = sample().to_bytes();
        b[3] = b'Z';
        assert!(matches!(
            Header::parse(&b),
            Err(DecodeError::BadMagic { .. })
        ));
    }

    #[test]
    fn unknown_kind_and_reserved_flags_are_refused() {
        let mut b = sample().to_bytes();
        b[5] = 0xee;
        assert_eq!(
            Header::parse(&b),
            Err(DecodeError::UnknownKind { code: 0xee })
        );
        assert_eq!(
            check_prefix(&b[..6]),
            Err(DecodeError::UnknownKind { code: 0xee })
        );
        let mut b = sample().to_bytes();
        b[7] = 0x80;
        assert_eq!(
            Header::parse(&b),
            Err(DecodeError::ReservedFlags { flags: 0x8000 })
        );
    }
}
