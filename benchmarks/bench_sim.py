"""Benchmark and reproduction numbers of the flow engine (fabricscope.sim.engine).

Prints tables and writes benchmarks/results/sim.json. Sections:

* speed: 1024-host fat-tree permutation of 2 MB flows, full event-driven FCT simulation,
  per scheme, cold (first run: routing caches built) and warm (another permutation);
* scaling: ECMP permutation on rail-optimized fabrics from 1k to 32k GPUs (each size in its
  own process so that the peak RSS is its own);
* reproductions: SIMULATION.md §1/§2 numbers next to ours (seed-averaged ones with their spread);
* degraded: one uplink of a leaf-spine 8x8 / 4 spines at 25 %, p99 per scheme over seeds;
* --big: all-to-all on 1,024 GPUs (1,047,552 flows): steady state and full simulation.

Usage: python benchmarks/bench_sim.py [--quick] [--big] [--only SECTION]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fabricscope.fabric import HashConfig, fat_tree_fabric, leaf_spine_fabric
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.engine import simulate, steady_state_rates
from fabricscope.sim.flows import FlowSpec, Workload

OUT = Path(__file__).resolve().parent / "results" / "sim.json"


def _derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    while True:
        p = rng.permutation(n)
        if not (p == np.arange(n)).any():
            return p


def permutation(fab: Fabric, seed: int, size: float = 2e6) -> Workload:
    nics = [n.id for n in fab.nics]
    p = _derangement(len(nics), np.random.default_rng(seed))
    return Workload("permutation", tuple(FlowSpec(i, nics[i], nics[int(p[i])], size) for i in range(len(nics))))


def fat_tree_1024() -> Fabric:
    return fat_tree_fabric(pods=16, tors_per_pod=8, aggs_per_pod=8, hosts_per_tor=8, cores_per_plane=8)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ---------------------------------------------------------------------- speed
def bench_speed(quick: bool) -> list[dict[str, object]]:
    fab = fat_tree_1024()
    rows = []
    for scheme in ("ecmp", "spray", "dlb", "flowlet", "random"):
        if quick and scheme in ("flowlet", "random"):
            continue
        t0 = time.perf_counter()
        cold = simulate(fab, permutation(fab, 100), lb=scheme, record_utilization=False)
        t_cold = time.perf_counter() - t0
        times = []
        for s in range(1 if quick else 3):
            t0 = time.perf_counter()
            warm = simulate(fab, permutation(fab, s), lb=scheme, record_utilization=False)
            times.append(time.perf_counter() - t0)
        st = warm.fct_stats_us()
        rows.append({
            "case": f"fat-tree 1024 permutation 2MB {scheme}",
            "cold_s": round(t_cold, 3), "warm_s": round(float(np.median(times)), 3),
            "events": warm.events, "fct_mean_us": round(st["mean"], 1),
            "fct_p99_us": round(st["p99"], 1), "cold_events": cold.events,
        })
    return rows


# ---------------------------------------------------------------------- scaling
def scaling_case(servers: int) -> dict[str, object]:
    t0 = time.perf_counter()
    fab = rail_optimized_fabric(servers)
    t_build = time.perf_counter() - t0
    w = permutation(fab, 0, size=8 * 2**20)
    t0 = time.perf_counter()
    ss = steady_state_rates(fab, w)
    t_ss = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = simulate(fab, w, record_utilization=False)
    t_sim = time.perf_counter() - t0
    return {
        "gpus": len(fab.nics), "switches": len(fab.switches), "links": len(fab.links),
        "tiers": fab.meta.get("tiers"), "build_s": round(t_build, 2),
        "steady_state_s": round(t_ss, 2), "throughput_ratio": round(ss.throughput_ratio, 4),
        "simulate_s": round(t_sim, 2), "events": res.events,
        "fct_p99_us": round(res.fct_stats_us()["p99"], 1), "peak_rss_gib": round(peak_rss_gib(), 3),
    }


def bench_scaling(quick: bool) -> list[dict[str, object]]:
    sizes = [128, 512] if quick else [128, 512, 1024, 4096]
    rows = []
    for servers in sizes:
        p = subprocess.run([sys.executable, __file__, "--scaling-case", str(servers)],
                           capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            rows.append({"gpus": servers * 8, "error": p.stderr.strip().splitlines()[-1:]})
            continue
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return rows


def big_case() -> dict[str, object]:
    fab = rail_optimized_fabric(128)
    nics = [n.id for n in fab.nics]
    n = len(nics)
    t0 = time.perf_counter()
    w = Workload("nic-all-to-all", tuple(
        FlowSpec(i * n + j, nics[i], nics[j], 1e6) for i in range(n) for j in range(n) if i != j))
    t_w = time.perf_counter() - t0
    t0 = time.perf_counter()
    steady_state_rates(fab, w)
    t_ss = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = simulate(fab, w, record_utilization=False, batch_rtol=1e-3)
    t_sim = time.perf_counter() - t0
    return {"case": "all-to-all 1024 GPUs ECMP, batch_rtol 1e-3", "flows": len(w.flows), "build_flows_s": round(t_w, 1),
            "steady_state_s": round(t_ss, 1), "simulate_s": round(t_sim, 1), "events": res.events,
            "completion_us": round(res.completion_ns / 1e3, 1), "peak_rss_gib": round(peak_rss_gib(), 2)}


# ---------------------------------------------------------------------- reproductions
def _ms(xs: list[float]) -> str:
    return f"{np.mean(xs):.3f} +- {np.std(xs, ddof=1):.3f}"


def bench_reproduce(quick: bool) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for k, ref_eff, ref_max in ((8, 0.656, 2.60), (64, 0.635, 3.96)):
        fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=k, spines=k)
        nics = [x.id for x in fab.nics]
        w = Workload("k", tuple(FlowSpec(i, nics[i], nics[k + i], 1e6) for i in range(k)))
        eff, mx = [], []
        for s in range(300 if k == 8 else 60):
            ss = steady_state_rates(fab, w, lb="random", seed=s)
            eff.append(ss.throughput_ratio)
            mx.append(100e9 / ss.rates_bps.min())
        rows.append({"item": f"single stage k={k} efficiency", "published": ref_eff, "ours": _ms(eff)})
        rows.append({"item": f"single stage k={k} E[max load]", "published": ref_max, "ours": _ms(mx)})
    cases = [("leaf-spine 8x8", leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=8), "0.608 +- 0.040", 20),
             ("leaf-spine 16x16", leaf_spine_fabric(leaves=16, hosts_per_leaf=16, spines=16), "0.560 +- 0.018", 20),
             ("leaf-spine 32x32", leaf_spine_fabric(leaves=32, hosts_per_leaf=32, spines=32), "0.525 +- 0.006", 10),
             ("fat tree 1024", fat_tree_1024(), "0.428 +- 0.005", 10)]
    for name, fab, ref, n in cases:
        n = min(n, 5) if quick else n
        rnd = [steady_state_rates(fab, permutation(fab, s), lb="random", seed=s).throughput_ratio for s in range(n)]
        crc = [steady_state_rates(fab, permutation(fab, s), lb="ecmp", hash_config=HashConfig(seed=s)).throughput_ratio
               for s in range(n)]
        rows.append({"item": f"{name} throughput/ideal, random paths ({n} perms)", "published": ref, "ours": _ms(rnd)})
        rows.append({"item": f"{name} throughput/ideal, crc32 per-switch seeds", "published": "-", "ours": _ms(crc)})
        if name == "fat tree 1024":
            pol = [steady_state_rates(fab, permutation(fab, s), lb="ecmp",
                                      hash_config=HashConfig(seed=s, per_switch_seed=False)).throughput_ratio
                   for s in range(n)]
            rows.append({"item": "fat tree 1024 throughput/ideal, crc32 same seed everywhere (polarized)",
                         "published": "-", "ours": _ms(pol)})
    fab = fat_tree_1024()
    nics = [x.id for x in fab.nics]
    lone = simulate(fab, Workload("lone", (FlowSpec(0, nics[0], nics[1000], 2e6),)))
    rows.append({"item": "lone flow FCT us", "published": 176.2, "ours": round(float(lone.fct_ns[0] / 1e3), 2)})
    for scheme, pub in (("ecmp", "403.2-473.3 / 385.2-450.0 / 756.1-922.1 / 889.9-1063.0 (fluid [C]: 433/480/800/960)"),
                        ("spray", "193.2-193.9 / 193.2-194.5 / 199.6-200.2 / 200.5-203.4")):
        stats = [simulate(fab, permutation(fab, s), lb=scheme, hash_config=HashConfig(seed=s),
                          record_utilization=False).fct_stats_us() for s in range(2 if quick else 5)]
        ours = " / ".join(_sd([x[k] for x in stats]) for k in ("mean", "p50", "p99", "max"))
        rows.append({"item": f"1024-host permutation FCT {scheme} mean/p50/p99/max us", "published": pub, "ours": ours})
    for spines, pub in ((8, "median 622 / max 786 (fluid 620)"), (4, "median 1223 / max 1443 (fluid 1240)")):
        ls = leaf_spine_fabric(leaves=32, hosts_per_leaf=32, spines=spines)
        st = [simulate(ls, permutation(ls, s), lb="spray", record_utilization=False).fct_stats_us()
              for s in range(2 if quick else 5)]
        rows.append({"item": f"oversubscribed {32 // spines}:1 spray median / max us", "published": pub,
                     "ours": f"{_sd([x['p50'] for x in st])} / {_sd([x['max'] for x in st])}"})
    return rows


def _sd(xs: list[float]) -> str:
    """Mean +- sample std over seeds (the spread every seed-averaged number is shown with)."""
    return f"{np.mean(xs):.1f} +- {np.std(xs, ddof=1):.1f}" if len(xs) > 1 else f"{xs[0]:.1f} (one seed)"


def bench_degraded(quick: bool) -> list[dict[str, object]]:
    """Issue 9: leaf-spine 8x8, 4 spines, one uplink at 25 %, permutation of 8 MiB; p99 per
    scheme healthy and degraded over seeds, and each degraded scheme against ECMP (paired
    95 % CI; "within seed spread" when it contains 0)."""
    from fabricscope.sim.scenario import run_scenario, scenario_from_flags

    seeds = list(range(3 if quick else 8))
    sc = scenario_from_flags(topo="leaf-spine:leaves=8,hosts_per_leaf=8,spines=4", workload="permutation:size=8MiB",
                             lb="ecmp,spray,dlb", degrade=["leaf-001~spine-01=25%"], seeds=seeds)
    res = run_scenario(sc, record_utilization=False)
    rows: list[dict[str, object]] = []
    for label in res.labels():
        p99 = list(res.seed_values(label).values())
        row: dict[str, object] = {"case": label, "seeds": len(p99), "p99_us": _sd(p99)}
        if "(faults)" in label and not label.startswith("ecmp"):
            d = res.difference("ecmp (faults)", label)
            row["vs ecmp (faults)"] = f"{d.mean:+.1f} +- {d.ci95:.1f} us: {d.verdict}" if d.ci95 is not None else d.verdict
        rows.append(row)
    return rows


def _print(title: str, rows: list[dict[str, object]]) -> None:
    print(f"\n== {title} ==")
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    print("  ".join(k.ljust(w[k]) for k in keys))
    for r in rows:
        print("  ".join(str(r.get(k, "")).ljust(w[k]) for k in keys))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer trials and sizes")
    ap.add_argument("--big", action="store_true", help="also the 1M-flow all-to-all (minutes)")
    ap.add_argument("--scaling-case", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--big-case", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=("speed", "scaling", "reproduce", "degraded"),
                    help="run one section and update it in the existing results file")
    args = ap.parse_args()
    if args.scaling_case:
        print(json.dumps(scaling_case(args.scaling_case)))
        return
    if args.big_case:
        print(json.dumps(big_case()))
        return
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    out: dict[str, object] = {"machine": machine}
    if args.only:
        sections = {"speed": bench_speed, "scaling": bench_scaling, "reproduce": bench_reproduce,
                    "degraded": bench_degraded}
        old = json.loads(OUT.read_text()) if OUT.exists() else {}
        old[args.only] = rows = sections[args.only](args.quick)
        _print(args.only, rows)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(old, indent=2, default=str) + "\n")
        print(f"\nupdated {args.only} in {OUT}")
        return
    out["speed"] = rows = bench_speed(args.quick)
    _print("speed: 1024-host fat tree, permutation of 2 MB flows (target ECMP < 1 s)", rows)
    out["scaling"] = rows = bench_scaling(args.quick)
    _print("scaling: ECMP permutation of 8 MiB flows on rail-optimized fabrics", rows)
    if args.big:
        p = subprocess.run([sys.executable, __file__, "--big-case"], capture_output=True, text=True, timeout=3600)
        big = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-500:]}
        out["big"] = [big]
        _print("1M flows", [big])
    out["reproduce"] = rows = bench_reproduce(args.quick)
    _print("reproductions (SIMULATION.md)", rows)
    out["degraded"] = rows = bench_degraded(args.quick)
    _print("one uplink at 25 %: p99 per scheme over seeds", rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)) + "\n")
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
