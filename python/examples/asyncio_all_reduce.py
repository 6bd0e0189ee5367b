"""Collectives from asyncio: `chorus run -n 2 -- python asyncio_all_reduce.py`.

Each `async_op=True` call returns a chorus.Work at once; awaiting it keeps the event loop
running. Operations run in the order they were submitted, whatever order they are awaited.
"""

import asyncio

import numpy as np

import chorus


async def main():
    comm = chorus.Comm.from_env()
    grads = [np.full(1024, comm.rank + k, dtype=np.float32) for k in range(4)]
    works = [comm.all_reduce(g, async_op=True) for g in grads]
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    t = asyncio.create_task(ticker())
    for w in reversed(works):                  # awaited out of order: still correct
        await w
    t.cancel()
    want = [sum(r + k for r in range(comm.size)) for k in range(4)]
    assert [g[0] for g in grads] == want, [g[0] for g in grads]
    print(f"rank {comm.rank}: {[float(g[0]) for g in grads]}", flush=True)
    comm.destroy()


asyncio.run(main())
