"""What one blocking all-reduce costs in Python before any peer is involved: a chorus
communicator of one rank, so the collective itself is nothing, called through each layer
a user or torch goes through, best of 5 × N calls.

    python benches/peer/call_overhead.py [-n 20000]

Needs the chorus package (pip install ./python), numpy and torch. Prints one line per
layer, microseconds per call. Layers without torch are skipped with a line saying so.
"""

import argparse
import datetime
import importlib.util
import os
import socket
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*NumPy.*")


def best(fn, calls, rounds=5):
    for _ in range(min(calls, 2000)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--calls", type=int, default=20000)
    o = p.parse_args(argv)
    if o.calls < 1:
        p.error("need -n >= 1")
    import numpy as np

    import chorus

    layers = []
    a = np.zeros(2, dtype=np.float32)
    if importlib.util.find_spec("torch") is None:
        comm = chorus.Comm(chorus.UniqueId.new(1), 0, 1)
        layers.append(("chorus.Comm.all_reduce(numpy array)", lambda: comm.all_reduce(a)))
        print("torch is not installed: the torch layers are not measured", file=sys.stderr)
    else:
        import torch
        import torch.distributed as dist

        import chorus.torch  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        dist.init_process_group("chorus", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
        pg = dist.group.WORLD
        comm = pg.comm
        t = torch.zeros(2)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        opts.asyncOp = False
        tensors = [t]
        layers += [
            ("chorus.Comm.all_reduce(numpy array)", lambda: comm.all_reduce(a)),
            ("chorus.Comm.all_reduce(torch tensor)", lambda: comm.all_reduce(t)),
            ("backend allreduce([t], opts).wait()", lambda: pg.allreduce(tensors, opts).wait()),
            ("torch.distributed.all_reduce(t)", lambda: dist.all_reduce(t)),
        ]
    for name, fn in layers:
        print(f"{name:40s} {best(fn, o.calls):6.2f} us", flush=True)
    if "torch" in sys.modules and sys.modules["torch"].distributed.is_initialized():
        sys.modules["torch"].distributed.destroy_process_group()
    else:
        comm.destroy()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CHORUS_TRANSPORT", "tcp")
    sys.exit(main(sys.argv[1:]))
