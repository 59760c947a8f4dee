"""Builders: sizes, ids, rails/planes/homing, radix checks (every switch fits its port count)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.fabric import (
    Fabric,
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.inventory import port_device
from fabricscope.fabric.summary import summarize
from fabricscope.model.errors import InventoryError


def _ports_used(f: Fabric) -> Counter[str]:
    used: Counter[str] = Counter()
    for ln in f.links:
        used[port_device(ln.a)] += 1
        used[port_device(ln.b)] += 1
    return used


def _neighbors(f: Fabric, dev: str) -> set[str]:
    return {port_device(p) for p in f.neighbors_ports(dev)}


# ---------------------------------------------------------------------- leaf-spine, fat tree
def test_leaf_spine_counts_and_oversubscription() -> None:
    f = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=2, links_per_spine=1)
    assert len(f.by_role("leaf")) == 4 and len(f.by_role("spine")) == 2
    assert f.gpu_count == 32 and len(f.nics) == 32
    assert len(f.links) == 32 + 4 * 2
    assert f.meta["oversubscription"] == {"leaf": 4.0}
    # Every leaf reaches every spine.
    for leaf in f.by_role("leaf"):
        assert {s.id for s in f.by_role("spine")} <= _neighbors(f, leaf.id)


def test_fat_tree_k_ary_matches_al_fares() -> None:
    k = 8
    f = fat_tree_fabric(k=k)
    assert len(f.nics) == k**3 // 4
    assert len(f.by_role("leaf")) == k * k // 2
    assert len(f.by_role("spine")) == k * k // 2
    assert len(f.by_role("core")) == (k // 2) ** 2
    assert max(_ports_used(f).values()) == k  # every switch uses exactly its k ports
    assert all(n == k for d, n in _ports_used(f).items() if f.devices[d].is_switch)


def test_fat_tree_htsim_reference_1024() -> None:
    f = fat_tree_fabric(pods=16, tors_per_pod=8, aggs_per_pod=8, hosts_per_tor=8, cores_per_plane=8)
    assert len(f.nics) == 1024
    assert len(f.by_role("core")) == 64
    assert f.meta["oversubscription"] == {"leaf": 1.0, "spine": 1.0}


def test_fat_tree_needs_parameters() -> None:
    with pytest.raises(InventoryError, match="give k"):
        fat_tree_fabric(pods=2)
    with pytest.raises(InventoryError, match="k: must be an even"):
        fat_tree_fabric(k=5)


def test_radix_rejects_impossible_leaf_spine() -> None:
    with pytest.raises(InventoryError, match=r"nics_per_host=8 needs 8 down \+ 1 up = 9 ports on a 4-port leaf"):
        leaf_spine_fabric(leaves=2, hosts_per_leaf=1, spines=1, nics_per_host=8, radix=4)
    with pytest.raises(InventoryError, match="radix: leaves=80"):
        leaf_spine_fabric(leaves=80, hosts_per_leaf=8, spines=8, radix=64)
    with pytest.raises(InventoryError, match="pods=9"):
        fat_tree_fabric(pods=9, tors_per_pod=4, aggs_per_pod=4, hosts_per_tor=4, cores_per_plane=4, radix=8)


# ---------------------------------------------------------------------- rail-optimized
def test_rail_optimized_default_is_1024_gpus_non_blocking() -> None:
    f = rail_optimized_fabric()
    s = summarize(f)
    assert s["gpus"] == 1024 and s["tiers"] == 2 and s["rails"] == 8
    assert s["switches"] == {"leaf": 32, "spine": 16}
    assert s["oversubscription"] == {"leaf": 1.0}
    # Non-blocking: bisection is half of all NIC bandwidth.
    assert s["bisection_gbps"] == pytest.approx(1024 * 400 / 2)
    used = _ports_used(f)
    assert max(used[d.id] for d in f.switches) <= 64


def test_rail_optimized_rails_and_ids() -> None:
    f = rail_optimized_fabric(16)
    for nic in f.nics:
        (leaf,) = f.leaves_of_nic[nic.id]
        assert f.devices[leaf].rail == nic.rail == nic.gpu
        assert leaf.startswith(f"leaf-p0-r{nic.rail}-")
    assert f.nic_of_gpu("host0003", 5).id == "host0003/nic5"
    # Addresses are unique and in 198.18.0.0/15.
    addrs = [d.address for d in f.devices.values() if d.address]
    assert len(addrs) == len(set(addrs))
    assert all(a.startswith("198.1") for a in addrs)


@pytest.mark.slow
def test_rail_optimized_32k_is_three_tier_in_radix() -> None:
    f = rail_optimized_fabric(4096)
    s = summarize(f)
    assert s["gpus"] == 32768 and s["tiers"] == 3
    assert s["switches"] == {"leaf": 1024, "spine": 1024, "core": 512}
    assert s["oversubscription"] == {"leaf": 1.0, "spine": 1.0}
    used = _ports_used(f)
    assert max(used[d.id] for d in f.switches) <= 64
    assert s["components"] == 1


def test_rail_optimized_oversubscription_and_pods() -> None:
    f = rail_optimized_fabric(64, oversubscription=3.0, pods=2)
    assert f.meta["tiers"] == 3 and f.meta["pods"] == 2
    leaf = f.by_role("leaf")[0]
    up = sum(1 for p in f.neighbors_ports(leaf.id) if f.devices[port_device(p)].role == "spine")
    down = sum(1 for p in f.neighbors_ports(leaf.id) if f.devices[port_device(p)].role == "nic")
    assert down == f.meta["servers_per_leaf"]
    assert down / up == pytest.approx(f.meta["oversubscription"]["leaf"])  # type: ignore[index]
    assert f.meta["oversubscription"]["leaf"] >= 2.9  # type: ignore[index]


def test_rail_optimized_per_rail_spines_keep_rails_apart() -> None:
    f = rail_optimized_fabric(16, spine_mode="per-rail")
    for sp in f.by_role("spine"):
        rails = {f.devices[n].rail for n in _neighbors(f, sp.id)}
        assert rails == {sp.rail}


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"servers_per_leaf": 40}, "servers_per_leaf=40 .* on a 64-port leaf"),
        ({"radix": 1}, "radix: must be an integer >= 2"),
        ({"spines": 5}, "spines: 5 spines must divide"),
        ({"servers": 0}, "servers: must be an integer >= 1"),
        ({"spine_mode": "ring"}, "spine_mode: unknown 'ring'"),
        ({"servers": 70000}, "too large for 3 tiers"),
        ({"nic_gbps": 0}, "nic_gbps: must be > 0"),
    ],
)
def test_rail_optimized_rejects_impossible(kwargs: dict[str, object], pattern: str) -> None:
    args: dict[str, object] = {"servers": 128, **kwargs}
    with pytest.raises(InventoryError, match=pattern):
        rail_optimized_fabric(**args)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    servers=st.integers(1, 80),
    rails=st.integers(1, 8),
    radix=st.sampled_from([8, 16, 32, 64]),
    over=st.sampled_from([1.0, 2.0, 3.0]),
    kind=st.sampled_from(["rail", "plane", "dual"]),
)
def test_every_switch_fits_its_radix(servers: int, rails: int, radix: int, over: float, kind: str) -> None:
    try:
        if kind == "rail":
            f = rail_optimized_fabric(servers, gpus_per_server=rails, radix=radix, oversubscription=over)
        elif kind == "plane":
            f = multi_plane_fabric(servers, gpus_per_server=rails, radix=radix, oversubscription=over)
        else:
            f = dual_tor_fabric(servers, gpus_per_server=rails, radix=radix, oversubscription=over)
    except InventoryError as exc:
        assert "radix" in str(exc)  # only "does not fit" may refuse a valid parameter set
        return
    used = _ports_used(f)
    assert all(used[d.id] <= radix for d in f.switches)
    assert f.gpu_count == servers * rails
    assert summarize(f)["components"] == 1


# ---------------------------------------------------------------------- multi-plane, dual-ToR
def test_multi_plane_planes_share_nothing_above_the_nic() -> None:
    f = multi_plane_fabric(16, planes=4)
    nic = f.nics[0]
    leaves = f.leaves_of_nic[nic.id]
    assert [f.devices[x].plane for x in leaves] == [0, 1, 2, 3]
    assert [p.split(":")[1] for p in f.ports_of[nic.id]] == ["p0", "p1", "p2", "p3"]
    assert f.ports[f.ports_of[nic.id][0]].speed_gbps == 100.0  # 400G split in 4
    for ln in f.links:
        da, db = f.devices[port_device(ln.a)], f.devices[port_device(ln.b)]
        if da.is_switch and db.is_switch:
            assert da.plane == db.plane  # no cable joins two planes


def test_dual_tor_homes_each_nic_on_two_tors_of_its_rail() -> None:
    f = dual_tor_fabric(8)
    for nic in f.nics:
        a, b = f.leaves_of_nic[nic.id]
        assert a.endswith("a") and b.endswith("b") and a[:-1] == b[:-1]
        assert f.devices[a].rail == f.devices[b].rail == nic.rail
        # Both ToRs reach the same spines.
        spines = {d for d in _neighbors(f, a) if f.devices[d].role == "spine"}
        assert spines and spines == {d for d in _neighbors(f, b) if f.devices[d].role == "spine"}
