"""A prompt end for a process that used ``chorus.torch``.

After ``destroy_process_group`` a torch process spends seconds exiting, none of them in
chorus: the interpreter's finalization runs the cyclic garbage collector over every object
torch's modules created (hundreds of thousands), several times, as it tears the modules
down. Measured on a 2-core machine: 1.4-2.2 s alone, 4.3 s with two such processes, ~9 s
for two ranks under ``chorus run`` on a loaded machine; ``strace`` shows no system call in
that time (pure CPU, no wait), and ``perf`` puts ``gc_collect_main`` on top.

``gc.freeze()`` as the process exits moves the objects alive then out of the collector's
reach, so finalization frees them by reference count only (0.6-0.9 s). Python makes no
promise to finalize objects still alive at exit, and every ``atexit`` handler still runs;
``CHORUS_TORCH_EXIT_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import atexit
import gc
import os
import threading

_ENV = "CHORUS_TORCH_EXIT_FREEZE"
_lock = threading.Lock()
_registered = False


def freeze_at_exit() -> None:
    """Arranges (once per process) for ``gc.freeze()`` to run when the interpreter exits.
    Called when this process creates its first chorus group: a process that imports
    ``chorus.torch`` without using it is left as it was."""
    global _registered
    if os.environ.get(_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    with _lock:
        if _registered:
            return
        _registered = True
    atexit.register(gc.freeze)
