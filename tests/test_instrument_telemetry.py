"""Telemetry instrument: twin counters -> the collector's events -> the production detectors."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import port_device
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import TelemetryEvent
from fabricscope.service.demo_telemetry import EXPECTED_KINDS, fault_ports
from fabricscope.service.instruments import ScenarioSpec
from fabricscope.service.instruments.telemetry import (
    DETECTOR_LEAVES,
    TWIN_FAULT_KINDS,
    TelemetryInstrument,
    detector_leaves,
)
from fabricscope.sim.faults import Fault
from fabricscope.telemetry.codec import WireFlattener, encode_notification, path_bytes, prefix_bytes
from fabricscope.telemetry.detectors import default_detectors
from fabricscope.telemetry.paths import parse_path

NS = 1_000_000_000
FAB = rail_optimized_fabric(16)
UPLINKS = sorted(p for p in FAB.peer_port if FAB.devices[port_device(p)].role == "leaf"
                 and FAB.devices[port_device(FAB.peer_port[p])].role == "spine")
A = UPLINKS[3]
B = FAB.peer_port[A]
START = 65 * NS


def _run(faults: list[Fault], duration_s: float = 180.0, seed: int = 3, **kw: object):
    inst = TelemetryInstrument(**kw)  # type: ignore[arg-type]
    return inst, inst.run(ScenarioSpec(FAB, faults, duration_s, seed=seed))


CASES = {
    "gray-loss": Fault("gray-loss", f"{A}->{B}", START, None, {"loss": 0.01}),
    "link-flap": Fault("link-flap", f"{A}|{B}", START, START + 30 * NS),
    "pfc-storm": Fault("pfc-storm", A, START, START + 40 * NS),
    "micro-burst": Fault("micro-burst", A, START, START + 10_000_000, {"depth_bytes": 2e6}),
    "congestion": Fault("congestion", f"{A}->{B}", START, START + 60 * NS),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_fault_is_detected_on_its_ports_after_its_start_and_not_before(case: str) -> None:
    fault = CASES[case]
    _, obs = _run([fault])
    ports = fault_ports(FAB, fault)
    on_ports = [o for o in obs if o.subject in ports]
    assert not [o for o in on_ports if o.reported_ns < fault.start_ns], "finding before the fault"
    hits = [o for o in on_ports if o.kind in EXPECTED_KINDS[fault.kind]]
    assert hits, f"{case} not detected: {[(o.kind, o.subject) for o in obs]}"
    # within two samples of the onset (10 s interval; the first sample after it may see a
    # partial step)
    assert min(o.reported_ns for o in hits) <= fault.start_ns + 20 * NS
    assert not [o for o in obs if o.subject not in ports], "finding away from the fault"


def test_fault_free_ten_minutes_gives_no_finding() -> None:
    inst, obs = _run([], duration_s=600.0)
    assert obs == []
    assert inst.stats["samples"] == 61 and inst.stats["events"] > 0


def test_findings_come_in_time_order_and_are_deterministic() -> None:
    faults = [CASES["gray-loss"], Fault("pfc-storm", UPLINKS[7], 30 * NS, 90 * NS)]
    _, a = _run(faults, seed=5)
    _, b = _run(faults, seed=5)
    assert a == b and a
    assert [o.reported_ns for o in a] == sorted(o.reported_ns for o in a)
    assert all(o.source == "telemetry" and o.reported_ns % (10 * NS) == 0 for o in a)


def test_events_are_what_the_collector_flattens_from_the_twins_gnmi_notifications() -> None:
    first: list[TelemetryEvent] = []

    def keep(evs: object) -> None:
        if not first:
            first.extend(evs)  # type: ignore[call-overload]

    inst = TelemetryInstrument(on_events=keep)
    inst.run(ScenarioSpec(FAB, [], 10.0, seed=1))
    twin = inst.twin(FAB, [], 1)
    target = "spine-p0-00"
    leaves = {lf.path: lf for lf in twin.leaves(target)}
    mine = [e for e in first if e.target == target]
    assert mine
    flat = WireFlattener()
    for e in mine:
        # find the twin leaf this event names and encode it the way the gNMI target does
        (path,) = [p for p, lf in leaves.items()
                   if p.rsplit("/", 1)[-1] == e.name.rsplit("/", 1)[-1]
                   and all(f"={v}]" in p for v in e.tags.values())
                   and ("queue[name=3]" in p or "queue" not in p)]
        (val,) = twin.read([leaves[path]])
        msg = encode_notification(e.ts_ns, prefix_bytes(target), [(path_bytes(parse_path(path)), val)])
        (want,), _ = flat.flatten(msg)
        assert (e.name, e.target, dict(e.tags), e.value) == (want.name, want.target, dict(want.tags),
                                                               want.value)


def test_only_the_leaves_the_detectors_read_are_subscribed() -> None:
    seen: set[str] = set()
    inst = TelemetryInstrument(on_events=lambda evs: seen.update(e.name.rsplit("/", 1)[-1] for e in evs))
    inst.run(ScenarioSpec(FAB, [], 0.0))
    assert seen == set(DETECTOR_LEAVES)
    wanted = detector_leaves(default_detectors())
    assert wanted is not None and set(DETECTOR_LEAVES) <= wanted
    n_switch_ports = sum(1 for p in FAB.peer_port if FAB.devices[port_device(p)].role != "nic")
    assert inst.stats["leaves"] == len(DETECTOR_LEAVES) * n_switch_ports


@pytest.mark.parametrize("hb", [0, 3, 6])
def test_suppress_redundant_sends_a_leaf_when_it_changes_or_at_the_heartbeat(hb: int) -> None:
    sent: dict[tuple[str, str, str], list[int]] = defaultdict(list)

    def record(evs: list[TelemetryEvent]) -> None:
        for e in evs:
            sent[(e.target, e.name, repr(sorted(e.tags.items())))].append(e.ts_ns // (10 * NS))

    TelemetryInstrument(heartbeat_intervals=hb, on_events=record).run(ScenarioSpec(FAB, [], 120.0))
    quiet = [k for k in sent if k[1].endswith("/in-fcs-errors")]  # zero all along without faults
    assert quiet
    expected = [0, *range(hb, 13, hb)] if hb else [0]
    assert all(sent[k] == expected for k in quiet)
    marks = [v for k, v in sent.items() if k[1].endswith("/watermark-bytes")]
    assert any(v == list(range(13)) for v in marks)  # a gauge that moves is sent every sample


def test_kinds_the_twin_does_not_model_are_left_out() -> None:
    from fabricscope.twin import state

    assert frozenset(state._PORT_KINDS | state._LINK_KINDS) == TWIN_FAULT_KINDS
    _, obs = _run([Fault("slow-gpu", "host0003/gpu1", START, None, {"factor": 2.0})], duration_s=60.0)
    assert obs == []


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="no such port"):
        _run([Fault("pfc-storm", "leaf-p0-r0-00:eth999", START)], duration_s=10.0)
    with pytest.raises(ConfigError, match="interval_s"):
        TelemetryInstrument(interval_s=0)
    with pytest.raises(ConfigError, match="heartbeat_intervals"):
        TelemetryInstrument(heartbeat_intervals=-1)
    with pytest.raises(ConfigError, match="utilization"):
        TelemetryInstrument(utilization=1.5)


@pytest.mark.parametrize("kind,fault", [
    ("error-counter-increase", Fault("gray-loss", f"{A}->{B}", START, None, {"loss": 0.01})),
    ("link-down", Fault("link-down", f"{A}|{B}", START)),
])
def test_a_persisting_symptom_is_refreshed_under_its_id_and_a_cleared_one_is_not(
        kind: str, fault: Fault) -> None:
    inst, obs = _run([fault], duration_s=300.0)
    hits = [o for o in obs if o.kind == kind]
    assert hits, [(o.kind, o.subject) for o in obs]
    ids = {o.id for o in hits}
    assert len(ids) == len({(o.kind, o.subject) for o in hits})  # refreshes reuse the id
    last = max(o.reported_ns for o in hits)
    assert last >= 300 * NS - inst.refresh_s * NS - inst.interval_s * NS, "not refreshed"
    # a fault that ends stops its refreshes within a refresh period
    ended = Fault(fault.kind, fault.subject, START, START + 60 * NS, fault.params)
    _, obs2 = _run([ended], duration_s=300.0)
    late = [o for o in obs2 if o.kind == kind and o.reported_ns > ended.end_ns + (inst.refresh_s + 2 * inst.interval_s) * NS]  # type: ignore[operator]
    assert not late, late
