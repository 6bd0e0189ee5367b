"""All-reduce (float32, sum) through chorus's Python package on numpy arrays, on 127.0.0.1,
swept over sizes the way nccl-tests' all_reduce_perf does, printing one chorus_bench JSON
document (see benches/peer/README.md) on stdout: what `chorus bench` measures, plus the cost
of the Python call.

    python chorus_py_allreduce.py -n 4 -b 8 -e 128M -f 2 -w 5 -i 20

The launcher (this process) makes the UniqueId (so it hosts the bootstrap root) and starts
N rank processes of this same file; rank 0 prints the document. A rank that fails makes the
launcher stop the others and exit non-zero; the launcher has a deadline, and every chorus
call is bounded, so nothing here waits forever.

Per size: barrier, W warm-up calls, barrier, I timed calls, in place and out of place; time
= the ranks' average of (elapsed / I). The timed calls run on zeroed buffers; a fresh
pattern is then reduced once and checked element by element on every rank.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from ranks import run_script, supervise


def parse_size(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    suffix = text[-1:].upper()
    try:
        if suffix in scale:
            return int(text[:-1]) * scale[suffix]
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}") from None


def options(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--ranks", type=int, default=2)
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=128 << 20)
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-i", "--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole sweep")
    p.add_argument("--transport", default="tcp",
                   help="chorus transport (CHORUS_TRANSPORT), tcp as `chorus bench --transport tcp` beside it")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.ranks < 1 or o.factor < 2 or o.iters < 1 or o.warmup < 0:
        p.error("need -n >= 1, -f >= 2, -i >= 1, -w >= 0")
    if o.min_bytes < 4 or o.max_bytes < o.min_bytes:
        p.error("need 4 <= MIN <= MAX")
    return o


def sizes(o):
    size = o.min_bytes
    while size <= o.max_bytes:
        yield size
        size *= o.factor


def launcher(o):
    import chorus

    uid = chorus.UniqueId.new(o.ranks, init_timeout=f"{int(o.timeout)}s")
    env = dict(os.environ, CHORUS_PY_BENCH_TOKEN=str(uid))
    ranks = [
        subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--rank", str(r)],
                         env=env, stdout=None if r == 0 else subprocess.DEVNULL)
        for r in range(o.ranks)
    ]
    return supervise(ranks, o.timeout, "chorus_py_allreduce")


# The same check pattern as gloo_allreduce.py and mpi_allreduce.c: (7i + 3r) mod 64.
PERIOD = 64


def pattern(np, rank, count):
    period = ((np.arange(PERIOD, dtype=np.int64) * 7 + rank * 3) % PERIOD).astype(np.float32)
    return np.resize(period, count)


def rank_main(o):
    import numpy as np

    import chorus

    comm = chorus.Comm(os.environ["CHORUS_PY_BENCH_TOKEN"], o.rank, o.ranks,
                       init_timeout=f"{int(o.timeout)}s", transport=o.transport)
    world = comm.size
    factor = 2.0 * (world - 1) / world
    send = np.zeros(o.max_bytes // 4, dtype=np.float32)
    recv = np.zeros_like(send)
    for _ in range(max(o.warmup, 1)):
        comm.all_reduce(send[:1])
    expected_period = sum(pattern(np, r, PERIOD) for r in range(world))

    def timed(count, in_place):
        s, r = send[:count], recv[:count]
        s[:] = 0
        comm.barrier()
        for _ in range(o.warmup):
            comm.all_reduce(s) if in_place else comm.all_reduce(s, out=r)
        comm.barrier()
        start = time.perf_counter()
        if in_place:
            for _ in range(o.iters):
                comm.all_reduce(s)
        else:
            for _ in range(o.iters):
                comm.all_reduce(s, out=r)
        per_call = np.array([(time.perf_counter() - start) / o.iters])
        comm.all_reduce(per_call)
        time_us = per_call[0] / world * 1e6
        s[:] = pattern(np, comm.rank, count)
        if in_place:
            comm.all_reduce(s)
            out = s
        else:
            comm.all_reduce(s, out=r)
            out = r
        wrong = np.array([int((out != np.resize(expected_period, count)).sum())], dtype=np.int64)
        comm.all_reduce(wrong)
        algbw = count * 4 / (time_us * 1e-6) / 1e9
        return {"time_us": round(float(time_us), 3), "algbw_gbs": algbw,
                "busbw_gbs": algbw * factor, "wrong": int(wrong[0])}

    rows = []
    for size in sizes(o):
        count = size // 4
        rows.append({
            "size": count * 4, "count": count, "type": "float", "redop": "sum", "root": -1,
            "out_of_place": timed(count, False), "in_place": timed(count, True),
        })
    if comm.rank == 0:
        doc = {
            "chorus_bench": 1, "collective": "all-reduce", "ranks": world, "transport": o.transport,
            "dtype": "float", "op": "sum", "warmup": o.warmup, "iters": o.iters,
            "library": f"chorus {chorus.__version__} (python)",
            "rows": rows,
            "avg_busbw_gbs": sum(r["in_place"]["busbw_gbs"] for r in rows) / len(rows),
        }
        print(json.dumps(doc), flush=True)
    comm.destroy()
    return 0


def main(argv):
    return run_script(argv, options, launcher, rank_main)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
