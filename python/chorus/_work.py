"""``Work``: the handle of an operation submitted with ``async_op=True``.

Operations run in the order they were submitted, one after another on the communicator's
submission thread (as NCCL's run on a stream), whatever order their works are waited on.
A ``wait()`` (with no timeout, or one at least the operation timeout) on the one unfinished
operation, before the submission thread has started it, runs it on the waiting thread
instead, which spares a blocking call made as submit-then-wait two thread wake-ups; the
order is the same either way. A ``Work`` dropped before its operation finished does not cancel it and costs the
communicator nothing: the operation runs to its end, the submission thread keeps the
buffers alive until then (so dropping the arrays as well is safe), later operations queue
behind it as usual, and a failure still shows in ``Comm.async_error()`` (and fails the
operations after it, as any failure does).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional


class Work:
    __slots__ = ("_w", "_pending")

    def __init__(self, inner: Any = None) -> None:
        self._w = inner
        # callbacks added to a group's work before the group was submitted
        self._pending: List[Callable[["Work"], Any]] = []

    def _submitted(self, inner: Any) -> None:
        self._w = inner
        pending, self._pending = self._pending, []
        for fn in pending:
            self.add_done_callback(fn)

    def _inner(self) -> Any:
        if self._w is None:
            raise ValueError("work: its group has not been submitted yet (leave the with block)")
        return self._w

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits until the operation has finished, at most ``timeout`` seconds (None: as
        long as it takes, which the operation timeout and failure detection bound). True
        when finished, False when the timeout passed first; raises the operation's
        ``chorus.Error`` if it failed. The GIL is released while waiting; Ctrl-C aborts
        the communicator and raises ``KeyboardInterrupt``."""
        return self._inner().wait(timeout)

    def is_completed(self) -> bool:
        """True once the operation has finished, successfully or not."""
        return self._inner().is_completed()

    def exception(self) -> Optional[BaseException]:
        """The operation's error once it has failed, else None."""
        return self._inner().exception()

    def add_done_callback(self, fn: Callable[["Work"], Any]) -> None:
        """Calls ``fn(work)`` once the operation has finished, successfully or not (as
        ``concurrent.futures.Future.add_done_callback`` does): at once on this thread if it
        already has, else on the communicator's submission thread, holding the GIL. Keep
        it short: the next queued operation starts after it returns. It must not wait for
        this communicator (a blocking collective or ``wait`` there raises
        ``RuntimeError``); submitting with ``async_op=True`` is fine. An exception it
        raises goes to ``sys.unraisablehook``."""
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        if self._w is None:
            self._pending.append(fn)
            return
        self._w.add_done_callback(lambda: fn(self))

    def __await__(self):
        return self._await().__await__()

    async def _await(self) -> None:
        inner = self._inner()
        if not inner.is_completed():
            # Woken by the done callback: no thread waits on the event loop's behalf.
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            inner.add_done_callback(lambda: _wake(loop, done))
            await done
        inner.wait()

    def __repr__(self) -> str:
        if self._w is None:
            return "<chorus.Work (group not yet submitted)>"
        state = "completed" if self._w.is_completed() else "running"
        return f"<chorus.Work {state}>"


def _wake(loop: asyncio.AbstractEventLoop, done: "asyncio.Future[None]") -> None:
    def resolve() -> None:
        if not done.done():
            done.set_result(None)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:
        pass  # the loop was closed: nobody awaits any more
