//! One collective as the pure-Python layer describes it, parsed once at submission into a
//! typed [`Spec`], and turned into a `chorus::Op` over the caller's memory on the
//! submission thread.
//!
//! The memory is named by address and length. The pure-Python layer takes both from the
//! object's own interface (`data_ptr()`, `__array_interface__`, the buffer protocol
//! through ctypes) and hands the object itself to the `Work`'s job, which holds it until
//! the operation has finished; that is what makes the slices below valid.

use chorus::{Buffer, DType, Op, Rank, Reduction};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `(collective, send, recv, count, dtype code, reduction, factor, root or peer)`, where
/// `send`/`recv` are `(address, bytes)` or `None`. `send == recv` means in place.
#[derive(FromPyObject)]
pub(crate) struct OpTuple(
    String,
    Option<(usize, usize)>,
    Option<(usize, usize)>,
    usize,
    u8,
    String,
    f64,
    u32,
);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv,
    Barrier,
}

/// Caller memory: `len` bytes at `addr`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Raw {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Raw {
    fn overlaps(self, other: Raw) -> bool {
        self.len > 0
            && other.len > 0
            && self.addr < other.addr.saturating_add(other.len)
            && other.addr < self.addr.saturating_add(self.len)
    }
}

/// A parsed collective.
pub(crate) struct Spec {
    pub(crate) kind: Kind,
    pub(crate) send: Option<Raw>,
    pub(crate) recv: Option<Raw>,
    pub(crate) count: usize,
    pub(crate) dtype: DType,
    pub(crate) reduction: Reduction,
    pub(crate) peer: u32,
}

/// Parses a group of collectives submitted together. No memory one of them writes may
/// overlap memory another reads or writes (Rust's aliasing rule, and a race besides).
pub(crate) fn parse(tuples: Vec<OpTuple>) -> PyResult<Vec<Spec>> {
    let specs = tuples
        .into_iter()
        .map(Spec::parse)
        .collect::<PyResult<Vec<_>>>()?;
    let mut ranges: Vec<(Raw, bool)> = Vec::new();
    for s in &specs {
        match (s.send, s.recv) {
            (Some(a), Some(b)) if a == b => ranges.push((a, true)),
            (send, recv) => {
                ranges.extend(send.map(|r| (r, false)));
                ranges.extend(recv.map(|r| (r, true)));
            }
        }
    }
    for (i, (a, a_writes)) in ranges.iter().enumerate() {
        for (b, b_writes) in &ranges[i + 1..] {
            if (*a_writes || *b_writes) && a.overlaps(*b) {
                return Err(PyValueError::new_err(
                    "out: expected memory that overlaps no other buffer of the call \
                     (pass the same array as input and output for in place)",
                ));
            }
        }
    }
    Ok(specs)
}

impl Spec {
    fn parse(t: OpTuple) -> PyResult<Spec> {
        let OpTuple(name, send, recv, count, dtype, red, factor, peer) = t;
        let kind = match name.as_str() {
            "all_reduce" => Kind::AllReduce,
            "reduce" => Kind::Reduce,
            "broadcast" => Kind::Broadcast,
            "all_gather" => Kind::AllGather,
            "reduce_scatter" => Kind::ReduceScatter,
            "all_to_all" => Kind::AllToAll,
            "gather" => Kind::Gather,
            "scatter" => Kind::Scatter,
            "send" => Kind::Send,
            "recv" => Kind::Recv,
            "barrier" => Kind::Barrier,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown collective {other:?}"
                )));
            }
        };
        let dtype = DType::from_code(dtype)
            .ok_or_else(|| PyValueError::new_err(format!("unknown dtype code {dtype}")))?;
        let reduction = reduction(&red, factor)?;
        let raw = |r: Option<(usize, usize)>| r.map(|(addr, len)| Raw { addr, len });
        Spec::checked(Spec {
            kind,
            send: raw(send),
            recv: raw(recv),
            count,
            dtype,
            reduction,
            peer,
        })
    }

    /// `spec`, once its memory is valid and its input and output either the same range
    /// or apart.
    pub(crate) fn checked(spec: Spec) -> PyResult<Spec> {
        let (send, recv) = (spec.send, spec.recv);
        for r in send.iter().chain(recv.iter()) {
            if r.len > 0 && (r.addr == 0 || r.addr.checked_add(r.len).is_none()) {
                return Err(PyValueError::new_err("buffer: expected valid memory"));
            }
        }
        if let (Some(a), Some(b)) = (send, recv)
            && a != b
            && a.overlaps(b)
        {
            return Err(PyValueError::new_err(
                "out: expected memory separate from the input, or the input itself for in place",
            ));
        }
        Ok(spec)
    }

    /// The operation over the caller's memory.
    ///
    /// # Safety
    /// The memory `send` and `recv` name must stay valid, and untouched by anything but
    /// this operation, for as long as the returned `Op` lives. The job that owns this spec
    /// holds the Python objects that own the memory until the operation has finished;
    /// [`parse`] has checked that no written range overlaps another.
    pub(crate) unsafe fn op(&self) -> Op<'_, [u8]> {
        // SAFETY: the caller upholds this function's contract for both ranges; in place,
        // only the exclusive view of the one range is made.
        let (send, recv) = unsafe {
            (
                self.send.filter(|_| !self.in_place()).map(|r| shared(r)),
                self.recv.map(|r| exclusive(r)),
            )
        };
        self.build(send.unwrap_or(&[]), recv.unwrap_or(&mut []))
    }

    /// Whether the spec names one range as both input and output.
    pub(crate) fn in_place(&self) -> bool {
        self.send.is_some() && self.send == self.recv
    }

    /// The operation over `send` and `recv`, whatever memory they are (empty where the spec
    /// has none); in place (only `recv` used) when [`Spec::in_place`].
    pub(crate) fn build<'a, M: ?Sized>(&self, send: &'a M, recv: &'a mut M) -> Op<'a, M> {
        let in_place = self.in_place();
        let buf = |send: &'a M, recv: &'a mut M| {
            if in_place {
                Buffer::in_place(recv)
            } else {
                Buffer::separate(send, recv)
            }
        };
        let (count, dtype, reduction, root) =
            (self.count, self.dtype, self.reduction, Rank(self.peer));
        match self.kind {
            Kind::AllReduce => Op::AllReduce {
                buf: buf(send, recv),
                count,
                dtype,
                reduction,
            },
            Kind::Reduce => Op::Reduce {
                buf: buf(send, recv),
                count,
                dtype,
                reduction,
                root,
            },
            Kind::Broadcast => Op::Broadcast {
                buf: buf(send, recv),
                count,
                dtype,
                root,
            },
            Kind::AllGather => Op::AllGather {
                buf: buf(send, recv),
                count,
                dtype,
            },
            Kind::ReduceScatter => Op::ReduceScatter {
                buf: buf(send, recv),
                count,
                dtype,
                reduction,
            },
            Kind::AllToAll => Op::AllToAll {
                buf: buf(send, recv),
                count,
                dtype,
            },
            Kind::Gather => Op::Gather {
                buf: buf(send, recv),
                count,
                dtype,
                root,
            },
            Kind::Scatter => Op::Scatter {
                buf: buf(send, recv),
                count,
                dtype,
                root,
            },
            Kind::Send => Op::Send {
                buf: send,
                count,
                dtype,
                peer: root,
            },
            Kind::Recv => Op::Recv {
                buf: recv,
                count,
                dtype,
                peer: root,
            },
            Kind::Barrier => Op::Barrier,
        }
    }
}

/// The reduction a name (and, for `premulsum`, a finite factor) stands for.
pub(crate) fn reduction(name: &str, factor: f64) -> PyResult<Reduction> {
    Ok(match name {
        "sum" => Reduction::Sum,
        "prod" => Reduction::Prod,
        "min" => Reduction::Min,
        "max" => Reduction::Max,
        "avg" => Reduction::Avg,
        "premulsum" if factor.is_finite() => Reduction::PreMulSum(factor),
        _ => {
            return Err(PyValueError::new_err(format!(
                "op: expected \"sum\", \"prod\", \"min\", \"max\", \"avg\" or \
                 chorus.PreMulSum(factor) with a finite factor, got {name:?}"
            )));
        }
    })
}

/// # Safety
/// `r` is readable memory for the chosen lifetime (see [`Spec::op`]).
unsafe fn shared<'a>(r: Raw) -> &'a [u8] {
    if r.len == 0 {
        return &[];
    }
    // SAFETY: non-null (checked in `parse`), readable for `len` bytes per the contract.
    unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) }
}

/// # Safety
/// `r` is writable memory no other reference aliases for the chosen lifetime.
unsafe fn exclusive<'a>(r: Raw) -> &'a mut [u8] {
    if r.len == 0 {
        return &mut [];
    }
    // SAFETY: non-null (checked in `parse`), writable and unaliased per the contract.
    unsafe { std::slice::from_raw_parts_mut(r.addr as *mut u8, r.len) }
}

/// `{name: (code, bytes per element)}` for every dtype the wire carries, under the names
/// numpy and torch give them.
pub(crate) fn dtype_table(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let table = PyDict::new(py);
    for d in DType::ALL {
        table.set_item(dtype_name(d), (d.code(), d.size()))?;
    }
    Ok(table)
}

/// `d`'s name in numpy and torch (`torch.<name>` is its torch dtype).
pub(crate) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::F8E4M3 => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
    }
}
