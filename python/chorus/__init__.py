"""chorus: collective communication (all-reduce, broadcast, ...) where no rank ever hangs.

A peer that dies, freezes or departs becomes a prompt, typed exception on every survivor
(``chorus.PeerFailed`` naming it), and the survivors ``shrink()`` and carry on::

    import numpy as np, chorus
    comm = chorus.Comm.from_env()           # under `chorus run -n 4 -- python x.py`
    a = np.full(4, comm.rank, dtype=np.float32)
    comm.all_reduce(a)                      # in place, op="sum"
"""

from . import _chorus
from ._chorus import UniqueId
from ._comm import Comm, Op, PreMulSum
from ._errors import (
    Aborted,
    Bootstrap,
    ConfigError,
    Destroyed,
    DeviceError,
    Error,
    Evicted,
    InternalError,
    InvalidArgument,
    Mismatch,
    NoQuorum,
    PeerDeparted,
    PeerFailed,
    ProtocolError,
    Revoked,
    Timeout,
    TransportError,
    from_text,
)
from ._health import Health, Member, PeerHealth
from ._work import Work

__version__: str = _chorus.__version__

#: The configuration keywords ``Comm`` and ``UniqueId.new`` take (``CHORUS_*`` in lowercase).
CONFIG_KEYS = tuple(_chorus.config_keys())

__all__ = [
    "Aborted",
    "Bootstrap",
    "CONFIG_KEYS",
    "Comm",
    "ConfigError",
    "Destroyed",
    "DeviceError",
    "Error",
    "Evicted",
    "Health",
    "InternalError",
    "InvalidArgument",
    "Member",
    "Mismatch",
    "NoQuorum",
    "Op",
    "PeerDeparted",
    "PeerFailed",
    "PeerHealth",
    "PreMulSum",
    "ProtocolError",
    "Revoked",
    "Timeout",
    "TransportError",
    "UniqueId",
    "Work",
    "__version__",
    "from_text",
]
