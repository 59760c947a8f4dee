"""The diagnosis core on hand-written findings: resource mapping, coordinator, verifier,
incident lifecycle and NIKA scoring."""

from __future__ import annotations

import pytest

from fabricscope.diagnosis.coordinator import CoordinatorParams, diagnose
from fabricscope.diagnosis.graph import ResourceMap, resource_kind
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.scoring import macro_f1, micro, prf, score_scenario
from fabricscope.diagnosis.specialists import Coverage, FindingIndex, specialists
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.model.records import Finding

NS = 1_000_000_000
COV = Coverage({"telemetry": 30 * NS, "probe": 15 * NS, "optics": 180 * NS,
                "straggler": 60 * NS})


@pytest.fixture(scope="module")
def fabric():  # type: ignore[no-untyped-def]
    return rail_optimized_fabric(8)


@pytest.fixture(scope="module")
def kb():  # type: ignore[no-untyped-def]
    return load_kb()


def _uplink(fabric, k=3):  # type: ignore[no-untyped-def]
    return [lk for lk in fabric.links if "spine" in lk.b][k]


def _run(fabric, kb, obs, until_s=300, params=None):  # type: ignore[no-untyped-def]
    c = Correlator(ResourceMap(fabric), kb, COV, params=params)
    for t in range(5, until_s + 1, 5):
        c.add([o for o in obs if (t - 5) * NS < o.reported_ns <= t * NS])
        c.tick(t * NS)
    return c


def test_resource_map_follows_the_inventory(fabric) -> None:  # type: ignore[no-untyped-def]
    rm = ResourceMap(fabric)
    lk = _uplink(fabric)
    assert rm.resources(f"{lk.a}->{lk.b}", "cable") == (lk.id,)
    assert rm.resources(lk.b, "cable") == (lk.id,)
    assert rm.resources(lk.b, "switch") == (lk.b.rsplit(":", 1)[0],)
    nic = fabric.nic_of_gpu("host0001", 3).id
    assert rm.resources("host0001/gpu3", "nic") == (nic,)
    assert rm.resources(nic, "host") == ("host0001",)
    assert rm.resources(f"{lk.a}->{lk.b} | {nic}", "switch")  # a credible set: every member
    assert resource_kind(fabric, lk.id) == "cable"
    assert resource_kind(fabric, "host0001/gpu3") == "gpu"
    assert rm.known(lk.id) and rm.known("host0001/gpu3") and not rm.known("leaf-zz")


def test_gray_link_with_fcs_errors_is_one_incident_on_the_cable(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric)
    obs = [Observed("probe", Finding("gray-link", f"{lk.a}->{lk.b}", 0.95, (30 * NS, 35 * NS)), 35 * NS),
           Observed("telemetry", Finding("error-counter-increase", lk.b, 0.9, (32 * NS, 40 * NS)), 40 * NS)]
    c = _run(fabric, kb, obs)
    incs = c.incidents()
    assert len(incs) == 1
    top = incs[0].root_causes[0]
    assert (top.resource, top.fault) == (lk.id, "gray-link")
    assert 0.35 <= top.probability <= 1.0
    assert set(top.explains) == {o.id for o in obs}
    assert incs[0].first_symptom_ns == 30 * NS and incs[0].detected_ns == 35 * NS
    assert incs[0].root_cause_ns is not None and incs[0].root_cause_ns >= 35 * NS
    assert any(ch.result == "supports" for ch in top.checks)


def test_two_faults_far_apart_are_two_incidents(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric, 0)
    storm = next(p for p in fabric.ports_of["leaf-p0-r5-00"] if "host" in fabric.peer_port[p])
    obs = [Observed("probe", Finding("gray-link", f"{lk.a}->{lk.b}", 0.95, (30 * NS, 35 * NS)), 35 * NS),
           Observed("telemetry", Finding("pause-storm", storm, 0.9, (40 * NS, 45 * NS)), 45 * NS)]
    keys = sorted(rc.key for i in _run(fabric, kb, obs).incidents() for rc in i.root_causes)
    assert keys == sorted([(lk.id, "gray-link"), (storm, "pfc-storm")])


def test_verifier_rejects_a_type_without_its_defining_symptom(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    """Error counters alone never conclude optic aging (its defining symptom is DOM drift)."""
    lk = _uplink(fabric)
    obs = [Observed("telemetry", Finding("error-counter-increase", lk.b, 0.9, (30 * NS, 40 * NS)), 40 * NS)]
    team = specialists(kb, ResourceMap(fabric))
    idx = FindingIndex(ResourceMap(fabric))
    for o in obs:
        idx.add(o)
    d = diagnose(obs, team, idx, COV, now_ns=300 * NS)
    assert d.root_causes and all(rc.fault != "optic-aging" for rc in d.root_causes)
    # optic aging stays a named alternative until the optics data can separate them
    assert any("not excluded yet" in e and "optic-aging" in e for rc in d.root_causes
               for e in rc.evidence) or d.root_causes[0].fault == "gray-link"


def test_dom_drift_plus_errors_names_the_optic_not_the_link(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric)
    obs = [Observed("telemetry", Finding("error-counter-increase", lk.b, 0.9, (30 * NS, 40 * NS)), 40 * NS),
           Observed("optics", Finding("optic-degrading", lk.b, 0.9, (20 * NS, 60 * NS)), 60 * NS)]
    keys = [rc.key for i in _run(fabric, kb, obs).incidents() for rc in i.root_causes]
    assert keys and keys[0][1] in ("optic-aging", "dirty-connector")
    assert keys[0][0] == lk.b


def test_unknown_subjects_give_no_root_cause(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    obs = [Observed("probe", Finding("gray-link", "nowhere:eth1->elsewhere:eth2", 0.99, (0, NS)), NS)]
    assert _run(fabric, kb, obs).incidents() == []


def test_incident_closes_when_its_symptoms_stop(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric)
    obs = [Observed("probe", Finding("gray-link", f"{lk.a}->{lk.b}", 0.95, (30 * NS, 35 * NS)), 35 * NS)]
    p = CorrelatorParams(close_after_ns=60 * NS)
    incs = _run(fabric, kb, obs, until_s=200, params=p).incidents()
    assert len(incs) == 1 and incs[0].status == "closed"
    assert incs[0].closed_ns is not None and incs[0].closed_ns >= 95 * NS


def test_no_findings_no_incident(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    assert _run(fabric, kb, []).incidents() == []


def test_min_probability_is_enforced(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric)
    obs = [Observed("probe", Finding("gray-link", f"{lk.a}->{lk.b}", 0.95, (30 * NS, 35 * NS)), 35 * NS)]
    rm = ResourceMap(fabric)
    idx = FindingIndex(rm)
    idx.add(obs[0])
    d = diagnose(obs, specialists(kb, rm), idx, COV, now_ns=40 * NS,
                 params=CoordinatorParams(min_probability=0.999))
    assert d.root_causes == () and d.rejected


def test_nika_scores() -> None:
    t = [("a", "x"), ("b", "y")]
    s = score_scenario(t, [("a", "x"), ("b", "z"), ("c", "y")])
    assert (s.pairs.tp, s.pairs.fp, s.pairs.fn) == (1, 2, 1)
    assert s.resources.tp == 2 and s.resources.fp == 1
    assert s.types.tp == 2 and s.types.fp == 1 and s.types.fn == 0
    assert prf([], []).f1 == 1.0 and prf(["a"], []).f1 == 0.0
    assert micro([s, s]).tp == 2
    assert macro_f1([s]) == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))


def test_a_symptom_back_after_its_incident_closed_opens_a_new_incident(fabric, kb) -> None:  # type: ignore[no-untyped-def]
    lk = _uplink(fabric)
    d = f"{lk.a}->{lk.b}"
    obs = [Observed("probe", Finding("gray-link", d, 0.95, (30 * NS, 35 * NS)), 35 * NS),
           # a new episode of the same symptom long after the first incident closed
           Observed("probe", Finding("gray-link", d, 0.95, (300 * NS, 305 * NS)), 305 * NS)]
    p = CorrelatorParams(close_after_ns=60 * NS)
    incs = _run(fabric, kb, obs, until_s=340, params=p).incidents()
    assert [i.status for i in incs] == ["closed", "open"]
    assert incs[1].first_symptom_ns == 300 * NS
    # while an incident is open, a repeated episode only refreshes it
    again = [obs[0], Observed("probe", Finding("gray-link", d, 0.95, (50 * NS, 55 * NS)), 55 * NS)]
    incs = _run(fabric, kb, again, until_s=100, params=p).incidents()
    assert len(incs) == 1 and incs[0].findings == (obs[0].id,)
