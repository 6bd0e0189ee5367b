"""All-reduce (float32, sum) through torch.distributed's gloo backend on 127.0.0.1, swept over
sizes the way nccl-tests' all_reduce_perf does, printing one chorus_bench JSON document (see
benches/peer/README.md) on stdout. With --backend chorus, the same sweep through chorus's
torch.distributed backend (chorus.torch), the "chorus (torch)" column.

    python gloo_allreduce.py -n 4 -b 8 -e 128M -f 2 -w 5 -i 20 [--backend chorus]

The launcher (this process) holds the rendezvous store on an ephemeral loopback port and
starts N rank processes of this same file; rank 0 prints the document. A rank that fails
makes the launcher stop the others and exit non-zero; every collective has a timeout, and
the launcher has a deadline of its own, so nothing here waits forever.

Per size: barrier, W warm-up calls, barrier, I timed calls; time = the ranks' average of
(elapsed / I), as nccl-tests averages. torch.distributed's all_reduce works in place, so only
the in-place column is measured ("out_of_place": null). The timed calls run on a zeroed
buffer (repeated in-place sums cannot overflow); a fresh pattern is then reduced once and
checked element by element on every rank.
"""

import argparse
import datetime
import json
import os
import sys
import time

from ranks import launch_on_store, run_script
import warnings

# torch warns at import when numpy is absent; numpy is not needed here.
warnings.filterwarnings("ignore", message=".*NumPy.*")

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
    p.add_argument("--backend", choices=("gloo", "chorus"), default="gloo",
                   help="torch.distributed backend: gloo, or chorus (import chorus.torch)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
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
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return launch_on_store(__file__, o.ranks, o.timeout, env, "gloo_allreduce", sys.argv[1:])


# The check pattern repeats every PERIOD elements: (7i + 3r) mod 64 is a permutation of
# 0..63 over any 64 consecutive i, different for every rank, and small enough that every
# partial sum is exact in float32. The same pattern as mpi_allreduce.c.
PERIOD = 64


def pattern(torch, rank, count):
    period = (torch.arange(PERIOD, dtype=torch.int64) * 7 + rank * 3) % PERIOD
    reps = -(-count // PERIOD)
    return period.to(torch.float32).repeat(reps)[:count]


def count_wrong(torch, buf, world):
    count = buf.numel()
    expected = sum(pattern(torch, r, PERIOD) for r in range(world))
    reps = -(-count // PERIOD)
    # Pad to whole periods with expected values, so the tail compares equal.
    padded = expected.repeat(reps)
    padded[:count] = buf
    return int((padded.view(reps, PERIOD) != expected).sum())


def rank_main(o):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=o.timeout)
    store = dist.TCPStore("127.0.0.1", o.store_port, is_master=False, timeout=timeout)
    if o.backend == "chorus":
        import chorus.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(o.backend, store=store, rank=o.rank, world_size=o.ranks,
                            timeout=timeout)
    # Test hook: rank 0 spoils one element of every checked result, so tests can see that
    # wrong results are counted.
    corrupt = os.environ.get("CHORUS_PEER_CORRUPT") == "1"
    # Test hook: a rank that dies after joining, leaving its peers blocked in a collective,
    # is what the launcher must notice and clean up (benches/tests/peer_run.rs).
    if os.environ.get("CHORUS_PEER_FAIL_RANK") == str(o.rank):
        sys.exit(3)
    world = dist.get_world_size()
    factor = 2.0 * (world - 1) / world
    buf = torch.zeros(o.max_bytes // 4, dtype=torch.float32)
    # A first sweep-wide warm-up, so the first size does not pay for connection set-up.
    for _ in range(max(o.warmup, 1)):
        dist.all_reduce(buf[:1])

    rows = []
    for size in sizes(o):
        count = size // 4
        t = buf[:count]
        t.zero_()
        dist.barrier()
        for _ in range(o.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(o.iters):
            dist.all_reduce(t)
        per_call = torch.tensor([(time.perf_counter() - start) / o.iters], dtype=torch.float64)
        dist.all_reduce(per_call)
        time_us = per_call.item() / world * 1e6

        t.copy_(pattern(torch, dist.get_rank(), count))
        dist.all_reduce(t)
        if corrupt and dist.get_rank() == 0:
            t[-1] += 1.0
        wrong = torch.tensor([count_wrong(torch, t, world)], dtype=torch.int64)
        dist.all_reduce(wrong)

        algbw = count * 4 / (time_us * 1e-6) / 1e9
        rows.append({
            "size": count * 4, "count": count, "type": "float", "redop": "sum", "root": -1,
            "out_of_place": None,
            "in_place": {"time_us": round(time_us, 3), "algbw_gbs": algbw,
                         "busbw_gbs": algbw * factor, "wrong": int(wrong.item())},
        })

    if dist.get_rank() == 0:
        doc = {
            "chorus_bench": 1, "collective": "all-reduce", "ranks": world, "transport": "tcp",
            "dtype": "float", "op": "sum", "warmup": o.warmup, "iters": o.iters,
            "library": f"torch {torch.__version__} {o.backend}",
            "rows": rows,
            "avg_busbw_gbs": sum(r["in_place"]["busbw_gbs"] for r in rows) / len(rows),
        }
        print(json.dumps(doc), flush=True)
    dist.destroy_process_group()
    return 0


def main(argv):
    return run_script(argv, options, launcher, rank_main)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
