"""The closed loop on the twin, on a simulated clock: instruments -> findings -> incidents.

``run_loop`` runs every instrument on the scenario (each causal, each reporting its findings
with the simulated time it reported them, :mod:`fabricscope.service.instruments`), replays the
findings in time order into the :class:`~fabricscope.diagnosis.incidents.Correlator` with a
tick every ``tick_s`` simulated seconds, and returns the incidents, the findings and when each
root cause was first named. The twin is a data source only: the correlator, specialists,
coordinator and verifier see findings and the inventory, never the injected truth, which stays
here for scoring (:func:`truth_pairs`).

Faults on the command line: ``KIND:SUBJECT[@START[-END]][,KEY=VALUE...]`` with times in
s / m / h from the scenario start (``gray-loss:leaf-p0-r0-00:eth9->spine-p0-00:eth1@30s,loss=0.02``).
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from fabricscope.diagnosis.baseline import TreeWalker
from fabricscope.diagnosis.cases import CaseBase
from fabricscope.diagnosis.checks import CheckOutcome, CheckRequest, CheckRunner
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import KnowledgeBase, load_kb
from fabricscope.diagnosis.model import Incident, Observed
from fabricscope.diagnosis.specialists import Coverage
from fabricscope.diagnosis.suspicions import is_suspicion
from fabricscope.fabric.catalog import build_fabric, parse_fabric_spec
from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.io import read_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.instruments import Instrument, ScenarioSpec
from fabricscope.sim.faults import FAULT_KINDS, Fault, param_value

NS = 1_000_000_000

#: The knowledge-base fault type each twin fault kind is (the truth a diagnosis is scored on).
TRUTH_TYPE: Mapping[str, str] = {
    "gray-loss": "gray-link", "link-flap": "link-flap", "link-down": "link-down",
    "link-degraded": "link-degraded", "congestion": "congestion", "micro-burst": "micro-burst",
    "pfc-storm": "pfc-storm", "optic-degrading": "optic-aging", "switch-fault": "switch-fault",
    "nic-fault": "nic-fault", "slow-nic": "slow-nic", "slow-gpu": "slow-gpu",
    "cpu-starved": "cpu-starved-host",
}

#: Parameters a fault gets when the command line gives none (visible, not extreme).
DEFAULT_PARAMS: Mapping[str, Mapping[str, float]] = {
    "gray-loss": {"loss": 0.02}, "link-degraded": {"factor": 0.25}, "link-delay": {"delay_ns": 50e3},
    "link-flap": {"period_ns": 20e9}, "congestion": {"load": 0.95},
    "micro-burst": {"depth_bytes": 8e6}, "optic-degrading": {"rate": 1.0, "accel": 6000.0},
    "switch-fault": {"loss": 0.02}, "nic-fault": {"loss": 0.05}, "slow-nic": {"factor": 0.2},
    "slow-gpu": {"factor": 1.6}, "cpu-starved": {"delay_ns": 2e6}, "pfc-storm": {"rate": 2e5},
}

_TIME = re.compile(r"^\s*(?P<v>\d+(?:\.\d*)?)\s*(?P<u>ms|s|m|h)?\s*$")


def parse_time_s(text: str, *, source: str) -> float:
    """``30``, ``30s``, ``2m``, ``1h``, ``500ms`` -> seconds."""
    m = _TIME.match(text)
    if not m:
        raise ConfigError(f"{source}: expected a time like 30s, 2m or 1h, got {text!r}")
    mult = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[m["u"] or "s"]
    return float(m["v"]) * mult


def parse_twin_fault(text: str, fabric: Fabric, *, source: str = "--fault") -> Fault:
    """``KIND:SUBJECT[@START[-END]][,KEY=VALUE...]`` -> a Fault checked against ``fabric``."""
    kind, sep, rest = text.strip().partition(":")
    if not sep or not rest:
        raise ConfigError(f"{source}: {text!r}: expected KIND:SUBJECT[@START[-END]][,KEY=VALUE...]")
    if kind not in FAULT_KINDS:
        raise ConfigError(f"{source}: {text!r}: unknown fault kind {kind!r}; choose one of "
                          f"{', '.join(TRUTH_TYPE)}")
    head, *kvs = rest.split(",")
    subject, _, when = head.partition("@")
    subject = subject.strip()
    start_s, end_s = 0.0, None
    if when:
        a, dash, b = when.partition("-")
        start_s = parse_time_s(a, source=f"{source}: {text!r}: start")
        if dash:
            end_s = parse_time_s(b, source=f"{source}: {text!r}: end")
    params = dict(DEFAULT_PARAMS.get(kind, {}))
    for kv in kvs:
        k, eq, v = kv.partition("=")
        if not eq:
            raise ConfigError(f"{source}: {text!r}: expected KEY=VALUE, got {kv!r}")
        # a number, or a documented name (optic-degrading mode=aging-laser)
        params[k.strip()] = param_value(kind, k.strip(), v, source=f"{source}: {text!r}")
    if "->" in subject:
        a, _, b = subject.partition("->")
        ok = fabric.peer_port.get(a) == b
    elif "|" in subject:
        ok = subject in fabric.link_by_id
    else:
        ok = ResourceMap(fabric).known(subject)
    if not ok:
        raise ConfigError(f"{source}: {text!r}: subject {subject!r} is not in the inventory "
                          "(a direction a:ethX->b:ethY of a cable, a cable a:ethX|b:ethY, a port, "
                          "a device or host/gpuN)")
    if end_s is None and kind == "micro-burst":
        end_s = start_s + 1.0  # a burst, not a standing queue (give -END to change it)
    end_ns = None if end_s is None else int(end_s * NS)
    return Fault(kind, subject, int(start_s * NS), end_ns, params)  # type: ignore[arg-type]


def load_twin_fabric(spec: str) -> Fabric:
    """An inventory file (``.yaml`` / ``.json``) or a builder spec (``rail-optimized:servers=256``)."""
    if spec.endswith((".yaml", ".yml", ".json")):
        return read_fabric(spec)
    kind, params = parse_fabric_spec(spec, source="--twin")
    return build_fabric(kind, params, source="--twin")


def truth_pairs(fabric: Fabric, kb: KnowledgeBase, faults: Iterable[Fault]
                ) -> list[tuple[Fault, tuple[str, str]]]:
    """(fault, (resource, type)) for every injected fault the knowledge base can name."""
    rmap = ResourceMap(fabric)
    out = []
    for f in faults:
        t = TRUTH_TYPE.get(f.kind)
        if t is None or t not in kb.types:
            continue
        kind = kb.types[t].resource
        res = rmap.resources(f.subject, kind)
        if kind == "port" and "->" in f.subject:
            res = (f.subject.split("->")[0],)
        if res:
            out.append((f, (res[0], t)))
    return out


def switch_telemetry_sees(fabric: Fabric, resource: str) -> bool:
    """Switch telemetry reports switch ports and switches, and so every cable (one end of
    each is a switch port); a NIC, host, GPU or job it does not see (no knowledge-base type
    of those has a telemetry symptom on itself, so this decides no absence today)."""
    if resource in fabric.ports:
        return fabric.devices[resource.rsplit(":", 1)[0]].is_switch
    if resource in fabric.devices:
        return fabric.devices[resource].is_switch
    return "|" in resource


def coverage_for(instruments: Sequence[Instrument], fabric: Fabric,
                 covers: Callable[[str, str], bool] | None = None,
                 spec: ScenarioSpec | None = None) -> Coverage:
    """How long each running instrument needs before its silence counts as absence, and what
    each can see: switch telemetry sees switch ports (and so every cable and switch), the
    straggler analysis the GPUs, NICs, hosts and access cables of its job; probes and optics
    see everything."""
    lat: dict[str, int] = {}
    for ins in instruments:
        step = float(getattr(ins, "interval_s", getattr(ins, "step_s", 10.0)))
        lat[ins.name] = int(3 * step * NS)
    if covers is not None:
        return Coverage(lat, covers)
    rmap = ResourceMap(fabric)
    job: set[str] = set()
    for ins in instruments:
        fn = getattr(ins, "job_gpus", None)
        if fn is not None and spec is not None:
            for g in fn(spec):
                job.add(g)
                for kind in ("nic", "host", "cable"):
                    job.update(rmap.resources(g, kind))

    def sees(signal: str, resource: str) -> bool:
        if signal == "straggler":
            return resource in job
        if signal == "telemetry":
            return switch_telemetry_sees(fabric, resource)
        return True

    return Coverage(lat, sees)


@dataclass
class LoopResult:
    """What one run of the loop produced (JSON via :meth:`to_json`)."""

    incidents: list[Incident]
    findings: list[Observed]
    named: list[tuple[str, tuple[str, str], int]]
    ticks: int
    duration_s: float
    seconds: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)
    #: The instruments' suspicions (:mod:`fabricscope.diagnosis.suspicions`; never evidence,
    #: kept apart from ``findings``) and the suspicion gate's counters.
    suspicions: list[Observed] = field(default_factory=list)
    suspicion_stats: dict[str, int] = field(default_factory=dict)

    def predicted(self) -> list[tuple[str, str]]:
        """Every (resource, type) the opened incidents name at the end."""
        return sorted({rc.key for i in self.incidents for rc in i.root_causes})

    def first_named(self, pair: tuple[str, str]) -> int | None:
        """When ``pair`` was first the root cause of an opened incident (ns), or None."""
        for t, pairs in self.timeline:
            if pair in pairs:
                return t
        return None


class _Side(Protocol):
    """One diagnosis procedure as the replay drives it (the coordinator or the tree)."""

    def add(self, findings: Sequence[Observed]) -> None: ...
    def tick(self, now_ns: int) -> list[CheckRequest]: ...
    def outcome(self, out: CheckOutcome, now_ns: int) -> list[CheckRequest]: ...
    def suspected(self, now_ns: int) -> list[CheckRequest]: ...
    def pairs(self) -> list[tuple[str, str]]: ...


class _CoordinatorSide:
    def __init__(self, corr: Correlator, on_change: Callable[[Incident], None] | None) -> None:
        self.corr = corr
        self.on_change = on_change

    def add(self, findings: Sequence[Observed]) -> None:
        self.corr.add(findings)

    def tick(self, now_ns: int) -> list[CheckRequest]:
        for inc in self.corr.tick(now_ns):
            if self.on_change is not None:
                self.on_change(inc)
        return self.corr.take_checks()

    def outcome(self, out: CheckOutcome, now_ns: int) -> list[CheckRequest]:
        self.corr.add_outcome(out)
        return self.tick(now_ns)

    def suspected(self, now_ns: int) -> list[CheckRequest]:
        self.corr.answer_suspicions(now_ns)
        return self.corr.take_checks()

    def pairs(self) -> list[tuple[str, str]]:
        return sorted({rc.key for inc in self.corr.incidents() if inc.status == "open"
                       for rc in inc.root_causes})


class TreeSide:
    """The knowledge-tree baseline (:class:`~fabricscope.diagnosis.baseline.TreeWalker`) as a
    side of :func:`replay`."""

    def __init__(self, walker: TreeWalker) -> None:
        self.walker = walker

    def add(self, findings: Sequence[Observed]) -> None:
        self.walker.add(findings)

    def tick(self, now_ns: int) -> list[CheckRequest]:
        return self.walker.step(now_ns)

    def outcome(self, out: CheckOutcome, now_ns: int) -> list[CheckRequest]:
        self.walker.outcome(out)
        return self.walker.step(now_ns)

    def suspected(self, now_ns: int) -> list[CheckRequest]:
        return []  # the tree reads alarms only

    def pairs(self) -> list[tuple[str, str]]:
        return sorted(self.walker.named)


def replay(found: Sequence[Observed], side: _Side, runner: CheckRunner | None, *,
           tick_ns: int, end_ns: int) -> tuple[list[tuple[int, list[tuple[str, str]]]], int]:
    """Feed ``found`` (in ``reported_ns`` order) to ``side`` with a tick every ``tick_ns``,
    start the checks it asks for on ``runner`` at once and hand each outcome back at its
    completion time (between ticks: an answer does not wait for the next tick). A
    suspicion reported between two ticks is handed to ``side`` at its report time (its checks
    start then; the suspicion gate's rate bounds apply), one on a tick with that tick.
    Returns the timeline of named (resource, type) pairs and the number of ticks. Both
    diagnosis procedures of the benchmark run through this one driver, with the same check
    costs."""
    heap: list[tuple[int, int, CheckRequest]] = []
    seq = 0
    i = 0
    timeline: list[tuple[int, list[tuple[str, str]]]] = []
    sus = sorted({o.reported_ns for o in found if is_suspicion(o) and o.reported_ns % tick_ns})
    k = 0

    def launch(reqs: Sequence[CheckRequest]) -> None:
        nonlocal seq
        if runner is None:
            return
        for r in reqs:
            heapq.heappush(heap, (runner.start(r), seq, r))
            seq += 1

    def feed(t: int) -> None:
        nonlocal i
        j = i
        while j < len(found) and found[j].reported_ns <= t:
            j += 1
        if j > i:
            side.add(found[i:j])
            i = j

    def record(t: int) -> None:
        pairs = side.pairs()
        if not timeline or timeline[-1][1] != pairs:
            timeline.append((t, pairs))

    ticks = 0
    now = tick_ns
    while now <= end_ns:
        while True:
            t_sus = sus[k] if k < len(sus) and sus[k] < now else None
            if heap and heap[0][0] <= now and (t_sus is None or heap[0][0] <= t_sus):
                t, _, req = heapq.heappop(heap)
                assert runner is not None
                feed(t)
                launch(side.outcome(runner.finish(req), t))
                record(t)
            elif t_sus is not None:
                k += 1
                feed(t_sus)
                launch(side.suspected(t_sus))
                record(t_sus)
            else:
                break
        feed(now)
        launch(side.tick(now))
        record(now)
        ticks += 1
        now += tick_ns
    return timeline, ticks


def run_loop(spec: ScenarioSpec, instruments: Sequence[Instrument], *,
             kb: KnowledgeBase | None = None, tick_s: float = 5.0,
             params: CorrelatorParams | None = None,
             covers: Callable[[str, str], bool] | None = None,
             on_change: Callable[[Incident], None] | None = None,
             progress: Callable[[str], None] | None = None,
             checks: CheckRunner | None = None,
             findings: Sequence[Observed] | None = None,
             cases: CaseBase | None = None) -> LoopResult:
    """Run the instruments on ``spec`` and the correlator over their findings (see module doc).

    ``checks``: a runner for the coordinator's active checks (``TwinChecks(spec)`` on the
    twin); None: passive evidence only. ``findings``: the instruments' findings of an earlier
    run of the same scenario (the instruments are then not run again; pass its suspicions
    too, ``res.findings + res.suspicions``, for the suspicion channel). ``cases``: the case
    base the coordinator consults (None: none). Suspicions are answered by checks only with
    ``checks`` and ``params.suspicions`` set (the default); the result keeps them apart from
    the findings.
    """
    kb = kb or load_kb()
    secs: dict[str, float] = {}
    found: list[Observed] = list(findings or ())
    for ins in instruments if findings is None else ():
        if progress is not None:
            progress(f"running the {ins.name} instrument on the twin")
        t0 = time.process_time()
        found.extend(ins.run(spec))
        secs[ins.name] = round(time.process_time() - t0, 3)
    found.sort(key=lambda o: (o.reported_ns, o.source, o.id))
    rmap = ResourceMap(spec.fabric)
    if checks is not None:
        params = replace(params or CorrelatorParams(), active_checks=True)
    corr = Correlator(rmap, kb, coverage_for(instruments, spec.fabric, covers, spec),
                      params=params, cases=cases)
    t0 = time.process_time()
    timeline, ticks = replay(found, _CoordinatorSide(corr, on_change), checks,
                             tick_ns=int(tick_s * NS), end_ns=int(spec.duration_s * NS))
    secs["correlate"] = round(time.process_time() - t0, 3)  # with the checks' backend
    alarms = [o for o in found if not is_suspicion(o)]
    return LoopResult(corr.incidents(), alarms, corr.named_at(), ticks, spec.duration_s, secs,
                      timeline, [o for o in found if is_suspicion(o)], corr.suspicion_stats())


INSTRUMENTS: tuple[str, ...] = ("telemetry", "probe", "straggler", "optics")


def default_instruments(names: Sequence[str] = INSTRUMENTS, *,
                        suspicions: bool = True) -> list[Instrument]:
    """The instruments by name, with their default settings; ``suspicions``: every
    instrument also publishes suspicions (:mod:`fabricscope.diagnosis.suspicions`)."""
    out: list[Instrument] = []
    for n in names:
        if n == "telemetry":
            from fabricscope.service.instruments.telemetry import TelemetryInstrument
            out.append(TelemetryInstrument(suspicions=suspicions))
        elif n == "probe":
            from fabricscope.service.instruments.probe import ProbeInstrument
            out.append(ProbeInstrument(suspicions=suspicions))
        elif n == "straggler":
            from fabricscope.service.instruments.straggler import StragglerInstrument
            out.append(StragglerInstrument(suspicions=suspicions))
        elif n == "optics":
            from fabricscope.service.instruments.optics import OpticsInstrument
            out.append(OpticsInstrument(suspicions=suspicions))
        else:
            raise ConfigError(f"--instruments: unknown {n!r}; choose from {', '.join(INSTRUMENTS)}")
    return out


class Injected(Protocol):
    """What scoring reads of an injected fault: a twin Fault or a ``--transport`` truth."""

    @property
    def kind(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def start_ns(self) -> int: ...


@dataclass(frozen=True)
class FaultScore:
    """One injected fault against what the loop concluded."""

    fault: Injected
    pair: tuple[str, str]
    found: bool
    time_to_root_cause_s: float | None


def score_run(result: LoopResult, truth: Sequence[tuple[Injected, tuple[str, str]]]
              ) -> tuple[list[FaultScore], list[tuple[str, str]]]:
    """Each injected fault: found (its pair among the final root causes) and when it was first
    named; and the predicted pairs no injected fault explains (false positives)."""
    predicted = set(result.predicted())
    out = []
    for f, pair in truth:
        t = result.first_named(pair)
        out.append(FaultScore(f, pair, pair in predicted,
                              None if t is None else max(0.0, (t - f.start_ns) / NS)))
    wanted = {p for _, p in truth}
    return out, sorted(predicted - wanted)
