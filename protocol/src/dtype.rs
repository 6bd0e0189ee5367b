//! Element types, reduction operators and collective kinds, with their wire codes. The
//! engine computes with these; the protocol carries their codes in chunk headers and status
//! replies, so both agree on one numbering.

use std::fmt;

/// An element type of a collective's buffers.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum DType {
    /// IEEE binary32, 4 bytes.
    F32 = 0,
    /// IEEE binary64, 8 bytes.
    F64 = 1,
    /// IEEE binary16, 2 bytes; reductions compute in `f32` and round once (nearest, ties to even).
    F16 = 2,
    /// bfloat16 (the top half of an `f32`), 2 bytes; reductions compute in `f32` and round once.
    BF16 = 3,
    /// Signed 8-bit integer; sums and products wrap (two's complement), as NCCL's do.
    I8 = 4,
    /// Unsigned 8-bit integer; sums and products wrap.
    U8 = 5,
    /// Signed 32-bit integer; sums and products wrap.
    I32 = 6,
    /// Unsigned 32-bit integer; sums and products wrap.
    U32 = 7,
    /// Signed 64-bit integer; sums and products wrap.
    I64 = 8,
    /// Unsigned 64-bit integer; sums and products wrap.
    U64 = 9,
    /// fp8, 4 exponent bits, 3 mantissa bits (OCP "E4M3FN": no infinities).
    F8E4M3 = 10,
    /// fp8, 5 exponent bits, 2 mantissa bits (OCP "E5M2").
    F8E5M2 = 11,
}

impl DType {
    /// Every type, in code order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The type for a wire code, or `None` for a code this version does not know.
    pub const fn from_code(code: u8) -> Option<DType> {
        if (code as usize) < DType::ALL.len() {
            Some(DType::ALL[code as usize])
        } else {
            None
        }
    }

    /// The short name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator. `PreMulSum`'s scalar travels with the operation, not on the wire.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum ReduceOp {
    /// Elementwise sum (integers wrap; floats round per the element type).
    Sum = 0,
    /// Elementwise product (integers wrap).
    Prod = 1,
    /// Elementwise minimum; for floats a NaN operand is ignored (IEEE `minNum`), and which of
    /// `+0`/`-0` wins depends on the order operands meet, which differs between algorithms.
    Min = 2,
    /// Elementwise maximum, with `Min`'s NaN and signed-zero rules.
    Max = 3,
    /// Sum, then divide by the number of contributors.
    Avg = 4,
    /// Multiply each contribution by a scalar, then sum (NCCL's `ncclRedOpCreatePreMulSum`).
    PreMulSum = 5,
}

impl ReduceOp {
    /// Every operator, in code order.
    pub const ALL: [ReduceOp; 6] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::PreMulSum,
    ];

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The operator for a wire code, or `None` for a code this version does not know.
    pub const fn from_code(code: u8) -> Option<ReduceOp> {
        if (code as usize) < ReduceOp::ALL.len() {
            Some(ReduceOp::ALL[code as usize])
        } else {
            None
        }
    }

    /// The short name nccl-tests prints.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum => "premulsum",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a collective operation, carried in chunk headers so that ranks calling
/// different collectives are detected instead of silently corrupting each other's data.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's buffer.
    AllReduce = 0,
    /// The root ends with the reduction of every rank's buffer.
    Reduce = 1,
    /// Every rank ends with the root's buffer.
    Broadcast = 2,
    /// Every rank ends with every rank's buffer, concatenated in rank order.
    AllGather = 3,
    /// Rank `i` ends with block `i` of the reduction of every rank's buffer.
    ReduceScatter = 4,
    /// Rank `i` sends its block `j` to rank `j`, which stores it as block `i`.
    AllToAll = 5,
    /// The root ends with every rank's buffer, concatenated in rank order.
    Gather = 6,
    /// Rank `i` ends with block `i` of the root's buffer.
    Scatter = 7,
    /// Point-to-point: one rank's `send` matched by one peer's `recv`.
    SendRecv = 8,
    /// No data: returns once every rank has entered it.
    Barrier = 9,
}

impl Collective {
    /// Every collective, in code order.
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
        Collective::SendRecv,
        Collective::Barrier,
    ];

    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The collective for a wire code, or `None` for a code this version does not know.
    pub const fn from_code(code: u8) -> Option<Collective> {
        if (code as usize) < Collective::ALL.len() {
            Some(Collective::ALL[code as usize])
        } else {
            None
        }
    }

    /// The kebab-case name used by the CLI and in errors (`all-reduce`, `send-recv`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllToAll => "all-to-all",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::SendRecv => "send-recv",
            Collective::Barrier => "barrier",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
