"""The one place the backend talks to the chorus communicator.

A torch call becomes one submission: a list of chorus operations over tensors' memory,
run one after another or as one NCCL-style group, behind everything submitted before it
(ranks must issue collectives in the same order). The communicator's submission thread
holds the tensors until the operations have finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

import chorus

_raw_mod = chorus._chorus
_DTYPES = _raw_mod.DTYPES  # {name: (code, bytes per element)}


@dataclass
class Step:
    """One chorus operation: ``send``/``recv`` are tensors (``send is recv`` for in place),
    ``count`` elements of ``dtype`` per block, ``peer`` is the root or the peer."""

    name: str
    send: Optional[torch.Tensor]
    recv: Optional[torch.Tensor]
    count: int
    dtype: str = "uint8"
    red: str = "sum"
    factor: float = 1.0
    peer: int = 0

    def tuple(self) -> tuple:
        def mem(t: Optional[torch.Tensor]):
            if t is None:
                return None
            return (t.data_ptr(), t.numel() * t.element_size())

        send = mem(self.send)
        recv = send if self.recv is self.send and self.send is not None else mem(self.recv)
        code = _DTYPES[self.dtype][0]
        return (self.name, send, recv, self.count, code, self.red, self.factor, self.peer)


def raw(comm: object) -> object:
    """The extension's communicator behind a ``chorus.Comm``."""
    for attr in ("_c", "_raw", "_comm"):
        inner = getattr(comm, attr, None)
        if inner is not None and hasattr(inner, "submit"):
            return inner
    if hasattr(comm, "submit"):
        return comm
    raise TypeError(f"not a chorus communicator: {type(comm).__name__}")


def submit(comm: object, steps: List[Step], group: bool, keep: object) -> object:
    """Queues ``steps`` on ``comm``; returns the chorus ``Work``. ``keep`` must own every
    tensor the steps name (views keep their base alive)."""
    return raw(comm).submit([s.tuple() for s in steps], group, keep)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a flat uint8 tensor (for operations that only move bytes)."""
    flat = t.reshape(-1)
    if t.dtype == torch.uint8:
        return flat
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return flat.view(torch.uint8)
