#!/usr/bin/env python3
"""NCCL all-reduce bus bandwidth with several ranks on ONE GPU, through torch.distributed,
for the same sizes as chorus's gpu_bench (run by kernels/check.sh).

NCCL refuses two ranks on one device unless it is 2.30.3 or later and
NCCL_MULTI_RANK_GPU_ENABLE=1 is set; where it refuses, this prints one line saying so and
exits 0. Writes JSON lines to --out.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def parse_version(v):
    if isinstance(v, int):  # older torch: 2*10000 + minor*100 + patch, or 1000-based
        return (v // 10000, (v // 100) % 100, v % 100) if v >= 10000 else (v // 1000, (v // 100) % 10, v % 100)
    return tuple(int(x) for x in v)


def worker(rank, world, init_file, sizes, out_path, budget_s):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", 0))
    start = time.monotonic()
    rows = []
    go = torch.zeros(1, dtype=torch.int32, device="cuda")
    for size in sizes:
        # Rank 0's clock decides for everyone: ranks that each read their own would leave the
        # loop at different sizes and the others would wait in an all-reduce nobody joins.
        if rank == 0:
            go.fill_(int(time.monotonic() - start <= budget_s))
        dist.broadcast(go, src=0)
        if not go.item():
            break
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        iters = 3 if size >= 256 << 20 else 10
        dist.all_reduce(x)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(iters):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        t = torch.tensor([best], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best = t.item()
        busbw = size * 2 * (world - 1) / world / best / 1e9
        rows.append({"kind": "allreduce", "impl": "nccl", "ranks": world, "bytes": size,
                     "us": round(best * 1e6, 1), "busbw_gbps": round(busbw, 2)})
    if rank == 0:
        with open(out_path, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
                print(f"{world:>6} {r['bytes'] >> 20:>9}M {r['us']:>12.1f} {r['busbw_gbps']:>9.1f} GB/s (nccl)",
                      flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--budget-s", type=float, default=60)
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001
        print(f"skipped NCCL comparison: torch is not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("skipped NCCL comparison: torch sees no GPU")
        return 0
    version = parse_version(torch.cuda.nccl.version())
    if version < (2, 30, 3):
        print(f"skipped NCCL comparison: NCCL {'.'.join(map(str, version))} is older than 2.30.3, "
              "which is the first to allow several ranks on one GPU")
        return 0
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    print(f"# NCCL {'.'.join(map(str, version))} with NCCL_MULTI_RANK_GPU_ENABLE=1, torch {torch.__version__}")
    sizes = []
    s = 1 << 20
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 4
    for world in (2, 4):
        with tempfile.TemporaryDirectory() as d:
            try:
                mp.spawn(worker, args=(world, os.path.join(d, "init"), sizes, args.out, args.budget_s / 2),
                         nprocs=world, join=True)
            except Exception as e:  # noqa: BLE001
                print(f"skipped NCCL comparison at {world} ranks: {str(e).strip().splitlines()[-1][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
