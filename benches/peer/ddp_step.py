"""The time of one DDP training step, chorus (chorus.torch) against gloo, interleaved.

    python ddp_step.py [-n 2 4] [-r 5] [-w 5] [-i 30] [--timeout 600]

The model and batches are the ones of the chorus.torch training test
(python/tests/torch_jobs/train.py: Linear(8, 16), Tanh, Linear(16, 1) on 8 x 8 batches),
so the step is dominated by the gradient all-reduce's per-call cost, which is what a
backend changes. For each world size the launcher (this process) holds a TCPStore on an
ephemeral loopback port and starts N rank processes of this file; every rank has a chorus
default group and a gloo group over the same ranks, and a DDP model on each. Each round
times W warm-up and I steps on one backend, then on the other (the order alternates by
round); the step time of a round is the ranks' average of the median step. One JSON
document on stdout: {"ddp_step": 1, "runs": [{"ranks", "backend", "rounds_ms",
"median_ms"}...]}; a table on stderr. Every wait is bounded (--timeout per world size).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

from ranks import launch_on_store, run_script

BACKENDS = ("chorus", "gloo")


def options(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("-r", "--rounds", type=int, default=5)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-i", "--iters", type=int, default=30)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per world size")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if min(o.ranks) < 2 or o.rounds < 1 or o.iters < 1 or o.warmup < 0:
        p.error("need -n >= 2, -r >= 1, -i >= 1, -w >= 0")
    return o


def launch(o, world, result):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    args = ["-r", str(o.rounds), "-w", str(o.warmup), "-i", str(o.iters), "--timeout", str(o.timeout),
            "--world", str(world), "--result", result]
    return launch_on_store(__file__, world, o.timeout, env, f"ddp_step ({world} ranks)", args, quiet=False)


def launcher(o):
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in o.ranks:
            result = os.path.join(tmp, f"ddp-{world}.json")
            if launch(o, world, result) != 0:
                return 1
            with open(result) as f:
                runs += json.load(f)
    print(json.dumps({"ddp_step": 1, "rounds": o.rounds, "warmup": o.warmup, "iters": o.iters,
                      "runs": runs}), flush=True)
    print(f"{'ranks':>5}  {'backend':<8}{'median ms':>10}  rounds (ms)", file=sys.stderr)
    for r in runs:
        rounds = " ".join(f"{x:.2f}" for x in r["rounds_ms"])
        print(f"{r['ranks']:>5}  {r['backend']:<8}{r['median_ms']:>10.3f}  {rounds}", file=sys.stderr)
    for world in o.ranks:
        got = {r["backend"]: r["median_ms"] for r in runs if r["ranks"] == world}
        print(f"{world} ranks: gloo / chorus = {got['gloo'] / got['chorus']:.2f}x", file=sys.stderr)
    return 0


def rank_main(o):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import chorus.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=o.timeout)
    store = dist.TCPStore("127.0.0.1", o.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("chorus", store=store, rank=o.rank, world_size=o.world, timeout=timeout)
    groups = {"chorus": None, "gloo": dist.new_group(backend="gloo", timeout=timeout)}
    nets = {}
    for name, group in groups.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        net = nn.parallel.DistributedDataParallel(model, process_group=group)
        nets[name] = (net, torch.optim.SGD(net.parameters(), lr=0.1))

    def batch(step):
        g = torch.Generator().manual_seed(10_000 * step + o.rank)
        x = torch.randn(8, 8, generator=g)
        return x, x[:, :4].sum(dim=1, keepdim=True) - 0.5 * x[:, 4:].sum(dim=1, keepdim=True)

    def steps(name, count, start):
        net, opt = nets[name]
        times = []
        for step in range(start, start + count):
            x, y = batch(step)
            t0 = time.perf_counter()
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        return times

    rounds = {name: [] for name in BACKENDS}
    step = 0
    for r in range(o.rounds):
        for name in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
            dist.barrier()
            steps(name, o.warmup, step)
            times = steps(name, o.iters, step + o.warmup)
            step += o.warmup + o.iters
            mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(mine)
            rounds[name].append(mine.item() / o.world * 1e3)
    if o.rank == 0:
        runs = [{"ranks": o.world, "backend": name, "rounds_ms": rounds[name],
                 "median_ms": statistics.median(rounds[name])} for name in BACKENDS]
        with open(o.result + ".tmp", "w") as f:
            json.dump(runs, f)
        os.rename(o.result + ".tmp", o.result)
    dist.destroy_process_group()
    return 0


def main(argv):
    return run_script(argv, options, launcher, rank_main)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
