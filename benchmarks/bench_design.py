"""Design what-if targets (issue 13): port saving, Young/Daly vs DES, the 32k comparison's time.

Parts:

* ``ports``: switch ports per GPU of a rail-optimized design (spines per rail) against the
  standard fat tree at 8,192 and 32,768 GPUs, for 64- and 128-port switches, and the
  rail design with shared spines; the saving against the ~40% claim.
* ``checkpoint``: Young's and Daly's intervals and goodput against a discrete-event
  simulation of the same failure process (exponential failures during work, checkpoints
  and restarts): whether the closed form lies in the DES's 95% confidence interval, over a
  grid of checkpoint costs and MTBFs and at 0.5x / 1x / 2x the Daly interval.
* ``compare``: ``fabricscope design compare --gpus 32768`` on the four built-in designs,
  end to end in a subprocess (process start to result), with 2 workers and with 1; wall
  time and peak RSS.
* ``scaling``: the same designs from 1,024 to 32,768 GPUs (cost per GPU, step time and
  scaling efficiency under ECMP and spraying, in-order and random placement).

    python benchmarks/bench_design.py                  # everything (~10 min on 2 cores)
    python benchmarks/bench_design.py --parts ports,checkpoint

Prints tables and writes ``benchmarks/results/design.json``.
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
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "design.json"
BIN = Path(sys.executable).parent / "fabricscope"


def _ports() -> list[dict[str, object]]:
    from fabricscope.design.spec import DesignSpec, build_design

    rows: list[dict[str, object]] = []
    for radix in (64, 128):
        for gpus in (8192, 32768):
            ft = build_design(DesignSpec("ft", "fat-tree", {"radix": radix}), gpus)
            base = _switch_ports(ft)
            for mode in ("per-rail", "shared"):
                spec = DesignSpec("rail", "rail-optimized", {"radix": radix, "spine_mode": mode})
                try:
                    f = build_design(spec, gpus)
                except Exception as exc:  # a size the builder refuses is reported, not hidden
                    rows.append({"radix": radix, "gpus": gpus, "spine_mode": mode, "error": str(exc)})
                    continue
                p = _switch_ports(f)
                rows.append({
                    "radix": radix, "gpus": gpus, "spine_mode": mode,
                    "rail_tiers": f.meta["tiers"], "fat_tree_tiers": ft.meta["tiers"],
                    "rail_ports_per_gpu": p / gpus, "fat_tree_ports_per_gpu": base / gpus,
                    "rail_switches": len(f.switches), "fat_tree_switches": len(ft.switches),
                    "saving": 1 - p / base,
                })
    return rows


def _switch_ports(f: object) -> int:
    fab = f  # a Fabric
    nic_ports = sum(1 for p in fab.ports.values() if fab.devices[p.device].role == "nic")  # type: ignore[attr-defined]
    return 2 * len(fab.links) - nic_ports  # type: ignore[attr-defined]


def _checkpoint(runs: int) -> list[dict[str, object]]:
    import numpy as np

    from fabricscope.design.montecarlo import simulate_checkpointed_job
    from fabricscope.design.reliability import (
        daly_interval,
        exact_interval,
        goodput,
        young_interval,
    )

    rows: list[dict[str, object]] = []
    rng = np.random.default_rng(2026)
    for delta, mtbf_h, restart in ((60, 2.0, 600), (60, 8.0, 600), (300, 2.0, 900),
                                   (300, 24.0, 600), (1800, 3.0, 1800)):
        m = mtbf_h * 3600.0
        daly = daly_interval(delta, m)
        for mult in (0.5, 1.0, 2.0):
            tau = daly * mult
            des = simulate_checkpointed_job(work_s=100 * daly, tau_s=tau, checkpoint_s=delta,
                                            restart_s=restart, mtbf_s=m, runs=runs, rng=rng)
            lo, hi = des.wall_ci_s
            rows.append({
                "checkpoint_s": delta, "mtbf_h": mtbf_h, "restart_s": restart,
                "young_s": young_interval(delta, m), "daly_s": daly,
                "exact_s": exact_interval(delta, m), "tau_s": tau, "tau_over_daly": mult,
                "goodput_formula": goodput(tau, delta, restart, m), "goodput_des": des.goodput,
                "goodput_des_ci": des.goodput_ci, "wall_formula_s": des.closed_form_wall_s,
                "wall_des_ci_s": (lo, hi), "inside_ci": lo <= des.closed_form_wall_s <= hi,
                "runs": runs,
            })
    return rows


def _cli_run(args: list[str]) -> tuple[float, float, dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        p = subprocess.run([str(BIN), "design", "compare", *args, "--out", str(out)],
                           capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if p.returncode != 0:
            raise SystemExit(f"design compare failed: {p.stderr[-2000:]}")
        res = json.loads(out.read_text())
    return wall, max(before, after) / 2**20, res


def _compare() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for workers in (2, 1):
        wall, rss, res = _cli_run(["--gpus", "32768", "--workers", str(workers)])
        rows.append({
            "workers": workers, "wall_s": wall, "peak_rss_gib_max_child": rss,
            "cases": [{"name": r["name"], "tiers": r["tiers"], "seconds": r["seconds"],
                       "timings": r["timings"]} for r in res["designs"]],
            "result": [_brief(r) for r in res["designs"]],
            "port_saving": res["port_saving"],
        })
    return rows


def _brief(r: dict) -> dict[str, object]:  # type: ignore[type-arg]
    st = r["steps"]
    return {
        "name": r["name"], "gpus": r["gpus"], "tiers": r["tiers"],
        "cost_per_gpu_usd": r["bom"]["cost_per_gpu_usd"], "watts_per_gpu": r["bom"]["watts_per_gpu"],
        "switches": r["bom"]["switches"], "switch_ports": r["bom"]["switch_ports_used"],
        "transceivers": r["bom"]["transceivers"],
        **{f"{lb}_step_s": v["step_s"] for lb, v in st.items()},
        **{f"{lb}_efficiency": v["efficiency"] for lb, v in st.items()},
        **{f"degraded_{lb}_step_s": v["step_s"] for lb, v in (r.get("degraded") or {}).items()},
        "interruptions_per_day": r["interruptions"]["per_day"],
        "fabric_interruptions_per_day": sum(v for k, v in r["interruptions"]["by_component"].items()
                                            if k != "gpu"),
        "mtbf_h": r["interruptions"]["mtbf_s"] / 3600, "young_min": r["checkpoint"]["young_s"] / 60,
        "daly_min": r["checkpoint"]["daly_s"] / 60, "goodput": r["checkpoint"]["goodput_daly"],
        "mc_goodput_p5": (r["montecarlo"] or {}).get("goodput", {}).get("p5"),
        "mc_goodput_p95": (r["montecarlo"] or {}).get("goodput", {}).get("p95"),
        "fabric_availability": r["availability"]["fabric"],
        "degraded_fraction": r["availability"]["degraded"],
        "meets_99_99": r["availability"]["meets_target"],
    }


def _scaling() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    job = Path(tempfile.mkdtemp()) / "job.yaml"
    # Sprayed rings between random servers of a 3-tier 32k fabric would fill the spray
    # router's cache with tens of GB (24 GB, 7.6 min measured for the fat tree): the design
    # step refuses them (scaling.SPRAY_BUDGET_ENTRIES) and the row says "skipped".
    for placement, lbs in (("in-order", "[ecmp, spray]"), ("random", "[ecmp, spray]")):
        job.write_text(f"name: llm-70b\nplacement: {placement}\noverlap: 0.3\nlb: {lbs}\n")
        wall, _rss, res = _cli_run(["--gpus", "1024,4096,16384,32768", "--runs", "200",
                                    "--job", str(job), "--extrapolate", "131072"])
        for r in res["designs"]:
            rows.append({"placement": placement, **_brief(r),
                         "skipped": sorted(r.get("skipped") or {})})
        for e in res["extrapolated"]:
            rows.append({"placement": placement, "name": e["name"], "gpus": e["gpus"],
                         "analytical_step_s": e["step"]["step_s"],
                         "analytical_efficiency": e["step"]["efficiency"]})
        rows.append({"placement": placement, "wall_s": wall})
    return rows


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _table(rows: list[dict[str, object]], cols: list[str]) -> None:
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(_fmt(r.get(c, "")) for c in cols))
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="ports,checkpoint,compare,scaling")
    ap.add_argument("--des-runs", type=int, default=4000)
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    out: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load_avg_start": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if RESULTS.exists():
        old = json.loads(RESULTS.read_text())
        out = {**old, **out}
    def save() -> None:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=1, default=str) + "\n")

    if "ports" in parts:
        out["ports"] = rows = _ports()
        print("== switch ports per GPU: rail-optimized vs fat tree (claim ~40% fewer)")
        _table(rows, ["radix", "gpus", "spine_mode", "rail_tiers", "fat_tree_tiers",
                      "rail_ports_per_gpu", "fat_tree_ports_per_gpu", "saving"])
    save()
    if "checkpoint" in parts:
        out["checkpoint"] = rows = _checkpoint(a.des_runs)
        print("== Young / Daly vs discrete-event simulation")
        _table(rows, ["checkpoint_s", "mtbf_h", "restart_s", "young_s", "daly_s", "exact_s",
                      "tau_over_daly", "goodput_formula", "goodput_des", "inside_ci"])
    save()
    if "compare" in parts:
        out["compare"] = rows = _compare()
        print("== design compare --gpus 32768 (4 built-in designs), end to end")
        _table(rows, ["workers", "wall_s", "peak_rss_gib_max_child"])
        _table(rows[0]["result"], ["name", "tiers", "cost_per_gpu_usd", "watts_per_gpu",  # type: ignore[arg-type]
                                   "ecmp_step_s", "spray_step_s", "degraded_ecmp_step_s",
                                   "interruptions_per_day", "goodput", "fabric_availability"])
    save()
    if "scaling" in parts:
        out["scaling"] = rows = _scaling()
        print("== scaling 1k -> 32k (+131k analytical)")
        _table(rows, ["placement", "name", "gpus", "cost_per_gpu_usd", "ecmp_step_s",
                      "ecmp_efficiency", "spray_efficiency", "analytical_efficiency", "wall_s"])
    out["load_avg_end"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
