#!/usr/bin/env python3
"""Side-by-side all-reduce bus bandwidth, chorus (each chunk size) beside NCCL, from the JSON
lines of gpu_bench and nccl_bench.py (kernels/check.sh runs this at the end).

    python3 kernels/bench_table.py chorus_bench.jsonl [nccl_bench.jsonl]
"""
import json
import sys


def rows(path):
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        print(f"(skipped a bad line in {path}: {line[:80]})")
    except OSError:
        return


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip())
        return 2
    chorus = list(rows(argv[1]))
    nccl = list(rows(argv[2])) if len(argv) > 2 else []
    for r in chorus:
        if r.get("kind") == "bandwidth":
            print(f"{r['what']:<20} {r['gbps']:>9.1f} GB/s")
    chunks = sorted({r["chunk"] for r in chorus if r.get("kind") == "allreduce"})
    cells = {}
    for r in chorus:
        if r.get("kind") == "allreduce":
            cells[(r["ranks"], r["bytes"], r["chunk"])] = r["busbw_gbps"]
    ref = {}
    for r in nccl:
        if r.get("kind") == "allreduce":
            ref[(r["ranks"], r["bytes"])] = r["busbw_gbps"]
    keys = sorted({(k[0], k[1]) for k in cells} | set(ref))
    if not keys:
        print("no all-reduce results")
        return 0
    head = f"{'ranks':>5} {'size':>9}" + "".join(f" {'chorus/' + str(c >> 10) + 'K':>14}" for c in chunks)
    print("\nall-reduce bus bandwidth, GB/s (f32 sum, ranks sharing one GPU)")
    print(head + f" {'nccl':>10} {'best/nccl':>10}")
    for ranks, size in keys:
        line = f"{ranks:>5} {size >> 20:>8}M"
        best = None
        for c in chunks:
            v = cells.get((ranks, size, c))
            line += f" {v:>14.1f}" if v is not None else f" {'-':>14}"
            if v is not None:
                best = v if best is None else max(best, v)
        n = ref.get((ranks, size))
        line += f" {n:>10.1f}" if n is not None else f" {'-':>10}"
        line += f" {best / n:>10.2f}" if (best is not None and n) else f" {'-':>10}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
