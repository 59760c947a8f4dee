"""Demo part "sim": what-if on a rail-optimized cluster: ECMP vs spraying vs DLB, healthy
and with a failed leaf uplink; prints the comparison table and writes the plots."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fabricscope.service.sim_report import format_table, write_report
from fabricscope.sim.scenario import parse_scenario, prepare, run_scenario, uplinks


def run(
    *, seed: int, outdir: Path, echo: Callable[[str], None], quick: bool = False
) -> dict[str, object]:
    """Run the what-if and return a JSON-able summary (see :mod:`fabricscope.service.demo`).

    Default cluster: 64 servers x 8 GPUs/NICs (512 GPUs, 400G NICs, 16 servers per leaf,
    non-blocking); quick mode: 16 servers x 8, 4 per leaf. Workload: a random permutation of
    8 MiB flows between all NICs (cross-rail traffic must climb to the spines, the case
    where load balancing matters). The failed link is the first leaf->spine uplink.
    """
    from fabricscope.fabric.catalog import build_fabric

    params: dict[str, object] = (
        {"servers": 16, "servers_per_leaf": 4} if quick else {"servers": 64, "servers_per_leaf": 16}
    )
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
            "seeds": [seed],
        },
        source="demo sim",
    )
    prep = prepare(sc)
    echo(
        f"fabric {prep.fabric.name}: {len(prep.fabric.nics)} GPUs/NICs, "
        f"{len(prep.fabric.switches)} switches; workload: permutation of 8 MiB flows; "
        f"injected: link-down {failed}"
    )
    result = run_scenario(prep)
    echo(format_table(result))
    rows = {str(r["scheme"]): r for r in result.table()}

    def p99(label: str) -> float:
        v = rows[label]["fct_p99_us"]
        return float(v) if isinstance(v, int | float) else float("nan")

    best = min(("ecmp", "spray", "dlb"), key=lambda s: p99(f"{s} (faults)"))
    echo(
        f"with the uplink down, p99 FCT: ECMP {p99('ecmp (faults)'):.0f} us, "
        f"spraying {p99('spray (faults)'):.0f} us, DLB {p99('dlb (faults)'):.0f} us -> {best} copes best; "
        f"unroutable flows: {sum(int(r['unroutable']) for r in rows.values() if isinstance(r['unroutable'], int))}"
    )
    files = write_report(result, outdir)
    for kind, path in files.items():
        echo(f"{kind}: {path}")
    return {
        "fabric": prep.fabric.name,
        "gpus": len(prep.fabric.nics),
        "injected": {"kind": "link-down", "link": failed},
        "table": result.table(),
        "best_under_failure": best,
        "files": {k: str(v) for k, v in files.items()},
    }
