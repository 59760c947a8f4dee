"""DLB under degradation (issue 9 item 5): a degraded uplink attracts proportionally less
traffic, and DLB is no worse than ECMP with one uplink of a leaf-spine 8x8 / 4 spines at 25 %."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fabricscope.fabric import Routing, leaf_spine_fabric
from fabricscope.sim.engine import _link_state
from fabricscope.sim.faults import Fault
from fabricscope.sim.loadbalance import PathFinder
from fabricscope.sim.scenario import resolve_link, run_scenario, scenario_from_flags

SEEDS = tuple(range(6))


def _uplink_counts(factor: float) -> tuple[int, list[int]]:
    """Place 400 flows leaf-000 -> other leaves with DLB; flows per uplink of leaf-000."""
    fab = leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=4)
    cable = resolve_link(fab, "leaf-000~spine-01")
    cap = _link_state(fab, [Fault("link-degraded", cable, 0, None, {"factor": factor})], 0.0).capacity
    pf = PathFinder(Routing(fab))
    ix = fab.index
    nics = [n.id for n in fab.nics]
    rng = np.random.default_rng(0)
    src = np.array([ix.node_of[nics[int(i)]] for i in rng.integers(0, 8, 400)])  # hosts of leaf-000
    dst = np.array([ix.node_of[nics[int(i)]] for i in rng.integers(8, 64, 400)])
    load = np.zeros(ix.n_edges)
    tab = pf.least_loaded(src, dst, np.arange(400) + 49152, load, cap)
    ups = [e for e in range(ix.n_edges)
           if fab.index.edge_id(e).startswith("leaf-000:") and "spine" in fab.index.edge_id(e).split("->")[1]]
    counts = np.bincount(tab.edges, minlength=ix.n_edges)
    a, b = cable.split("|")
    degraded = next(e for e in ups if ix.edge_id(e) in (f"{a}->{b}", f"{b}->{a}"))
    return int(counts[degraded]), [int(counts[e]) for e in ups if e != degraded]


def test_degraded_uplink_gets_a_proportional_share() -> None:
    # 400 flows over 3 full uplinks + one at 25 %: a capacity-proportional split is
    # 400 * 0.25 / 3.25 = 30.8 on the degraded one and 123 on each other one.
    mine, others = _uplink_counts(0.25)
    assert 27 <= mine <= 34, (mine, others)
    assert all(115 <= c <= 131 for c in others), others
    healthy_mine, healthy_others = _uplink_counts(1.0)
    assert all(abs(c - 100) <= 1 for c in [healthy_mine, *healthy_others])


@pytest.mark.slow
def test_dlb_no_worse_than_ecmp_with_one_uplink_at_25_percent() -> None:
    """The issue's case: DLB p99 was 17.3 ms against ECMP 6.7 ms (healthy DLB 2.0 ms).

    Paired over seeds (the same permutation for both schemes): the mean of DLB p99 - ECMP p99
    must not exceed the one-sided 95 % bound of its seed spread (t quantile x s / sqrt(n)).
    """
    sc = scenario_from_flags(
        topo="leaf-spine:leaves=8,hosts_per_leaf=8,spines=4", workload="permutation:size=2MiB",
        lb="ecmp,dlb", degrade=["leaf-001~spine-01=25%"], seeds=SEEDS, compare_healthy=False,
    )
    res = run_scenario(sc, record_utilization=False)
    p99 = {(r.scheme, r.seed): r.result.fct_stats_us()["p99"] for r in res.runs}
    d = np.array([p99[("dlb", s)] - p99[("ecmp", s)] for s in SEEDS])
    bound = stats.t.ppf(0.95, len(SEEDS) - 1) * d.std(ddof=1) / np.sqrt(len(SEEDS))
    assert d.mean() <= bound, (d, bound)
    # And DLB with the degraded uplink stays near its own healthy p99 scale, not 8x it.
    healthy = run_scenario(scenario_from_flags(
        topo="leaf-spine:leaves=8,hosts_per_leaf=8,spines=4", workload="permutation:size=2MiB",
        lb="dlb", seeds=SEEDS[:2]), record_utilization=False)
    h = np.mean([r.result.fct_stats_us()["p99"] for r in healthy.runs])
    assert np.mean([p99[("dlb", s)] for s in SEEDS]) < 2.0 * h
