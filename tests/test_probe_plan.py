"""Probe plans: deterministic without a controller, budgeted, and covering every ECMP path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric import Routing, fat_tree_fabric, leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.probe.plan import (
    coverage_probability,
    plan_mesh,
    plan_probes,
    ports_for_coverage,
)


def test_coverage_probability_matches_inclusion_exclusion() -> None:
    # Small n: the alternating inclusion-exclusion sum is exact and stable.
    for n in (1, 2, 3, 5, 8):
        for k in (0, 1, n, 3 * n, 10 * n):
            ie = sum((-1) ** j * math.comb(n, j) * (1 - j / n) ** k for j in range(n + 1))
            assert coverage_probability(n, k) == pytest.approx(ie, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64])
def test_ports_for_coverage_is_the_least_k(n: int) -> None:
    k = ports_for_coverage(n, 0.99)
    assert coverage_probability(n, k) >= 0.99
    if k > 1:
        assert coverage_probability(n, k - 1) < 0.99
    # Union bound n(1-1/n)^k <= 0.01 is sufficient, so the exact k never exceeds it.
    if n > 1:
        assert k <= math.ceil(math.log(0.01 / n) / math.log(1 - 1 / n))


def test_plans_are_identical_on_every_agent_and_redrawn_per_epoch() -> None:
    f = fat_tree_fabric(k=4)
    a = plan_probes(f, f.nics[0].id, seed=7, epoch=3)
    b = plan_probes(f, f.nics[0].id, seed=7, epoch=3)
    assert a == b
    c = plan_probes(f, f.nics[0].id, seed=7, epoch=4)
    assert c.src_ports != a.src_ports


def test_plan_covers_tor_mesh_and_respects_budget() -> None:
    f = fat_tree_fabric(k=8)
    p = plan_probes(f, f.nics[0].id, seed=1, budget_pps=100, epoch_s=30, min_probes_per_flow=2)
    tor = {n.id for n in f.nics if f.leaves_of_nic[n.id] == f.leaves_of_nic[f.nics[0].id]} - {f.nics[0].id}
    assert {x.dst for x in p.peers if x.reason == "tor"} == tor
    assert p.n_flows <= 100 * 30 / 2
    assert {x.reason for x in p.peers} == {"tor", "rail", "pod"}
    # A tight budget drops the rotating samples first, never the ToR mesh.
    tight = plan_probes(f, f.nics[0].id, seed=1, budget_pps=1, epoch_s=30, min_probes_per_flow=2)
    assert {x.dst for x in tight.peers if x.reason == "tor"} == tor
    assert not [x for x in tight.peers if x.reason == "pod"]


def test_unknown_self_is_a_config_error() -> None:
    f = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
    with pytest.raises(ConfigError, match="not a NIC"):
        plan_probes(f, "nosuch", seed=0)


def test_measured_path_coverage_meets_target() -> None:
    # Every cross-leaf pair in a leaf-spine with 8 spines has 8 paths. Each pair is covered
    # with probability p >= 0.99 if the switch hash behaves like a uniform draw; over N pairs
    # the covered fraction is Binomial(N, p)/N, so we allow 4 standard deviations below 0.99.
    f = leaf_spine_fabric(leaves=8, hosts_per_leaf=4, spines=8)
    r = Routing(f)
    plans = plan_mesh(f, seed=3, pod_peers=0, rail_peers_per_leaf=4)
    covered = []
    for src, plan in plans.items():
        for peer in plan.peers:
            if peer.path_count < 2:
                continue
            dip = f.devices[peer.dst].address
            seen = {r.path(src, peer.dst, flow) for dst, flow in plan.flows(f) if dst == peer.dst}
            assert dip is not None
            covered.append(len(seen) == peer.path_count)
    n = len(covered)
    assert n > 500
    frac = float(np.mean(covered))
    assert frac >= 0.99 - 4 * math.sqrt(0.99 * 0.01 / n)
