"""The suspicion channel: a sub-alarm statistic answered by rate-bounded active checks; a
suspicion is never evidence, never an incident, never a root cause."""

from __future__ import annotations

import pytest

from fabricscope.diagnosis.baseline import TreeWalker
from fabricscope.diagnosis.checks import CheckOutcome, CheckRequest
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.suspicions import (
    SUSPICION,
    SuspicionGate,
    SuspicionParams,
    is_suspicion,
    suspicion,
)
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.checks import TwinChecks
from fabricscope.service.instruments.optics import OpticsInstrument
from fabricscope.service.instruments.telemetry import TelemetryInstrument
from fabricscope.service.supervise_twin import _CoordinatorSide, replay, run_loop
from fabricscope.sim.faults import Fault
from test_diagnosis_checks import _uplink
from test_diagnosis_core import COV

NS = 1_000_000_000


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return rail_optimized_fabric(8)


def _leaf_port(cable: str) -> str:
    return next(p for p in cable.split("|") if p.startswith("leaf"))


def _probe_suspicion(cable: str, t_s: float) -> Observed:
    a, b = cable.split("|")
    return suspicion("probe", "gray-link", f"{a}->{b}", int(t_s * NS), (0, int(t_s * NS)),
                     statistic="window localization", value=0.5, early=0.0, alarm=0.99,
                     evidence="test")


def test_a_confirmed_suspicion_names_the_cause_earlier(fabric: Fabric) -> None:
    """An aging optic: the optics instrument's watch grade is a suspicion one 60 s poll
    before the detector's k = 2 readings; the coordinator's DOM check confirms it and names
    optic-aging earlier than the same run with the channel off."""
    port = _leaf_port(_uplink(fabric))
    spec = ScenarioSpec(fabric, [Fault("optic-degrading", port, 30 * NS, None,
                                       {"rate": 1.0, "accel": 6000.0})], 180.0, 4)
    ins = [OpticsInstrument(suspicions=True)]
    on = run_loop(spec, ins, checks=TwinChecks(spec))
    off = run_loop(spec, ins, checks=TwinChecks(spec), findings=on.findings + on.suspicions,
                   params=CorrelatorParams(suspicions=None))
    pair = (port, "optic-aging")
    assert on.suspicions and all(is_suspicion(o) for o in on.suspicions)
    assert not any(is_suspicion(o) for o in on.findings)
    t_on, t_off = on.first_named(pair), off.first_named(pair)
    assert t_on is not None and t_off is not None
    assert t_on < t_off - 30 * NS  # at least half a polling interval earlier
    assert on.suspicion_stats["confirmed"] >= 1 and on.suspicion_stats["checks"] >= 1
    assert pair in on.predicted() and pair in off.predicted()
    # what confirmed it is the check's measurement (an active optics finding), not the
    # suspicion, which is in no incident
    inc = next(i for i in on.incidents if pair in [rc.key for rc in i.root_causes])
    assert not {o.id for o in on.suspicions} & set(inc.findings)
    assert any(a.startswith(f"checked: dom on {port} (for a suspicion)") and "optic-degrading" in a
               for a in inc.actions)


def test_an_unconfirmed_suspicion_opens_nothing(fabric: Fabric) -> None:
    """Suspicions on a healthy cable are checked (the checks cost and are counted), find
    nothing, and open no incident; with the channel off they are dropped."""
    cable = _uplink(fabric)
    spec = ScenarioSpec(fabric, [], 120.0, 5)
    found = [_probe_suspicion(cable, t) for t in (10, 15, 20, 25, 30, 60, 90)]
    kb = load_kb()
    rmap = ResourceMap(fabric)
    corr = Correlator(rmap, kb, COV, params=CorrelatorParams(active_checks=True))
    runner = TwinChecks(spec)
    tl, _ = replay(found, _CoordinatorSide(corr, None), runner, tick_ns=5 * NS, end_ns=120 * NS)
    assert corr.incidents() == [] and all(ps == [] for _, ps in tl)
    st = corr.suspicion_stats()
    assert st["suspicions"] == len(found) and st["checks"] == len(runner.log) >= 1
    assert st["confirmed"] == 0
    assert not corr.index.items  # a suspicion never enters the evidence
    dropped = Correlator(rmap, kb, COV, params=CorrelatorParams(active_checks=True, suspicions=None))
    dropped.add(found)
    assert dropped.tick(30 * NS) == [] and dropped.take_checks() == []
    assert dropped.suspicion_stats() == {"dropped": len(found)}


def test_a_suspicion_alone_is_never_a_root_cause_or_a_tree_alarm(fabric: Fabric) -> None:
    cable = _uplink(fabric)
    o = _probe_suspicion(cable, 10)
    assert o.kind == SUSPICION
    kb = load_kb()
    rmap = ResourceMap(fabric)
    corr = Correlator(rmap, kb, COV, params=CorrelatorParams(active_checks=True))
    corr.add([o])
    for t in range(5, 200, 5):
        corr.tick(t * NS)
    assert corr.incidents() == []  # its checks never came back: nothing measured, nothing named
    walker = TreeWalker(kb, lambda s, k: rmap.resources(s, k))
    walker.add([o])
    assert walker.step(10 * NS) == [] and walker.named == {}


def _nothing(req: CheckRequest,
             decided: tuple[tuple[str, str], ...] = (("telemetry", "error-counter-increase"),
                                                     ("telemetry", "link-down"))) -> CheckOutcome:
    return CheckOutcome(req, req.requested_ns + NS, (), decided, (req.resource,))


def test_the_rate_bound_holds_per_resource_and_over_the_fabric(fabric: Fabric) -> None:
    """A noisy fabric: suspicions on 12 cables every 5 s for 5 minutes. Each resource gets at
    most ``per_resource`` check rounds and the fabric at most ``max_rounds`` in any window."""
    params = SuspicionParams(window_ns=60 * NS, per_resource=2, max_rounds=6, recheck_ns=10 * NS,
                             hold_ns=60 * NS, max_kinds=2)
    gate = SuspicionGate(load_kb(), ResourceMap(fabric), params)
    cables = [lk.id for lk in fabric.links if "spine" in lk.b][:12]
    rounds: list[tuple[int, str]] = []
    for t in range(5, 300, 5):
        now = t * NS
        for c in cables:
            gate.offer(_probe_suspicion(c, t))
        reqs = gate.due(now)
        for r in {q.resource for q in reqs}:
            rounds.append((now, r))
        for q in reqs:
            assert gate.owns(q)
            assert gate.outcome(_nothing(q)) is False
    assert rounds
    for t0, _ in rounds:
        in_window = [(t, r) for t, r in rounds if t0 <= t < t0 + params.window_ns]
        assert len(in_window) <= params.max_rounds
        for c in cables:
            assert sum(1 for _, r in in_window if r == c) <= params.per_resource
    assert gate.stats["limited"] > 0 and gate.stats["confirmed"] == 0
    assert gate.stats["rounds"] == len(rounds)


def test_the_telemetry_instrument_suspects_a_queue_before_its_alarm(fabric: Fabric) -> None:
    """Congestion starting between samples: the first sample's queue rise is below the
    micro-burst detector's thresholds (a suspicion), the alarm comes a sample later; the
    same twin without the fault publishes no suspicion."""
    lk = next(lk for lk in fabric.links if "spine" in lk.b)
    subj = f"{lk.a}->{lk.b}"
    spec = ScenarioSpec(fabric, [Fault("congestion", subj, 33 * NS, None, {"load": 0.95})], 70.0, 5)
    out = TelemetryInstrument(suspicions=True).run(spec)
    port = lk.a
    sus = [o for o in out if is_suspicion(o) and o.subject == port]
    alarm = [o for o in out if o.kind == "micro-burst" and o.subject == port]
    assert sus and alarm
    assert min(o.reported_ns for o in sus) < min(o.reported_ns for o in alarm)
    assert all(o.finding.details["anticipates"] == "micro-burst" for o in sus)
    clean = TelemetryInstrument(suspicions=True).run(ScenarioSpec(fabric, [], 70.0, 5))
    assert not [o for o in clean if is_suspicion(o)]
    plain = TelemetryInstrument().run(spec)  # off by default
    assert not [o for o in plain if is_suspicion(o)]


def test_a_check_that_cannot_decide_the_suspicion_is_not_repeated(fabric: Fabric) -> None:
    """A gray-link suspicion on a cable whose check decides only link-down (a host end: its
    receiver is no gNMI target) gets one round, not a round every 10 s; a suspect an open
    incident already names gets none."""
    gate = SuspicionGate(load_kb(), ResourceMap(fabric), SuspicionParams())
    cable = _uplink(fabric)
    for t in range(5, 60, 5):
        gate.offer(_probe_suspicion(cable, t))
        for q in gate.due(t * NS):
            gate.outcome(_nothing(q, (("telemetry", "link-down"),)))
    assert gate.stats["rounds"] == 1 and gate.stats["undecidable"] == 1
    named = SuspicionGate(load_kb(), ResourceMap(fabric), SuspicionParams(),
                          explained=lambda r: r == cable)
    named.offer(_probe_suspicion(cable, 5))
    assert named.due(5 * NS) == [] and named.stats["explained"] == 1
