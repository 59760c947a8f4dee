"""Demo part "sim": what-if on a rail-optimized cluster: ECMP vs spraying vs DLB, healthy
and with a failed leaf uplink, over three seeds; prints the comparison table with its seed
spread, says which differences exceed it, and writes the plots."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fabricscope.service.sim_report import format_comparisons, format_table, write_report
from fabricscope.sim.scenario import parse_scenario, prepare, run_scenario, uplinks


def run(
    *, seed: int, outdir: Path, echo: Callable[[str], None], quick: bool = False
) -> dict[str, object]:
    """Run the what-if and return a JSON-able summary (see :mod:`fabricscope.service.demo`).

    Default cluster: 64 servers x 8 GPUs/NICs (512 GPUs, 400G NICs, 16 servers per leaf,
    non-blocking); quick mode: 16 servers x 8, 4 per leaf. Workload: a random permutation of
    8 MiB flows between all NICs (cross-rail traffic must climb to the spines, the case
    where load balancing matters). The failed link is the first leaf->spine uplink.

    Three seeds (``seed``, ``seed + 1``, ``seed + 2``: three permutations): one seed's
    ECMP p99 is hash luck (a failed uplink re-hashes flows and can come out *faster*), so
    the table shows the spread and every conclusion says whether it exceeds it.
    """
    from fabricscope.fabric.catalog import build_fabric

    params: dict[str, object] = (
        {"servers": 16, "servers_per_leaf": 4} if quick else {"servers": 64, "servers_per_leaf": 16}
    )
    seeds = [seed, seed + 1, seed + 2]
    fabric = build_fabric("rail-optimized", params, source="demo sim")
    failed = uplinks(fabric)[0]
    sc = parse_scenario(
        {
            "name": "what-if: load balancing and a failed uplink",
            "topology": {"kind": "rail-optimized", "params": params},
            "workload": {"kind": "permutation", "size": "8MiB"},
            "lb": ["ecmp", "spray", "dlb"],
            "faults": [{"kind": "link-down", "link": failed}],
            "compare_healthy": True,
            "seeds": seeds,
            # 1 MiB flowlets: 8 re-routing decisions per 8 MiB flow keep DLB's run short.
            "flowlet_bytes": "1MiB",
        },
        source="demo sim",
    )
    prep = prepare(sc)
    echo(
        f"fabric {prep.fabric.name}: {len(prep.fabric.nics)} GPUs/NICs, "
        f"{len(prep.fabric.switches)} switches; workload: permutation of 8 MiB flows, "
        f"seeds {', '.join(map(str, seeds))}; injected: link-down {failed}"
    )
    result = run_scenario(prep)
    echo(format_table(result))
    rows = {str(r["scheme"]): r for r in result.table()}

    def p99(label: str) -> float:
        v = rows[label]["fct_p99_us"]
        return float(v) if isinstance(v, int | float) else float("nan")

    for line in format_comparisons(result):
        echo(line)
    ranked = sorted(("ecmp", "spray", "dlb"), key=lambda s: p99(f"{s} (faults)"))
    best = ranked[0]
    close = result.difference(f"{best} (faults)", f"{ranked[1]} (faults)")
    verdict = (
        f"{best} copes best" if close.verdict == "higher"
        else f"{best} and {ranked[1]} are within seed spread of each other"
    )
    echo(
        f"with the uplink down, p99 FCT (mean of {len(seeds)} seeds): ECMP {p99('ecmp (faults)'):.0f} us, "
        f"spraying {p99('spray (faults)'):.0f} us, DLB {p99('dlb (faults)'):.0f} us -> {verdict}; "
        f"unroutable flows: {sum(int(r['unroutable']) for r in rows.values() if isinstance(r['unroutable'], int))}"
    )
    files = write_report(result, outdir)
    for kind, path in files.items():
        echo(f"{kind}: {path}")
    return {
        "fabric": prep.fabric.name,
        "gpus": len(prep.fabric.nics),
        "seeds": seeds,
        "injected": {"kind": "link-down", "link": failed},
        "table": result.table(),
        "comparisons": [d.to_dict() for d in result.comparisons()],
        "best_under_failure": best,
        "best_is_clear": close.verdict == "higher",
        "files": {k: str(v) for k, v in files.items()},
    }
