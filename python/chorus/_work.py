"""``Work``: the handle of an operation submitted with ``async_op=True``.

Operations run in the order they were submitted, one after another on the communicator's
submission thread (as NCCL's run on a stream), whatever order their works are waited on.
A ``Work`` dropped before its operation finished does not cancel it: the operation runs to
its end, the submission thread keeps the buffers alive until then, later operations queue
behind it as usual, and a failure still shows in ``Comm.async_error()``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional


class Work:
    __slots__ = ("_w",)

    def __init__(self, inner: Any = None) -> None:
        self._w = inner

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

    def __await__(self):
        return self._await().__await__()

    async def _await(self) -> None:
        inner = self._inner()
        if not inner.is_completed():
            # The wait releases the GIL; an executor thread carries it so the event loop
            # keeps running.
            await asyncio.get_running_loop().run_in_executor(None, inner.wait)
        inner.wait()

    def __repr__(self) -> str:
        if self._w is None:
            return "<chorus.Work (group not yet submitted)>"
        state = "completed" if self._w.is_completed() else "running"
        return f"<chorus.Work {state}>"
