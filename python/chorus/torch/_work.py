"""``Work``: torch's handle of an operation, over the chorus ``Work`` of its submission.

torch needs three ways to learn an operation's end, and all three lead to the same
``_Call.finish``, which runs once: ``Work.wait()`` (the caller's thread waits on chorus
directly, so a blocking collective costs no thread hand-off), ``is_completed()`` (a
look), and ``get_future()`` (DDP's reducer and comm hooks): a torch ``Future`` that the
process group's completion thread fulfils, in submission order, which is the order
chorus finishes them in.
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch.futures import Future

import chorus


def _error(kind: type, message: str) -> BaseException:
    """A chorus exception of class ``kind`` made here (not from a Rust error)."""
    try:
        return kind(message)
    except Exception:  # a class that insists on its Rust fields
        return chorus.Error(message)


class _Call:
    """One submission and what follows it: copying results out, the future, the error."""

    __slots__ = ("pg", "name", "work", "outputs", "post", "deadline", "lock", "ended", "exc", "future")

    def __init__(
        self,
        pg: "object",
        name: str,
        work: Optional[object],
        outputs: List[torch.Tensor],
        post: Optional[Callable[[], None]] = None,
        deadline: Optional[float] = None,
    ) -> None:
        self.pg = pg
        self.name = name
        self.work = work  # the chorus Work; None for a call with nothing to communicate
        self.outputs = outputs
        self.post = post
        self.deadline = deadline  # monotonic seconds: the process group's timeout
        # A bool, not a threading.Event (a Condition built in Python, ~9 us a call): nobody
        # blocks on it, the waits are chorus's.
        self.lock = threading.Lock()
        self.ended = False
        self.exc: Optional[BaseException] = None
        self.future: Optional[Future] = None

    def finish(self, timeout: Optional[float]) -> bool:
        """Waits at most ``timeout`` seconds (None: until it ends, bounded by the deadline);
        True once the call has ended, successfully or not."""
        if self.ended:
            return True
        if self.work is not None:
            limit = timeout
            if self.deadline is not None:
                left = max(self.deadline - time.monotonic(), 0.0)
                limit = left if limit is None else min(limit, left)
            try:
                ended = self.work.wait(limit) if limit is not None else self.work.wait()
            except BaseException as e:  # the operation failed (or Ctrl-C aborted it)
                self._end(e)
                return True
            if not ended:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self._expire()
                    return True
                return False
        self._end(None)
        return True

    def _expire(self) -> None:
        # The process group's timeout passed (set_timeout may have shortened it below the
        # communicator's own op timeout): abort, as NCCL's watchdog does, so no rank waits
        # on an operation that will not finish in time.
        e = _error(
            getattr(chorus, "Timeout", chorus.Error),
            f"[chorus:timeout] {self.name} did not finish within the process group's timeout "
            f"({self.pg.timeout_seconds():g} s); the communicator was aborted",
        )
        self.pg._fail(e)
        self.pg._abort_comm(f"timeout: {self.name} exceeded the process group timeout")
        self._end(e)

    def _end(self, exc: Optional[BaseException]) -> None:
        with self.lock:
            if self.ended:
                return
            if exc is None and self.post is not None:
                try:
                    self.post()
                except BaseException as e:  # copying out failed: report it, never hang
                    exc = e
            self.exc = exc
            self.ended = True
            fut = self.future
        if exc is not None:
            self.pg._fail(exc)
        if fut is not None:
            _fulfil(fut, self)

    def get_future(self) -> Future:
        with self.lock:
            if self.future is None:
                self.future = Future()
                pending = not self.ended
            else:
                return self.future
        if pending:
            self.pg._completer().watch(self)
        else:
            _fulfil(self.future, self)
        return self.future


def _fulfil(fut: Future, call: _Call) -> None:
    if fut.done():
        return
    try:
        if call.exc is not None:
            fut.set_exception(call.exc)
        else:
            fut.set_result(call.outputs)
    except RuntimeError:
        pass  # fulfilled meanwhile by the other path


class Work(dist.Work):
    """torch's ``Work`` for one or more chorus calls (a coalesced batch has several)."""

    def __init__(self, calls: List[_Call], outputs: Optional[List[torch.Tensor]] = None) -> None:
        super().__init__()
        self._calls = calls
        self._outputs = outputs if outputs is not None else [t for c in calls for t in c.outputs]
        self._future: Optional[Future] = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Blocks until the operation ends and raises its chorus exception if it failed.
        ``timeout`` (torch's convention: zero means none) bounds this wait only: past it,
        ``chorus.Timeout`` is raised and the operation goes on."""
        calls = self._calls
        if len(calls) == 1 and calls[0].ended:  # a blocking call returns it ended
            if calls[0].exc is not None:
                raise calls[0].exc
            return True
        seconds = _seconds(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        for call in self._calls:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not call.finish(left):
                raise _error(
                    getattr(chorus, "Timeout", chorus.Error),
                    f"[chorus:timeout] wait: {call.name} did not finish within {seconds:g} s "
                    "(it is still running; abort() ends it)",
                )
        for call in self._calls:
            if call.exc is not None:
                raise call.exc
        return True

    def is_completed(self) -> bool:
        return all(c.finish(0.0) for c in self._calls)

    def is_success(self) -> bool:
        return self.is_completed() and all(c.exc is None for c in self._calls)

    def exception(self) -> Optional[BaseException]:
        for c in self._calls:
            if c.finish(0.0) and c.exc is not None:
                return c.exc
        return None

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._outputs

    def get_future(self) -> Future:
        if self._future is None:
            if len(self._calls) == 1 and self._calls[0].outputs is self._outputs:
                self._future = self._calls[0].get_future()
            else:
                futs = [c.get_future() for c in self._calls]
                outputs = self._outputs
                self._future = torch.futures.collect_all(futs).then(
                    lambda f: ([x.value() for x in f.value()], outputs)[1]
                )
        return self._future

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        names = ",".join(c.name for c in self._calls)
        return f"chorus.torch.Work({names}, completed={self.is_completed()})"


class Ended(dist.Work):
    """The ``Work`` of a blocking call (``asyncOp=False``) that succeeded and has nothing
    left to copy out: already over, so it carries only the call's outputs (no ``_Call``,
    no deadline, no error), which keeps a blocking call's Python short. One per call: a
    caller of ``ProcessGroup.allreduce`` that keeps two of them gets each call's own
    tensors from ``result()``. Made by :func:`ended`."""

    _outputs: List[torch.Tensor]

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._outputs)
        return fut

    def synchronize(self) -> None:
        pass

    def block_current_stream(self) -> None:
        pass

    def __repr__(self) -> str:
        return "chorus.torch.Work(ended, completed=True)"


def ended(outputs: List[torch.Tensor]) -> Ended:
    """An :class:`Ended` for ``outputs``. ``Ended`` has no ``__init__`` of its own (torch's
    is called directly, about half the cost of one that calls ``super().__init__()``)."""
    e = Ended()
    e._outputs = outputs
    return e


def _seconds(timeout: object) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return None if s <= 0 else s


class Completer:
    """The thread that fulfils futures, in submission order. It waits on at most one call
    at a time, each wait bounded by the call's deadline (and failure detection), and stops
    when its process group shuts down."""

    def __init__(self, name: str) -> None:
        self._q: "queue.Queue[Optional[_Call]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, call: _Call) -> None:
        self._q.put(call)

    def stop(self, timeout: float) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            call = self._q.get()
            if call is None:
                return
            while not call.finish(1.0):
                pass
