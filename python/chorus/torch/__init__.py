"""``chorus.torch``: chorus as a ``torch.distributed`` backend.

``import chorus.torch`` registers the backend ``"chorus"`` (CPU tensors), so a training
script changes one word::

    import chorus.torch
    dist.init_process_group("chorus")        # under torchrun, env://, tcp://, file://

Rank 0 of every group makes a fresh ``chorus.UniqueId`` (a new random job secret) and
publishes it in the store torch hands the backend; the others read it. The group's
``timeout`` is the communicator's op timeout. Failures raise chorus's exception classes
(``chorus.PeerFailed`` naming the peer, ``chorus.Timeout``, ``chorus.Aborted``) out of
``Work.wait()`` and out of the futures DDP uses.

Fault tolerance, as torchft drives a process group: ``group.abort()`` from any thread,
``group.errored()``, ``group.shutdown()``, ``group.set_timeout()``, and
:func:`shrink` / :func:`grow` / :func:`join` to carry on with the survivors or with
newcomers without restarting the processes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional, Tuple

import torch

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

import chorus

from . import _cuda
from ._backend import BackendChorus, ChorusGroup, ProcessGroupChorus
from ._rendezvous import _seconds, config_from_env, rendezvous
from ._exit import freeze_at_exit

__all__ = ["ProcessGroupChorus", "BackendChorus", "shrink", "grow", "grow_token", "join", "BACKEND"]

BACKEND = "chorus"

_DEFAULT_TIMEOUT = 1800.0  # torch's default for backends other than NCCL


_launcher_token_used = False


def _create(opts: object, backend_options: object = None) -> ProcessGroupChorus:
    """torch's creator hook (extended API): one communicator per group, met in the store
    (or, for the default group under ``chorus run``, through the launcher's own root)."""
    timeout = _seconds(getattr(opts, "timeout", None), _DEFAULT_TIMEOUT)
    rank, size = int(opts.group_rank), int(opts.group_size)
    config = config_from_env(timeout)
    freeze_at_exit()
    token = _launcher_token(opts, rank, size)
    if token is not None:
        comm = chorus.Comm(chorus.UniqueId(token), rank, size, **config)
        return ProcessGroupChorus(comm, timeout, created_by="launcher")
    comm = rendezvous(opts.store, rank, size, timeout, config)
    return ProcessGroupChorus(comm, timeout)


def _launcher_token(opts: object, rank: int, size: int) -> Optional[str]:
    """``chorus run``'s job token, for the first default group of a process it launched
    with the same rank and world: its root is the launcher, which witnesses every rank's
    exit (the fastest evidence) and would otherwise wait for ranks that never join it. The
    token names one communicator, so a later group meets through the store as usual."""
    global _launcher_token_used
    env = os.environ
    token = env.get("CHORUS_UNIQUE_ID")
    members = getattr(opts, "global_ranks_in_group", None)
    if (
        not token
        or _launcher_token_used
        or members is None
        or len(members) != 0  # empty only for the default group
        or env.get("CHORUS_RANK") != str(rank)
        or env.get("CHORUS_WORLD_SIZE") != str(size)
    ):
        return None
    _launcher_token_used = True
    return token


def _register() -> None:
    if "CHORUS" in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=_cuda.DEVICES)


_register()


def _group(group: Optional[dist.ProcessGroup]) -> Tuple[ChorusGroup, dist.ProcessGroup]:
    """The chorus group behind ``group`` (default: the default group), and the object
    torch registered: the same, or torch's own ``ProcessGroup`` around a ``BackendChorus``
    (after ``dist.shrink_group``)."""
    pg = group if group is not None else _c10d._get_default_group()
    if isinstance(pg, ChorusGroup):
        return pg, pg
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except Exception:
        backend = None
    if not isinstance(backend, ChorusGroup):
        raise TypeError(f"group: expected a chorus process group, got {type(pg).__name__}")
    return backend, pg


def shrink(group: Optional[dist.ProcessGroup] = None) -> ProcessGroupChorus:
    """The group of ``group``'s survivors (default: the default group), after a failure.

    Every survivor calls it. They agree on who is gone (bounded by the agreement
    timeout), and the new group numbers them 0..n-1 in their old order. Shrinking the
    default group makes the new one the default (``dist.get_rank()``, ``get_world_size()``
    and collectives without ``group=`` use it); a subgroup's survivors get a new
    registered subgroup. The old group is aborted and stays unusable.
    """
    old, registered = _group(group)
    was_default = registered is _c10d._get_default_group()
    new = ProcessGroupChorus(old.comm.shrink(), old.timeout_seconds(), old._comm_timeout, created_by="shrink")
    new._ancestor = old
    _install(new, registered, was_default, "shrink")
    return new


def grow_token(group: Optional[dist.ProcessGroup] = None) -> str:
    """The token newcomers pass to :func:`join` to enter ``group`` at its next :func:`grow`."""
    return _group(group)[0].comm.grow_token()


def grow(group: Optional[dist.ProcessGroup] = None, joiners: int = 1) -> ProcessGroupChorus:
    """Admits ``joiners`` new processes (which call :func:`join` with :func:`grow_token`)
    at an epoch boundary: every member calls it; the members keep their ranks and the
    newcomers follow. Returns the new group, which becomes the default group: only the
    default group grows (a newcomer has no other group to be part of)."""
    old, registered = _group(group)
    was_default = registered is _c10d._get_default_group()
    if not was_default:
        raise ValueError("grow: only the default group can grow (newcomers join it as their world)")
    new = ProcessGroupChorus(old.comm.grow(int(joiners)), old.timeout_seconds(), old._comm_timeout, created_by="grow")
    new._ancestor = old
    _install(new, registered, was_default, "grow")
    return new


def join(token: str, timeout: timedelta = timedelta(minutes=30)) -> ProcessGroupChorus:
    """A newcomer's side of :func:`grow`: joins the running group ``token`` names and
    makes it this process's default group (``torch.distributed`` must not be initialized
    yet in this process)."""
    if dist.is_initialized():
        raise RuntimeError("join: torch.distributed is already initialized in this process")
    seconds = _seconds(timeout, _DEFAULT_TIMEOUT)
    freeze_at_exit()
    comm = chorus.Comm.join(token, **config_from_env(seconds))
    new = ProcessGroupChorus(comm, seconds, created_by="join")
    _install(new, None, True, "join")
    return new


_generation = 0


def _install(new: ProcessGroupChorus, old: Optional[dist.ProcessGroup], default: bool, how: str) -> None:
    """Registers ``new`` in torch's group tables, as ``init_process_group``/``new_group``
    would have, so every ``torch.distributed`` function accepts it."""
    global _generation
    _generation += 1
    world = _c10d._world
    base = world.pg_names.get(old, "chorus") if old is not None else "chorus"
    name = f"{base}:{how}{_generation}"
    store = world.pg_map[old][1] if old is not None and old in world.pg_map else None
    if default:
        ranks = {i: i for i in range(new.size())}
    else:
        # The new group's members by their global ranks: each tells the others its own.
        mine = torch.tensor([dist.get_rank()], dtype=torch.int64)
        everyone = torch.empty(new.size(), dtype=torch.int64)
        new.all_gather_single(everyone, mine).wait()
        ranks = {int(g): i for i, g in enumerate(everyone.tolist())}
    new._set_group_name(name)
    if hasattr(new, "_set_group_desc"):
        new._set_group_desc(name)
    world.pg_map[new] = (BACKEND, store)
    world.pg_names[new] = name
    world.pg_backend_config[new] = BACKEND
    world.pg_group_ranks[new] = ranks
    tag = f"ptd:{name}"
    world.tags_to_pg.setdefault(tag, []).append(new)
    world.pg_to_tag[new] = tag
    if default:
        world.tags_to_pg.setdefault("", []).append(new)
    register = getattr(_c10d, "_register_process_group", None)
    if register is not None:
        register(name, new)
    if default:
        update = getattr(_c10d, "_update_default_pg", None)
        if update is not None:
            update(new)
        else:
            world.default_pg = new
    if old is not None:
        _retire(old)


def _retire(old: dist.ProcessGroup) -> None:
    """Takes a superseded group out of torch's tables. torch aborts every group it still
    knows when it shrinks the default one (``dist.shrink_group``), and aborting a chorus
    communicator aborts those shrunk or grown from it (principle 4): a stale ancestor left
    there would take its successors down. The new group keeps it and destroys it after
    itself (``shutdown``)."""
    world = _c10d._world
    name = world.pg_names.pop(old, None)
    for table in (world.pg_map, world.pg_backend_config, world.pg_group_ranks, world.pg_to_tag,
                  getattr(world, "pg_coalesce_state", {})):
        table.pop(old, None)
    for groups in world.tags_to_pg.values():
        while old in groups:
            groups.remove(old)
    unregister = getattr(_c10d, "_unregister_process_group", None)
    if name is not None and unregister is not None:
        try:
            unregister(name)
        except Exception:  # not registered under that name (an older torch)
            pass
