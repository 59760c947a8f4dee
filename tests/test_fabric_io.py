"""Inventory files: round trips (Hypothesis over builder parameters) and every rejection names
the file, the field and the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricscope.fabric import (
    Fabric,
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.io import fabric_from_dict, fabric_to_dict, read_fabric, write_fabric
from fabricscope.model.errors import InventoryError

small_fabrics = st.one_of(
    st.builds(
        lambda leaves, hpl, spines, lps, nics, lat: leaf_spine_fabric(
            leaves=leaves, hosts_per_leaf=hpl, spines=spines, links_per_spine=lps,
            nics_per_host=nics, latency_ns=lat),
        st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 2),
        st.integers(1, 2), st.sampled_from([0, 500, 1000]),
    ),
    st.builds(lambda k: fat_tree_fabric(k=k), st.sampled_from([2, 4])),
    st.builds(
        lambda servers, gpus, radix, over, planes: rail_optimized_fabric(
            servers, gpus_per_server=gpus, radix=radix, oversubscription=over, planes=planes),
        st.integers(1, 12), st.integers(1, 4), st.sampled_from([8, 16]),
        st.sampled_from([1.0, 2.0]), st.integers(1, 2),
    ),
    st.builds(lambda s, p: multi_plane_fabric(s, planes=p, gpus_per_server=2, radix=8),
              st.integers(1, 6), st.integers(1, 3)),
    st.builds(lambda s: dual_tor_fabric(s, gpus_per_server=2, radix=8), st.integers(1, 6)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fabric=small_fabrics, suffix=st.sampled_from([".yaml", ".yml", ".json"]))
def test_round_trip(tmp_path: Path, fabric: Fabric, suffix: str) -> None:
    path = write_fabric(fabric, tmp_path / f"f{suffix}")
    back = read_fabric(path)
    assert back == fabric
    assert back.index.edge_id(0) == fabric.index.edge_id(0)
    assert fabric_from_dict(fabric_to_dict(fabric), source="x") == fabric


def test_explicit_ports_survive(tmp_path: Path) -> None:
    f = leaf_spine_fabric(leaves=1, hosts_per_leaf=1, spines=1)
    d = fabric_to_dict(f)
    d["ports"] = [{"id": "leaf-000:eth9", "speed_gbps": 400}]  # an uncabled port
    g = fabric_from_dict(d, source="x.yaml")
    assert g.ports["leaf-000:eth9"].speed_gbps == 400
    assert read_fabric(write_fabric(g, tmp_path / "g.json")) == g
    assert "ports" in json.loads((tmp_path / "g.json").read_text())


def _base() -> dict[str, Any]:
    return fabric_to_dict(rail_optimized_fabric(2, gpus_per_server=2, radix=8))


def _bad(mutate: Any) -> str:
    data = _base()
    mutate(data)
    with pytest.raises(InventoryError) as exc:
        fabric_from_dict(data, source="cluster.yaml")
    msg = str(exc.value)
    assert msg.startswith("cluster.yaml: ")
    return msg


def test_rejections_name_file_field_value() -> None:
    assert "(top level).colour: unknown key" in _bad(lambda d: d.update(colour="red"))
    assert "version: expected 1, got 2" in _bad(lambda d: d.update(version=2))
    assert "devices: missing" in _bad(lambda d: d.pop("devices"))
    assert "devices[0] (host0000).speed: unknown key" in _bad(lambda d: d["devices"][0].update(speed=1))
    assert "devices[0] (host0000).gpus: expected an integer >= 0, got 'eight'" in _bad(
        lambda d: d["devices"][0].update(gpus="eight"))
    assert "devices[0] (host0000).role: expected one of" in _bad(lambda d: d["devices"][0].update(role="router"))
    assert "address: not an IP address: '1.2.3'" in _bad(lambda d: d["devices"][1].update(address="1.2.3"))
    assert "devices[0].id: 'a:b' contains ':'" in _bad(lambda d: d["devices"][0].update(id="a:b"))
    assert ".id: duplicate id 'host0000' (first at devices[0])" in _bad(
        lambda d: d["devices"].append(dict(d["devices"][0])))
    # A NIC renamed onto its neighbour's id: named as a duplicate, not as a link to a missing device.
    assert "(host0000/nic0).id: duplicate id 'host0000/nic0' (first at devices[1])" in _bad(
        lambda d: d["devices"][2].update(id="host0000/nic0"))
    assert "address: duplicate address '198.18.0.1' (first at devices[1])" in _bad(
        lambda d: d["devices"][2].update(address="198.18.0.1"))
    assert "links[0].capacity_gbps: must be > 0, got 0" in _bad(lambda d: d["links"][0].update(capacity_gbps=0))
    assert "links[0].capacity_gbps: expected a number, got '400G'" in _bad(
        lambda d: d["links"][0].update(capacity_gbps="400G"))
    assert "links[0].latency_ns: expected an integer >= 0, got -1" in _bad(
        lambda d: d["links"][0].update(latency_ns=-1))
    assert "links[0].b: port 'nosuch:eth1' is on an unknown device 'nosuch'" in _bad(
        lambda d: d["links"][0].update(b="nosuch:eth1"))
    assert "links[0].a: a port id is '<device>:<port>', got 'host0000'" in _bad(
        lambda d: d["links"][0].update(a="host0000"))
    assert "already used by link" in _bad(lambda d: d["links"].append(
        {"a": d["links"][0]["a"], "b": "spine-p0-00:eth99", "capacity_gbps": 1}))
    # Many problems are reported at once, not one per run.
    msg = _bad(lambda d: [x.update(gpus="x") for x in d["devices"][:3]])
    assert "3 problems" in msg


def test_nic_on_two_rails_is_rejected() -> None:
    def cable_rail1(d: dict[str, Any]) -> None:
        nic = next(x for x in d["devices"] if x["role"] == "nic" and x["rail"] == 0)
        leaf1 = next(x for x in d["devices"] if x["role"] == "leaf" and x["rail"] == 1)
        d["links"].append({"a": f"{nic['id']}:p1", "b": f"{leaf1['id']}:eth99", "capacity_gbps": 400})

    assert "NIC on two rails [0, 1]" in _bad(cable_rail1)


def test_malformed_files_give_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("version: 1\ndevices:\n  - {id: a, role: host\nlinks: []\n")
    with pytest.raises(InventoryError, match=r"bad\.yaml:4:\d+: malformed YAML"):
        read_fabric(p)
    j = tmp_path / "bad.json"
    j.write_text('{"version": 1,\n "devices": [}\n')
    with pytest.raises(InventoryError, match=r"bad\.json:2:\d+: malformed JSON"):
        read_fabric(j)
    with pytest.raises(InventoryError, match=r"unknown inventory format '\.txt'"):
        read_fabric(tmp_path / "f.txt")
    with pytest.raises(InventoryError, match="cannot read inventory"):
        read_fabric(tmp_path / "missing.yaml")
    top = tmp_path / "list.yaml"
    top.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(InventoryError, match=r"list\.yaml: expected a mapping at the top level, got list"):
        read_fabric(top)
