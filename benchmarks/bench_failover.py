"""Benchmark: a link fails under running traffic; how long each load balancer takes to give the
affected flows 90 % of their goodput back (docs/benchmarks/failover.md).

The fluid transport engine (NSCC senders, UEC lossy switches) runs a permutation of flows that
outlast the run; at ``--fail-at`` one leaf-spine cable goes down (both directions). Schemes
(:mod:`fabricscope.sim.transport.failover`): ECMP re-hashing after routing reconverged,
oblivious spraying (re-spread after reconvergence), REPS (senders stop recycling the entropies
that lose packets), switch adaptive routing (the switch whose port failed moves its traffic at
once; the far end only at reconvergence). The cable: the first uplink of the first leaf (ToR)
that an ECMP flow of the seed's permutation uses.

    python benchmarks/bench_failover.py [--quick] [--converge-us 1000] [--plot docs/img/failover.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.flows import Workload
from fabricscope.sim.transport import FluidTransport, TransportConfig
from fabricscope.sim.transport.failover import FAILOVER_SCHEMES, FailoverRun, failover_run
from fabricscope.sim.workload.traffic import permutation

OUT = Path(__file__).parent / "results" / "failover.json"


def _uplink_in_use(fab: Fabric, w: Workload, device: str, up_role: str, seed: int) -> str:
    """The first cable from ``device`` up to a ``up_role`` switch that an ECMP flow of ``w``
    uses going up (so that every scheme has flows on it)."""
    ix = fab.index
    ecmp = FluidTransport(fab, w, config=TransportConfig(cc="nscc"), lb="ecmp", seed=seed)
    used = {ix.edge_id(int(e)) for e in ecmp.segs.edge}
    for lk in fab.links:
        for mine, other in ((lk.a, lk.b), (lk.b, lk.a)):
            if mine.split(":")[0] == device and other.startswith(up_role) and f"{mine}->{other}" in used:
                return f"{lk.a}|{lk.b}"
    raise SystemExit(f"error: no ECMP flow of seed {seed} goes up from {device}")


def _case(label: str, fab: Fabric, where: tuple[str, str], seed: int, args: Any,
          runs: dict[str, list[FailoverRun]]) -> list[dict[str, object]]:
    w = permutation(fab, 1e12, seed=seed)
    link = _uplink_in_use(fab, w, where[0], where[1], seed)
    rows: list[dict[str, object]] = []
    for scheme in FAILOVER_SCHEMES:
        t0, c0 = time.perf_counter(), time.process_time()
        r = failover_run(fab, w, scheme=scheme, link=link, fail_at_ns=args.fail_at_us * 1e3,
                         until_ns=(args.fail_at_us + args.converge_us + args.after_us) * 1e3,
                         converge_ns=args.converge_us * 1e3, bin_ns=args.bin_us * 1e3, seed=seed)
        row = {"case": label, "seed": seed, "link": link, **r.to_dict(),
               "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2)}
        rows.append(row)
        runs.setdefault(label, []).append(r)
        print(row, flush=True)
    return rows


def _table(rows: list[dict[str, object]]) -> str:
    lines = ["| case | seed | scheme | flows hit | lowest goodput | at the end | re-routes at (us) | back at 90 % after (us) | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = r["recovery_us"]
        lines.append(f"| {r['case']} | {r['seed']} | {r['scheme']} | {r['n_affected']} | {float(r['min_fraction']):.0%} | "  # type: ignore[arg-type]
                     f"{float(r['end_fraction']):.0%} | "  # type: ignore[arg-type]
                     f"{', '.join(f'{x:g}' for x in r['reroute_us'])} | "  # type: ignore[attr-defined]
                     f"{'not by the end' if rec is None else 'never below' if rec == 0 else rec} | {r['wall_s']} |")
    return "\n".join(lines)


def _plot(runs: dict[str, list[FailoverRun]], converge_us: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(runs)
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 3.2 * len(cases)), squeeze=False)
    for ax, label in zip(axes[:, 0], cases, strict=True):
        for r in runs[label]:
            ax.plot(r.t_us, r.affected_gbps / max(r.pre_affected_gbps, 1e-9), label=r.scheme, lw=1.4)
        ax.axvline(0, color="k", lw=0.8)
        ax.axvline(converge_us, color="grey", ls=":", lw=1)
        ax.axhline(0.9, color="red", ls="--", lw=0.8)
        ax.text(converge_us, 0.05, " routing reconverged", color="grey", fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_xlim(-100, float(runs[label][0].t_us[-1]))
        ax.set_ylabel("goodput of the flows hit\n/ before the failure")
        ax.set_title(f"{label}: the cable goes down at t = 0 (first seed)", fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("time from the failure (us); red: 90 %")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 128-host fabric only (CI smoke run)")
    ap.add_argument("--fail-at-us", type=float, default=300.0, help="failure time (us); the flows settle before it")
    ap.add_argument("--converge-us", type=float, default=1000.0, help="routing reconvergence after the failure (us)")
    ap.add_argument("--after-us", type=float, default=1000.0, help="simulated time after reconvergence (us)")
    ap.add_argument("--bin-us", type=float, default=5.0, help="goodput bin (us)")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9",
                    help="seeds (permutation and entropies) of the 128-host leaf-spine; the others take the first 3 / 1")
    ap.add_argument("--plot", type=Path, default=None, help="write the goodput-over-time plot (PNG) here")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    runs: dict[str, list[FailoverRun]] = {}
    small = leaf_spine_fabric(leaves=8, hosts_per_leaf=16, spines=16)
    for sd in seeds[:1] if args.quick else seeds:
        rows += _case("leaf-spine 8 x 16, 16 spines (128 hosts)", small, ("leaf-000", "spine"), sd, args,
                      runs if sd == seeds[0] else {})
    if not args.quick:
        big = leaf_spine_fabric(leaves=32, hosts_per_leaf=32, spines=32)
        rows += _case("leaf-spine 32 x 32, 32 spines (1,024 hosts)", big, ("leaf-000", "spine"), seeds[0],
                      args, runs)
        ft = fat_tree_fabric(k=8)
        for sd in seeds[:3]:
            rows += _case("fat tree k = 8 (128 hosts), a ToR-aggregation cable", ft, ("tor-p00-00", "agg"),
                          sd, args, runs if sd == seeds[0] else {})
    table = _table(rows)
    print(table)
    out = {"machine": "2 shared CPU cores", "python": sys.version.split()[0],
           "fail_at_us": args.fail_at_us, "converge_us": args.converge_us, "bin_us": args.bin_us,
           "rows": rows, "total_wall_s": round(time.perf_counter() - t0, 1)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")
    if args.plot is not None:
        _plot(runs, args.converge_us, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
