"""Composition for live probing: plan -> agent (responder + prober) -> store, and
store -> analysis -> findings.

Paths on live hosts come from a traceroute cache (``--paths``, JSON written by
:mod:`fabricscope.probe.traceroute` tools) when available; otherwise each flow's candidate
path set from the inventory's ECMP next hops (weights = even split per hop), which the
localizer accepts (it then blames the links shared by the lossy flows' candidate sets).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding, FiveTuple, ProbeSample
from fabricscope.probe.agent import Prober, Responder
from fabricscope.probe.analysis import Baseline, Observations, analyze
from fabricscope.probe.localize import PathModel
from fabricscope.probe.plan import plan_probes
from fabricscope.store.probes import ProbeStore, write_jsonl


def self_nics(fabric: Fabric, self_id: str) -> list[str]:
    """NIC ids for ``--self``: a NIC id, or a host id (all its NICs)."""
    d = fabric.devices.get(self_id)
    if d is None:
        raise ConfigError(f"--self {self_id!r}: no such host or NIC in inventory {fabric.name!r}")
    if d.role == "nic":
        return [d.id]
    if d.role == "host":
        return [n.id for n in fabric.nics_of_host[d.id]]
    raise ConfigError(f"--self {self_id!r}: is a {d.role}, expected a host or a NIC")


async def run_agent(
    fabric: Fabric,
    self_id: str,
    *,
    seed: int = 0,
    rate_pps: float = 100.0,
    duration_s: float = 0.0,
    epoch_s: float = 30.0,
    db: Path | None = None,
    jsonl: Path | None = None,
    echo: Callable[[str], None] = print,
    flush_every: int = 2000,
    stop: asyncio.Event | None = None,
) -> dict[str, int]:
    """Run responders and probers for ``self_id``'s NICs; re-draw the plan every epoch.

    Stops after ``duration_s`` (0: until ``stop`` is set or cancelled). Returns counters.
    """
    nics = self_nics(fabric, self_id)
    store = ProbeStore(db) if db is not None else None
    fh = open(jsonl, "a", encoding="utf-8") if jsonl is not None else None  # noqa: SIM115
    buf: list[tuple[ProbeSample, int]] = []
    totals = {"samples": 0, "lost": 0, "foreign_or_malformed": 0}

    def flush() -> None:
        if not buf:
            return
        if store is not None:
            store.insert([s for s, _ in buf], [st for _, st in buf])
        if fh is not None:
            write_jsonl(buf, fh)
            fh.flush()
        buf.clear()

    def sink(s: ProbeSample, status: int) -> None:
        buf.append((s, status))
        totals["samples"] += 1
        totals["lost"] += s.t_recv_ns is None
        if len(buf) >= flush_every:
            flush()

    responders = []
    for n in nics:
        addr = fabric.devices[n].address
        if addr is None:
            raise ConfigError(f"inventory {fabric.name}: NIC {n} has no address")
        responders.append(await Responder(addr).start())
    stop = stop or asyncio.Event()
    t_end = time.monotonic() + duration_s if duration_s > 0 else None
    epoch = int(time.time() // epoch_s)
    try:
        while not stop.is_set():
            probers = []
            for n in nics:
                plan = plan_probes(fabric, n, seed=seed, epoch=epoch, budget_pps=rate_pps,
                                   epoch_s=epoch_s)
                probers.append(await Prober(n, plan.flows(fabric), sink, rate_pps=rate_pps).start())
            echo(f"epoch {epoch}: probing {sum(len(p._flow_specs) for p in probers)} flows from "
                 f"{', '.join(nics)} at {rate_pps:g} probes/s per NIC")
            next_epoch = (epoch + 1) * epoch_s
            while not stop.is_set() and time.time() < next_epoch:
                if t_end is not None and time.monotonic() >= t_end:
                    stop.set()
                    break
                await asyncio.sleep(0.2)
                flush()
            for p in probers:
                await p.stop(drain_s=1.0)
                for reason, cnt in p.counters.rejected.items():  # "late": a reply after the timeout (counted lost)
                    key = f"prober_rejected_{reason}"
                    totals[key] = totals.get(key, 0) + cnt
            epoch += 1
    finally:
        for r in responders:
            totals["foreign_or_malformed"] += sum(r.counters.rejected.values())
            for reason, cnt in r.counters.rejected.items():  # per reason (magic, version, short, ...)
                key = f"foreign_or_malformed_{reason}"
                totals[key] = totals.get(key, 0) + cnt
            await r.stop()
        flush()
        if store is not None:
            store.close()
        if fh is not None:
            fh.close()
    return totals


def read_paths(path: Path, fabric: Fabric) -> dict[tuple[str, str, int, int], tuple[int, ...]]:
    """A traceroute path cache: JSON list of {src_ip, dst_ip, src_port, dst_port, links: [directed link ids]}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read path cache: {exc}") from None
    out: dict[tuple[str, str, int, int], tuple[int, ...]] = {}
    for i, row in enumerate(data):
        try:
            key = (str(row["src_ip"]), str(row["dst_ip"]), int(row["src_port"]), int(row["dst_port"]))
            out[key] = tuple(fabric.edge_index(x) for x in row["links"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: entry {i}: {exc}") from None
    return out


def live_path_model(fabric: Fabric, paths: Mapping[tuple[str, str, int, int], tuple[int, ...]] | None = None) -> PathModel:
    """Known paths where traced, else the candidate set (even split per hop)."""
    routing = Routing(fabric)
    known = paths or {}

    def resolve(src: str, dst: str, ft: FiveTuple) -> Sequence[int] | Mapping[int, float]:
        hit = known.get((ft.src_ip, ft.dst_ip, ft.src_port, ft.dst_port))
        if hit is not None:
            return hit
        return routing.spray_weights(src, dst)

    return PathModel(fabric, resolve)


def analyze_observations(fabric: Fabric, obs: Observations, *, method: str = "map",
                         paths: Mapping[tuple[str, str, int, int], tuple[int, ...]] | None = None,
                         baseline: Baseline | None = None) -> list[Finding]:
    """Findings of one window of stored live probes. Without a baseline, one is learned
    from the same window (robustly: the background loss rate trims implausible flows and
    the responder time is the fleet median)."""
    if baseline is None:
        baseline = Baseline()
        baseline.learn(obs, track_rtt=False)
    return analyze(fabric, live_path_model(fabric, paths), obs, baseline, method=method)
