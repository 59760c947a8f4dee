"""Blast radius: hand-computed shares on small fabrics, and a per-unit brute force cross-check."""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import pytest

from fabricscope.design.blast import blast_radius
from fabricscope.design.model import COMPONENTS, BlastRow
from fabricscope.fabric.builders import (
    FabricBuilder,
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.inventory import Fabric, port_device


def _rows(f: Fabric) -> dict[str, BlastRow]:
    rows = blast_radius(f)
    names = [r.component for r in rows]
    assert names == [c for c in COMPONENTS if c in names]  # COMPONENTS order, no repeats
    return {r.component: r for r in rows}


def test_single_homed_leaf_cuts_the_gpus_of_its_nics() -> None:
    f = rail_optimized_fabric(16)
    spl = int(f.meta["servers_per_leaf"])  # type: ignore[call-overload]
    r = _rows(f)
    assert r["gpu"].gpus_cut == 1.0 and r["nic"].gpus_cut == 1.0
    leaves = 8 * math.ceil(16 / spl)
    assert r["leaf"].count == leaves
    assert r["leaf"].gpus_cut == pytest.approx(16 * 8 / leaves)
    assert (r["leaf"].gpus_degraded, r["leaf"].failover) == (0.0, "none")
    assert r["link:host-leaf"].gpus_cut == 1.0 and r["link:host-leaf"].count == 128
    assert "core" not in r and "link:spine-core" not in r


def test_dual_tor_leaf_degrades_by_half_and_cuts_nothing() -> None:
    f = dual_tor_fabric(16)
    r = _rows(f)
    leaf = r["leaf"]
    assert leaf.gpus_cut == 0.0 and leaf.failover == "dual-tor"
    assert leaf.bandwidth_lost == pytest.approx(0.5)
    assert leaf.gpus_degraded == pytest.approx(2 * 16 * 8 / leaf.count)  # each NIC on 2 ToRs
    hl = r["link:host-leaf"]
    assert (hl.gpus_cut, hl.gpus_degraded, hl.failover) == (0.0, 1.0, "dual-tor")
    assert hl.bandwidth_lost == pytest.approx(0.5)


def test_multi_plane_leaf_degrades_by_the_plane_share() -> None:
    for planes in (2, 4):
        r = _rows(multi_plane_fabric(16, planes=planes))
        assert r["leaf"].gpus_cut == 0.0 and r["leaf"].failover == "multi-plane"
        assert r["leaf"].bandwidth_lost == pytest.approx(1 / planes)


@pytest.mark.parametrize(("spines", "lps"), [(3, 1), (4, 2)])
def test_two_tier_spine_share_is_one_over_the_spines(spines: int, lps: int) -> None:
    leaves, hpl = 4, 2
    f = leaf_spine_fabric(leaves=leaves, hosts_per_leaf=hpl, spines=spines, links_per_spine=lps)
    r = _rows(f)
    s = r["spine"]
    assert (s.count, s.gpus_cut, s.failover) == (spines, 0.0, "fast-reroute")
    assert s.gpus_degraded == leaves * hpl and s.bandwidth_lost == pytest.approx(1 / spines)
    ls = r["link:leaf-spine"]
    assert ls.count == leaves * spines * lps and ls.gpus_degraded == hpl
    assert ls.bandwidth_lost == pytest.approx(1 / (spines * lps))


def test_core_share_is_the_product_over_two_tiers() -> None:
    pods, tors, aggs, hosts, cores = 2, 2, 2, 2, 3
    f = fat_tree_fabric(pods=pods, tors_per_pod=tors, aggs_per_pod=aggs, hosts_per_tor=hosts,
                        cores_per_plane=cores)
    r = _rows(f)
    gpus = pods * tors * hosts
    # A ToR spreads over `aggs` aggregation switches, agg j over the `cores` cores of plane j:
    # core c of plane j carries 1/aggs * 1/cores of every GPU's traffic leaving its pod.
    c = r["core"]
    assert (c.count, c.gpus_cut, c.gpus_degraded) == (aggs * cores, 0.0, gpus)
    assert c.bandwidth_lost == pytest.approx(1 / (aggs * cores))
    sc = r["link:spine-core"]
    assert sc.count == pods * aggs * cores and sc.gpus_degraded == gpus / pods
    assert sc.bandwidth_lost == pytest.approx(1 / (aggs * cores))
    sp = r["spine"]
    assert sp.gpus_degraded == gpus / pods and sp.bandwidth_lost == pytest.approx(1 / aggs)


def test_rail_three_tier_core_share() -> None:
    f = rail_optimized_fabric(16, servers_per_pod=8)
    m = f.meta
    assert m["tiers"] == 3
    s, cpg = int(m["spines_per_group"]), int(m["cores_per_group"])  # type: ignore[call-overload]
    r = _rows(f)
    assert r["core"].bandwidth_lost == pytest.approx(1 / (s * cpg))
    assert r["core"].gpus_degraded == 16 * 8  # every pod reaches every core group


def _uneven() -> Fabric:
    """leaf0: 400G to s0 + 100G to s1; leaf1: its only uplink to s0. Two 1-NIC hosts each."""
    b = FabricBuilder("uneven")
    s0, s1 = b.switch("spine-0", "spine"), b.switch("spine-1", "spine")
    for li in range(2):
        leaf = b.switch(f"leaf-{li}", "leaf")
        for h in range(2):
            hid = b.host(f"host{li}{h}", 1)
            b.cable(b.nic(hid, 0, gpu=0), leaf, 100.0, a_prefix="p")
        if li == 0:
            b.cable(leaf, s0, 400.0)
            b.cable(leaf, s1, 100.0)
        else:
            b.cable(leaf, s0, 100.0)
    return b.build({"kind": "hand"})


def test_capacity_weighted_split_and_a_leafs_only_uplink() -> None:
    r = _rows(_uneven())
    s = r["spine"]
    # spine-0 down: leaf0's 2 GPUs lose 400/500, leaf1's 2 GPUs are cut; spine-1: leaf0 loses 0.2.
    assert s.count == 2
    assert s.gpus_cut == pytest.approx(2 / 2)
    assert s.gpus_degraded == pytest.approx((2 + 2) / 2)
    assert s.bandwidth_lost == pytest.approx((2 * 0.8 + 2 * 0.2) / 4)
    ls = r["link:leaf-spine"]
    assert ls.count == 3 and ls.gpus_cut == pytest.approx(2 / 3)


def _brute(f: Fabric) -> dict[str, tuple[float, float, float]]:
    """Per-unit failure by the definitions, with plain dicts (no matrices, no compression)."""
    role = {d.id: d.role for d in f.devices.values()}
    nic_ports: dict[str, list[tuple[str, float, str]]] = defaultdict(list)
    up: dict[str, list[tuple[str, float, str]]] = defaultdict(list)
    for ln in f.links:
        a, b = port_device(ln.a), port_device(ln.b)
        if role[a] == "nic" or role[b] == "nic":
            n, leaf = (a, b) if role[a] == "nic" else (b, a)
            nic_ports[n].append((leaf, ln.capacity_gbps, ln.id))
        else:
            lo, hi = (a, b) if f.devices[a].tier < f.devices[b].tier else (b, a)
            up[lo].append((hi, ln.capacity_gbps, ln.id))

    @functools.cache
    def frac_via(dev: str, dead: str) -> float:
        """Share of dev's upward traffic that crosses the element `dead` (device or link id)."""
        total = sum(c for _, c, _ in up[dev])
        out = 0.0
        for nxt, c, lid in up[dev]:
            if dead in (nxt, lid):
                out += c / total
            elif up.get(nxt):
                out += c / total * frac_via(nxt, dead)
        return out

    out: dict[str, tuple[float, float, float]] = {}
    classes = {"spine": [d.id for d in f.switches if d.role == "spine"],
               "core": [d.id for d in f.switches if d.role == "core"],
               "link:leaf-spine": [ln.id for ln in f.links
                                   if {role[port_device(ln.a)], role[port_device(ln.b)]}
                                   == {"leaf", "spine"}],
               "link:spine-core": [ln.id for ln in f.links
                                   if {role[port_device(ln.a)], role[port_device(ln.b)]}
                                   == {"spine", "core"}]}
    for cls, units in classes.items():
        if not units:
            continue
        cut = deg = lost = 0.0
        for u in units:
            for ports in nic_ports.values():
                cap = sum(c for _, c, _ in ports)
                loss = sum(c / cap * frac_via(leaf, u) for leaf, c, _ in ports)
                if loss >= 1 - 1e-9:
                    cut += 1
                elif loss > 1e-9:
                    deg += 1
                    lost += loss
        out[cls] = (cut / len(units), deg / len(units), lost / deg if deg else 0.0)
    return out


@pytest.mark.parametrize("build", [
    lambda: dual_tor_fabric(16, servers_per_pod=8),
    lambda: multi_plane_fabric(16, planes=2, servers_per_pod=8),
    lambda: rail_optimized_fabric(16, servers_per_pod=8, spine_mode="per-rail"),
    _uneven,
], ids=["dual-tor-3tier", "multi-plane-3tier", "rail-per-rail-3tier", "uneven"])
def test_matches_a_per_unit_brute_force(build: object) -> None:
    f = build()  # type: ignore[operator]
    rows = _rows(f)
    for cls, (cut, deg, lost) in _brute(f).items():
        r = rows[cls]
        assert (r.gpus_cut, r.gpus_degraded, r.bandwidth_lost) == pytest.approx(
            (cut, deg, lost), rel=1e-9, abs=1e-12), cls
