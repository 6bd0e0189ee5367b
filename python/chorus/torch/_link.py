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
from chorus import _chorus

# {chorus dtype name: (wire code, bytes per element)}
DTYPES = _chorus.DTYPES

@dataclass
class Step:
    """One chorus operation: ``send``/``recv`` are tensors (``send is recv`` for in place)
    whose own dtypes are what chorus reduces; ``peer`` is the root or the peer."""

    name: str
    send: Optional[torch.Tensor]
    recv: Optional[torch.Tensor]
    red: str = "sum"
    factor: float = 1.0
    peer: int = 0

    def op(self) -> object:
        return chorus.PreMulSum(self.factor) if self.red == "premulsum" else self.red

    def call(self, comm: object, async_op: bool = True, timeout: Optional[float] = None) -> object:
        """Submits this step through ``chorus.Comm``'s public collectives: asynchronously,
        into the group being built, or (``async_op=False``) run to its end before
        returning, within ``timeout`` seconds if given."""
        s, r = self.send, self.recv
        a = {"async_op": True} if async_op else {"async_op": False, "timeout": timeout}
        in_place = s is r
        if self.name == "all_reduce":
            return comm.all_reduce(s, op=self.op(), **a)
        if self.name == "reduce":
            return comm.reduce(s, op=self.op(), root=self.peer, **a)
        if self.name == "broadcast":
            return comm.broadcast(s, root=self.peer, **a)
        if self.name == "all_gather":
            return comm.all_gather(r, **a) if in_place else comm.all_gather(s, out=r, **a)
        if self.name == "reduce_scatter":
            return comm.reduce_scatter(s, out=r, op=self.op(), **a)
        if self.name == "all_to_all":
            return comm.all_to_all(s, r, **a)
        if self.name == "gather":
            return comm.gather(s, out=r, root=self.peer, **a)
        if self.name == "scatter":
            return comm.scatter(s, r, root=self.peer, **a)
        if self.name == "send":
            return comm.send(s, self.peer, **a)
        if self.name == "recv":
            return comm.recv(r, self.peer, **a)
        if self.name == "barrier":
            return comm.barrier(**a)
        raise ValueError(f"unknown collective {self.name!r}")


def submit(comm: object, steps: List[Step], group: bool) -> object:
    """Queues ``steps`` on ``comm`` behind everything submitted before; returns the chorus
    ``Work``. The communicator holds the tensors the steps name until they finish."""
    if len(steps) == 1 and not group:
        return steps[0].call(comm)
    with comm.group(async_op=True) as work:
        for s in steps:
            s.call(comm)
    return work


def run(comm: object, steps: List[Step], group: bool, timeout: Optional[float]) -> None:
    """Runs ``steps`` on ``comm`` and returns once they have finished (raising their chorus
    error), on this thread when nothing submitted before is unfinished: what torch's
    blocking collectives (``async_op=False``) get, since torch waits at once anyway.
    ``timeout`` (seconds, None: the communicator's op timeout) aborts the communicator if
    they overrun it."""
    if len(steps) == 1 and not group:
        steps[0].call(comm, False, timeout)
        return
    with comm.group(timeout=timeout):
        for s in steps:
            s.call(comm)


def all_reduce_now(comm: object, t: torch.Tensor, dtype: str, red: str, factor: float, timeout: Optional[float]) -> None:
    """Runs the in-place all-reduce of ``t`` (as :func:`all_reduce` describes it) to its
    end before returning, as :func:`run` runs steps."""
    inner = getattr(comm, "_c", None)
    if t.is_cpu and inner is not None and getattr(comm, "_group", None) is None:
        code, size = DTYPES[dtype]
        n = t.numel()
        mem = (t.data_ptr(), n * size)
        inner.run([("all_reduce", mem, mem, n, code, red, factor, 0)], False, t, timeout)
        return
    op = chorus.PreMulSum(factor) if red == "premulsum" else red
    comm.all_reduce(t, op=op, timeout=timeout)


def all_reduce(comm: object, t: torch.Tensor, dtype: str, red: str, factor: float) -> object:
    """Queues the in-place all-reduce of ``t`` (a checked tensor whose elements chorus
    reduces as ``dtype``) and returns the chorus ``Work``: for a CPU tensor straight to the
    extension, skipping the public layer's description of it (the caller has checked all
    it checks); any other tensor through ``chorus.Comm.all_reduce``."""
    inner = getattr(comm, "_c", None)
    if t.is_cpu and inner is not None and getattr(comm, "_group", None) is None:
        code, size = DTYPES[dtype]
        n = t.numel()
        mem = (t.data_ptr(), n * size)
        return inner.submit([("all_reduce", mem, mem, n, code, red, factor, 0)], False, t, None)
    op = chorus.PreMulSum(factor) if red == "premulsum" else red
    return comm.all_reduce(t, op=op, async_op=True)


def on_host(steps: List[Step]) -> bool:
    """Whether every tensor the steps name is a CPU tensor."""
    for s in steps:
        if (s.send is not None and not s.send.is_cpu) or (s.recv is not None and not s.recv.is_cpu):
            return False
    return True


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a flat uint8 tensor (for operations that only move bytes)."""
    flat = t.reshape(-1)
    if t.dtype == torch.uint8:
        return flat
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return flat.view(torch.uint8)
