"""Collective workloads on the flow engine: 32k-GPU ring steady state, 1k-GPU all-to-all, scaling.

Each case runs in its own subprocess so its peak RSS (``resource.getrusage``) belongs to it
alone. Cases:

* ``ring``: ring all-reduce steady state (``ring_steady_state`` -> engine
  ``steady_state_rates`` with ECMP -> ``ring_time_from_rates``) on rail-optimized fabrics of
  1,024 .. 32,768 GPUs, rail-aligned rings, 8 channels, in-order and random placement,
  S = 1 GiB. Timed separately: fabric build (not part of the target), workload, engine
  rates, the latency (alpha) term's path walk.
* ``alltoall``: all-to-all on 1,024 GPUs (128 servers x 8; PXN, about 1M flows), full
  event-driven ``simulate`` with ECMP.
* ``repro``: the 128-rank ring all-reduce on htsim's 128-host fat tree, full DAG (item 4 of
  SIMULATION.md), with the steady-state estimate over 12 random placements.

    python benchmarks/bench_collectives.py                 # everything
    python benchmarks/bench_collectives.py --quick         # 1k and 4k GPUs, no repro
    python benchmarks/bench_collectives.py --parts ring --max-gpus 32768

Prints a table and writes ``benchmarks/results/collectives.json``.
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

SIZES = (1024, 2048, 4096, 8192, 16384, 32768)
RESULTS = Path(__file__).resolve().parent / "results" / "collectives.json"
GiB = 2**30


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _ring(gpus: int, placement: str) -> dict[str, object]:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.fabric.routing import Routing
    from fabricscope.sim.engine import steady_state_rates
    from fabricscope.sim.workload import (
        alpha_beta_time,
        path_latency_s,
        place_ranks,
        ring_steady_state,
        ring_time_from_rates,
    )

    row: dict[str, object] = {"case": "ring-steady", "gpus": gpus, "placement": placement, "lb": "ecmp"}
    t0 = time.perf_counter()
    fab = rail_optimized_fabric(gpus // 8)
    _ = fab.index
    row["build_s"] = time.perf_counter() - t0
    row["rss_after_build_gib"] = _rss_gib()
    t0 = time.perf_counter()
    ss = ring_steady_state(place_ranks(fab, policy=placement, seed=0), GiB)
    row["workload_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = steady_state_rates(fab, ss, lb="ecmp")
    row["rates_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lat = path_latency_s(fab, ss, routing=Routing(fab))
    row["latency_s"] = time.perf_counter() - t0
    t_bw = ring_time_from_rates(ss, st.rates_bps)
    t_all = ring_time_from_rates(ss, st.rates_bps, latency_s=lat)
    row["sim_s"] = row["workload_s"] + row["rates_s"] + row["latency_s"]  # type: ignore[operator]
    row["flows"] = len(ss.flows)
    row["predicted_ms"] = t_all * 1e3
    row["bandwidth_term_ms"] = t_bw * 1e3
    ideal = alpha_beta_time("allreduce", gpus, GiB, bandwidth_bps=8 * 400e9)
    row["bw_term_over_ideal"] = t_bw / ideal
    row["min_rate_gbps"] = float(st.rates_bps.min()) / 1e9
    row["peak_rss_gib"] = _rss_gib()
    return row


def _alltoall(gpus: int) -> dict[str, object]:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.sim.engine import simulate
    from fabricscope.sim.workload import all_to_all, place_ranks

    row: dict[str, object] = {"case": "alltoall-full", "gpus": gpus, "placement": "in-order", "lb": "ecmp"}
    t0 = time.perf_counter()
    fab = rail_optimized_fabric(gpus // 8)
    _ = fab.index
    row["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    w = all_to_all(place_ranks(fab), GiB)
    row["workload_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = simulate(fab, w, lb="ecmp", record_utilization=False)
    row["engine_s"] = time.perf_counter() - t0
    row["sim_s"] = row["workload_s"] + row["engine_s"]  # type: ignore[operator]
    row["flows"] = len(w.flows)
    row["events"] = r.events
    row["completion_ms"] = r.completion_ns / 1e6
    row["busbw_GBps"] = r.busbw_Bps / 1e9
    row["peak_rss_gib"] = _rss_gib()
    return row


def _repro() -> dict[str, object]:
    import numpy as np

    from fabricscope.fabric.builders import fat_tree_fabric
    from fabricscope.sim.engine import simulate, steady_state_rates
    from fabricscope.sim.workload import (
        alpha_beta_time,
        path_latency_s,
        place_ranks,
        ring_collective,
        ring_steady_state,
        ring_time_from_rates,
    )

    fab = fat_tree_fabric(pods=8, tors_per_pod=4, aggs_per_pod=4, hosts_per_tor=4, cores_per_plane=4)
    size = 32 * 2**20
    row: dict[str, object] = {"case": "repro-128", "gpus": 128,
                              "ideal_ms": alpha_beta_time("allreduce", 128, size, bandwidth_bps=100e9) * 1e3}
    for label, pol, lb in (("in_order_ecmp", "in-order", "ecmp"), ("random_spray", "random", "spray"),
                           ("random_ecmp", "random", "ecmp")):
        t0 = time.perf_counter()
        r = simulate(fab, ring_collective(place_ranks(fab, policy=pol, seed=0), size), lb=lb,
                     record_utilization=False)
        row[f"{label}_ms"] = r.completion_ns / 1e6
        row[f"{label}_busbw_gbps"] = r.busbw_Bps * 8 / 1e9
        row[f"{label}_wall_s"] = time.perf_counter() - t0
    est = []
    for seed in range(12):
        ss = ring_steady_state(place_ranks(fab, policy="random", seed=seed), size)
        st = steady_state_rates(fab, ss, lb="ecmp")
        est.append(ring_time_from_rates(ss, st.rates_bps, latency_s=path_latency_s(fab, ss)) * 1e3)
    row["random_ecmp_steady_ms_12_seeds"] = est
    row["random_ecmp_steady_mean_ms"] = float(np.mean(est))
    row["random_ecmp_steady_sd_ms"] = float(np.std(est, ddof=1))
    row["peak_rss_gib"] = _rss_gib()
    return row


def _child(args: argparse.Namespace) -> None:
    if args.case == "ring":
        row = _ring(args.gpus, args.placement)
    elif args.case == "alltoall":
        row = _alltoall(args.gpus)
    else:
        row = _repro()
    print(json.dumps(row))


def _run(case: list[str]) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--child", *case]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"case": " ".join(case), "error": out.stderr.strip().splitlines()[-1:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="ring,alltoall,repro")
    ap.add_argument("--max-gpus", type=int, default=32768)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", default="ring", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, default=1024, help=argparse.SUPPRESS)
    ap.add_argument("--placement", default="in-order", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    parts = set(args.parts.split(","))
    sizes = [g for g in SIZES if g <= args.max_gpus and (not args.quick or g in (1024, 4096))]
    rows: list[dict[str, object]] = []
    if "ring" in parts:
        for g in sizes:
            for pol in ("in-order", "random"):
                rows.append(_run(["--case", "ring", "--gpus", str(g), "--placement", pol]))
                print(json.dumps(rows[-1]), flush=True)
    if "alltoall" in parts:
        rows.append(_run(["--case", "alltoall", "--gpus", "1024"]))
        print(json.dumps(rows[-1]), flush=True)
    if "repro" in parts and not args.quick:
        rows.append(_run(["--case", "repro"]))
        print(json.dumps(rows[-1]), flush=True)
    cols = ("case", "gpus", "placement", "flows", "build_s", "workload_s", "rates_s", "latency_s",
            "engine_s", "sim_s", "peak_rss_gib", "predicted_ms", "bw_term_over_ideal", "completion_ms")
    print()
    print(" | ".join(cols))
    for r in rows:
        if r.get("case", "").startswith("repro"):  # type: ignore[union-attr]
            continue
        print(" | ".join(_fmt(r.get(c, "")) for c in cols))
    machine = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
