#!/usr/bin/env python3
"""The README's peer table, regenerated from one run's `report.json`.

    benches/peer/readme_table.py bench-out/peer/report.json

prints the markdown bus-bandwidth table (in-place, GB/s, with chorus's ratios) and the 8-byte
latency line per rank count, so the README's table always comes from one run and is replaced
whole, never edited by hand. The paragraph above it (date, machine, command, limits) comes
from the same report's `meta` and `limits`, printed first as a comment to copy.
"""

import argparse
import datetime
import json
import sys

COLUMNS = [
    ("chorus-shm", "chorus (shm)"),
    ("chorus-tcp", "chorus (tcp)"),
    ("chorus-py", "chorus (python)"),
    ("chorus-torch", "chorus (torch)"),
    ("gloo-tcp", "Gloo (tcp)"),
    ("openmpi-tcp", "Open MPI (tcp)"),
    ("openmpi-shm", "Open MPI (shm)"),
]
RATIOS = [
    ("chorus-shm", "openmpi-shm", "chorus (shm) ÷ MPI shm"),
    ("chorus-tcp", "openmpi-tcp", "chorus (tcp) ÷ MPI tcp"),
    ("chorus-tcp", "gloo-tcp", "chorus (tcp) ÷ Gloo"),
]
NAMES = dict(COLUMNS)


def size(b):
    for unit, suffix in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit:
            return f"{b // unit} {suffix}"
    return f"{b} B"


def busbw(row):
    """System → in-place bus bandwidth (GB/s) of one size's row; a missing cell is absent."""
    out = {}
    for cell in row["cells"]:
        ip = cell.get("in_place")
        if ip is not None:
            out[cell["system"]] = ip["busbw_gbs"]
    return out


def table(report):
    lines = [
        "| ranks | size | "
        + " | ".join(name for _, name in COLUMNS)
        + " | "
        + " | ".join(name for _, _, name in RATIOS)
        + " |",
        "|---:|---:|" + "---:|" * (len(COLUMNS) + len(RATIOS)),
    ]
    for world in report["worlds"]:
        for row in world["rows"]:
            bw = busbw(row)
            cells = ["–" if bw.get(c) is None else f"{bw[c]:.3f}" for c, _ in COLUMNS]
            ratios = [
                f"{bw[a] / bw[b]:.2f}×" if bw.get(a) and bw.get(b) else "–" for a, b, _ in RATIOS
            ]
            lines.append(
                f"| {world['ranks']} | {size(row['size'])} | " + " | ".join(cells + ratios) + " |"
            )
    return "\n".join(lines)


def latency(report):
    lines = []
    for world in report["worlds"]:
        parts = [
            f"{NAMES.get(l['system'], l['system'])} {l['time_us']:.1f}" for l in world["latency"]
        ]
        lines.append(f"{world['ranks']} ranks, {size(world['latency'][0]['size'])}, µs: " + ", ".join(parts))
    return "\n".join(lines)


def calls(meta):
    """The timed calls per size: the same at every size, or a scaled sweep's factor on them
    up to a size, both as the report's meta records them."""
    if not meta.get("scaled"):
        return f"{meta['iters']} timed calls"
    small = meta["iters"] * meta["small_calls"]
    return f"{small} timed calls up to {size(meta['small_up_to'])}, {meta['iters']} above"


def provenance(report):
    meta, limits = report["meta"], report["limits"]
    when = datetime.datetime.fromtimestamp(meta["started_unix_s"], datetime.timezone.utc)
    versions = dict(meta.get("versions", []))
    memcpy = max(limits["memcpy"], key=lambda m: m["size"])
    return (
        f"<!-- run started {when:%Y-%m-%d %H:%M} UTC at chorus {versions.get('chorus', '?')}; "
        f"{meta['cpu']}, {meta['cores']} cores, Linux {meta['kernel']}; "
        f"{'quick' if meta['quick'] else 'full'} sweep, {calls(meta)}, "
        f"{meta['rounds']} rounds; memcpy {memcpy['gbs']:.1f} GB/s ({size(memcpy['size'])}), "
        f"loopback TCP {limits['tcp']['stream_gbs']:.2f} GB/s -->"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="report.json written by benches/peer/run.sh")
    args = parser.parse_args()
    try:
        with open(args.report) as f:
            report = json.load(f)
        print(provenance(report))
        print()
        print(table(report))
        print()
        print(latency(report))
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"readme_table: cannot read {args.report}: {e}")
    except (KeyError, TypeError, ValueError) as e:
        sys.exit(f"readme_table: {args.report} is not a peer report (missing or bad {e})")


if __name__ == "__main__":
    main()
