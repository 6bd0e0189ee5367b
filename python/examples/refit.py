"""Seed 001's refit: 2 trainers broadcast their weights to 3 generation shards; a shard
dies mid-broadcast; the survivors get PeerFailed naming it, shrink, and refit again.

    chorus run -n 5 -- python refit.py      (exits 1: rank 2 died, as intended)
"""

import hashlib
import os
import signal
import threading
import time

import numpy as np

import chorus

TRAINERS = 2
NAMES = [f"layers.{i}.weight" for i in range(4)]

comm = chorus.Comm.from_env()
rng = np.random.default_rng(0)
weights = {n: rng.standard_normal(1 << 20).astype(np.float32) for n in NAMES}  # 16 MiB
digest = hashlib.sha256(b"".join(w.tobytes() for w in weights.values())).hexdigest()
if comm.rank != 0:
    for w in weights.values():
        w[:] = 0                               # the shards hold stale weights


def refit(c):
    for n in NAMES:
        c.broadcast(weights[n], root=0)        # rank 0 (a trainer) is the root


refit(comm)
if comm.rank == TRAINERS:                      # shard 0 dies during the next refit
    threading.Thread(target=lambda: (time.sleep(0.005), os.kill(os.getpid(), signal.SIGKILL))).start()
try:
    for _ in range(100):
        refit(comm)
except chorus.PeerFailed as e:
    print(f"rank {comm.rank}: {e}", flush=True)
    assert e.peer == TRAINERS
    comm = comm.shrink()                       # survivors, compacted: trainers stay 0 and 1
    if comm.rank != 0:
        for w in weights.values():
            w[:] = 0
    refit(comm)
    got = hashlib.sha256(b"".join(w.tobytes() for w in weights.values())).hexdigest()
    print(f"rank {comm.rank} of {comm.size} after shrink: identical={got == digest}", flush=True)
    assert got == digest
    comm.destroy()
