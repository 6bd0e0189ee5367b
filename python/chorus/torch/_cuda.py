"""The chorus backend's CUDA tensors: which it takes, and the error for those it cannot.

A CUDA tensor goes to ``chorus.Comm`` as it is: the communicator's device half runs the
collective on the tensor's memory, ordered after the work on its current stream, and
records the completion there (see ``chorus._cuda``). Registered for ``"cuda"`` beside
``"cpu"``, so ``backend="chorus"`` serves both; a process without a usable device gets
``chorus.DeviceError`` naming what is missing at the call, before anything is submitted.
"""

from __future__ import annotations

import torch

from .. import _cuda
from .._errors import from_text

#: The devices the backend registers for.
DEVICES = ["cpu", "cuda"]


def check(t: torch.Tensor, what: str) -> None:
    """Raises unless ``t`` (not on the CPU) is a CUDA tensor on a device this process can
    use: ValueError for other devices, ``chorus.DeviceError`` for an unusable CUDA one."""
    if t.device.type != "cuda":
        raise ValueError(
            f"{what}: the chorus backend takes CPU and CUDA tensors, got a tensor on {t.device}"
        )
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    why = _cuda.unavailable(index)
    if why is not None:
        raise from_text(f"{why} ({what} is on {t.device})")
