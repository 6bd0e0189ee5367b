"""A numpy all-reduce: `chorus run -n 4 -- python all_reduce.py`."""

import numpy as np

import chorus

with chorus.Comm.from_env() as comm:          # rank and world from `chorus run`
    a = np.full(4, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(a)                        # in place; op="sum" by default
    top = np.empty_like(a)
    comm.all_reduce(a, out=top, op="max")     # out of place
    print(f"rank {comm.rank} of {comm.size}: {a.tolist()}", flush=True)
    assert a.tolist() == [comm.size * (comm.size + 1) / 2] * 4
