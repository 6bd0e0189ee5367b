"""``chorus.Comm``: the communicator, over the extension's ``_chorus.Comm``.

Every collective takes numpy arrays, torch CPU tensors or writable buffers, without
copying: the result lands in the caller's memory. ``out=None`` means in place. With
``async_op=True`` a collective returns a ``Work`` at once; otherwise it returns None once
the operation has finished, or raises its ``chorus.Error``. Either way the operation runs
after every one submitted before it on this communicator: a blocking call made while
nothing is queued or running runs on the calling thread (GIL released), any other goes
through the communicator's submission thread.

``timeout`` (seconds, counted from when the operation starts, after those queued before
it) bounds one call more tightly than the ``op_timeout`` configuration: when it passes,
the communicator is aborted, as torch's watchdog aborts an NCCL communicator, because an
operation the peers are inside cannot be cancelled alone. The call then fails with
``chorus.Timeout``, later ones with ``Aborted``; ``shrink`` or ``destroy`` it.

Waits release the GIL. Another thread's ``comm.abort()`` ends a blocked collective with
``Aborted``. Ctrl-C during a blocked collective (or membership call) aborts the
communicator and raises ``KeyboardInterrupt``: every operation on it fails with
``Aborted``, the other members see this member depart, and the communicator cannot be
used again (``destroy`` it; the others ``shrink``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Tuple, Union

from . import _chorus, _cuda
from ._buffers import Buf, describe
from ._health import Health, Member, _health, _members
from ._work import Work


class PreMulSum:
    """The reduction that multiplies each rank's contribution by ``factor``, then sums
    (NCCL's ncclRedOpCreatePreMulSum)."""

    __slots__ = ("factor",)

    def __init__(self, factor: float) -> None:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"factor: expected a number, got {type(factor).__name__}")
        self.factor = float(factor)

    def __repr__(self) -> str:
        return f"PreMulSum({self.factor})"


Op = Union[str, PreMulSum]
_OPS = ("sum", "prod", "min", "max", "avg")


_OP_ARGS = {name: (name, 0.0) for name in _OPS}


def _op(op: Op) -> Tuple[str, float]:
    if isinstance(op, str):
        args = _OP_ARGS.get(op)
        if args is not None:
            return args
    elif isinstance(op, PreMulSum):
        return ("premulsum", op.factor)
    raise ValueError(
        f'op: expected "sum", "prod", "min", "max", "avg" or chorus.PreMulSum(factor), got {op!r}'
    )


class _Group:
    def __init__(self) -> None:
        self.ops: List[tuple] = []
        self.keep: List[Any] = []
        self.work = Work()


class Comm:
    """A communicator: ``Comm(uid, rank, world, **config)``, where each keyword is a
    ``CHORUS_*`` variable in lowercase without the prefix, with the same units and text
    (``heartbeat_deadline="2s"``, ``transport="quic"``, ``observers=3``). The variables
    themselves apply too, as for ``from_env``: a keyword beats its variable, a variable
    beats the default (and a bad variable is a ``ValueError`` naming it, unless a keyword
    overrides it)."""

    def __init__(self, uid: Any, rank: int, world: int, **config: Any) -> None:
        if isinstance(uid, str):
            uid = _chorus.UniqueId(uid)
        if not isinstance(uid, _chorus.UniqueId):
            raise TypeError(f"uid: expected a chorus.UniqueId or its token, got {type(uid).__name__}")
        _int("world", world)
        if world < 1:
            raise ValueError(f"world: expected at least 1 rank, got {world}")
        _int("rank", rank)
        if not 0 <= rank < world:
            raise ValueError(f"rank: expected a rank in 0..{world - 1}, got {rank}")
        self._c = _chorus.Comm.init(uid, rank, world, **config)
        self._group: Optional[_Group] = None

    @classmethod
    def _wrap(cls, inner: Any) -> "Comm":
        comm = cls.__new__(cls)
        comm._c = inner
        comm._group = None
        return comm

    @classmethod
    def from_env(cls, **config: Any) -> "Comm":
        """The communicator of the launch: ``chorus run``, torchrun, Slurm or Open MPI
        (configuration as for ``Comm``: a keyword beats its ``CHORUS_*`` variable)."""
        return cls._wrap(_chorus.Comm.from_env(**config))

    @classmethod
    def join(cls, token: str, **config: Any) -> "Comm":
        """Joins a running communicator whose members call ``grow`` (``token`` is their
        ``grow_token()``)."""
        if not isinstance(token, str):
            raise TypeError(f"token: expected a str, got {type(token).__name__}")
        return cls._wrap(_chorus.Comm.join(token, **config))

    # -- properties -----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def epoch(self) -> int:
        """The membership generation: 0 after init, bumped by every shrink and grow."""
        return self._c.epoch

    @property
    def members(self) -> List[Member]:
        return _members(self._c.members())

    def health(self) -> Health:
        """This member's ledger: per peer the state, last-heard age and evidence."""
        return _health(self._c.health())

    def async_error(self) -> Optional[BaseException]:
        """The first failure recorded on this communicator (ncclCommGetAsyncError)."""
        return self._c.async_error()

    # -- collectives ----------------------------------------------------------------------

    def all_reduce(self, a: Any, out: Any = None, op: Op = "sum", *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Every rank ends with the reduction of every rank's ``a``."""
        if not async_op and timeout is None and self._group is None and self._c.all_reduce_now(a, out, op):
            # numpy arrays and plain torch CPU tensors with a plain reduction, described
            # and run by the extension in one call; anything else (or anything wrong) takes
            # the general path below.
            return None
        send, recv = self._pair(a, out)
        _same(send, recv, "out", send.numel)
        return self._go(("all_reduce", send.raw, recv.raw, send.numel, send.dtype, *_op(op), 0), (send.keep, recv.keep), async_op, timeout)

    def reduce(self, a: Any, out: Any = None, op: Op = "sum", root: int = 0, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """The root's ``out`` (or ``a``, in place) ends with the reduction; other ranks'
        buffers are left as they are."""
        root = self._rank("root", root)
        send, recv = self._pair(a, out)
        _same(send, recv, "out", send.numel)
        return self._go(("reduce", send.raw, recv.raw, send.numel, send.dtype, *_op(op), root), (send.keep, recv.keep), async_op, timeout)

    def broadcast(self, a: Any, root: int = 0, out: Any = None, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Every rank's ``out`` (or ``a``, in place) ends with the root's ``a``."""
        root = self._rank("root", root)
        send, recv = self._pair(a, out)
        _same(send, recv, "out", send.numel)
        return self._go(("broadcast", send.raw, recv.raw, send.numel, send.dtype, "sum", 0.0, root), (send.keep, recv.keep), async_op, timeout)

    def all_gather(self, a: Any, out: Any = None, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """``out`` (``size`` times ``a``) ends with rank i's ``a`` at block i. In place
        (``out=None``), ``a`` is the whole output and this rank's block is already in it."""
        send, recv = self._pair(a, out)
        if out is None:
            count = self._blocks(send, "a")
        else:
            count = send.numel
            _same(send, recv, "out", count * self.size)
        return self._go(("all_gather", send.raw, recv.raw, count, send.dtype, "sum", 0.0, 0), (send.keep, recv.keep), async_op, timeout)

    def reduce_scatter(self, a: Any, out: Any = None, op: Op = "sum", *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Rank i's ``out`` ends with the reduction of block i of every rank's ``a``
        (``size`` blocks). In place, the result lands in block ``rank`` of ``a``."""
        send, recv = self._pair(a, out)
        count = self._blocks(send, "a")
        if out is not None:
            _same(send, recv, "out", count)
        return self._go(("reduce_scatter", send.raw, recv.raw, count, send.dtype, *_op(op), 0), (send.keep, recv.keep), async_op, timeout)

    def all_to_all(self, a: Any, out: Any, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Block j of rank i's ``a`` lands in block i of rank j's ``out``."""
        if out is None:
            raise ValueError("out: expected an output buffer the size of a, got None")
        send, recv = self._pair(a, out)
        count = self._blocks(send, "a")
        _same(send, recv, "out", send.numel)
        return self._go(("all_to_all", send.raw, recv.raw, count, send.dtype, "sum", 0.0, 0), (send.keep, recv.keep), async_op, timeout)

    def gather(self, a: Any, out: Any = None, root: int = 0, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """The root's ``out`` (``size`` times ``a``) ends with rank i's ``a`` at block i;
        ``out`` matters only at the root."""
        root = self._rank("root", root)
        send = describe(a, "a", writable=False)
        if self.rank == root:
            if out is None:
                raise ValueError("out: expected an output buffer at the root, got None")
            recv = describe(out, "out", writable=True)
            _same(send, recv, "out", send.numel * self.size)
            raw, keep = recv.raw, recv.keep
        else:
            raw, keep = None, None
        return self._go(("gather", send.raw, raw, send.numel, send.dtype, "sum", 0.0, root), (send.keep, keep), async_op, timeout)

    def scatter(self, a: Any, out: Any, root: int = 0, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Rank i's ``out`` ends with block i of the root's ``a`` (``size`` blocks); ``a``
        matters only at the root (pass None elsewhere)."""
        root = self._rank("root", root)
        recv = describe(out, "out", writable=True)
        if self.rank == root:
            if a is None:
                raise ValueError("a: expected the input at the root, got None")
            send = describe(a, "a", writable=False)
            _same(recv, send, "a", recv.numel * self.size)
            raw, keep = send.raw, send.keep
        else:
            raw, keep = None, None
        return self._go(("scatter", raw, recv.raw, recv.numel, recv.dtype, "sum", 0.0, root), (keep, recv.keep), async_op, timeout)

    def send(self, a: Any, peer: int, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Sends ``a`` to ``peer``, which calls ``recv`` with a buffer of the same size."""
        peer = self._rank("peer", peer)
        buf = describe(a, "a", writable=False)
        return self._go(("send", buf.raw, None, buf.numel, buf.dtype, "sum", 0.0, peer), buf.keep, async_op, timeout)

    def recv(self, a: Any, peer: int, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Receives into ``a`` what ``peer`` sends."""
        peer = self._rank("peer", peer)
        buf = describe(a, "a", writable=True)
        return self._go(("recv", None, buf.raw, buf.numel, buf.dtype, "sum", 0.0, peer), buf.keep, async_op, timeout)

    def barrier(self, *, async_op: bool = False, timeout: Optional[float] = None) -> Optional[Work]:
        """Returns once every rank has entered the barrier."""
        return self._go(("barrier", None, None, 0, 0, "sum", 0.0, 0), None, async_op, timeout)

    @contextlib.contextmanager
    def group(self, *, async_op: bool = False, timeout: Optional[float] = None) -> Iterator[Work]:
        """Collectives called inside run together (NCCL's group calls): each returns the
        group's ``Work`` at once, and they are submitted as one when the block ends, which
        then waits for them unless ``async_op``. Yields that ``Work``. ``timeout`` is the
        group's, as for a single collective."""
        if self._group is not None:
            raise ValueError("group: already inside a group on this communicator")
        timeout = _timeout(timeout)
        g = self._group = _Group()
        try:
            yield g.work
        finally:
            self._group = None
        if g.ops:
            if _cuda.held(g.keep):
                _no_device_timeout(timeout)
                g.work._submitted(_cuda.submit(self, g.ops, True, tuple(g.keep)))
                if not async_op:
                    g.work.wait()
            elif async_op:
                g.work._submitted(self._c.submit(g.ops, True, tuple(g.keep), timeout))
            else:
                try:
                    self._c.run(g.ops, True, tuple(g.keep), timeout)
                except BaseException as e:
                    g.work._submitted(_Finished(e))
                    raise
                g.work._submitted(_Finished(None))

    # -- membership -----------------------------------------------------------------------

    def abort(self, reason: str = "aborted from Python") -> None:
        """Aborts now: local, immediate, idempotent, never waits on a peer. Every operation
        in flight or queued on this communicator (and on those split or shrunk from it)
        fails with ``Aborted``; the others see this member depart."""
        self._c.abort(reason)

    def revoke(self) -> None:
        """Makes the communicator unusable on every member (their operations fail with
        ``Revoked``); shrink to continue."""
        self._c.revoke()

    def shrink(self) -> "Comm":
        """The survivors' communicator: agreed membership, ranks compacted in their old
        order, the next epoch. Every survivor calls it."""
        return Comm._wrap(self._c.shrink())

    def grow(self, joiners: int) -> "Comm":
        """Admits ``joiners`` new processes (calling ``Comm.join(grow_token())``) at the
        next epoch. Every member calls it."""
        _int("joiners", joiners)
        if joiners < 1:
            raise ValueError(f"joiners: expected at least 1, got {joiners}")
        return Comm._wrap(self._c.grow(joiners))

    def grow_token(self) -> str:
        """The token newcomers pass to ``Comm.join``."""
        return self._c.grow_token()

    def split(self, color: Optional[int], key: int = 0) -> Optional["Comm"]:
        """Members with the same ``color`` form a new communicator, ranked by ``key`` (ties
        by old rank); ``color=None`` opts out (returns None). Every member calls it."""
        if color is not None:
            _int("color", color)
            if color < 0:
                raise ValueError(f"color: expected a non-negative int or None, got {color}")
        _int("key", key)
        if key < 0:
            raise ValueError(f"key: expected a non-negative int, got {key}")
        inner = self._c.split(color, key)
        return None if inner is None else Comm._wrap(inner)

    def destroy(self) -> None:
        """Leaves gracefully, bounded by the teardown budget (idempotent)."""
        _cuda.close(self)
        self._c.destroy()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<chorus.Comm rank {self.rank} of {self.size}, epoch {self.epoch}>"

    # -- helpers --------------------------------------------------------------------------

    def _pair(self, a: Any, out: Any) -> Tuple[Buf, Buf]:
        if out is None:
            buf = describe(a, "a", writable=True)
            return buf, buf
        return describe(a, "a", writable=False), describe(out, "out", writable=True)

    def _blocks(self, buf: Buf, name: str) -> int:
        if buf.numel % self.size:
            raise ValueError(
                f"{name}: expected a multiple of the world size ({self.size}) elements, got {buf.numel}"
            )
        return buf.numel // self.size

    def _rank(self, name: str, value: int) -> int:
        _int(name, value)
        if not 0 <= value < self.size:
            raise ValueError(f"{name}: expected a rank in 0..{self.size - 1}, got {value}")
        return value

    def _go(self, spec: tuple, keep: Any, async_op: bool, timeout: Optional[float]) -> Optional[Work]:
        g = self._group
        if g is not None:
            if timeout is not None:
                raise ValueError("timeout: inside a group, pass it to comm.group() instead")
            g.ops.append(spec)
            g.keep.append(keep)
            return g.work
        timeout = _timeout(timeout)
        if _cuda.held(keep):
            _no_device_timeout(timeout)
            work = _cuda.submit(self, [spec], False, keep)
            if async_op:
                return Work(work)
            work.wait()
            return None
        if async_op:
            return Work(self._c.submit([spec], False, keep, timeout))
        self._c.run([spec], False, keep, timeout)
        return None


def _no_device_timeout(timeout: Optional[float]) -> None:
    # Device collectives run under the communicator's op timeout only, for now.
    if timeout is not None:
        raise ValueError("timeout: a per-call timeout is not supported on CUDA memory yet; "
                         "the communicator's op timeout (CHORUS_OP_TIMEOUT) applies")


def _same(ref: Buf, other: Buf, name: str, numel: int) -> None:
    if other.dtype != ref.dtype:
        raise TypeError(f"{name}: expected dtype {ref.dtype_name} like the input, got {other.dtype_name}")
    if other.numel != numel:
        raise ValueError(f"{name}: expected {numel} elements, got {other.numel}")


def _timeout(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout: expected a number of seconds or None, got {type(timeout).__name__}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout: expected a positive, finite number of seconds, got {timeout}")
    return float(timeout)


class _Finished:
    """The inner work of a blocking group, which has finished (or failed with ``error``)
    by the time anyone sees it."""

    __slots__ = ("error",)

    def __init__(self, error: Optional[BaseException]) -> None:
        self.error = error

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return self.error if isinstance(self.error, Exception) else None

    def add_done_callback(self, callback: Any) -> None:
        callback()


def _int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
