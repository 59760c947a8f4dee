"""Summaries: bisection and oversubscription against the textbook formulas, computed by hand."""

from __future__ import annotations

import inspect

import pytest

from fabricscope.fabric import (
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.catalog import build_fabric, builder_parameters, parse_params
from fabricscope.fabric.summary import summarize
from fabricscope.model.errors import InventoryError


@pytest.mark.parametrize(("spines", "lps", "up_gbps"), [(8, 1, 100.0), (2, 1, 100.0), (2, 2, 400.0), (4, 1, 50.0)])
def test_leaf_spine_bisection_and_oversubscription(spines: int, lps: int, up_gbps: float) -> None:
    leaves, hpl, r = 6, 8, 100.0
    f = leaf_spine_fabric(leaves=leaves, hosts_per_leaf=hpl, spines=spines, links_per_spine=lps,
                          uplink_gbps=up_gbps)
    s = summarize(f)
    n = leaves * hpl
    o = hpl * r / (spines * lps * up_gbps)  # down:up per leaf
    assert s["oversubscription"] == {"leaf": pytest.approx(o)}
    # Half the hosts send to the other half: limited by NICs, or by the leaves' uplinks.
    assert s["bisection_gbps"] == pytest.approx(min(n * r, n * r / o) / 2)
    assert s["switches"] == {"leaf": leaves, "spine": spines}


def test_fat_tree_bisection() -> None:
    k = 8
    s = summarize(fat_tree_fabric(k=k, gbps=100.0))
    assert s["bisection_gbps"] == pytest.approx(k**3 / 4 * 100 / 2)  # full bisection
    # htsim-style with 2:1 at the ToR and 4:1 at the aggregation: the core tier limits.
    s = summarize(fat_tree_fabric(pods=4, tors_per_pod=4, aggs_per_pod=2, hosts_per_tor=4, cores_per_plane=1))
    assert s["oversubscription"] == {"leaf": 2.0, "spine": 4.0}
    hosts = 4 * 4 * 4
    assert s["bisection_gbps"] == pytest.approx(hosts * 100 / (2 * 2 * 4))


def test_rail_and_multi_plane_and_dual_tor_counts() -> None:
    s = summarize(multi_plane_fabric(16, planes=2))
    assert (s["planes"], s["rails"], s["nic_ports"], s["nic_gbps"]) == (2, 8, 256, 400.0)
    assert s["bisection_gbps"] == pytest.approx(128 * 400 / 2)
    s = summarize(dual_tor_fabric(16))
    assert (s["nic_ports"], s["switches"]["leaf"]) == (256, 16)
    s = summarize(rail_optimized_fabric(16, spine_mode="per-rail"))
    assert s["components"] == 8 and s["bisection_gbps"] == 0.0  # rail-only: rails meet in hosts
    s = summarize(rail_optimized_fabric(32, oversubscription=2.0))
    assert s["oversubscription"]["leaf"] == pytest.approx(2.0, rel=0.1)


def test_catalog_builds_by_kind_and_rejects_unknowns() -> None:
    f = build_fabric("rail-optimized", parse_params(["servers=4", "gpus-per-server=2", "radix=8"]))
    assert f.gpu_count == 8
    assert build_fabric("fat_tree", {"k": 4}).gpu_count == 16
    assert "servers" in builder_parameters("dual-tor")
    with pytest.raises(InventoryError, match="unknown topology 'torus'"):
        build_fabric("torus", {})
    with pytest.raises(InventoryError, match="sever: unknown parameter for rail-optimized; known: servers"):
        build_fabric("rail-optimized", {"sever": "1"})
    with pytest.raises(InventoryError, match="k: expected an integer, got 'four'"):
        build_fabric("fat-tree", {"k": "four"})
    # Every builder builds with no parameter at all (issue 9: defaults for every builder).
    for kind in ("leaf-spine", "fat-tree", "rail-optimized", "multi-plane", "dual-tor"):
        assert build_fabric(kind, {}).gpu_count > 0, kind
        assert all(d is not inspect.Parameter.empty for _, d in builder_parameters(kind).values()), kind
    with pytest.raises(InventoryError, match="expected KEY=VALUE, got 'servers'"):
        parse_params(["servers"])
    assert build_fabric("rail-optimized", {"servers": 2, "radix": 8, "spines": "auto"}).gpu_count == 16
