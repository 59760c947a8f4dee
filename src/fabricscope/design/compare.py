"""Compare fabric designs at given scales: cost, scaling efficiency and availability.

:func:`evaluate` answers everything for one design at one GPU count (one unit of work a
caller can run in a worker process); :func:`summarize` joins the units into the comparison
(the rail-vs-fat-tree port saving, the analytical extrapolation beyond the simulated scales,
the notes that say what each figure assumes). The JSON shape is documented in
docs/design-whatif.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fabricscope.design.blast import blast_radius
from fabricscope.design.bom import Bom, bill_of_materials
from fabricscope.design.catalog import Catalog, default_catalog
from fabricscope.design.model import BlastRow, FailureRate
from fabricscope.design.montecarlo import monte_carlo, simulate_checkpointed_job
from fabricscope.design.reliability import (
    DEFAULT_FAILOVER_S,
    DEFAULT_SURVIVE_S,
    availability,
    daly_interval,
    exact_interval,
    failure_table,
    goodput,
    interruptions,
    link_failure_rate,
    young_interval,
)
from fabricscope.design.scaling import (
    JobShape,
    SimulationTooLarge,
    StepTime,
    analytical_step,
    device_down,
    simulated_step,
)
from fabricscope.design.spec import DesignSpec, build_design
from fabricscope.fabric.inventory import Fabric

#: The published claim the port comparison is checked against (issue 13 / seed material).
RAIL_PORT_SAVING_CLAIM = 0.40


@dataclass(frozen=True)
class Options:
    """How much work :func:`evaluate` does (the defaults are the CLI's)."""

    runs: int = 1000
    des_runs: int = 2000
    seed: int = 0
    horizon_days: float = 30.0
    simulate: bool = True
    degraded: bool = True  # also simulate the step after a survivable failure (first lb)


def _rates_for(spec: DesignSpec, bom: Bom) -> dict[str, FailureRate]:
    """The failure table with each link class composed from the media the BOM chose."""
    table = failure_table(spec.failures or None, source=f"{spec.source}: failures")
    for row in bom.links:
        cls = f"link:{row.link_class}"
        if cls in (spec.failures or {}):
            continue  # the design gave this link class's rate itself
        per_link = row.transceivers // row.count if row.count else 0
        table[cls] = link_failure_rate(table, cls, per_link)
    return table


def _worst_survivable(fabric: Fabric, rows: Sequence[BlastRow]) -> tuple[str, str] | None:
    """The lowest-tier switch whose failure a whole-fabric job survives (it cuts no GPU).

    A multi-homed leaf (dual-ToR, multi-plane) where there is one, else a spine, else a
    core; the device is the first of its role in the inventory (the Clos is symmetric, so
    any one is typical). None when every switch failure cuts GPUs.
    """
    by = {r.component: r for r in rows}
    for comp in ("leaf", "spine", "core"):
        row = by.get(comp)
        if row is not None and row.gpus_cut == 0 and row.gpus_degraded > 0:
            dev = next((d.id for d in fabric.switches if d.role == comp), None)
            if dev is not None:
                return comp, dev
    return None


def evaluate(
    spec: DesignSpec,
    gpus: int,
    job: JobShape,
    *,
    catalog: Catalog | None = None,
    options: Options = Options(),
) -> dict[str, Any]:
    """Everything about ``spec`` at ``gpus`` GPUs, as a JSON-ready dict (see the module doc)."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, start: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - start, 3)
        return now

    fabric = build_design(spec, gpus)
    t = lap("build_s", t0)
    cat = (catalog or default_catalog())
    if spec.catalog:
        cat = cat.merged(spec.catalog, source=f"{spec.source}: catalog")
    bom = bill_of_materials(fabric, cat)
    t = lap("bom_s", t)
    rows = blast_radius(fabric)
    t = lap("blast_s", t)
    rates = _rates_for(spec, bom)
    intr = interruptions(rows, rates, job_gpus=gpus, total_gpus=gpus)
    avail = availability(rows, rates, total_gpus=gpus, checkpoint_s=job.checkpoint_s,
                         restart_s=job.restart_s)
    m = intr.mtbf_s
    d, r = job.checkpoint_s, job.restart_s
    daly = daly_interval(d, m)
    rng = np.random.default_rng([options.seed, gpus])
    checkpoint: dict[str, Any] = {
        "mtbf_s": m, "checkpoint_s": d, "restart_s": r, "young_s": young_interval(d, m),
        "daly_s": daly, "exact_s": exact_interval(d, m),
        "goodput_daly": goodput(daly, d, r, m) if math.isfinite(daly) else 1.0,
    }
    if math.isfinite(daly) and options.des_runs >= 2:
        des = simulate_checkpointed_job(work_s=daly * 100, tau_s=daly, checkpoint_s=d,
                                        restart_s=r, mtbf_s=m, runs=options.des_runs, rng=rng)
        checkpoint["des"] = asdict(des)
    mc = None
    if options.runs >= 2 and math.isfinite(daly):
        mc = monte_carlo(rows, rates, total_gpus=gpus, job_gpus=gpus,
                         horizon_h=options.horizon_days * 24.0, runs=options.runs, rng=rng,
                         tau_s=daly, checkpoint_s=d, restart_s=r)
    t = lap("reliability_s", t)
    steps: dict[str, dict[str, Any]] = {}
    degraded: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if options.simulate:
        for lb in job.lb:
            try:
                steps[lb] = simulated_step(fabric, job, lb=lb).to_json()
            except SimulationTooLarge as exc:
                skipped[lb] = str(exc)
        t = lap("simulate_s", t)
        worst = _worst_survivable(fabric, rows) if options.degraded else None
        if worst is not None:
            comp, dev = worst
            for lb in [x for x in job.lb if x in steps][:1]:
                st = simulated_step(fabric, job, lb=lb, faults=device_down(fabric, dev),
                                    fault_label=f"{comp} {dev} down")
                degraded[lb] = st.to_json()
            t = lap("simulate_degraded_s", t)
    else:
        st = analytical_step(job, gpus, nic_gbps=_nic_gbps(bom), tiers=_tiers(fabric))
        steps["analytical"] = st.to_json()
    return {
        "name": spec.name, "kind": spec.kind, "gpus": gpus, "tiers": _tiers(fabric),
        "fabric": fabric.name, "nic_gbps": _nic_gbps(bom), "notes": spec.notes,
        "bom": bom.to_json(),
        "blast": [asdict(b) for b in rows],
        "failure_rates": {k: asdict(v) for k, v in sorted(rates.items())},
        "interruptions": {
            "per_day": intr.per_day, "mtbf_s": intr.mtbf_s,
            "by_component": dict(intr.by_component), "probability": dict(intr.probability),
        },
        "availability": _availability_json(avail),
        "checkpoint": checkpoint,
        "montecarlo": asdict(mc) if mc is not None else None,
        "steps": steps,
        "degraded": degraded,
        "skipped": skipped,
        "failover_s": dict(DEFAULT_FAILOVER_S), "survive_s": DEFAULT_SURVIVE_S,
        "seconds": round(time.perf_counter() - t0, 3), "timings": timings,
    }


def _tiers(fabric: Fabric) -> int:
    t = fabric.meta.get("tiers")
    return int(t) if isinstance(t, int) else len({d.role for d in fabric.switches})


def _nic_gbps(bom: Bom) -> float:
    hl = [row for row in bom.links if row.link_class == "host-leaf"]
    ports = sum(row.count for row in hl)
    cap = sum(row.count * row.gbps for row in hl)
    return cap / bom.gpus if bom.gpus and ports else 0.0


def _availability_json(a: Any) -> dict[str, Any]:
    out = asdict(a)
    out["by_component"] = dict(a.by_component)
    out["notes"] = list(a.notes)
    return out


def port_saving(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Switch ports of each rail-optimized design against each fat tree at the same scale.

    Only designs with the same port speed compare (a dual-plane design's ports are half as
    fast, so its port count says nothing about this claim).

    ``saving = 1 - rail ports / fat-tree ports``; the seed material claims ~40% at 10k GPUs
    "while staying two-tier". It holds when the rail design stays at two tiers (three switch
    ports per GPU: leaf down, leaf up, spine down) where the fat tree needs three (five:
    ToR down and up, aggregation down and up, core), non-blocking: 1 - 3/5 = 40%.
    """
    out: list[dict[str, Any]] = []
    for ft in (r for r in rows if r["kind"] == "fat-tree"):
        for rr in (r for r in rows if r["kind"] == "rail-optimized" and r["gpus"] == ft["gpus"]
                   and math.isclose(float(r["nic_gbps"]), float(ft["nic_gbps"]))
                   and _port_gbps(r) == _port_gbps(ft)):
            a, b = int(rr["bom"]["switch_ports_used"]), int(ft["bom"]["switch_ports_used"])
            out.append({
                "gpus": ft["gpus"], "design": rr["name"], "tiers": rr["tiers"],
                "fat_tree": ft["name"], "fat_tree_tiers": ft["tiers"],
                "ports": a, "fat_tree_ports": b,
                "ports_per_gpu": a / ft["gpus"], "fat_tree_ports_per_gpu": b / ft["gpus"],
                "saving": 1.0 - a / b if b else 0.0, "claim": RAIL_PORT_SAVING_CLAIM,
                "holds": abs((1.0 - a / b) - RAIL_PORT_SAVING_CLAIM) <= 0.05 if b else False,
            })
    return out


def _port_gbps(row: Mapping[str, Any]) -> tuple[float, ...]:
    return tuple(sorted({float(t["port_gbps"]) for t in row["bom"]["tiers"]}))


def summarize(
    rows: Sequence[Mapping[str, Any]],
    specs: Sequence[DesignSpec],
    job: JobShape,
    *,
    extrapolate: Sequence[int] = (),
    options: Options = Options(),
) -> dict[str, Any]:
    """The comparison: every (design, scale) row, the port saving and the extrapolation."""
    ext: list[dict[str, Any]] = []
    for spec in specs:
        mine = [r for r in rows if r["name"] == spec.name]
        if not mine:
            continue
        big = max(mine, key=lambda r: r["gpus"])
        for g in extrapolate:
            if g <= big["gpus"]:
                continue
            tiers = big["tiers"] if g <= 2 * big["gpus"] else big["tiers"] + 1
            st: StepTime = analytical_step(job, g, nic_gbps=float(big["nic_gbps"]), tiers=tiers)
            ext.append({"name": spec.name, "gpus": g, "tiers_assumed": tiers,
                        "step": st.to_json()})
    notes = [
        "scaling: weak scaling (constant per-GPU batch); the DP gradient all-reduce is simulated "
        "as one steady ring step on the flow engine (max-min, no queues), "
        f"{job.placement} placement, {job.qps} QPs per ring connection under ECMP",
        "extrapolated rows are the alpha-beta ring at the full NIC rate with no collisions "
        "(analytical, not simulated), one more tier assumed past twice the largest built scale",
        "availability: first order (overlapping failures counted twice), failure rates from "
        "the documented default table unless the design overrides them",
        "cost: the fabric only (switches, optics, cables, fiber, NIC ports), catalog prices",
    ]
    return {
        "job": {k: v for k, v in asdict(job).items() if k != "source"},
        "options": asdict(options),
        "designs": list(rows),
        "port_saving": port_saving(rows),
        "extrapolated": ext,
        "notes": notes,
    }


__all__ = ["RAIL_PORT_SAVING_CLAIM", "Options", "evaluate", "port_saving", "summarize"]
