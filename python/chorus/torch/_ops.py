"""What torch asks for, checked and translated into chorus operations.

Everything here runs in the caller's thread before anything is submitted, so bad input
(a CUDA tensor, a non-contiguous tensor, sizes that cannot match, a reduction chorus does
not have) is an exception at the call, naming the argument, and never reaches a peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch
from torch.distributed import ReduceOp

from . import _cuda

# torch dtype -> the chorus dtype name reductions run in; every other dtype travels as
# bytes (broadcast, gathers, all-to-all, send/recv), which needs no arithmetic.
REDUCIBLE = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}
for _name, _chorus in (
    ("uint32", "uint32"),
    ("uint64", "uint64"),
    ("float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e5m2"),
):
    if hasattr(torch, _name):
        REDUCIBLE[getattr(torch, _name)] = _chorus

_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}

_NAMES = {
    ReduceOp.SUM: "sum",
    ReduceOp.PRODUCT: "prod",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.AVG: "avg",
}


@dataclass(frozen=True)
class Reduction:
    """A torch reduction as chorus runs it: an operator name and, for PREMUL_SUM, a factor."""

    name: str
    factor: float = 1.0

    def __str__(self) -> str:
        return f"premulsum({self.factor})" if self.name == "premulsum" else self.name


# One Reduction per plain operator, found by the operator's value (comparing pybind enums
# one by one cost more than the rest of the call).
_BY_VALUE = {op.value: Reduction(name) for op, name in _NAMES.items()}
_RED_OP_TYPE = ReduceOp.RedOpType


def reduction(op: object) -> Reduction:
    """The chorus reduction for a torch ``ReduceOp`` (or an options object holding one).

    BAND, BOR, BXOR and anything else chorus cannot compute raise: a reduction is never
    quietly replaced by another (it would return a wrong result).
    """
    op = getattr(op, "reduceOp", op)
    # ReduceOp.SUM and the like are RedOpType values (which pass isinstance(_, ReduceOp));
    # a ReduceOp object (what options hold; PREMUL_SUM's has its factor) holds one in .op.
    plain = type(op) is _RED_OP_TYPE
    if plain:
        kind = op
    elif type(op) is ReduceOp or isinstance(op, ReduceOp):
        kind = op.op
    else:
        raise TypeError(f"op: expected a torch.distributed.ReduceOp, got {type(op).__name__}")
    found = _BY_VALUE.get(kind.value)
    if found is not None:
        return found
    if kind == ReduceOp.RedOpType.PREMUL_SUM:
        factor = None if plain else op.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise ValueError(
                    f"op: PREMUL_SUM expects a scalar factor, got a tensor of {factor.numel()} elements"
                )
            factor = float(factor.item())
        if not isinstance(factor, (int, float)):
            raise ValueError("op: PREMUL_SUM without a factor (make it with _make_nccl_premul_sum)")
        return Reduction("premulsum", float(factor))
    raise ValueError(
        f"op: ReduceOp.{kind.name} is not supported by the chorus backend "
        "(supported: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM)"
    )


def check_tensor(t: object, what: str) -> torch.Tensor:
    """``t`` as a tensor chorus can read and write in place: dense, contiguous, on the CPU
    or a usable CUDA device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        _cuda.check(t, what)
    if t.layout != torch.strided:
        raise ValueError(f"{what}: expected a dense (strided) tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise ValueError(
            f"{what}: expected a contiguous tensor, got shape {tuple(t.shape)} with strides "
            f"{t.stride()} (call .contiguous() first)"
        )
    return t


def check_list(ts: object, what: str) -> list:
    if not isinstance(ts, (list, tuple)):
        raise TypeError(f"{what}: expected a list of tensors, got {type(ts).__name__}")
    return [check_tensor(t, f"{what}[{i}]") for i, t in enumerate(ts)]


def one(ts: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    """The single tensor of a per-device list (torch passes one tensor per device)."""
    ts = check_list(ts, what)
    if len(ts) != 1:
        raise ValueError(f"{what}: expected exactly one tensor (one CPU device), got {len(ts)}")
    return ts[0]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def same_layout(t: torch.Tensor, ref: torch.Tensor, what: str, ref_what: str) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{what}: expected dtype {ref.dtype} (as {ref_what}), got {t.dtype}")
    if t.numel() != ref.numel():
        raise ValueError(
            f"{what}: expected {ref.numel()} elements (as {ref_what}), got {t.numel()}"
        )


class Reducible(NamedTuple):
    """A tensor as a reduction sees it: the tensor to hand chorus (a real view of a complex
    tensor, a byte view of a bool one), its chorus dtype name and the reduction to run."""

    tensor: torch.Tensor
    dtype: str
    red: Reduction


def reducible(t: torch.Tensor, red: Reduction, what: str) -> Reducible:
    """How to reduce ``t`` with ``red``, or an error saying why chorus cannot."""
    name = REDUCIBLE.get(t.dtype)
    if name is not None:
        return Reducible(t, name, red)
    if t.dtype == torch.bool:
        # torch's bool sum/max is "any", prod/min is "all": max and min of 0/1 bytes.
        as_bytes = t.view(torch.uint8)
        if red.name in ("sum", "max"):
            return Reducible(as_bytes, "uint8", Reduction("max"))
        if red.name in ("prod", "min"):
            return Reducible(as_bytes, "uint8", Reduction("min"))
    elif t.dtype in _COMPLEX and red.name in ("sum", "avg", "premulsum"):
        # These are linear, so they act on the real and imaginary parts separately (what
        # NCCL does); PRODUCT, MIN and MAX are not and stay refused.
        real = torch.view_as_real(t)
        return Reducible(real, REDUCIBLE[_COMPLEX[t.dtype]], red)
    raise TypeError(
        f"{what}: the chorus backend cannot reduce dtype {t.dtype} with {str(red).upper()}"
    )


def split_sizes(splits: Optional[Sequence[int]], t: torch.Tensor, n: int, what: str) -> list:
    """Per-peer element counts along dim 0 of ``t`` (torch's all_to_all_single split sizes):
    an empty list means equal parts."""
    rows = t.shape[0] if t.dim() > 0 else t.numel()
    if not splits:
        if rows % n:
            raise ValueError(
                f"{what}: {rows} rows do not split into {n} equal parts; pass split sizes"
            )
        return [rows // n] * n
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise ValueError(f"{what}: expected {n} split sizes (one per rank), got {len(splits)}")
    if any(s < 0 for s in splits):
        raise ValueError(f"{what}: split sizes must be non-negative, got {splits}")
    if sum(splits) != rows:
        raise ValueError(
            f"{what}: split sizes {splits} add up to {sum(splits)} rows, the tensor has {rows}"
        )
    return splits
