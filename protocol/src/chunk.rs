//! The fixed 24-byte layout of a data chunk's header (SPEC.md, "Chunk"). The payload follows
//! it raw, so a receiver splits it off the receive buffer without a copy and a sender can
//! hand it to the kernel separately (writev, zero-copy send).
//!
//! ```text
//! 0     1      2          4        8           16             24
//! | coll | dtype| reserved | step   | op (u64)  | offset (u64) | payload ...
//! ```

use crate::dtype::{Collective, DType};
use crate::ids::OpSeq;
use crate::message::ChunkHeader;
use crate::validation::Invalid;

impl ChunkHeader {
    /// Length of the chunk header on the wire.
    pub const LEN: usize = 24;

    /// A header for a payload of `collective` in `dtype`.
    pub const fn new(
        collective: Collective,
        dtype: DType,
        op: OpSeq,
        step: u32,
        offset: u64,
    ) -> Self {
        ChunkHeader {
            collective: collective.code(),
            dtype: dtype.code(),
            op,
            step,
            offset,
        }
    }

    /// The collective, or `None` if the code is unknown (a decoded header never is).
    pub const fn collective(&self) -> Option<Collective> {
        Collective::from_code(self.collective)
    }

    /// The element type, or `None` if the code is unknown (a decoded header never is).
    pub const fn dtype(&self) -> Option<DType> {
        DType::from_code(self.dtype)
    }

    /// The header's 24 bytes.
    pub fn to_bytes(&self) -> [u8; ChunkHeader::LEN] {
        let mut b = [0u8; ChunkHeader::LEN];
        b[0] = self.collective;
        b[1] = self.dtype;
        b[4..8].copy_from_slice(&self.step.to_le_bytes());
        b[8..16].copy_from_slice(&self.op.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// Parses the 24 bytes; refuses non-zero reserved bytes. Codes are checked by the
    /// validation rules, which also need the payload length.
    pub fn parse(b: &[u8; ChunkHeader::LEN]) -> Result<ChunkHeader, Invalid> {
        if b[2] != 0 || b[3] != 0 {
            return Err(Invalid::ChunkReserved);
        }
        let mut step = [0u8; 4];
        step.copy_from_slice(&b[4..8]);
        let mut op = [0u8; 8];
        op.copy_from_slice(&b[8..16]);
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&b[16..24]);
        Ok(ChunkHeader {
            collective: b[0],
            dtype: b[1],
            op: OpSeq(u64::from_le_bytes(op)),
            step: u32::from_le_bytes(step),
            offset: u64::from_le_bytes(offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_at_the_documented_offsets() {
        let h = ChunkHeader::new(Collective::AllGather, DType::BF16, OpSeq(0x11), 7, 4096);
        let b = h.to_bytes();
        assert_eq!(b[0], 3);
        assert_eq!(b[1], 3);
        assert_eq!(&b[2..4], &[0, 0]);
        assert_eq!(&b[4..8], &7u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x11u64.to_le_bytes());
        assert_eq!(&b[16..24], &4096u64.to_le_bytes());
        assert_eq!(ChunkHeader::parse(&b), Ok(h));
        assert_eq!(h.collective(), Some(Collective::AllGather));
        assert_eq!(h.dtype(), Some(DType::BF16));
    }

    #[test]
    fn reserved_bytes_must_be_zero() {
        let mut b = ChunkHeader::new(Collective::AllReduce, DType::F32, OpSeq(1), 0, 0).to_bytes();
        b[3] = 1;
        assert_eq!(ChunkHeader::parse(&b), Err(Invalid::ChunkReserved));
    }
}
