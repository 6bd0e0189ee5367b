"""How a chorus group's communicator is found: torch's store and the environment.

Rank 0 of a group makes a fresh ``chorus.UniqueId`` (a new random job secret, its
bootstrap root in this process) and publishes its token in the store torch hands the
backend, as ProcessGroupNCCL does with its unique id; the others read it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

import chorus

from ._work import _error

_UID_KEY = "chorus/unique_id"


def _seconds(timeout: object, default: float) -> float:
    if timeout is None:
        return default
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return default if s <= 0 else s


def _millis(seconds: float) -> str:
    return f"{max(int(seconds * 1000), 1)}ms"


def config_from_env(timeout: float) -> dict:
    """The communicator's keywords: every ``CHORUS_*`` setting of the environment (so a
    job tunes heartbeats the usual way), with torch's timeout as the op timeout and, unless
    ``CHORUS_INIT_TIMEOUT`` says otherwise, as the init timeout."""
    cfg = {}
    for key in chorus.CONFIG_KEYS:
        value = os.environ.get(f"CHORUS_{key.upper()}")
        if value is not None and value != "":
            cfg[key] = value
    cfg["op_timeout"] = _millis(timeout)
    cfg.setdefault("init_timeout", _millis(timeout))
    return cfg


def rendezvous(store: dist.Store, rank: int, size: int, timeout: float, config: dict) -> object:
    """A chorus communicator for ``size`` ranks, found through torch's ``store``: rank 0
    makes a fresh ``UniqueId`` (a new random job secret, its bootstrap root in this
    process) and publishes its token; the others read it, waiting at most ``timeout``."""
    if rank == 0:
        host = os.environ.get("CHORUS_BIND", "127.0.0.1")
        bind = f"[{host}]:0" if ":" in host else f"{host}:0"
        uid = chorus.UniqueId.new(size, bind=bind, **config)
        store.set(_UID_KEY, str(uid))
    else:
        try:
            store.wait([_UID_KEY], timedelta(seconds=timeout))
        except Exception as e:
            raise _error(
                getattr(chorus, "Bootstrap", chorus.Error),
                f"[chorus:bootstrap] rank {rank}: rank 0 published no chorus id in the store "
                f"within {timeout:g} s ({e})",
            ) from e
        uid = chorus.UniqueId(store.get(_UID_KEY).decode())
    return chorus.Comm(uid, rank, size, **config)
