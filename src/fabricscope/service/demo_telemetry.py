"""Demo part: the twin streams over real gNMI on loopback into the collector; findings vs injected faults.

Builds a twin of a small rail-optimized cluster on the wall clock, injects a micro-burst, a
gray link, a flapping link and a PFC storm at known times, serves it with the gNMI target on
127.0.0.1, runs the collector (SAMPLE for counters, watermarks and ECN; ON_CHANGE for
oper-status) into DuckDB, and scores what the detectors found against the ground truth.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.model.records import Finding
from fabricscope.service.gnmi_twin import twin_for
from fabricscope.sim.clock import WallClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.telemetry.collector import Collector
from fabricscope.telemetry.config import parse_config
from fabricscope.telemetry.target import GnmiTarget

NS = 1_000_000_000

# Which finding kinds count as detecting each fault kind.
EXPECTED_KINDS: dict[str, tuple[str, ...]] = {
    "micro-burst": ("micro-burst", "queue-buildup"),
    "congestion": ("micro-burst", "queue-buildup"),
    "gray-loss": ("error-counter-increase",),
    "link-flap": ("link-flap",),
    "link-down": ("link-down", "link-flap"),
    "pfc-storm": ("pause-storm",),
}


def fault_ports(fabric: Fabric, f: Fault) -> set[str]:
    """Ports where a detector may legitimately see fault ``f`` (both ends of its link)."""
    s = f.subject
    if "->" in s:
        a, b = s.split("->")
        return {a, b}
    if "|" in s:
        return set(s.split("|"))
    if s in fabric.peer_port:
        return {s, fabric.peer_port[s]}
    return {p for p in fabric.ports_of.get(s, ())}


@dataclass(frozen=True)
class Match:
    fault: Fault
    finding: Finding | None

    @property
    def delay_ns(self) -> int | None:
        return None if self.finding is None else max(0, self.finding.window[0] - self.fault.start_ns)


def match_findings(fabric: Fabric, faults: Sequence[Fault], findings: Sequence[Finding]) -> tuple[list[Match], list[Finding]]:
    """Pair each fault with the earliest finding of an expected kind on one of its ports
    (at or after the fault start); return the pairs and the findings nobody explains."""
    used: set[int] = set()
    matches: list[Match] = []
    for f in faults:
        ports = fault_ports(fabric, f)
        kinds = EXPECTED_KINDS.get(f.kind, ())
        best: tuple[int, int] | None = None
        for i, g in enumerate(findings):
            if g.kind in kinds and g.subject in ports and g.window[1] >= f.start_ns and (
                    f.end_ns is None or g.window[0] <= f.end_ns + 5 * NS) and (best is None or g.window[0] < best[0]):
                best = (g.window[0], i)
        if best is not None:
            used.add(best[1])
        matches.append(Match(f, findings[best[1]] if best else None))
    explained = set(used)
    for i, g in enumerate(findings):  # follow-on evidence of a matched fault is not a false alarm
        if i not in explained and any(g.subject in fault_ports(fabric, f) for f in faults):
            explained.add(i)
    return matches, [g for i, g in enumerate(findings) if i not in explained]


def _scenario(fabric: Fabric, t0: int, rng: np.random.Generator, quick: bool) -> list[Fault]:
    uplinks = sorted(p for p in fabric.peer_port
                     if fabric.devices[port_device(p)].role == "leaf"
                     and fabric.devices[port_device(fabric.peer_port[p])].role == "spine")
    a, b, c, d = (uplinks[i] for i in rng.choice(len(uplinks), 4, replace=False))
    s = 0.5 if quick else 1.0  # time scale; t0: every stream has its baseline
    return [
        Fault("micro-burst", a, t0 + int(0.3 * s * NS), t0 + int(0.3 * s * NS) + 8_000_000, {"depth_bytes": 6e6}),
        Fault("gray-loss", f"{b}->{fabric.peer_port[b]}", t0 + int(0.7 * s * NS), None, {"loss": 0.002}),
        Fault("link-flap", f"{c}|{fabric.peer_port[c]}", t0 + int(1.1 * s * NS), t0 + int(3.5 * s * NS),
              {"period_ns": 0.8 * s * NS}),
        Fault("pfc-storm", d, t0 + int(1.9 * s * NS), t0 + int(3.9 * s * NS), {"rate": 60_000}),
    ]


async def _stream(fabric: Fabric, seed: int, clock: WallClock, outdir: Path, seconds: float, interval: str,
                  quick: bool) -> tuple[list[Finding], list[Fault], int, dict[str, object]]:
    twin = twin_for(fabric, utilization=0.3, seed=seed, clock=clock)
    target = GnmiTarget(twin)
    port = await target.start()
    names = [d.id for d in fabric.switches]
    db = outdir / "telemetry.duckdb"
    if db.exists():
        db.unlink()
    cfg = parse_config({
        "targets": {"twin": {"address": f"127.0.0.1:{port}", "names": names}},
        "subscriptions": {
            "counters": {"paths": ["/interfaces/interface[name=*]/state/counters",
                                   "/interfaces/interface[name=*]/ethernet/state/counters"],
                         "sample-interval": interval},
            "queues": {"paths": ["/fabricscope/qos/interfaces/interface[interface-id=*]/queues/queue[name=3]/state"],
                       "sample-interval": interval},
            "status": {"paths": ["/interfaces/interface[name=*]/state/oper-status"], "stream-mode": "on-change",
                       "heartbeat-interval": "10s"},
        },
        "detectors": {"micro-burst": {}, "error-increase": {}, "link-flap": {}, "pause-storm": {}},
        "sinks": [{"type": "duckdb", "path": str(db)}],
        "buffer": {"flush-interval": "100ms"},
    }, source="demo")
    col = Collector(cfg)
    try:
        task = asyncio.create_task(col.run())
        # Inject only once every stream has its baseline (start-up time varies with machine load).
        n_streams = len(names) * len(cfg.subscriptions)
        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 30 and (
                len(col.stats.targets) < n_streams or any(st.syncs == 0 for st in col.stats.targets.values())):
            await asyncio.sleep(0.05)
        t0 = clock.now_ns()
        faults = _scenario(fabric, t0, np.random.default_rng(seed), quick)
        twin.set_faults(FaultSchedule.of(faults))
        await asyncio.sleep(seconds)
        col.stop()
        stats = await task
    finally:
        await target.stop()
        col.close()
    from fabricscope.store.telemetry import TelemetryStore

    store = TelemetryStore(db)
    findings = store.findings()
    rows = store.count()
    store.close()
    return findings, faults, t0, {"updates": stats.received, "rows": rows, "bytes_on_wire": target.bytes_sent,
                                  "targets": len(names), "port": port}


def run(*, seed: int, outdir: Path, echo: Callable[[str], None], quick: bool = False) -> dict[str, object]:
    """Stream the twin over gNMI into the collector and score the findings against the faults."""
    fabric = rail_optimized_fabric(servers=4 if quick else 8)
    clock = WallClock()
    seconds = 3.0 if quick else 6.0
    interval = "250ms" if quick else "500ms"
    wall0 = time.perf_counter()
    findings, faults, t0, stats = asyncio.run(_stream(fabric, seed, clock, outdir, seconds, interval, quick))
    matches, unexplained = match_findings(fabric, faults, findings)
    echo(f"twin {fabric.name}: {stats['targets']} switches served over gNMI on 127.0.0.1:{stats['port']}, "
         f"{stats['updates']} updates in {time.perf_counter() - wall0:.1f} s -> DuckDB ({stats['rows']} rows), "
         f"sample interval {interval}")
    # subject last: on a narrow terminal only the long link ids wrap, the columns stay aligned
    echo(f"{'injected fault':<14} {'at':>6} {'detected as':<22} {'delay':>6}  subject (finding on)")
    for m in matches:
        at = (m.fault.start_ns - t0) / NS
        if m.finding is None:
            echo(f"{m.fault.kind:<14} {at:>5.2f}s {'-- missed --':<22} {'':>6}  {m.fault.subject}")
        else:
            echo(f"{m.fault.kind:<14} {at:>5.2f}s {m.finding.kind:<22} {m.delay_ns / 1e6:>4.0f}ms  "  # type: ignore[operator]
                 f"{m.fault.subject} ({m.finding.subject})")
    echo(f"detected {sum(m.finding is not None for m in matches)}/{len(matches)} faults; "
         f"{len(unexplained)} finding(s) not explained by an injected fault")
    summary: dict[str, object] = {
        "fabric": fabric.name, **stats,
        "faults": [{"kind": m.fault.kind, "subject": m.fault.subject, "at_s": (m.fault.start_ns - t0) / NS,
                    "detected": m.finding is not None,
                    "finding": None if m.finding is None else m.finding.kind,
                    "delay_ms": None if m.delay_ns is None else m.delay_ns / 1e6} for m in matches],
        "detected": sum(m.finding is not None for m in matches),
        "false_findings": len(unexplained),
    }
    (outdir / "telemetry.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
