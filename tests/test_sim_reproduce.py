"""Reproductions of SIMULATION.md (§1 hash collisions, §2 htsim FCT table, oversubscription,
polarization) on the flow engine. Every randomized check is seeded; its tolerance is derived
from the number of trials (see ``_tol``), never tuned to the answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric import HashConfig, Routing, fat_tree_fabric, leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.engine import simulate, steady_state_rates
from fabricscope.sim.flows import FlowSpec, Workload

SIZE = 2e6  # SIMULATION.md's "2 MB": ideal FCT 160 us at 100 Gb/s -> 2,000,000 bytes
RATE = 100e9


def _tol(sd: float, n: int, ref_sd: float = 0.0, ref_n: int = 1, ref_round: float = 0.0) -> float:
    """3 standard errors of the difference of two means (ours over ``n`` trials, the
    reference's over ``ref_n`` trials with sd ``ref_sd``) plus the reference's rounding."""
    return 3.0 * math.sqrt(sd**2 / n + ref_sd**2 / ref_n) + ref_round


def _derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    while True:
        p = rng.permutation(n)
        if not (p == np.arange(n)).any():
            return p


def _permutation(fab: Fabric, seed: int, size: float = SIZE) -> Workload:
    nics = [n.id for n in fab.nics]
    p = _derangement(len(nics), np.random.default_rng(seed))
    return Workload("permutation", tuple(FlowSpec(i, nics[i], nics[int(p[i])], size) for i in range(len(nics))))


def _fat_tree_1024() -> Fabric:
    return fat_tree_fabric(pods=16, tors_per_pod=8, aggs_per_pod=8, hosts_per_tor=8, cores_per_plane=8)


# ----------------------------------------------------------------- §1 single stage
@pytest.mark.parametrize(
    ("k", "trials", "ref_eff", "ref_max"),
    [(8, 300, 0.656, 2.60), (64, 60, 0.635, 3.96)],
)
def test_balls_into_bins(k: int, trials: int, ref_eff: float, ref_max: float) -> None:
    """k line-rate flows hashed uniformly onto k spines (two leaves of k hosts, k spines):
    efficiency = aggregate / ideal and the most loaded spine, against the closed form."""
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=k, spines=k)
    nics = [n.id for n in fab.nics]
    w = Workload("k-flows", tuple(FlowSpec(i, nics[i], nics[k + i], 1e6) for i in range(k)))
    eff, mx = [], []
    for s in range(trials):
        ss = steady_state_rates(fab, w, lb="random", seed=s)
        eff.append(ss.throughput_ratio)
        mx.append(RATE / ss.rates_bps.min())  # flows on the fullest spine get 1/load
    # The closed-form reference is exact up to its printed rounding (3 or 2 decimals).
    assert abs(np.mean(eff) - ref_eff) <= _tol(np.std(eff, ddof=1), trials, ref_round=5e-4)
    assert abs(np.mean(mx) - ref_max) <= _tol(np.std(mx, ddof=1), trials, ref_round=5e-3)


# ----------------------------------------------------------------- §1 multi stage
@pytest.mark.parametrize(
    ("name", "trials", "ref", "ref_sd"),
    [("leaf-spine 8x8", 20, 0.608, 0.040), ("leaf-spine 32x32", 8, 0.525, 0.006)],
)
def test_multistage_leaf_spine(name: str, trials: int, ref: float, ref_sd: float) -> None:
    k = 8 if "8x8" in name else 32
    fab = leaf_spine_fabric(leaves=k, hosts_per_leaf=k, spines=k)
    r = [steady_state_rates(fab, _permutation(fab, s), lb="random", seed=s).throughput_ratio
         for s in range(trials)]
    # Reference: mean +- sd over 20 permutations.
    assert abs(np.mean(r) - ref) <= _tol(np.std(r, ddof=1), trials, ref_sd, 20, 5e-4)


@pytest.mark.slow
def test_multistage_fat_tree_1024() -> None:
    fab = _fat_tree_1024()
    trials = 8
    r = [steady_state_rates(fab, _permutation(fab, s), lb="random", seed=s).throughput_ratio
         for s in range(trials)]
    assert abs(np.mean(r) - 0.428) <= _tol(np.std(r, ddof=1), trials, 0.005, 20, 5e-4)
    # The CRC hash (per-switch seeds) is reported in docs/sim.md, not asserted: CRC is affine
    # in its seed, so per-switch seeds still correlate tiers and the result differs from
    # uniformly random paths.


# ----------------------------------------------------------------- §2 htsim FCT table
@pytest.mark.slow
def test_permutation_fct_ecmp_and_spray_1024() -> None:
    fab = _fat_tree_1024()
    means, p99s = [], []
    for s in range(5):  # the reference's fluid row also uses 5 permutations
        res = simulate(fab, _permutation(fab, s), lb="ecmp", hash_config=HashConfig(seed=s),
                       record_utilization=False)
        st = res.fct_stats_us()
        means.append(st["mean"])
        p99s.append(st["p99"])
    # Within 15% of the band spanned by htsim's two ECMP rows (sender CC, receiver credit).
    assert 403.2 * 0.85 <= np.mean(means) <= 473.3 * 1.15
    assert 756.1 * 0.85 <= np.mean(p99s) <= 922.1 * 1.15

    res = simulate(fab, _permutation(fab, 0), lb="spray", record_utilization=False)
    routing = Routing(fab)
    ix = fab.index
    mtu_ser_ns = 4096 * 8 / RATE * 1e9
    for j in range(0, 1024, 97):
        f = res.src[j], res.dst[j]
        path = routing.path(*f)
        rtt = 2 * sum(int(ix.latency_ns[e]) for e in path)
        expected = SIZE * 8 / RATE * 1e9 + rtt + (len(path) - 1) * mtu_ser_ns
        assert res.fct_ns[j] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("spines", "fluid_us"), [(8, 620.0), (4, 1240.0)])
def test_oversubscribed_leaf_spine_median(spines: int, fluid_us: float) -> None:
    """1024 hosts, 32 per leaf, 4:1 (8 spines) and 8:1 (4 spines), spraying: the median FCT
    within 5% of the fluid expectation of SIMULATION.md (31 inter-leaf flows / uplinks x 160 us)."""
    fab = leaf_spine_fabric(leaves=32, hosts_per_leaf=32, spines=spines)
    med = [np.median(simulate(fab, _permutation(fab, s), lb="spray",
                              record_utilization=False).fct_us()) for s in range(2)]
    assert abs(np.mean(med) / fluid_us - 1) <= 0.05


# ----------------------------------------------------------------- polarization
@pytest.mark.slow
def test_polarization_loses_throughput() -> None:
    """Every tier hashing with the same function and seed (per_switch_seed=False) loses
    throughput against per-switch seeds on the same flows (same 5-tuples)."""
    fab = _fat_tree_1024()
    trials = 4
    good, bad = [], []
    for s in range(trials):
        w = _permutation(fab, s)
        good.append(steady_state_rates(fab, w, lb="ecmp", hash_config=HashConfig(seed=s)).throughput_ratio)
        bad.append(steady_state_rates(
            fab, w, lb="ecmp", hash_config=HashConfig(seed=s, per_switch_seed=False)).throughput_ratio)
    diff = np.array(good) - np.array(bad)
    # Paired difference: significant at 3 standard errors, and large in absolute terms.
    assert diff.mean() > 3 * diff.std(ddof=1) / math.sqrt(trials)
    assert diff.mean() > 0.1
