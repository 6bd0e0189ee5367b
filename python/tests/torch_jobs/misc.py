"""Two ranks, started as plain processes: a chorus subgroup of a gloo world, the init
methods, the watchdog's abort, timeouts, bad input, grow and shrink_group. Usage: misc.py RANK TCP_PORT FILE. Every check raises on failure; rank 0
writes what it measured to $OUT/misc.json.
"""

import atexit
import gc
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import chorus
import chorus.torch

N = 2
OUT = os.environ["OUT"]
found = {}
TOKEN = os.path.join(OUT, "grow-token")


def _frozen_at_exit() -> None:
    # Registered before chorus.torch registers its exit freeze, so it runs after it
    # (atexit runs last-in first-out): what it sees is what finalization will see.
    with open(os.path.join(OUT, f"exit-freeze-{sys.argv[1]}"), "w") as f:
        f.write(str(gc.get_freeze_count()))


atexit.register(_frozen_at_exit)

if sys.argv[1] == "join":
    # The newcomer: waits (bounded) for the members' grow token, joins, then takes part.
    deadline = time.monotonic() + 120
    while not os.path.exists(TOKEN):
        assert time.monotonic() < deadline, "no grow token within 120 s"
        time.sleep(0.05)
    group = chorus.torch.join(open(TOKEN).read(), timeout=timedelta(seconds=60))
    assert (dist.get_rank(), dist.get_world_size()) == (2, 3), (dist.get_rank(), dist.get_world_size())
    t = torch.full((2,), 10.0)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), 13.0)), t
    dist.destroy_process_group()  # departs: the members then shrink it away
    with open(TOKEN + ".left", "w") as f:
        f.write("left")
    sys.exit(0)

rank, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def expect(exc_class, fn, *words):
    try:
        fn()
    except exc_class as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return e
    raise AssertionError(f"no {exc_class.__name__}")


def ones_reduced(group=None):
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((3,), 3.0)), t


# --- a chorus group under a gloo default group: torch's creator path, met in the store ---
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port + 2}", rank=rank, world_size=N,
                        timeout=timedelta(seconds=30))
sub = dist.new_group(backend="chorus", timeout=timedelta(seconds=30))
assert isinstance(sub, chorus.torch.ProcessGroupChorus) and sub.created_by == "rendezvous", sub
ones_reduced(sub)
dist.destroy_process_group()

# --- every init method torch has, one after another in the same processes -------------
for method in (f"tcp://127.0.0.1:{port}", f"file://{path}", "env://"):
    if method == "env://":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + 1), RANK=str(rank), WORLD_SIZE=str(N))
        dist.init_process_group("chorus", init_method=method, timeout=timedelta(seconds=30))
    else:
        dist.init_process_group("chorus", init_method=method, rank=rank, world_size=N, timeout=timedelta(seconds=30))
    assert isinstance(dist.group.WORLD, chorus.torch.ProcessGroupChorus)
    ones_reduced()
    if method != "env://":
        dist.destroy_process_group()
found["init_methods"] = 3
world = dist.group.WORLD

# --- a blocking collective runs on the caller's thread; an async one is queued ----------
counts = world.comm._c._calls  # (run inline, queued)
inline, queued = counts()
ones_reduced()
b = torch.full((2,), float(rank))
dist.broadcast(b, src=1)
assert torch.equal(b, torch.ones(2)), b
dist.barrier()
assert counts() == (inline + 3, queued), (counts(), inline, queued)
w = dist.all_reduce(torch.ones(2), async_op=True)
assert w.wait() and counts() == (inline + 3, queued + 1), counts()
found["blocking_inline"] = 3

# --- the torchft watchdog: abort() from another thread releases a blocked wait ---------
g = dist.new_group(timeout=timedelta(seconds=30))
if rank == 0:
    w = dist.all_reduce(torch.ones(4), group=g, async_op=True)  # rank 1 never joins it
    aborted_at = []

    def watchdog():
        time.sleep(0.5)
        aborted_at.append(time.monotonic())
        g.abort()
        aborted_at.append(time.monotonic())

    threading.Thread(target=watchdog).start()
    e = expect(chorus.Aborted, w.wait)
    released = time.monotonic()
    found["abort_call_s"] = aborted_at[1] - aborted_at[0]
    found["abort_release_s"] = released - aborted_at[0]
    assert found["abort_release_s"] < 0.05, found
    assert isinstance(g.errored(), chorus.Aborted), g.errored()
    assert w.is_completed() and not w.is_success() and isinstance(w.exception(), chorus.Aborted)
    # Pending works fail too, and the group refuses new ones.
    expect(chorus.Error, lambda: dist.all_reduce(torch.ones(1), group=g))
else:
    time.sleep(1.0)
    g.abort()
dist.barrier(group=world)

# --- sizes that differ across ranks: only the peer sees it; both fail, naming it -------
g = dist.new_group(timeout=timedelta(seconds=10))
t0 = time.monotonic()
e = expect(chorus.Error, lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 8), group=g))
found[f"mismatch_s"] = time.monotonic() - t0
found["mismatch_error"] = str(e)
assert "all-reduce" in str(e) or "all_reduce" in str(e) or "AllReduce" in str(e), e
g.abort()
dist.barrier(group=world)

# --- a peer that never calls: the op timeout (the group's timeout) ends it, naming it ---
g = dist.new_group(timeout=timedelta(seconds=2))
if rank == 0:
    t0 = time.monotonic()
    e = expect(chorus.Timeout, lambda: dist.gather(torch.ones(2), [torch.zeros(2), torch.zeros(2)], dst=0, group=g))
    found["op_timeout_s"] = time.monotonic() - t0
    found["op_timeout_error"] = str(e)
    assert 1.5 < found["op_timeout_s"] < 6, found
    assert "gather" in str(e), e
dist.barrier(group=world)
g.abort()

# --- set_timeout shortens the deadline of later operations ----------------------------
g = dist.new_group(timeout=timedelta(seconds=30))
g.set_timeout(timedelta(seconds=0.5))
if rank == 0:
    t0 = time.monotonic()
    e = expect(chorus.Timeout, lambda: dist.all_reduce(torch.ones(2), group=g), "all_reduce")
    found["set_timeout_s"] = time.monotonic() - t0
    assert 0.45 < found["set_timeout_s"] < 1.4, found
    assert isinstance(g.errored(), chorus.Timeout), g.errored()
dist.barrier(group=world)
g.abort()

# --- wait(timeout) bounds the wait, not the operation --------------------------------
g = dist.new_group(timeout=timedelta(seconds=30))
if rank == 0:
    w = dist.all_reduce(torch.ones(2), group=g, async_op=True)
    t0 = time.monotonic()
    expect(chorus.Timeout, lambda: w.wait(timeout=timedelta(milliseconds=200)), "still running")
    found["wait_timeout_s"] = time.monotonic() - t0
    assert not w.is_completed()
    g.abort()
    expect(chorus.Aborted, w.wait)
dist.barrier(group=world)
g.abort()

# --- tensors chorus cannot take: refused at the call, the group stays usable -----------
expect(ValueError, lambda: dist.all_reduce(torch.ones(2, device="meta")), "takes CPU and CUDA tensors")
expect(ValueError, lambda: dist.broadcast(torch.ones(3, 2)[:, 0], src=0), "contiguous")
expect(ValueError, lambda: dist.group.WORLD.send([torch.ones(1)], rank, 0), "another rank")
ones_reduced()

# --- grow: a third process joins at an epoch boundary; the members keep their ranks -----
if rank == 0:
    with open(TOKEN + ".tmp", "w") as f:
        f.write(chorus.torch.grow_token())
    os.rename(TOKEN + ".tmp", TOKEN)
grown = chorus.torch.grow(joiners=1)
assert grown is dist.group.WORLD and (dist.get_rank(), dist.get_world_size()) == (rank, 3)
t = torch.full((2,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((2,), 13.0)), t
found["grow"] = 3

# --- torch's own shrink hook: dist.shrink_group drops the newcomer once it has left ------
deadline = time.monotonic() + 60
while not os.path.exists(TOKEN + ".left"):
    assert time.monotonic() < deadline, "the newcomer did not leave within 60 s"
    time.sleep(0.02)
expect(RuntimeError, lambda: dist.shrink_group([rank]), "should not call")  # torch's own check
shrunk = dist.shrink_group([2])
assert shrunk is dist.group.WORLD and (dist.get_rank(), dist.get_world_size()) == (rank, 2)
inner = shrunk._get_backend(torch.device("cpu"))
assert isinstance(inner, chorus.torch.BackendChorus) and inner.created_by == "shrink", inner
ones_reduced()
assert shrunk.rank() == rank and inner.errored() is None
found["shrink_group"] = 2

dist.destroy_process_group()
if rank == 0:
    with open(os.path.join(OUT, "misc.json"), "w") as f:
        json.dump(found, f, indent=1)
print(f"rank {rank}: misc done {found}", file=sys.stderr)
