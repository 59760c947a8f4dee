"""Health-check findings (issue 16) reach the diagnosis in the knowledge base's terms."""

from __future__ import annotations

from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.normalize import normalize
from fabricscope.diagnosis.specialists import Coverage
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.model.records import Finding

NS = 1_000_000_000


def _obs(kind: str, subject: str, check: str = "", source: str = "host") -> Observed:
    return Observed(source, Finding(kind, subject, 1.0, (10 * NS, 10 * NS), details={"check": check}), 10 * NS)


def test_health_kinds_map_to_the_knowledge_base() -> None:
    fab = rail_optimized_fabric(2)
    nic = fab.nic_of_gpu("host0001", 0).id
    cases = {("roce-mtu", "mtu"): ("config", "mtu-mismatch"),
             ("roce-pfc-config", "pfc"): ("config", "pfc-priority-mismatch"),
             ("roce-pfc-config", "trust"): ("config", "pfc-priority-mismatch"),
             ("roce-pfc-config", "ecn-rp"): ("config", "ecn-disabled"),
             ("collective-busbw-low", ""): ("collective", "busbw-low")}
    kb = load_kb()
    symptoms = {(s.signal, s.finding) for ft in kb.types.values() for s in ft.symptoms}
    for (kind, check), want in cases.items():
        o = normalize(_obs(kind, nic, check), fab)
        assert (o.source, o.kind) == want
        assert want in symptoms  # the mapped kind is one the knowledge base knows
        assert o.id == _obs(kind, nic, check).id  # evidence references keep their id
    other = _obs("roce-bw-low", nic)
    assert normalize(other, fab) == other


def test_a_roce_mtu_failure_becomes_an_mtu_incident_on_the_nics_cable() -> None:
    fab = rail_optimized_fabric(2)
    nic = fab.nic_of_gpu("host0001", 2).id
    rm = ResourceMap(fab)
    c = Correlator(rm, load_kb(), Coverage({"telemetry": 30 * NS, "probe": 15 * NS}))
    c.add([_obs("roce-mtu", nic, "mtu")])
    c.tick(60 * NS)
    incs = c.incidents()
    assert len(incs) == 1
    top = incs[0].root_causes[0]
    assert top.fault == "mtu-mismatch" and top.resource in rm.resources(nic, "cable")


def test_two_failed_checks_of_one_kind_on_one_nic_are_two_findings() -> None:
    a, b = _obs("roce-mtu", "host0001/nic0", "mtu"), _obs("roce-mtu", "host0001/nic0", "netdev-mtu")
    assert a.id != b.id
    assert _obs("roce-mtu", "host0001/nic0", "mtu").id == a.id  # stable
    plain = Observed("probe", Finding("gray-link", "a:eth1->b:eth2", 0.9, (1, 2)), 2)
    assert plain.id == Observed("probe", Finding("gray-link", "a:eth1->b:eth2", 0.5, (1, 9)), 3).id
