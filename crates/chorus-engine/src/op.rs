//! What an operation is: the collective, its buffers and arguments, as NCCL takes them.

use chorus_protocol::{Collective, DType, Rank, ReduceOp};

/// The buffers of a collective: separate send and receive buffers, or one buffer used for
/// both (NCCL's in-place form, `sendbuff == recvbuff`, or the offset variants for
/// all-gather, reduce-scatter and gather/scatter at the root; see each [`Op`] variant).
pub enum Buffer<'a, M: ?Sized> {
    /// One buffer that is both input and output (NCCL's `sendbuff == recvbuff`).
    InPlace(&'a mut M),
    /// Input and output in distinct memory; they must not overlap.
    Separate {
        /// The input.
        send: &'a M,
        /// The output.
        recv: &'a mut M,
    },
}

impl<'a, M: ?Sized> Buffer<'a, M> {
    /// Separate buffers.
    pub fn separate(send: &'a M, recv: &'a mut M) -> Self {
        Buffer::Separate { send, recv }
    }

    /// One buffer for input and output.
    pub fn in_place(buf: &'a mut M) -> Self {
        Buffer::InPlace(buf)
    }

    /// True for [`Buffer::InPlace`]: the collective must read its input before overwriting it.
    pub fn is_in_place(&self) -> bool {
        matches!(self, Buffer::InPlace(_))
    }

    /// The input.
    pub fn send(&self) -> &M {
        match self {
            Buffer::InPlace(b) => b,
            Buffer::Separate { send, .. } => send,
        }
    }

    /// The output.
    pub fn recv(&mut self) -> &mut M {
        match self {
            Buffer::InPlace(b) => b,
            Buffer::Separate { recv, .. } => recv,
        }
    }
}

/// A reduction operator with its argument (`PreMulSum` carries its scalar).
#[derive(Copy, Clone, PartialEq, Debug)]
pub enum Reduction {
    /// Elementwise sum (integers wrap, as NCCL's do).
    Sum,
    /// Elementwise product (integers wrap).
    Prod,
    /// Elementwise minimum; a float NaN operand is ignored (IEEE `minNum`).
    Min,
    /// Elementwise maximum; a float NaN operand is ignored (IEEE `maxNum`).
    Max,
    /// Sum, then divide by the world size (integers truncate toward zero).
    Avg,
    /// Multiply each rank's contribution by the scalar, then sum. Integer types multiply
    /// exactly by an integral scalar below 2^63 and go through `f64` otherwise.
    PreMulSum(f64),
}

impl Reduction {
    /// The protocol's operator code.
    pub fn op(self) -> ReduceOp {
        match self {
            Reduction::Sum => ReduceOp::Sum,
            Reduction::Prod => ReduceOp::Prod,
            Reduction::Min => ReduceOp::Min,
            Reduction::Max => ReduceOp::Max,
            Reduction::Avg => ReduceOp::Avg,
            Reduction::PreMulSum(_) => ReduceOp::PreMulSum,
        }
    }

    /// The operator the device applies between two contributions.
    pub(crate) fn combine(self) -> ReduceOp {
        match self {
            Reduction::Avg | Reduction::PreMulSum(_) => ReduceOp::Sum,
            other => other.op(),
        }
    }

    /// The scalar each contribution is multiplied by before combining, if any.
    pub(crate) fn premul(self) -> Option<f64> {
        match self {
            Reduction::PreMulSum(s) => Some(s),
            _ => None,
        }
    }
}

impl TryFrom<ReduceOp> for Reduction {
    type Error = ReduceOp;

    /// Every operator but `PreMulSum`, which needs its scalar.
    fn try_from(op: ReduceOp) -> Result<Self, ReduceOp> {
        Ok(match op {
            ReduceOp::Sum => Reduction::Sum,
            ReduceOp::Prod => Reduction::Prod,
            ReduceOp::Min => Reduction::Min,
            ReduceOp::Max => Reduction::Max,
            ReduceOp::Avg => Reduction::Avg,
            ReduceOp::PreMulSum => return Err(op),
        })
    }
}

/// One operation. Counts are in elements of `dtype`; buffers are device memory of at least
/// the sizes below (a shorter buffer is an `InvalidArgument` error, never a panic).
pub enum Op<'a, M: ?Sized> {
    /// Every rank ends with the reduction of all ranks' `count` elements.
    /// Send and receive: `count` elements each.
    AllReduce {
        /// Send and receive buffers of `count` elements each, or one in place.
        buf: Buffer<'a, M>,
        /// Elements per rank.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// How contributions combine; every rank must pass the same one.
        reduction: Reduction,
    },
    /// The root ends with the reduction; other ranks' receive buffers are not touched
    /// (in place, a non-root's buffer is its input and is left unchanged).
    Reduce {
        /// Send buffer of `count` elements; the receive buffer (`count`) matters only at the root.
        buf: Buffer<'a, M>,
        /// Elements per rank.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// How contributions combine; every rank must pass the same one.
        reduction: Reduction,
        /// The rank that receives the result; the same on every rank.
        root: Rank,
    },
    /// Every rank ends with the root's `count` elements. The send buffer matters only at
    /// the root.
    Broadcast {
        /// `count` elements each; the send buffer is read only at the root.
        buf: Buffer<'a, M>,
        /// Elements broadcast.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// The rank whose data every rank ends with.
        root: Rank,
    },
    /// Every rank contributes `count` elements; every receive buffer (`world * count`) ends
    /// with rank `i`'s contribution at element `i * count`. In place, the buffer is the
    /// receive buffer and this rank's contribution is already at `rank * count`.
    AllGather {
        /// Send `count` elements, receive `world * count`.
        buf: Buffer<'a, M>,
        /// Elements each rank contributes.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
    },
    /// Every rank contributes `world * count` elements; rank `i` ends with the reduction of
    /// block `i` (`count` elements). In place, the buffer holds `world * count` elements and
    /// the result lands at `rank * count`; the other blocks are left unchanged.
    ReduceScatter {
        /// Send `world * count` elements, receive `count`.
        buf: Buffer<'a, M>,
        /// Elements each rank ends with.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// How contributions combine; every rank must pass the same one.
        reduction: Reduction,
    },
    /// Block `j` (`count` elements) of rank `i`'s send buffer lands in block `i` of rank
    /// `j`'s receive buffer. Both buffers hold `world * count` elements.
    AllToAll {
        /// Send and receive buffers of `world * count` elements each.
        buf: Buffer<'a, M>,
        /// Elements per pair of ranks.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
    },
    /// The root's receive buffer (`world * count`) ends with rank `i`'s `count` elements at
    /// `i * count`. In place at the root, its contribution is already at `root * count`; at
    /// other ranks only the send buffer matters.
    Gather {
        /// Send `count` elements; the root's receive buffer holds `world * count`.
        buf: Buffer<'a, M>,
        /// Elements each rank contributes.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// The rank that receives everything.
        root: Rank,
    },
    /// Rank `i` receives block `i` (`count` elements) of the root's send buffer
    /// (`world * count`). In place at the root, its own block stays where it is.
    Scatter {
        /// The root's send buffer holds `world * count` elements; every receive buffer `count`.
        buf: Buffer<'a, M>,
        /// Elements each rank receives.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// The rank whose buffer is scattered.
        root: Rank,
    },
    /// Send `count` elements to `peer`, which posts a matching [`Op::Recv`].
    Send {
        /// At least `count` elements to send.
        buf: &'a M,
        /// Elements sent; the peer's `Recv` must name the same count.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// The receiving rank.
        peer: Rank,
    },
    /// Receive `count` elements from `peer`.
    Recv {
        /// Room for at least `count` elements.
        buf: &'a mut M,
        /// Elements received; a different count from the sender is a `SizeMismatch`.
        count: usize,
        /// Element type of both buffers; `count` is in its elements.
        dtype: DType,
        /// The sending rank.
        peer: Rank,
    },
    /// Returns once every rank has entered the barrier.
    Barrier,
}

impl<M: ?Sized> Op<'_, M> {
    /// The collective kind (send and receive are both `SendRecv`).
    pub fn collective(&self) -> Collective {
        match self {
            Op::AllReduce { .. } => Collective::AllReduce,
            Op::Reduce { .. } => Collective::Reduce,
            Op::Broadcast { .. } => Collective::Broadcast,
            Op::AllGather { .. } => Collective::AllGather,
            Op::ReduceScatter { .. } => Collective::ReduceScatter,
            Op::AllToAll { .. } => Collective::AllToAll,
            Op::Gather { .. } => Collective::Gather,
            Op::Scatter { .. } => Collective::Scatter,
            Op::Send { .. } | Op::Recv { .. } => Collective::SendRecv,
            Op::Barrier => Collective::Barrier,
        }
    }

    /// The element type (barrier: bytes).
    pub fn dtype(&self) -> DType {
        match self {
            Op::AllReduce { dtype, .. }
            | Op::Reduce { dtype, .. }
            | Op::Broadcast { dtype, .. }
            | Op::AllGather { dtype, .. }
            | Op::ReduceScatter { dtype, .. }
            | Op::AllToAll { dtype, .. }
            | Op::Gather { dtype, .. }
            | Op::Scatter { dtype, .. }
            | Op::Send { dtype, .. }
            | Op::Recv { dtype, .. } => *dtype,
            Op::Barrier => DType::U8,
        }
    }

    /// The count argument (barrier: 0).
    pub fn count(&self) -> usize {
        match self {
            Op::AllReduce { count, .. }
            | Op::Reduce { count, .. }
            | Op::Broadcast { count, .. }
            | Op::AllGather { count, .. }
            | Op::ReduceScatter { count, .. }
            | Op::AllToAll { count, .. }
            | Op::Gather { count, .. }
            | Op::Scatter { count, .. }
            | Op::Send { count, .. }
            | Op::Recv { count, .. } => *count,
            Op::Barrier => 0,
        }
    }
}
