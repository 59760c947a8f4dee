"""Routing invariants: ECMP paths are shortest, counts match enumeration, hashing is
deterministic, route_many equals per-flow path(), polarization shows, failures reroute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from fabricscope.fabric import (
    Fabric,
    HashConfig,
    Routing,
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.hashing import _FUNCS, HASH_FUNCTIONS
from fabricscope.model.errors import UnroutableError

# Small fabrics of every kind (failure-free and partial-failure variants come from the tests).
FABRICS: dict[str, Fabric] = {
    "leaf-spine": leaf_spine_fabric(leaves=4, hosts_per_leaf=3, spines=3, links_per_spine=2),
    "fat-tree": fat_tree_fabric(k=4),
    "htsim": fat_tree_fabric(pods=3, tors_per_pod=2, aggs_per_pod=3, hosts_per_tor=2, cores_per_plane=2),
    "rail-2t": rail_optimized_fabric(8, gpus_per_server=4, radix=8),
    "rail-3t": rail_optimized_fabric(8, gpus_per_server=2, radix=8, pods=2),
    "multi-plane": multi_plane_fabric(4, planes=2, gpus_per_server=2, radix=8),
    "dual-tor": dual_tor_fabric(4, gpus_per_server=2, radix=8),
}


def _hop_distance(f: Fabric, r: Routing, s: int, t: int) -> float:
    """Independent oracle: BFS where only switches forward (NICs are endpoints, never transit)."""
    ix = f.index
    keep = r.usable & (ix.is_switch[ix.src] | (ix.src == s)) & (ix.is_switch[ix.dst] | (ix.dst == t))
    g = csr_matrix((np.ones(int(keep.sum())), (ix.src[keep], ix.dst[keep])), shape=(ix.n_nodes, ix.n_nodes))
    return float(shortest_path(g, unweighted=True, directed=True, indices=[s])[0, t])


def _is_walk(f: Fabric, path: tuple[int, ...], s: int, t: int) -> bool:
    ix = f.index
    node = s
    for e in path:
        if int(ix.src[e]) != node:
            return False
        node = int(ix.dst[e])
    return node == t


pair_st = st.tuples(st.sampled_from(sorted(FABRICS)), st.integers(0, 10**6), st.integers(0, 10**6))


@settings(max_examples=60, deadline=None)
@given(pair=pair_st, sport=st.integers(0, 65535))
def test_every_ecmp_path_is_shortest_and_counted(pair: tuple[str, int, int], sport: int) -> None:
    kind, i, j = pair
    f = FABRICS[kind]
    r = Routing(f)
    nics = f.nics
    a, b = nics[i % len(nics)].id, nics[j % len(nics)].id
    if a == b:
        return
    s, t = r.node(a), r.node(b)
    dist = _hop_distance(f, r, s, t)
    paths = r.paths(a, b)
    assert paths and all(len(p) == dist and _is_walk(f, p, s, t) for p in paths)
    assert len(set(paths)) == len(paths) == r.path_count(a, b)
    flow = r.flow_tuple(a, b, src_port=sport)
    chosen = r.path(a, b, flow)
    assert chosen in paths
    assert r.path(a, b, flow) == chosen  # same 5-tuple, same path
    # Spraying splits one unit of traffic evenly: it leaves the source whole and arrives whole.
    w = r.spray_weights(a, b)
    assert sum(v for e, v in w.items() if f.index.src[e] == s) == pytest.approx(1.0)
    assert sum(v for e, v in w.items() if f.index.dst[e] == t) == pytest.approx(1.0)


def test_path_counts_of_clos_formulas() -> None:
    f = FABRICS["fat-tree"]  # k=4: inter-pod (k/2)^2 = 4 paths, intra-pod k/2 = 2, same ToR 1
    r = Routing(f)
    assert r.path_count("host0000/nic0", "host0015/nic0") == 4
    assert r.path_count("host0000/nic0", "host0002/nic0") == 2
    assert r.path_count("host0000/nic0", "host0001/nic0") == 1
    ls = FABRICS["leaf-spine"]  # 3 spines x 2 parallel links each way
    assert Routing(ls).path_count("host0000/nic0", "host0005/nic0") == 3 * 2 * 2
    mp = FABRICS["multi-plane"]  # a multi-homed NIC hashes over its planes
    rm = Routing(mp)
    firsts = [p[0] for p in rm.paths("host0000/nic0", "host0003/nic0")]
    assert len(set(firsts)) == 2 and firsts.count(firsts[0]) * 2 == len(firsts)  # 2 equal planes


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(sorted(FABRICS)),
    fn=st.sampled_from(HASH_FUNCTIONS),
    per_switch=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_route_many_equals_path(kind: str, fn: str, per_switch: bool, seed: int, data: st.DataObject) -> None:
    f = FABRICS[kind]
    hc = HashConfig(function=fn, seed=seed, per_switch_seed=per_switch)  # type: ignore[arg-type]
    # No failure, a top-tier cable (reroute), or a NIC cable (unroutable when single-homed).
    failed = data.draw(st.sampled_from([(), (f.links[-1].id,), (f.links[0].id,)]))
    r = Routing(f, hash_config=hc, failed_links=failed)
    n = len(f.nics)
    src = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))
    dst = data.draw(st.lists(st.integers(0, n - 1), min_size=len(src), max_size=len(src)))
    sports = data.draw(st.lists(st.integers(0, 65535), min_size=len(src), max_size=len(src)))
    s_nodes = [r.node(f.nics[i].id) for i in src]
    t_nodes = [r.node(f.nics[i].id) for i in dst]
    table = r.route_many(s_nodes, t_nodes, sports, strict=False)
    for k in range(len(src)):
        a, b = f.nics[src[k]].id, f.nics[dst[k]].id
        try:
            expected = r.path(a, b, r.flow_tuple(a, b, src_port=sports[k]))
        except UnroutableError:
            assert not table.ok[k] and table.path(k) == ()
            continue
        assert table.ok[k]
        assert table.path(k) == expected


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(sorted(FABRICS)), data=st.data())
def test_spray_many_equals_spray_weights(kind: str, data: st.DataObject) -> None:
    f = FABRICS[kind]
    failed = data.draw(st.sampled_from([(), (f.links[-1].id,), (f.links[0].id,)]))
    r = Routing(f, failed_links=failed)
    n = len(f.nics)
    src = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=30))
    dst = data.draw(st.lists(st.integers(0, n - 1), min_size=len(src), max_size=len(src)))
    s_nodes = [r.node(f.nics[i].id) for i in src]
    t_nodes = [r.node(f.nics[i].id) for i in dst]
    table = r.spray_many(s_nodes, t_nodes, strict=False, chunk=data.draw(st.integers(1, 40)))
    for k in range(len(src)):
        try:
            expected = r.spray_weights_nodes(s_nodes[k], t_nodes[k])
        except UnroutableError:
            assert not table.ok[k] and table.weights_of(k) == {}
            continue
        got = table.weights_of(k)
        assert table.ok[k] and got.keys() == expected.keys()
        assert all(got[e] == pytest.approx(expected[e], rel=1e-12) for e in got)


@settings(max_examples=50, deadline=None)
@given(
    fn=st.sampled_from(HASH_FUNCTIONS),
    key=st.binary(min_size=0, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_hash_is_affine_in_the_seed(fn: str, key: bytes, seed: int) -> None:
    """h(key, seed) == h(key, 0) ^ T(seed, len): what makes route_many a few xors per hop."""
    hc = HashConfig(function=fn)  # type: ignore[arg-type]
    keys = np.frombuffer(key, dtype=np.uint8).reshape(1, -1)
    base = int(hc.base_hashes(keys)[0])
    assert base == _FUNCS[fn](key, 0)
    assert base ^ hc.seed_term(seed, len(key)) == _FUNCS[fn](key, seed)


def test_polarization_with_one_seed_everywhere() -> None:
    """Same function and seed in every tier: the agg->core choice repeats the ToR->agg choice,
    so a pod's traffic to other pods uses only aggs_per_pod of its aggs x cores uplinks."""
    f = fat_tree_fabric(k=8)
    ix = f.index
    src = [n.id for n in f.nics if n.pod == 0]
    dst = [n.id for n in f.nics if n.pod == 1]

    def core_links_used(hc: HashConfig) -> int:
        r = Routing(f, hash_config=hc)
        used = set()
        for a in src:
            for b in dst:
                for sport in range(49152, 49152 + 4):
                    for e in r.path(a, b, r.flow_tuple(a, b, src_port=sport)):
                        if ix.tier[ix.src[e]] == 2 and ix.tier[ix.dst[e]] == 3:
                            used.add(e)
        return len(used)

    polarized = core_links_used(HashConfig(per_switch_seed=False))
    independent = core_links_used(HashConfig(per_switch_seed=True))
    assert polarized == 4  # k/2 aggs, each stuck on one core
    assert independent == 16  # (k/2)^2: every uplink of the pod carries something


def test_failed_link_reroutes_and_partition_is_unroutable() -> None:
    f = FABRICS["leaf-spine"]
    r0 = Routing(f)
    a, b = "host0000/nic0", "host0005/nic0"
    up = next(e for e in r0.paths(a, b)[0] if f.index.tier[f.index.dst[e]] == 2)
    lid = f.links[up // 2].id
    r1 = Routing(f, failed_links=[lid])
    # 3 spines x 2 uplinks x 2 downlinks = 12 paths; one uplink gone takes its 2 downlinks' paths.
    assert r0.path_count(a, b) == 12 and r1.path_count(a, b) == 10
    assert all(up not in p for p in r1.paths(a, b))
    nic_link = f.link_of_port[f.ports_of[a][0]].id
    r2 = Routing(f, failed_links=[nic_link])
    with pytest.raises(UnroutableError, match="no path from host0000/nic0"):
        r2.path(a, b)
    with pytest.raises(UnroutableError, match="flow 0 of 1"):
        r2.route_many([r2.node(a)], [r2.node(b)])
    table = r2.route_many([r2.node(a), r2.node(b)], [r2.node(b), r2.node("host0001/nic0")], strict=False)
    assert table.ok.tolist() == [False, True] and table.path(0) == ()


def test_dual_tor_survives_one_tor() -> None:
    f = FABRICS["dual-tor"]
    a, b = "host0000/nic0", "host0003/nic0"
    tor_a = f.leaves_of_nic[a][0]
    failed = [f.link_of_port[p].id for p in f.ports_of[tor_a] if f.link_of_port.get(p)]
    r = Routing(f, failed_links=failed)
    assert all(tor_a not in "".join(r.edge_ids(p)) for p in r.paths(a, b))
    assert r.reachable(a, b)


def test_route_many_with_ipv6_endpoints_falls_back_exactly() -> None:
    from fabricscope.fabric.io import fabric_from_dict, fabric_to_dict

    data = fabric_to_dict(FABRICS["leaf-spine"])
    for i, d in enumerate(x for x in data["devices"] if x["role"] == "nic"):
        d["address"] = f"2001:db8::{i + 1:x}"
    f = fabric_from_dict(data, source="v6.yaml")
    r = Routing(f)
    nics = [r.node(n.id) for n in f.nics]
    src, dst = nics, nics[::-1]
    table = r.route_many(src, dst, list(range(49152, 49152 + len(src))))
    for k, (a, b) in enumerate(zip(src, dst, strict=True)):
        ida, idb = f.index.node_ids[a], f.index.node_ids[b]
        assert table.path(k) == r.path(ida, idb, r.flow_tuple(ida, idb, src_port=49152 + k))
