"""torch's own shrink hook, ``dist.shrink_group(ranks_to_exclude)``, on a chorus group.

torch asks the group's backend for ``supports_shrinking`` and calls its
``shrink(ranks_to_exclude, flags, opts)``, which returns a ``Backend``; torch destroys the
old group and wraps that backend in a new ``ProcessGroup`` of its own (the new default
group when the default was shrunk). chorus does not take a list of ranks to drop: the
survivors agree on who is gone (principle 6). So the hook runs chorus's shrink and then
checks the agreement against torch's list; a difference is an error, and the new
communicator is aborted rather than used with a layout torch does not expect.

torch 2.15 also has reconfigure hooks (``init_process_group(enable_reconfigure=True)``,
``Backend.get_reconfigure_handle``/``reconfigure``, ``dist._reconfigure(uuid, handles)``):
the backend re-forms itself in place over a new set of peers. A Python backend cannot
carry that out: torch's ``ProcessGroup.rank()``/``size()`` read the C++ ``Backend``'s own
rank and size fields, which torch exposes no way to set from Python (overriding ``rank()``
in a Python ``Backend`` is not seen by C++: checked on 2.15), so after a reconfigure to a
different membership every ``dist.get_rank()``/``get_world_size()`` would be stale. So
``supports_reconfigure`` stays False; :func:`chorus.torch.shrink`/``grow``/``join`` and
``dist.shrink_group`` are the ways to change a group's members.
"""

from __future__ import annotations

import threading
from typing import List

import torch

_lock = threading.Lock()
# torch keeps the Backend it wraps only as a C++ pointer: without a Python reference its
# Python half (every method) would be collected. Held until the group shuts down.
_held: list = []

SHRINK_ABORT = 0x01  # torch.distributed.distributed_c10d.SHRINK_ABORT


def backend_shrink(group: "object", ranks_to_exclude: List[int], shrink_flags: int) -> "object":
    from ._backend import BackendChorus

    n, me = group.size(), group.rank()
    excluded = sorted({int(r) for r in ranks_to_exclude})
    expected = [r for r in range(n) if r not in excluded]
    if int(shrink_flags) & SHRINK_ABORT:
        group.abort()
    comm = group.comm.shrink()
    # Which old ranks chorus kept: each survivor tells the others its own.
    everyone = torch.empty(comm.size, dtype=torch.int64)
    comm.all_gather(torch.tensor([me], dtype=torch.int64), out=everyone)
    kept = everyone.tolist()
    if kept != expected:
        comm.abort("shrink_group: the agreed survivors are not the ones torch was told")
        gone = [r for r in range(n) if r not in kept]
        raise RuntimeError(
            f"shrink_group: ranks_to_exclude {excluded}, but the survivors agreed that "
            f"{gone} are gone (chorus drops only ranks that died or departed)"
        )
    new = BackendChorus(comm, group.timeout_seconds(), group._comm_timeout, created_by="shrink")
    with _lock:
        _held.append(new)
    return new


def release(group: "object") -> None:
    """Drops the reference :func:`backend_shrink` took (at the group's shutdown)."""
    with _lock:
        if group in _held:
            _held.remove(group)
