"""Membership and health from Python: health() as plain objects, split, revoke, grow with a
newcomer that joins by token, and the properties."""

import json
import os
import subprocess
import sys

import harness

HEALTH_SPLIT_REVOKE = r'''
comm = connect()
h = comm.health()
members = comm.members
# split: even ranks and odd ranks, ordered by descending old rank
sub = comm.split(RANK % 2, key=WORLD - RANK)
a = np.array([RANK], np.int64)
sub.all_reduce(a)
out = comm.split(None)
# revoke: rank 0 revokes; everyone's next collective fails with Revoked
try:
    comm.barrier()      # inside: a rank still finishing it may already see the revoke
    if RANK == 0:
        comm.revoke()
    for _ in range(100):
        comm.all_reduce(np.zeros(4, np.float32))
        time.sleep(0.01)
    revoked = None
except chorus.Error as e:
    revoked = type(e).__name__
time.sleep(1.0)  # stay a member while the revoke reaches everyone (a departure is not a revoke)
result(world=h.world, epoch=h.epoch, rank=h.rank,
       states=[p.state for p in h.peers], heard=[p.last_heard_s is None or p.last_heard_s >= 0 for p in h.peers],
       members=[m.rank for m in members], pids_ok=members[RANK].pid == os.getpid(),
       sub_rank=sub.rank, sub_size=sub.size, sub_sum=int(a[0]), out=out is None,
       revoked=revoked, async_error=type(comm.async_error()).__name__)
sub.destroy()
comm.destroy()
'''


def test_health_split_revoke():
    results = harness.run(HEALTH_SPLIT_REVOKE, 4, timeout=90)
    for rank, r in enumerate(results):
        assert r["world"] == 4 and r["epoch"] == 0 and r["rank"] == rank
        assert len(r["states"]) == 4 and r["states"][rank] == "alive"
        assert all(s in ("joining", "alive", "suspect") for s in r["states"]), r
        assert all(r["heard"])
        assert r["members"] == [0, 1, 2, 3] and r["pids_ok"]
        # colors {0, 2} and {1, 3}; key = 4 - rank puts the higher old rank first
        assert r["sub_size"] == 2 and r["sub_rank"] == (0 if rank >= 2 else 1), r
        assert r["sub_sum"] == (0 + 2 if rank % 2 == 0 else 1 + 3), r
        assert r["out"]
        assert r["revoked"] == "Revoked", r


GROW = r'''
comm = connect()
if RANK == 0:
    with open(ARGS["token_file"] + ".tmp", "w") as f:
        f.write(comm.grow_token())
    os.rename(ARGS["token_file"] + ".tmp", ARGS["token_file"])
grown = comm.grow(1)
a = np.array([grown.rank + 1], np.int64)
grown.all_reduce(a)
result(size=grown.size, rank=grown.rank, epoch=grown.epoch, total=int(a[0]))
grown.destroy()
comm.destroy()
'''

JOINER = r'''
import json, os, sys, time
import numpy as np
import chorus
path = sys.argv[1]
deadline = time.time() + 60
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.01)
comm = chorus.Comm.join(open(path).read())
a = np.array([comm.rank + 1], np.int64)
comm.all_reduce(a)
print("RESULT " + json.dumps(dict(size=comm.size, rank=comm.rank, epoch=comm.epoch, total=int(a[0]))), flush=True)
comm.destroy()
'''


def test_grow_admits_a_newcomer(tmp_path):
    token_file = str(tmp_path / "token")
    ranks = harness.start(GROW, 2, timeout=90, args={"token_file": token_file})
    joiner = subprocess.run([sys.executable, "-c", JOINER, token_file], capture_output=True,
                            text=True, timeout=90)
    results = ranks.finish()
    assert joiner.returncode == 0, joiner.stderr
    newcomer = json.loads(joiner.stdout.split("RESULT ", 1)[1])
    assert newcomer == {"size": 3, "rank": 2, "epoch": 1, "total": 6}
    for rank, r in enumerate(results):
        assert r == {"size": 3, "rank": rank, "epoch": 1, "total": 6}
