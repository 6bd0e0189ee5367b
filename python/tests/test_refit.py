"""Seed 001, written as its users would: 2 trainer ranks and 3 generation shards run a
refit loop in which rank 0 broadcasts a dict of tensors (64 MiB in all). Shard 0 (rank 2)
dies mid-broadcast (SIGKILL) or freezes (SIGSTOP): every survivor raises ``PeerFailed``
naming it, promptly; ``shrink()`` gives a world of 4 with the trainers still ranks 0 and 1;
the next refit delivers bytes identical to rank 0's. A frozen shard that is resumed gets
``Evicted``."""

import os
import select
import signal
import threading
import time

import pytest

import harness

DEADLINE_S = 1.5

REFIT = r'''
import hashlib
comm = connect(heartbeat_interval="100ms", heartbeat_deadline=ARGS["deadline"])
try:
    import torch
except ImportError:
    torch = None

MIB = 1 << 20
NAMES = [f"layers.{i}.weight" for i in range(8)]        # 8 x 8 MiB = 64 MiB

def fresh(seed):
    rng = np.random.default_rng(seed)
    return {n: np.frombuffer(rng.bytes(8 * MIB), dtype=np.float32).copy() for n in NAMES}

def digest(params):
    h = hashlib.sha256()
    for n in NAMES:
        h.update(memoryview(params[n]).cast("B"))
    return h.hexdigest()

weights = fresh(1)                          # what rank 0 (the trainer) holds
expected = digest(weights)
if RANK != 0:
    for a in weights.values():
        a[:] = 0
params = {n: torch.from_numpy(a) for n, a in weights.items()} if torch else weights

def refit(c):
    for n in NAMES:
        c.broadcast(params[n], root=0)

n = 0
try:
    while n < 1000:
        if RANK == 2 and n == 1:
            mark("refit1")
        refit(comm)
        n += 1
    result(error=None)
except chorus.Evicted as e:
    result(error="Evicted", text=str(e))
    sys.exit(0)
except chorus.PeerFailed as e:
    caught = time.time()
    failed = dict(error="PeerFailed", peer=e.peer, caught=caught, text=str(e))
if RANK == 2:
    # a frozen shard that was resumed: it is no longer a member
    try:
        comm.barrier()
        result(error=None, late=True)
    except chorus.Error as e:
        result(error=type(e).__name__, text=str(e), late=True)
    sys.exit(0)
new = comm.shrink()
if RANK != 0:
    for a in weights.values():
        a[:] = 0
refit(new)
got = digest(weights)
new.barrier()
if new.rank == 0:
    mark("shrunk")
result(refits=n, new_rank=new.rank, new_size=new.size, epoch=new.epoch,
       identical=(got == expected), **failed)
new.destroy()
'''


def check_survivors(results, deadline_s, since, bound_s, exited=None):
    for rank in (0, 1, 3, 4):
        r = results[rank]
        assert r is not None, f"rank {rank} printed no result"
        assert r["error"] == "PeerFailed", (rank, r)
        assert r["peer"] == 2, (rank, r)
        # The clock starts when the death became visible: a SIGKILLed process's sockets
        # and pidfd only signal once the kernel has ended it (see `_exit_note`).
        start = max(since, exited[0]) if exited else since
        late = r["caught"] - start
        assert late < bound_s, f"rank {rank} raised {late * 1000:.0f} ms after the fault{_exit_note(exited, since, r)}: {r}"
        assert r["new_size"] == 4 and r["epoch"] == 1, (rank, r)
        assert r["new_rank"] == {0: 0, 1: 1, 3: 2, 4: 3}[rank], (rank, r)
        assert r["identical"], f"rank {rank}: the refit after shrink differs from rank 0's bytes"


def _exit_note(exited, since, r):
    """Where the time went, for a failure message: a SIGKILLed process's sockets close
    only once the kernel has torn down every one of its threads and its address space,
    which on a loaded machine can itself take longer than the bound; no survivor can see
    the death before that."""
    if not exited:
        return ""
    return (f" (the kernel took {(exited[0] - since) * 1000:.0f} ms to end the killed shard; "
            f"this survivor raised {(r['caught'] - exited[0]) * 1000:+.0f} ms from that exit)")


def _watch_exit(pid):
    """Records when `pid` has exited (its pidfd becomes readable)."""
    exited = []
    fd = os.pidfd_open(pid)

    def wait():
        select.select([fd], [], [], 60)
        exited.append(time.time())
        os.close(fd)

    threading.Thread(target=wait, daemon=True).start()
    return exited


@pytest.mark.timeout(300)
def test_refit_survives_a_killed_shard():
    ranks = harness.start(REFIT, 5, timeout=280, args={"deadline": f"{DEADLINE_S}s"},
                          config={"init_timeout": "120s"})
    ranks.wait_mark(2, "refit1")
    time.sleep(0.02)  # mid-broadcast
    exited = _watch_exit(ranks.procs[2].pid)
    killed = time.time()
    os.kill(ranks.procs[2].pid, signal.SIGKILL)
    results = ranks.finish(expect_rc={2: -signal.SIGKILL})
    check_survivors(results, DEADLINE_S, killed, 0.1, exited)


@pytest.mark.timeout(300)
def test_refit_survives_a_frozen_shard_which_is_then_evicted():
    ranks = harness.start(REFIT, 5, timeout=280, args={"deadline": f"{DEADLINE_S}s"},
                          config={"init_timeout": "120s"})
    ranks.wait_mark(2, "refit1")
    time.sleep(0.02)
    stopped = time.time()
    os.kill(ranks.procs[2].pid, signal.SIGSTOP)
    try:
        ranks.wait_mark(0, "shrunk")
    finally:
        os.kill(ranks.procs[2].pid, signal.SIGCONT)
    results = ranks.finish()
    check_survivors(results, DEADLINE_S, stopped, DEADLINE_S * 1.2)
    assert results[2] is not None and results[2]["error"] == "Evicted", results[2]
