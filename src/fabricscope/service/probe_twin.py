"""Composition for probing the twin: plans -> twin transport -> observations -> analysis.

The twin's agents are emulated in bulk (every NIC cycles through its plan's flows at the
budget rate, :func:`~fabricscope.twin.probe_transport.round_robin_schedule`), the transport
decides what comes back, and the same pure analysis as on live hosts localizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from fabricscope.fabric.hashing import HashConfig
from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.records import Finding, FiveTuple
from fabricscope.probe.analysis import (
    ANSWERED,
    REPLY_LOST,
    REQUEST_LOST,
    Baseline,
    Observations,
    analyze,
)
from fabricscope.probe.localize import FindingTracker, PathModel
from fabricscope.probe.plan import ProbePlan, plan_mesh
from fabricscope.sim.faults import Fault, FaultSchedule, optic_mode
from fabricscope.twin.probe_transport import (
    FlowTable,
    ProbeBatch,
    ProbeTransport,
    round_robin_schedule,
)


def routing_resolver(routing: Routing) -> PathModel:
    """A path model whose paths come from the fabric's ECMP hashing (twin mode, flow by flow)."""

    def resolve(src: str, dst: str, ft: FiveTuple) -> tuple[int, ...]:
        return routing.path(src, dst, ft)

    return PathModel(routing.fabric, resolve)


def plan_arrays(fabric: Fabric, plans: dict[str, ProbePlan]) -> tuple[list[np.ndarray], ...]:
    """Per plan: (src nodes, dst nodes, src ports, dst ports) of its flows."""
    node = fabric.index.node_of
    out: tuple[list[np.ndarray], ...] = ([], [], [], [])
    for src, plan in plans.items():
        d = np.array([node[p.dst] for p in plan.peers for _ in p.src_ports], dtype=np.int64)
        sp = np.array([x for p in plan.peers for x in p.src_ports], dtype=np.int64)
        out[0].append(np.full(d.shape[0], node[src], dtype=np.int64))
        out[1].append(d)
        out[2].append(sp)
        out[3].append(np.full(d.shape[0], plan.dst_port, dtype=np.int64))
    return out


@dataclass
class TwinMesh:
    """A probed twin: plans for every NIC, flows registered with paths computed once.

    ``transport_for(faults, seed)`` gives a fresh transport sharing the flow registry (paths
    are the expensive part), so many fault scenarios reuse one mesh.
    """

    fabric: Fabric
    seed: int = 0
    budget_pps: float = 100.0
    epoch_s: float = 30.0
    hash_config: HashConfig = field(default_factory=HashConfig)
    plan_kw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.routing = Routing(self.fabric, hash_config=self.hash_config)
        self.plans: dict[str, ProbePlan] = plan_mesh(
            self.fabric, seed=self.seed, budget_pps=self.budget_pps, epoch_s=self.epoch_s,
            **self.plan_kw)
        self._proto = ProbeTransport(self.fabric, routing=self.routing, seed=self.seed)
        s, t, sp, dp = plan_arrays(self.fabric, self.plans)
        lens = [x.shape[0] for x in s]
        ids = self._proto.register_arrays(np.concatenate(s), np.concatenate(t),
                                          np.concatenate(sp), np.concatenate(dp))
        self.groups = np.split(ids, np.cumsum(lens)[:-1])
        fl = self._proto.flows
        self.model = PathModel(self.fabric)
        self.model.bind(fl, fl.src_node, fl.dst_node, self._proto.path_tables())
        self.hops = self.model.hops

    @property
    def flows(self) -> FlowTable:
        return self._proto.flows

    @cached_property
    def untraced_model(self) -> PathModel:
        """The path model a live deployment has without traceroute: every flow's candidate
        ECMP path set (even split per hop), as ``probe analyze`` without ``--paths`` uses."""
        fl = self._proto.flows
        model = PathModel(self.fabric)
        model.bind_candidates(fl, fl.src_node, fl.dst_node, spray=self.routing.spray_many)
        return model

    def transport_for(self, faults: FaultSchedule, seed: int, **kw: float) -> ProbeTransport:
        t = ProbeTransport(self.fabric, routing=self.routing, faults=faults, seed=seed, **kw)  # type: ignore[arg-type]
        # Share the registry: same flows, same paths.
        t.flows, t._flow_of, t._tables = self._proto.flows, self._proto._flow_of, self._proto._tables
        t._arrays = self._proto._padded()
        return t

    def probe(self, transport: ProbeTransport, *, start_ns: int, duration_ns: int,
              seed: int) -> Observations:
        flow, t = round_robin_schedule(self.groups, rate_pps=self.budget_pps, start_ns=start_ns,
                                       duration_ns=duration_ns, rng=np.random.default_rng(seed))
        return to_observations(transport.carry(flow, t), self.flows)


def to_observations(batch: ProbeBatch, flows: Sequence[tuple[str, str, FiveTuple]]) -> Observations:
    """The twin's columnar batch as the analysis' input (same columns, no copies)."""
    lost = batch.t_recv_ns < 0
    status = np.where(lost, np.where(batch.req_arrived, REPLY_LOST, REQUEST_LOST), ANSWERED)
    return Observations(flows, batch.flow, batch.t_send_ns, batch.t_resp_rx_ns,
                        batch.t_resp_tx_ns, batch.t_recv_ns, status.astype(np.int64))


@dataclass
class Timeline:
    """Findings of each evaluation step and the hysteresis tracker's open set."""

    steps: list[tuple[int, list[Finding], list[Finding]]] = field(default_factory=list)
    tracker: FindingTracker = field(default_factory=FindingTracker)


def learn_baseline(mesh: TwinMesh, *, seed: int, warmup_s: float = 10.0,
                   background_loss: float = 1e-5) -> Baseline:
    """Learn what normal looks like from a fault-free warm-up of the twin."""
    baseline = Baseline()
    clean = mesh.transport_for(FaultSchedule(), seed + 1, background_loss=background_loss)
    warm = mesh.probe(clean, start_ns=0, duration_ns=int(warmup_s * 1e9), seed=seed + 2)
    baseline.learn(warm, hops=mesh.hops, track_rtt=False)
    return baseline


def run_scenario(
    mesh: TwinMesh,
    faults: FaultSchedule,
    *,
    seed: int,
    duration_s: float = 30.0,
    step_s: float = 5.0,
    methods: Sequence[str] = ("map",),
    background_loss: float = 1e-5,
    baseline: Baseline | None = None,
    all_steps: bool = True,
) -> tuple[dict[str, Timeline], Observations, Baseline]:
    """Probe the twin for ``duration_s`` with ``faults`` (times relative to the start),
    analysing the growing window every ``step_s`` seconds with each method (methods after
    the first only at the end unless ``all_steps``).

    Without a ``baseline`` one is first learned on a fault-free warm-up.
    """
    s = int(1e9)
    if baseline is None:
        baseline = learn_baseline(mesh, seed=seed, background_loss=background_loss)
    tr = mesh.transport_for(faults, seed, background_loss=background_loss)
    obs = mesh.probe(tr, start_ns=0, duration_ns=int(duration_s * s), seed=seed + 3)
    out = {m: Timeline() for m in methods}
    t = step_s
    while t <= duration_s + 1e-9:
        # Send times are sorted, so the growing window is a prefix: slices, not copies.
        k = int(np.searchsorted(obs.t_send_ns, int(t * s)))
        w = Observations(obs.flows, obs.flow[:k], obs.t_send_ns[:k], obs.t_resp_rx_ns[:k],
                         obs.t_resp_tx_ns[:k], obs.t_recv_ns[:k],
                         None if obs.status is None else obs.status[:k])
        last = t + step_s > duration_s + 1e-9
        for i, m in enumerate(methods):
            if i > 0 and not last and not all_steps:
                continue
            f = analyze(mesh.fabric, mesh.model, w, baseline, method=m)
            out[m].steps.append((int(t * s), f, out[m].tracker.update(f, int(t * s))))
        t += step_s
    return out, obs, baseline


PROBE_FAULT_KINDS = ("gray-loss", "link-down", "link-delay", "congestion", "switch-fault",
                     "nic-fault", "cpu-starved")


def probe_visible(fault: Fault) -> bool:
    """Whether the probe transport models ``fault``: the kinds above, and an optic whose
    ``mode`` (aging-laser, dirty-connector, bent-fiber, hot-module) raises frame loss; the
    ``generic`` optic drift changes readings only."""
    if fault.kind in PROBE_FAULT_KINDS:
        return True
    return fault.kind == "optic-degrading" and optic_mode(fault) != "generic"


_ALIASES = {"gray": "gray-loss", "delay": "link-delay", "down": "link-down", "switch": "switch-fault",
            "nic": "nic-fault", "cpu": "cpu-starved"}


def parse_probe_fault(text: str, fabric: Fabric, *, source: str = "--fault") -> Fault:
    """A probe-visible fault from the command line, checked against ``fabric``.

    The twin's fault syntax (as ``gnmi serve-twin --fault``):
    ``"KIND SUBJECT [start=10s] [end=20s] [param=value ...]"``, e.g.
    ``"gray-loss spine-01:eth3->leaf-002:eth4 loss=0.05"``; also the compact
    ``KIND:SUBJECT,param=value,...`` (``gray:spine-01:eth3->leaf-002:eth4,loss=0.05``).
    Short kinds: gray, delay, down, switch, nic, cpu.
    """
    from fabricscope.model.errors import ConfigError, FabricscopeError
    from fabricscope.service.gnmi_twin import parse_fault

    text = text.strip()
    if " " not in text and ":" in text:
        kind, _, rest = text.partition(":")
        subject, *kvs = rest.split(",")
        text = " ".join([kind, subject, *kvs])
    head, _, tail = text.partition(" ")
    text = f"{_ALIASES.get(head, head)} {tail}"
    fault = parse_fault(text, source=source)
    if not probe_visible(fault):
        raise ConfigError(f"{source}: {text!r}: {fault.kind} is not visible to probes; "
                          f"choose one of {', '.join(PROBE_FAULT_KINDS)} or optic-degrading "
                          "with mode=aging-laser|dirty-connector|bent-fiber|hot-module")
    # Resolve the subject now (one clear line, not a failure deep in the transport).
    try:
        ProbeTransport(fabric, faults=FaultSchedule.of([fault]))
    except FabricscopeError as exc:
        raise ConfigError(f"{source}: {text!r}: {exc}") from None
    return fault


@dataclass(frozen=True)
class TwinRun:
    """What ``probe twin`` produced: the probes (also in ``db`` if given) and the mesh."""

    mesh: TwinMesh
    obs: Observations
    faults: FaultSchedule


def run_twin(fabric: Fabric, faults: Sequence[Fault], *, duration_s: float, seed: int = 0,
             rate_pps: float = 100.0, background_loss: float = 1e-5,
             db: str | None = None) -> TwinRun:
    """Probe the twin of ``fabric`` for ``duration_s`` with ``faults`` (times relative to the
    start), every NIC at ``rate_pps``; probes go to the DuckDB file ``db`` (table
    ``probes``, as ``probe agent`` writes it, so ``probe analyze --db`` reads it)."""
    from fabricscope.store.probes import ProbeStore

    mesh = TwinMesh(fabric, seed=seed, budget_pps=rate_pps)
    schedule = FaultSchedule.of(faults)
    tr = mesh.transport_for(schedule, seed, background_loss=background_loss)
    obs = mesh.probe(tr, start_ns=0, duration_ns=int(duration_s * 1e9), seed=seed + 1)
    if db is not None:
        store = ProbeStore(db)
        try:
            store.insert_observations(obs)
        finally:
            store.close()
    return TwinRun(mesh, obs, schedule)


def traced_paths(run: TwinRun) -> dict[tuple[str, str, int, int], tuple[int, ...]]:
    """The twin's true path of every probe flow, both directions, keyed like a traceroute
    path cache (what `lab trace` gives on live hosts)."""
    from fabricscope.probe.localize import reverse_tuple

    out: dict[tuple[str, str, int, int], tuple[int, ...]] = {}
    routing = run.mesh.routing
    for src, dst, ft in run.mesh.flows:
        for a, b, t in ((src, dst, ft), (dst, src, reverse_tuple(ft))):
            out[(t.src_ip, t.dst_ip, t.src_port, t.dst_port)] = routing.path(a, b, t)
    return out
