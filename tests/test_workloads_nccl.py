"""SIMULATION.md item 4: nccl-tests busbw of ring all-reduce, run on the flow engine.

* On a non-blocking fabric with packet spraying, ring all-reduce busbw equals the NIC rate
  (per GPU; times the NICs per server on a rail-optimized fabric, where NVLink is free).
* The 128-rank ring on the 128-host 3-tier fat tree (htsim's setup): in-order placement at
  the ideal bandwidth term, random placement + per-flow ECMP clearly slowest, random
  placement + spraying in between (in a fluid model: equal to in-order). htsim's numbers are
  reported in docs/workloads.md, not asserted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric, rail_optimized_fabric
from fabricscope.sim.engine import simulate, steady_state_rates
from fabricscope.sim.workload import (
    alpha_beta_time,
    path_latency_s,
    place_ranks,
    ring_collective,
    ring_steady_state,
    ring_time_from_rates,
)

MiB = 2**20


@pytest.fixture(scope="module")
def htsim_tree():
    return fat_tree_fabric(pods=8, tors_per_pod=4, aggs_per_pod=4, hosts_per_tor=4, cores_per_plane=4)


def _rel_latency_bound(w, fabric, rate_bps):
    """Largest share of a step the latency can take: the tolerance the busbw check may use."""
    lat = float(path_latency_s(fabric, w).max())
    step = w.meta["chunk_bytes"] * 8 / rate_bps
    return lat / (step + lat)


def test_spray_busbw_equals_nic_rate_single_gpu_hosts():
    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=4)  # non-blocking, 100G
    w = ring_collective(place_ranks(fab, policy="random", seed=5), 2**30)
    r = simulate(fab, w, lb="spray", record_utilization=False)
    nic = 100e9 / 8
    assert _rel_latency_bound(w, fab, 100e9) < 0.002
    assert r.busbw_Bps == pytest.approx(nic, rel=0.01)
    assert r.busbw_Bps <= nic * (1 + 1e-9)


def test_spray_busbw_rail_optimized_is_nics_times_rate():
    fab = rail_optimized_fabric(4)  # 4 servers x 8 GPUs x 400G, rail-aligned rings
    w = ring_collective(place_ranks(fab), 8 * 2**30)
    r = simulate(fab, w, lb="spray", record_utilization=False)
    per_server = 8 * 400e9 / 8
    assert _rel_latency_bound(w, fab, 400e9) < 0.005
    assert r.busbw_Bps == pytest.approx(per_server, rel=0.01)


@pytest.mark.slow
def test_ring_order_128_ranks(htsim_tree):
    size = 32 * MiB  # 256 KiB per step, as in SIMULATION.md §2
    ideal = alpha_beta_time("allreduce", 128, size, bandwidth_bps=100e9)

    in_order = place_ranks(htsim_tree, policy="in-order")
    w = ring_collective(in_order, size)
    t_in = simulate(htsim_tree, w, lb="ecmp", record_utilization=False).completion_ns / 1e9
    # In order: no ECMP collision, so the bandwidth term is the ideal; the rest is latency,
    # one hop's delay per step on the ring's slowest (cross-pod) hop.
    ss = ring_steady_state(in_order, size)
    rates = steady_state_rates(htsim_tree, ss, lb="ecmp").rates_bps
    assert ring_time_from_rates(ss, rates) == pytest.approx(ideal, rel=1e-9)
    alpha = float(path_latency_s(htsim_tree, ss).max())
    assert t_in == pytest.approx(alpha_beta_time("allreduce", 128, size, bandwidth_bps=100e9,
                                                 alpha_s=alpha), rel=0.01)

    rnd = place_ranks(htsim_tree, policy="random", seed=0)
    t_spray = simulate(htsim_tree, ring_collective(rnd, size), lb="spray",
                       record_utilization=False).completion_ns / 1e9

    # Random + ECMP over N placements from the steady state (validated against the full DAG
    # in test_steady_state_matches_full_dag). Claim "clearly slowest": the mean slowdown
    # over in-order, minus 3 standard errors (sd / sqrt(N)), exceeds 1.5x.
    n_trials = 12
    slow = []
    for seed in range(n_trials):
        pl = place_ranks(htsim_tree, policy="random", seed=seed)
        s = ring_steady_state(pl, size)
        st = steady_state_rates(htsim_tree, s, lb="ecmp")
        slow.append(ring_time_from_rates(s, st.rates_bps, latency_s=path_latency_s(htsim_tree, s)) / t_in)
    mean, se = float(np.mean(slow)), float(np.std(slow, ddof=1)) / math.sqrt(n_trials)
    assert mean - 3 * se > 1.5, slow
    # Spraying removes the collisions: between in-order and random ECMP (a fluid model has
    # no packet-level spraying penalty, so it ties with in-order).
    assert t_in <= t_spray * (1 + 1e-6)
    assert t_spray < min(slow) * t_in


@pytest.mark.slow
def test_steady_state_matches_full_dag(htsim_tree):
    # 32 random ranks with ECMP: the full 62-step DAG and the one-step steady state agree
    # (the steady state is exact when one hop gates every step; it can only over-estimate).
    for seed in range(3):
        pl = place_ranks(htsim_tree, 32, policy="random", seed=seed)
        full = simulate(htsim_tree, ring_collective(pl, 8 * MiB), lb="ecmp",
                        record_utilization=False).completion_ns / 1e9
        ss = ring_steady_state(pl, 8 * MiB)
        st = steady_state_rates(htsim_tree, ss, lb="ecmp")
        est = ring_time_from_rates(ss, st.rates_bps, latency_s=path_latency_s(htsim_tree, ss))
        assert full <= est * (1 + 1e-6)
        assert full == pytest.approx(est, rel=0.1)


def test_tree_allreduce_time_is_bounded_by_its_busiest_nic():
    fab = rail_optimized_fabric(4)
    pl = place_ranks(fab)
    size, chunks = 2 * 2**30, 16
    from collections import Counter

    from fabricscope.sim.workload import tree_allreduce

    w = tree_allreduce(pl, size, chunks=chunks)
    r = simulate(fab, w, lb="spray", record_utilization=False)
    sent: Counter[str] = Counter()
    for f in w.flows:
        sent[f.src] += f.size_bytes
    t_nic = max(sent.values()) * 8 / 400e9  # the busiest NIC's bytes at line rate
    depth = 2  # 4 servers: in-order tree depth
    t = r.completion_ns / 1e9
    assert t >= t_nic
    # pipelining: at most the fill/drain of 2 * depth chunk times on top
    assert t <= t_nic * (1 + (2 * depth + 1) / chunks)


def test_job_iteration_matches_pipeline_formula():
    # Compute-dominated job (tiny transfers): one iteration of a pipeline with m micro-batches
    # and p stages takes (m + p - 1)(fwd + bwd), the 1F1B / GPipe bubble formula
    # (Narayanan et al., SC'21), plus the DP all-reduce.
    from fabricscope.sim.workload import JobSpec, job_iteration

    fab = rail_optimized_fabric(8)
    fwd, bwd, mb, pp = 1_000_000, 2_000_000, 4, 4
    job = JobSpec(dp=2, tp=8, pp=pp, microbatches=mb, grad_bytes=1e6, activation_bytes=1e3,
                  fwd_compute_ns=fwd, bwd_compute_ns=bwd)
    r = simulate(fab, job_iteration(fab, job), lb="ecmp", record_utilization=False)
    expected = (mb + pp - 1) * (fwd + bwd)
    end = float(np.nanmax(r.end_ns))  # from t = 0: the first forward compute has no flow
    assert end == pytest.approx(expected, rel=0.01)
    assert end > expected  # the DP ring and transfers come on top
