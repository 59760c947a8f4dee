"""Demo part: a training job on the twin with an injected slow NIC, localized from its traces."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

_FAULTS = ("none", "slow-gpu", "slow-nic", "link-degraded", "congestion", "switch-fault",
           "stage-imbalance", "sequence-imbalance")


def _fault(kind: str, fabric: Any, placement: list[tuple[str, int]], *, pp: int,
           start_ns: int, rng_pick: int) -> list[Any]:
    from fabricscope.model.errors import ConfigError
    from fabricscope.sim.faults import Fault

    if kind not in _FAULTS:
        raise ConfigError(f"--fault: unknown {kind!r}; choose one of {', '.join(_FAULTS)}")
    host, gpu = placement[rng_pick % len(placement)]
    nic = fabric.nic_of_gpu(host, gpu).id
    port = fabric.ports_of[nic][0]
    cable = fabric.link_of_port[port].id
    if kind == "none":
        return []
    if kind == "slow-gpu":
        return [Fault("slow-gpu", f"{host}/gpu{gpu}", start_ns, params={"factor": 1.6})]
    if kind == "slow-nic":
        return [Fault("slow-nic", nic, start_ns, params={"factor": 0.1})]
    if kind == "link-degraded":
        return [Fault("link-degraded", cable, start_ns, params={"factor": 0.25})]
    if kind == "congestion":
        peer = fabric.peer_port[port]
        return [Fault("congestion", f"{peer}->{port}", start_ns, params={"load": 0.75})]
    if kind == "switch-fault":
        leaf = fabric.leaves_of_nic[nic][0]
        return [Fault("switch-fault", leaf, start_ns, params={"factor": 0.3})]
    if kind == "stage-imbalance":
        return [Fault("stage-imbalance", "job", 0, params={"factor": 1.5, "stage": pp - 1})]
    return [Fault("sequence-imbalance", "job", 0, params={"cv": 0.35})]


def write_twin_scenario(
    outdir: pathlib.Path, *, fault: str = "slow-nic", dp: int = 4, tp: int = 2, pp: int = 2,
    iterations: int = 12, comm: str = "engine", seed: int = 0, schedule: str = "gpipe",
) -> dict[str, object]:
    """Generate a twin job with one fault and write its traces, truth and inventory.

    ``schedule="1f1b"`` also writes ``bytedance/trace-twin.parquet`` in ByteDance's schema
    (OSDI'25).
    """
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.fabric.io import write_fabric
    from fabricscope.twin.tracegen import (
        TRACE_T0_NS,
        TwinJob,
        bytedance_parquet,
        generate_trace,
        nominal_iteration_ns,
        write_twin_traces,
    )

    job = TwinJob(dp=dp, tp=tp, pp=pp, microbatches=4, iterations=iterations,
                  schedule=schedule)
    gpus = 4 if tp <= 4 else tp
    servers = max(2, -(-job.world_size // gpus))
    fabric = rail_optimized_fabric(servers, gpus_per_server=gpus, radix=16)
    placement = [(h.id, g) for h in fabric.hosts for g in range(h.gpus)][: job.world_size]
    start = TRACE_T0_NS + (iterations // 3) * nominal_iteration_ns(job)
    faults = _fault(fault, fabric, placement, pp=pp, start_ns=start, rng_pick=seed * 7 + 5)
    trace = generate_trace(fabric, job, faults=faults, comm=comm, seed=seed)
    outdir.mkdir(parents=True, exist_ok=True)
    write_twin_traces(trace, outdir)
    if schedule == "1f1b":
        (outdir / "bytedance").mkdir(exist_ok=True)
        (outdir / "bytedance" / "trace-twin.parquet").write_bytes(bytedance_parquet(trace, tp))
    write_fabric(fabric, outdir / "inventory.json")
    return {"ranks": job.world_size, "injected": [f"{f.kind} {f.subject}" for f in faults]}


def run(*, seed: int, outdir: pathlib.Path, echo: Callable[[str], None],
        quick: bool = False) -> dict[str, object]:
    """Run a DP x TP x PP job on a rail-optimized twin, slow one NIC, localize it.

    Communication times come from the flow engine; the localizer reads only the Kineto
    files the twin wrote (and the inventory), never the injected truth.
    """
    from fabricscope.straggler.pipeline import analyze_paths
    from fabricscope.straggler.plot import plot_report

    t0 = time.perf_counter()
    outdir = pathlib.Path(outdir)
    run_dir = outdir / "straggler-twin"
    iterations = 8 if quick else 16
    info = write_twin_scenario(run_dir, fault="slow-nic", dp=4, tp=2, pp=4 if not quick else 2,
                               iterations=iterations, comm="engine", seed=seed)
    truth = json.loads((run_dir / "truth.json").read_text())
    _, report = analyze_paths([run_dir / "kineto"], inventory=run_dir / "inventory.json")
    plot = plot_report(report, outdir / "straggler-timeline.png")
    (outdir / "straggler-report.json").write_text(json.dumps(report.to_json(), indent=1))
    injected = truth["faults"][0]
    found = report.findings[0] if report.findings else None
    accept = set(truth["expected"][0].get("accept", [truth["expected"][0]["subject"]]))
    ok = found is not None and found.subject in accept
    echo(f"straggler: {info['ranks']}-rank DP4 x TP2 x PP{4 if not quick else 2} job on a "
         f"rail-optimized twin, {iterations} iterations, comm times from the flow engine")
    echo(f"  {'':10} {'kind':12} {'subject':24} {'when'}")
    first = found.details.get("first_iteration", "?") if found else "-"
    echo(f"  {'injected':10} {injected['kind']:12} {injected['subject']:24} "
         f"from t={injected['start_ns'] / 1e9:.2f}s (~iteration {iterations // 3})")
    if found is not None:
        echo(f"  {'found':10} {found.kind:12} {found.subject:24} from iteration {first}, "
             f"p={found.score:.2f}  {'OK' if ok else 'WRONG'}")
    else:
        echo(f"  {'found':10} nothing  WRONG")
    echo(f"  estimated slowdown {report.slowdown:.2f}x; plot {plot.name}")
    return {
        "ok": ok, "injected": injected, "found": found.subject if found else None,
        "kind": found.kind if found else None, "score": found.score if found else 0.0,
        "first_iteration": first, "slowdown": round(report.slowdown, 3),
        "plot": str(plot), "seconds": round(time.perf_counter() - t0, 2),
    }
