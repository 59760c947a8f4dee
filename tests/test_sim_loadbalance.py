"""Load balancing: the vectorized walks agree exactly with Routing, spraying conserves bytes,
random paths are uniform."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from fabricscope.fabric import HashConfig, Routing, fat_tree_fabric, leaf_spine_fabric
from fabricscope.sim.loadbalance import PathFinder, _stack, crc32_vec


def test_crc32_vec_is_zlib() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 256, size=(200, 13), dtype=np.uint8)
    seeds = rng.integers(0, 2**32, size=200, dtype=np.uint64).astype(np.uint32)
    got = crc32_vec(keys, seeds)
    assert [int(x) for x in got] == [zlib.crc32(bytes(k), int(s)) for k, s in zip(keys, seeds, strict=True)]
    assert int(crc32_vec(np.frombuffer(os.urandom(13), np.uint8)[None, :] * 0, np.zeros(1, np.uint32))[0]) == zlib.crc32(bytes(13), 0)


@pytest.mark.parametrize(
    "hc", [HashConfig(), HashConfig(per_switch_seed=False), HashConfig(function="crc16", seed=3), HashConfig(function="xor")]
)
def test_ecmp_walk_equals_routing_path(hc: HashConfig) -> None:
    fab = fat_tree_fabric(k=8)
    r = Routing(fab, hash_config=hc)
    pf = PathFinder(r)
    nics = [n.id for n in fab.nics]
    rng = np.random.default_rng(1)
    s = rng.integers(0, len(nics), 300)
    t = rng.integers(0, len(nics), 300)
    sport = rng.integers(49152, 65535, 300)
    node = fab.index.node_of
    src = np.array([node[nics[i]] for i in s])
    dst = np.array([node[nics[i]] for i in t])
    tab = pf.single_paths(src, dst, sport)
    # The engine's own hashed walk (used for striping) must agree too.
    hops, failed = pf.walk(src, dst, keys=pf.keys(src, dst, sport))
    own = _stack(hops, failed, 300)
    for j in range(300):
        ft = r.flow_tuple(nics[s[j]], nics[t[j]], src_port=int(sport[j]))
        expected = r.path(nics[s[j]], nics[t[j]], ft)
        assert tuple(tab.row(j)[0].tolist()) == expected
        assert tuple(own.row(j)[0].tolist()) == expected


def test_spray_equals_routing_weights_and_conserves() -> None:
    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=3, spines=3, nics_per_host=2)
    r = Routing(fab)
    pf = PathFinder(r)
    nics = [n.id for n in fab.nics]
    node = fab.index.node_of
    pairs = [(a, b) for a in nics[:6] for b in nics if a != b]
    tab = pf.spray(np.array([node[a] for a, _ in pairs]), np.array([node[b] for _, b in pairs]))
    for j, (a, b) in enumerate(pairs):
        e, w = tab.row(j)
        assert dict(zip(e.tolist(), w.tolist(), strict=True)) == pytest.approx(dict(r.spray_weights(a, b)))
        # One unit leaves the source NIC and one unit reaches the destination NIC.
        ix = fab.index
        assert w[ix.src[e] == node[a]].sum() == pytest.approx(1.0)
        assert w[ix.dst[e] == node[b]].sum() == pytest.approx(1.0)


def test_random_paths_are_uniform_over_spines() -> None:
    k, n = 8, 4000
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=1, spines=k)
    pf = PathFinder(Routing(fab))
    a, b = (fab.index.node_of[x.id] for x in fab.nics)
    tab = pf.single_paths(np.full(n, a), np.full(n, b), np.zeros(n, np.int64), rng=np.random.default_rng(7))
    second = tab.edges.reshape(n, -1)[:, 1]
    counts = np.bincount(np.unique(second, return_inverse=True)[1], minlength=k)
    assert counts.shape[0] == k
    # Multinomial: each count ~ Binomial(n, 1/k); allow 4 sd per bin.
    sd = np.sqrt(n / k * (1 - 1 / k))
    assert (np.abs(counts - n / k) <= 4 * sd).all()
