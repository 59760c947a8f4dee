"""The advisor on a real probe store: ``run_twin(db=...)`` writes it, ``advise`` reads a window.

Stored probes carry no traced paths, so the advisor localizes over each flow's candidate ECMP
set: a gray NIC uplink is pinned (every flow of the NIC crosses it), a gray spine -> leaf
direction is one of the leaf's equal-cost downlinks (a credible set, which the answer must
not narrow to a wrong member).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.advisor import Inputs, advise, gather
from fabricscope.service.probe_twin import run_twin
from fabricscope.sim.faults import Fault

S = 1_000_000_000
ONSET = 20 * S
NIC_DOWN = "leaf-p0-r1-00:eth6->host0005/nic1:p0"  # leaf -> NIC: every flow to the NIC
SPINE_DOWN = "spine-p0-01:eth2->leaf-p0-r0-00:eth12"  # one of leaf-p0-r0-00's 8 downlinks


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 64 NICs, as tests/test_instrument_probe.py: rail and cross-leaf peers in every plan.
    return rail_optimized_fabric(16, gpus_per_server=4, radix=16)


def _store(fabric: Fabric, tmp: Path, direction: str, seed: int) -> Path:
    db = tmp / "probes.duckdb"
    run_twin(fabric, [Fault("gray-loss", direction, ONSET, params={"loss": 0.02})],
             duration_s=60, seed=seed, db=str(db))
    return db


@pytest.fixture(scope="module")
def nic_db(fabric: Fabric, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(fabric, tmp_path_factory.mktemp("nic"), NIC_DOWN, seed=4)


def test_gray_nic_link_is_the_top_root_cause(fabric: Fabric, nic_db: Path) -> None:
    ans = advise(fabric, Inputs(probes_db=[nic_db]), since=ONSET, until=60 * S)
    assert ans.sources == {"probe": 1}
    assert ans.ranked, ans.notes
    _, top = ans.ranked[0]
    (cable,) = ResourceMap(fabric).resources(NIC_DOWN, "cable")
    assert (top.resource, top.fault) == (cable, "gray-link")
    assert top.probability >= 0.5
    # Its evidence is the probe finding on the faulty direction itself.
    assert any(f"probe: gray-link on {NIC_DOWN} " in e for e in top.evidence), top.evidence
    assert ans.window == (ONSET, 60 * S)


def test_a_window_before_the_fault_has_no_probe_finding(fabric: Fabric, nic_db: Path) -> None:
    ans = advise(fabric, Inputs(probes_db=[nic_db]), since=0, until=ONSET)
    assert ans.sources == {"probe": 0} and ans.ranked == []
    assert ans.notes == ["no finding in the inputs for this window: nothing to explain"]


def test_a_window_with_no_probes_is_one_config_error(fabric: Fabric, nic_db: Path) -> None:
    with pytest.raises(ConfigError, match=r"--probes .*probes\.duckdb: no probes in the window "
                                          r"\[100000000000, 200000000000\]") as exc:
        advise(fabric, Inputs(probes_db=[nic_db]), since=100 * S, until=200 * S)
    assert "\n" not in str(exc.value)


def test_gray_spine_direction_is_a_credible_set_containing_it(
        fabric: Fabric, tmp_path: Path) -> None:
    db = _store(fabric, tmp_path, SPINE_DOWN, seed=4)
    inputs = Inputs(probes_db=[db])
    found, counts = gather(fabric, inputs, since=ONSET, until=None)
    assert counts == {"probe": 1}
    (o,) = found
    rmap = ResourceMap(fabric)
    members = rmap.members(o.finding.subject)
    assert o.kind == "gray-link" and SPINE_DOWN in members
    # The set is the leaf's downlinks from its spines (what ECMP cannot tell apart untraced).
    assert 1 < len(members) <= 8
    assert all(m.startswith("spine-") and "->leaf-p0-r0-00:" in m for m in members)
    # The answer never narrows an unseparable set to one (possibly wrong) member.
    ans = advise(fabric, inputs, since=ONSET)
    assert ans.sources == {"probe": 1}
    assert ans.ranked or any("ambiguous" in n for n in ans.notes), ans.notes
    allowed = {c for m in members for c in rmap.resources(m, "cable")} | set(members)
    assert all(rc.resource in allowed or " | " in rc.resource for _, rc in ans.ranked)
    assert all(rc.probability < 0.5 for _, rc in ans.ranked)
    # ... and shows the credible set it could not narrow, as an unexplained finding
    if not ans.ranked:
        assert [u.subject for u in ans.unexplained] == [o.finding.subject]
        assert ans.to_json()["unexplained_findings"][0]["subject"] == o.finding.subject
