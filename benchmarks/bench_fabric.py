"""Fabric scaling: build, routing tables, and bulk ECMP routing from 1k to 32k GPUs.

Each size runs in its own subprocess so the peak RSS (``resource.getrusage``) belongs to that
size alone. Rows: rail-optimized fabrics (the demo/simulator default) of 1,024 .. 32,768 GPUs,
routing a rail-aligned ring (one flow per GPU, the NCCL ring's traffic) and a random
permutation (cross-rail, cross-pod) with :meth:`Routing.route_many`, plus per-flow
:meth:`Routing.path` on a sample for comparison; and the 1,024-GPU all-to-all (about 1M flows).

    python benchmarks/bench_fabric.py            # all sizes
    python benchmarks/bench_fabric.py --quick    # 1k and 4k only

Prints a table and writes ``benchmarks/results/fabric.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

SIZES = (1024, 4096, 8192, 16384, 32768)
RESULTS = Path(__file__).resolve().parent / "results" / "fabric.json"


def _measure(gpus: int, case: str) -> dict[str, object]:
    import numpy as np

    from fabricscope.fabric import Routing, rail_optimized_fabric

    row: dict[str, object] = {"gpus": gpus, "case": case}
    t0 = time.perf_counter()
    f = rail_optimized_fabric(gpus // 8)
    row["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ix = f.index
    row["index_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = Routing(f)
    _ = r._dist  # distances from every leaf: the routing tables' only global state
    row["tables_s"] = time.perf_counter() - t0
    row.update(switches=len(f.switches), links=len(f.links), tiers=f.meta["tiers"])
    nic = np.array([r.node(n.id) for n in f.nics], dtype=np.int64)  # host-major, rail-minor
    rng = np.random.default_rng(1)
    if case == "all-to-all":
        s, t = np.meshgrid(nic, nic, indexing="ij")
        keep = s != t
        src, dst = s[keep], t[keep]
    elif case == "ring":
        src, dst = nic, np.roll(nic, -8)  # GPU g of host h -> GPU g of host h+1 (same rail)
    else:
        src, dst = nic, rng.permutation(nic)
    sports = rng.integers(49152, 65536, src.shape[0])
    t0 = time.perf_counter()
    table = r.route_many(src, dst, sports)
    row["route_many_s"] = time.perf_counter() - t0
    row["flows"] = int(src.shape[0])
    row["hops"] = int(table.edges.shape[0])
    if case == "ring":  # packet spraying: every equal-cost edge of every flow, with its share
        t0 = time.perf_counter()
        spray = r.spray_many(src, dst)
        row["spray_many_s"] = time.perf_counter() - t0
        row["spray_entries"] = int(spray.edges.shape[0])
    sample = min(2000, src.shape[0])
    ids = ix.node_ids
    t0 = time.perf_counter()
    for i in range(sample):
        a, b = ids[src[i]], ids[dst[i]]
        r.path(a, b, r.flow_tuple(a, b, src_port=int(sports[i])))
    row["path_per_flow_us"] = (time.perf_counter() - t0) / sample * 1e6
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _opt(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k and 4k GPUs only")
    ap.add_argument("--one", nargs=2, metavar=("GPUS", "CASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_measure(int(args.one[0]), args.one[1])))
        return
    sizes = SIZES[:2] if args.quick else SIZES
    jobs = [(g, c) for g in sizes for c in ("ring", "permutation")] + [(1024, "all-to-all")]
    rows = []
    hdr = (f"{'GPUs':>6} {'case':<12} {'flows':>9} {'switches':>8} {'links':>7} {'build s':>8} "
           f"{'tables s':>8} {'route s':>8} {'spray s':>8} {'path us':>8} {'peak MiB':>9}")
    print(hdr)
    for gpus, case in jobs:
        out = subprocess.run([sys.executable, __file__, "--one", str(gpus), case],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{gpus:>6} {case:<12} {row['flows']:>9,} {row['switches']:>8,} {row['links']:>7,} "
              f"{row['build_s'] + row['index_s']:>8.2f} {row['tables_s']:>8.2f} "
              f"{row['route_many_s']:>8.2f} {_opt(row.get('spray_many_s')):>8} "
              f"{row['path_per_flow_us']:>8.0f} {row['peak_rss_mib']:>9.0f}",
              flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "notes": "build s includes Fabric.index; route s = Routing.route_many for all flows; "
                 "spray s = Routing.spray_many (ring only); path us = per-flow Routing.path (cold "
                 "next-hop cache) on up to 2000 flows; peak = ru_maxrss of the run",
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
