"""Where a blocking all-reduce through torch.distributed spends its time, layer by layer, in
a real N-rank job: what the "chorus (torch)" column costs over "chorus (python)".

    python torch_layers.py -n 4 -b 64K -w 200 -i 5000 -r 3

Each rank times the same in-place float32 sum all-reduce through three layers, interleaved
in every round:

- dist: ``torch.distributed.all_reduce(t)`` (torch's wrapper, then the backend's);
- backend: the chorus backend's ``allreduce([t], opts).wait()``, as torch calls it;
- extension: the extension's ``all_reduce_now``, which every layer ends in.

Per layer it prints the time per call (the ranks' average, median over rounds) and the CPU
time per call this rank's thread spent outside ``all_reduce_now`` (rank 0's, median over
rounds): the Python and C++ the layer adds. Compared with the same layers timed at world 1
(``call_overhead.py``), it shows how much more that code costs when ranks share cores and
its caches go cold between calls. The CPU clock is read around each extension call (about
0.2 µs, the same for every layer).

Every layer's result is checked once per round (every rank's rank + 1, summed); a wrong
element makes the job exit 1.

The launcher (this process) holds the rendezvous store and starts N rank processes of this
same file; every collective has a timeout and the launcher a deadline of its own.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

from gloo_allreduce import parse_size
from ranks import launch_on_store, run_script

LAYERS = ("dist", "backend", "extension")


def options(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--ranks", type=int, default=2)
    p.add_argument("-b", "--bytes", type=parse_size, default=8, help="buffer size (float32)")
    p.add_argument("-w", "--warmup", type=int, default=200)
    p.add_argument("-i", "--iters", type=int, default=5000)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole job")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.ranks < 1 or o.iters < 1 or o.warmup < 0 or o.rounds < 1:
        p.error("need -n >= 1, -i >= 1, -w >= 0, -r >= 1")
    if o.bytes < 4:
        p.error("need at least 4 bytes")
    return o


def launcher(o):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("CHORUS_TRANSPORT", "tcp")  # as the chorus (torch) column runs
    return launch_on_store(__file__, o.ranks, o.timeout, env, "torch_layers", sys.argv[1:])


class Clocked:
    """The extension's communicator, with the CPU time of its ``all_reduce_now`` summed."""

    def __init__(self, inner):
        self.inner = inner
        self.inside_ns = 0

    def all_reduce_now(self, *args):
        start = time.thread_time_ns()
        try:
            return self.inner.all_reduce_now(*args)
        finally:
            self.inside_ns += time.thread_time_ns() - start


def rank_main(o):
    import torch
    import torch.distributed as dist

    import chorus.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=o.timeout)
    store = dist.TCPStore("127.0.0.1", o.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("chorus", store=store, rank=o.rank, world_size=o.ranks,
                            timeout=timeout)
    world = dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if getattr(backend, "_inner", None) is None:
        print("torch_layers: the chorus backend has no extension communicator", file=sys.stderr)
        return 2
    clocked = backend._inner = Clocked(backend._inner)
    t = torch.zeros(o.bytes // 4, dtype=torch.float32)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.asyncOp = False
    ts = [t]
    calls = {
        "dist": lambda: dist.all_reduce(t),
        "backend": lambda: backend.allreduce(ts, opts).wait(),
        "extension": lambda: clocked.all_reduce_now(t, None, "sum", None),
    }
    times = {layer: [] for layer in LAYERS}
    outside = {layer: [] for layer in LAYERS}
    # The timed calls sum zeros (so repeated in-place sums stay bounded); after each timed
    # loop one more call per layer sums every rank's rank + 1, which must give
    # world (world + 1) / 2 in every element, exact in float32.
    expected = world * (world + 1) // 2
    wrong = 0
    for _ in range(o.rounds):
        for layer in LAYERS:
            call = calls[layer]
            dist.barrier()
            for _ in range(o.warmup):
                call()
            dist.barrier()
            clocked.inside_ns = 0
            cpu0 = time.thread_time_ns()
            start = time.perf_counter()
            for _ in range(o.iters):
                call()
            elapsed = time.perf_counter() - start
            cpu = time.thread_time_ns() - cpu0
            per_call = torch.tensor([elapsed / o.iters], dtype=torch.float64)
            dist.all_reduce(per_call)
            times[layer].append(per_call.item() / world * 1e6)
            outside[layer].append((cpu - clocked.inside_ns) / o.iters / 1e3)
            t.fill_(dist.get_rank() + 1)
            call()
            wrong += int((t != expected).sum())
            t.zero_()
    wrong = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(wrong)
    if dist.get_rank() == 0:
        print(f"# {world} ranks, {o.bytes} B, {o.rounds} rounds of {o.warmup} + {o.iters} calls, "
              f"CHORUS_TRANSPORT={os.environ.get('CHORUS_TRANSPORT', '')}, torch {torch.__version__}")
        print(f"{'layer':10s} {'us per call':>12s} {'CPU outside the extension, us':>31s}")
        for layer in LAYERS:
            print(f"{layer:10s} {statistics.median(times[layer]):12.2f} "
                  f"{statistics.median(outside[layer]):31.2f}", flush=True)
    dist.destroy_process_group()
    if wrong.item() != 0:
        print(f"torch_layers: {wrong.item()} wrong elements", file=sys.stderr)
        return 1
    return 0


def main(argv):
    return run_script(argv, options, launcher, rank_main)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
