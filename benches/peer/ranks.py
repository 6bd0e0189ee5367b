"""Starting and waiting on the rank processes of the peer-bench scripts (gloo_allreduce.py,
chorus_py_allreduce.py, ddp_step.py, torch_layers.py): every wait is bounded, and a failed
or overdue rank ends the rest."""

import datetime
import os
import subprocess
import sys
import time


def supervise(ranks, timeout, label):
    """Waits for every process in `ranks` (rank order) for at most `timeout` seconds.

    Returns 0 when all exited 0. Otherwise kills what is still running, reaps everything,
    prints one line naming the first failure under `label`, and returns 1."""
    deadline = time.monotonic() + timeout
    failed = None
    while failed is None and any(p.poll() is None for p in ranks):
        for r, p in enumerate(ranks):
            if p.poll() not in (None, 0):
                failed = f"rank {r} exited with status {p.returncode}"
        if failed is None and time.monotonic() > deadline:
            failed = f"sweep still running after {timeout:.0f} s"
        time.sleep(0.02)
    if failed is None:
        failed = next((f"rank {r} exited with status {p.returncode}"
                       for r, p in enumerate(ranks) if p.returncode != 0), None)
    if failed is None:
        return 0
    for p in ranks:
        if p.poll() is None:
            p.kill()
    for p in ranks:
        p.wait()
    print(f"{label}: {failed}", file=sys.stderr)
    return 1


def run_script(argv, options, launcher, rank_main):
    """A peer-bench script's entry: parsed with no ``--rank`` it is the launcher
    (``launcher(o)``), with one it is that rank (``rank_main(o)``). Returns the exit status."""
    o = options(argv)
    if o.rank is None:
        return launcher(o)
    return rank_main(o)


def launch_on_store(script, world, timeout, env, label, args, quiet=True):
    """Runs ``world`` processes of ``script`` with ``args`` plus ``--rank R --store-port P``
    around a torch ``TCPStore`` this process holds, and supervises them (see
    :func:`supervise`). The store listens on an ephemeral loopback port, so the port is
    known before any rank starts and no fixed port is assumed free. ``quiet``: only rank
    0's stdout is kept. Returns the exit status."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    ranks = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(script), *args,
             "--rank", str(r), "--store-port", str(store.port)],
            env=env, stdout=None if r == 0 or not quiet else subprocess.DEVNULL)
        for r in range(world)
    ]
    return supervise(ranks, timeout, label)
