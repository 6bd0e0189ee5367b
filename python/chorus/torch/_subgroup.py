"""``new_group`` on a chorus default group: a ``split`` of its communicator where one can
be used, else a fresh communicator met through the store, as torch would make it.

torch 2.15 (the version tested; an older torch calls the backend's creator on the
members only) hands ``new_group`` to the default group when that group has a
``new_group`` method, on every rank of the world, members and not. A split then costs one
all-gather on the parent and links between the members over the parent's session: no new
bootstrap root, certificate, store round trip or handshake with a root. It needs three
things:

- the group asks for the chorus backend (``new_group(backend="gloo")`` is torch's to make);
- every rank of the world takes part: torch names a group by a counter when all ranks call
  it, and by a hash of its ranks with ``use_local_synchronization=True``, where the
  non-members never call (a split would wait for them);
- the group's timeout is at most the parent's operation timeout: a child communicator
  inherits the parent's, and a shorter deadline is the process group's to enforce (as
  with ``set_timeout``), while a longer one cannot be granted.

Anything else gets what torch's own path gives: a communicator per group, through the
creator hook, met in the store. The choice uses only what every rank sees alike (never a
rank's own health), so all ranks of the world take the same path; a broken parent makes
the split fail with the parent's error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import List, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from ._rendezvous import _seconds

BACKEND = "chorus"


def new_group(
    parent: "object",
    ranks: List[int],
    timeout: Optional[timedelta],
    backend: object,
    pg_options: object,
    group_name: str,
    group_desc: Optional[str],
) -> Optional[dist.ProcessGroup]:
    """The new group for this rank, or None where this rank is not a member."""
    seconds = _seconds(timeout, parent.timeout_seconds())
    if splittable(parent, backend, group_name, seconds):
        return split(parent, ranks, seconds, group_name, group_desc)
    return fresh(parent, ranks, timeout, backend, pg_options, group_name, group_desc)


def splittable(parent: "object", backend: object, group_name: str, seconds: float) -> bool:
    every_rank_calls = group_name.isdigit()  # torch's counter name; a hash otherwise
    return (
        str(backend).lower() == BACKEND
        and every_rank_calls
        and seconds <= parent._comm_timeout
        and parent is _c10d._get_default_group()
    )


def split(parent: "object", ranks: List[int], seconds: float, group_name: str, group_desc: Optional[str]) -> Optional[dist.ProcessGroup]:
    from ._backend import ProcessGroupChorus

    me = parent.rank()
    # The split's all-gather runs on the parent beside its queue of operations: let that
    # queue empty first, so every rank's all-gather meets the others' and no operation.
    parent._drain()
    member = me in ranks
    child = parent.comm.split(0 if member else None, ranks.index(me) if member else 0)
    if child is None:
        return None
    pg = ProcessGroupChorus(child, seconds, comm_timeout=parent._comm_timeout, created_by="split")
    pg._set_group_name(group_name)
    pg._set_group_desc(group_desc or "undefined")
    return pg


def fresh(
    parent: "object",
    ranks: List[int],
    timeout: Optional[timedelta],
    backend: object,
    pg_options: object,
    group_name: str,
    group_desc: Optional[str],
) -> Optional[dist.ProcessGroup]:
    """What torch does without the hook. Its helper also registers the group, which torch
    does again with what this returns: the first registration is undone here."""
    _, store = _c10d._world.pg_map[parent]
    me = parent.rank()
    pg, _ = _c10d._new_process_group_helper(
        len(ranks),
        ranks.index(me) if me in ranks else None,
        ranks,
        backend,
        store,
        group_name,
        backend_options=pg_options,
        timeout=timeout,
        device_id=parent.bound_device_id,
        group_desc=group_desc,
    )
    if pg is _c10d.GroupMember.NON_GROUP_MEMBER:
        return None
    _c10d._unregister_process_group(group_name)
    tagged = _c10d._world.tags_to_pg.get(f"ptd:{group_name}", [])
    if pg in tagged:
        tagged.remove(pg)
    return pg
