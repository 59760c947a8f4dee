"""Slow-node search on the twin (512 nodes) and expected vs twin busbw of all-reduce runs.

Cases:

* ``search``: 100 seeded scenarios with one slow node among 512 (random node, rate factor
  uniform in [0.5, 0.85]) and 100 with two, for the group scheme (Hwang binary splitting,
  all_reduce_perf on groups) and the pair scheme (pairs, then good partners); the tests of
  a round share a non-blocking leaf-spine (32 leaves x 16 hosts, 16 spines, 400G, ECMP),
  noise |N(0, 1.5%)| per test (and 33 scenarios each at 3%). Targets: <= 10 rounds and 100/100 for one; <= 2x the rounds
  for two.
* ``link``: one leaf-spine cable at half rate (no slow node): what the search reports.
* ``busbw``: expected (closed form) vs measured (event-driven twin run, 1% noise) busbw of
  ring all-reduce on a 16-server x 8-GPU rail-optimized fabric, 2 / 4 / 8 nodes, healthy
  and with a slow NIC, 1 MiB .. 1 GiB. Target: within 5%.

    python benchmarks/bench_slownode.py            # everything (about a minute)
    python benchmarks/bench_slownode.py --quick    # 20 scenarios each

Prints a table and writes ``benchmarks/results/slownode.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "slownode.json"


def _search(n_nodes: int, n_slow: int, scheme: str, scenarios: int,
            noise: float = 0.015) -> dict[str, Any]:
    from fabricscope.twin.collective_twin import random_scenario, run_plan_on_twin

    rounds: list[int] = []
    tests: list[int] = []
    ok = 0
    misses: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for seed in range(scenarios):
        truth = random_scenario(n_nodes, n_slow, 1000 * n_slow + seed)
        r = run_plan_on_twin(n_nodes, truth, seed, scheme=scheme, noise_rel=noise)
        rounds.append(r.rounds)
        tests.append(r.verdict.tests)
        if r.correct:
            ok += 1
        elif len(misses) < 5:
            misses.append({"seed": seed, "truth": truth, "verdict": r.verdict.to_json()})
    return {"case": "search", "nodes": n_nodes, "slow": n_slow, "scheme": scheme, "noise": noise,
            "scenarios": scenarios, "correct": ok, "rounds_max": max(rounds),
            "rounds_mean": statistics.mean(rounds), "tests_mean": statistics.mean(tests),
            "wall_s": time.perf_counter() - t0, "misses": misses}


def _link(scheme: str) -> dict[str, Any]:
    from fabricscope.twin.collective_twin import run_plan_on_twin, search_fabric

    fab = search_fabric(512)
    cable = next(ln.id for ln in fab.links if "leaf-005" in ln.id and "spine-03" in ln.id)
    r = run_plan_on_twin(512, {cable: 0.5}, 7, scheme=scheme)
    v = r.verdict
    return {"case": "link", "scheme": scheme, "cable": cable, "rounds": v.rounds,
            "slow_nodes": list(v.localized), "slow_pairs": [[p.a, p.b] for p in v.slow_pairs],
            "ambiguous": len(v.ambiguous), "transient": len(v.transient)}


def _busbw() -> dict[str, Any]:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.twin.collective_twin import expected_busbw, slow_faults, twin_rows

    fab = rail_optimized_fabric(16, gpus_per_server=8, nic_gbps=400, radix=16)
    sizes = [2**k for k in range(20, 31, 2)]
    rows: list[dict[str, Any]] = []
    worst = 0.0
    t0 = time.perf_counter()
    for nodes in (2, 4, 8):
        for slow in (None, {"host0001": 0.6}):
            exp = expected_busbw(fab, "all_reduce_perf", nodes * 8, sizes, gpus_per_node=8,
                                 faults=slow_faults(fab, slow))
            _, meas = twin_rows(fab, "all_reduce_perf", nodes, sizes, slow=slow, seed=nodes,
                                noise_rel=0.01)
            _, clean = twin_rows(fab, "all_reduce_perf", nodes, sizes, slow=slow,
                                 noise_rel=0.0)
            for e, m, c in zip(exp, meas, clean, strict=True):
                dev = max(abs(b / e.busbw_gbs - 1) for b in m.busbw_gbs)
                worst = max(worst, dev)
                rows.append({"nodes": nodes, "slow": bool(slow), "size": e.size_bytes,
                             "expected_gbs": e.busbw_gbs, "bound": e.bound,
                             "measured_gbs": list(m.busbw_gbs),
                             "noise_free_ratio": c.busbw_gbs[0] / e.busbw_gbs,
                             "deviation": dev})
    return {"case": "busbw", "rows": rows, "worst_deviation": worst,
            "worst_noise_free": max(abs(r["noise_free_ratio"] - 1) for r in rows),
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 scenarios per case")
    args = ap.parse_args()
    n = 20 if args.quick else 100
    out: dict[str, Any] = {"machine": f"{platform.machine()} {platform.python_version()}",
                           "cases": []}
    print(f"{'scheme':7} {'slow':>4} {'noise':>5} {'correct':>9} {'rounds max':>10} {'mean':>6} "
          f"{'tests/search':>12} {'wall s':>7}")
    plan = [(s, k, 0.015, n) for s in ("group", "pair") for k in (1, 2)]
    plan += [(s, k, 0.03, max(10, n // 3)) for s in ("group", "pair") for k in (1, 2)]
    for scheme, k, noise, m in plan:
        r = _search(512, k, scheme, m, noise)
        out["cases"].append(r)
        print(f"{scheme:7} {k:4d} {noise:5.1%} {r['correct']:4d}/{m:<4d} {r['rounds_max']:10d} "
              f"{r['rounds_mean']:6.2f} {r['tests_mean']:12.1f} {r['wall_s']:7.1f}")
    for scheme in ("group", "pair"):
        r = _link(scheme)
        out["cases"].append(r)
        print(f"link {r['cable']} at 0.5, {scheme}: rounds {r['rounds']}, slow nodes "
              f"{r['slow_nodes']}, slow pairs {r['slow_pairs']}, ambiguous {r['ambiguous']}, "
              f"transient {r['transient']}")
    b = _busbw()
    out["cases"].append(b)
    print(f"busbw expected vs twin: worst deviation {b['worst_deviation']:.2%} (noise free "
          f"{b['worst_noise_free']:.2%}) over {len(b['rows'])} rows, {b['wall_s']:.1f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
