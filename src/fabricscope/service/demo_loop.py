"""Demo part: the closed loop: faults on the twin -> instruments -> incidents -> root cause +
action, scored against the injected truth (``fabricscope supervise`` on an embedded default)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _faults(seed: int, quick: bool) -> list[str]:
    from fabricscope.fabric.builders import rail_optimized_fabric

    f = rail_optimized_fabric(8)
    rng = np.random.default_rng(seed)
    leafs = [s.id for s in f.switches if s.role == "leaf"]
    leaf = leafs[int(rng.integers(len(leafs)))]
    down = [p for p in f.ports_of[leaf] if "host" in f.peer_port.get(p, "")]
    up = [p for p in f.ports_of[leaf] if "spine" in f.peer_port.get(p, "")]
    p_down = down[int(rng.integers(len(down)))]
    p_up = up[int(rng.integers(len(up)))]
    out = [f"gray-loss:{p_up}->{f.peer_port[p_up]}@30s,loss=0.03"]
    if not quick:
        out.append(f"pfc-storm:{p_down}@40s")
        out.append("slow-gpu:host0001/gpu2@50s,factor=1.8")
    return out


def run(*, seed: int, outdir: Path, echo: Callable[[str], None], quick: bool = False
        ) -> dict[str, object]:
    """Run ``supervise`` on an 8-server rail-optimized twin with injected faults; score it."""
    from fabricscope.service.supervise_loop import print_run, run_supervise

    faults = _faults(seed, quick)
    doc = run_supervise(twin="rail-optimized:servers=8", faults=faults,
                        duration="2m" if quick else "3m", tick="5s",
                        instruments="telemetry,probe,straggler,optics", seed=seed,
                        db=outdir / "incidents.duckdb")
    print_run(doc, echo=lambda line: echo(line.replace("[", "\\[")))  # console markup
    (outdir / "loop.json").write_text(json.dumps(doc, indent=1))
    sc = doc["score"]["faults"]
    found = sum(1 for s in sc if s["found"])
    times = [s["time_to_root_cause_s"] for s in sc if s["time_to_root_cause_s"] is not None]
    echo(f"closed loop: {found}/{len(sc)} injected faults diagnosed with the right root cause, "
         f"{len(doc['score']['false_positives'])} false positive(s); incidents in "
         f"{outdir / 'incidents.duckdb'} (fabricscope incidents list --db ...)")
    return {"ok": found == len(sc) and not doc["score"]["false_positives"],
            "found": found, "injected": len(sc),
            "false_positives": len(doc["score"]["false_positives"]),
            "time_to_root_cause_s": times, "incidents": len(doc["incidents"]),
            "db": str(outdir / "incidents.duckdb")}
