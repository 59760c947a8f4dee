"""Probe plans: deterministic without a controller, budgeted, and covering every ECMP path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric import Routing, fat_tree_fabric, leaf_spine_fabric
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.probe.plan import (
    MIN_PARTIAL_PORTS,
    coverage_probability,
    plan_mesh,
    plan_probes,
    ports_for_coverage,
)
from fabricscope.service.probe_twin import TwinMesh


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
    # A tight budget shrinks the rotating samples first, never the ToR mesh; what no peer
    # fits at full coverage is probed at partial coverage (>= MIN_PARTIAL_PORTS ports), so
    # some probes still cross the spines, within the budget.
    tight = plan_probes(f, f.nics[0].id, seed=1, budget_pps=1, epoch_s=30, min_probes_per_flow=2)
    assert {x.dst for x in tight.peers if x.reason == "tor"} == tor
    assert tight.n_flows <= 1 * 30 / 2
    assert not [x for x in tight.peers if x.reason == "rail"]
    partial = [x for x in tight.peers if x.reason == "pod"]
    assert partial and all(MIN_PARTIAL_PORTS <= len(x.src_ports) < ports_for_coverage(
        x.path_count, 0.99) for x in partial)
    # below one peer's least ports beyond the ToR mesh, only the ToR mesh is left
    tor_flows = sum(len(x.src_ports) for x in tight.peers if x.reason == "tor")
    bare = plan_probes(f, f.nics[0].id, seed=1, budget_pps=(tor_flows + MIN_PARTIAL_PORTS - 1)
                       * 2 / 30, epoch_s=30, min_probes_per_flow=2)
    assert {x.reason for x in bare.peers} == {"tor"}


def test_a_small_rail_fabric_probes_across_its_spines_at_the_default_rate() -> None:
    """Rail-optimized, 32 servers, 20 probes/s: no cross-leaf pair fits at 99 % coverage
    (256 end-to-end paths need ~2,600 ports); before partial coverage no probe crossed a
    spine, so a spine fault was invisible to the prober. Now every spine and every
    leaf-spine link is on some planned flow's path (paths from the twin's routing)."""
    f = rail_optimized_fabric(32)
    for p in plan_mesh(f, seed=0, budget_pps=20.0, epoch_s=30.0).values():
        assert p.n_flows <= 20 * 30 / 2
        assert all(len(x.src_ports) >= MIN_PARTIAL_PORTS for x in p.peers if x.reason != "tor")
    mesh = TwinMesh(f, seed=0, budget_pps=20.0, epoch_s=30.0)
    P, pf, pr = mesh.model.patterns
    flows_per_row = np.bincount(pf, minlength=P.shape[0]) + np.bincount(pr, minlength=P.shape[0])
    crossing = np.asarray(P.T @ flows_per_row).ravel()
    ix = f.index
    spines = [s.id for s in f.switches if s.tier == max(d.tier for d in f.switches)]
    assert len(spines) >= 2
    assert all(crossing[ix.n_edges + ix.node_of[s]] > 0 for s in spines)
    up = [e for e in range(ix.n_edges)
          if all(f.devices[pt.rsplit(":", 1)[0]].is_switch for pt in (ix.from_port[e], ix.to_port[e]))]
    assert up and all(crossing[e] > 0 for e in up)


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
