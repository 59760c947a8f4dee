"""FCT slowdown by flow-size bucket (sim/slowdown.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.slowdown import (
    bucket_slowdowns,
    fct_slowdown,
    flow_line_rates,
    format_slowdown_table,
    ideal_fct_ns,
    slowdown_by_size,
)
from fabricscope.sim.transport import TransportConfig, simulate_transport


@pytest.fixture(scope="module")
def fabric():  # type: ignore[no-untyped-def]
    return leaf_spine_fabric(leaves=2, hosts_per_leaf=4, spines=2, host_gbps=100.0, uplink_gbps=200.0)


def _nics(fabric) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.id for n in fabric.nics]


def test_a_lone_flow_has_slowdown_one_in_both_engines(fabric) -> None:  # type: ignore[no-untyped-def]
    n = _nics(fabric)
    wl = Workload("lone", (FlowSpec(0, n[0], n[5], 1_000_000.0),))
    ideal = simulate(fabric, wl)
    rate = flow_line_rates(fabric, ideal)
    assert rate.tolist() == [100e9]
    # ideal FCT = size / rate + base RTT + store-and-forward: the engine's lone-flow FCT.
    assert ideal_fct_ns(ideal, rate)[0] == pytest.approx(ideal.fct_ns[0], rel=1e-12)
    assert fct_slowdown(ideal, rate)[0] == pytest.approx(1.0, abs=1e-9)
    tr = simulate_transport(fabric, wl, config=TransportConfig(cc="none")).sim
    assert fct_slowdown(tr, flow_line_rates(fabric, tr))[0] == pytest.approx(1.0, abs=2e-3)


def test_two_flows_sharing_a_sender_are_slowed_by_the_share(fabric) -> None:  # type: ignore[no-untyped-def]
    n = _nics(fabric)
    size = 2_000_000.0
    wl = Workload("pair", (FlowSpec(0, n[0], n[5], size), FlowSpec(1, n[0], n[6], size)))
    res = simulate(fabric, wl)
    rate = flow_line_rates(fabric, res)
    lat = res.fct_ns - res.fluid_ns  # the empty-path latency of each flow
    expect = (2 * size * 8 / 100e9 * 1e9 + lat) / (size * 8 / 100e9 * 1e9 + lat)
    assert np.allclose(fct_slowdown(res, rate), expect, rtol=1e-9)
    assert 1.9 < float(expect[0]) < 2.0  # half the link each, latency shared


def test_incomplete_flows_are_nan_and_counted() -> None:
    size = np.array([1.0, 2.0, 3.0, 4.0])
    s = np.array([1.0, np.nan, 2.0, 3.0])
    t = bucket_slowdowns(size, s, step_percent=50.0, short_bytes=2.0)
    assert t.incomplete == 1
    assert sum(b.flows for b in t.buckets) == 3
    assert t.short.flows == 1 and t.short.p99 == 1.0


def test_equal_count_buckets_percentiles_and_ties() -> None:
    rng = np.random.default_rng(0)
    size = rng.permutation(np.arange(1, 1001, dtype=float))
    slow = 1.0 + size / 1000.0  # slowdown grows with size
    t = bucket_slowdowns(size, slow, step_percent=10.0)
    assert [b.flows for b in t.buckets] == [100] * 10
    b0 = t.buckets[0]
    assert (b0.lo_bytes, b0.hi_bytes) == (0.0, 100.0)
    # "lower" percentile: element int(n p) of the sorted bucket, as HPCC's fct_analysis.py.
    assert b0.p50 == pytest.approx(1.0 + 51 / 1000.0) and b0.p99 == pytest.approx(1.0 + 100 / 1000.0)
    assert t.buckets[-1].hi_bytes == 1000.0
    assert t.overall.flows == 1000
    # Ties never straddle a bucket boundary: 60 flows of one size go together.
    size2 = np.concatenate([np.full(60, 5.0), np.arange(100, 140, dtype=float)])
    t2 = bucket_slowdowns(size2, np.ones(100), step_percent=25.0)
    assert t2.buckets[0].flows == 60 and t2.buckets[0].hi_bytes == 5.0
    assert sum(b.flows for b in t2.buckets) == 100


def test_fixed_edges_and_short_threshold() -> None:
    size = np.array([1e3, 5e3, 5e4, 2e5, 3e5, 5e6])
    slow = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    t = bucket_slowdowns(size, slow, edges_bytes=[1e4, 1e6])
    assert [(b.lo_bytes, b.hi_bytes, b.flows) for b in t.buckets] == [
        (0.0, 1e4, 2), (1e4, 1e6, 3), (1e6, 5e6, 1)]
    assert t.short.flows == 4 and t.short.p99 == 4.0  # <= 200 KB by default
    text = format_slowdown_table(t, title="x")
    assert "short (<= 200KB)" in text and "all flows" in text and "10KB-1MB" in text


def test_by_size_on_a_result_and_errors(fabric) -> None:  # type: ignore[no-untyped-def]
    n = _nics(fabric)
    flows = tuple(FlowSpec(i, n[i % 4], n[4 + i % 4], float(10_000 * (i + 1)), start_ns=1000 * i) for i in range(20))
    res = simulate(fabric, Workload("w", flows))
    t = slowdown_by_size(res, flow_line_rates(fabric, res), step_percent=20.0)
    assert sum(b.flows for b in t.buckets) == 20 and t.incomplete == 0
    assert all(b.p50 >= 1.0 for b in t.buckets)
    assert math.isfinite(t.overall.p99)
    with pytest.raises(ConfigError, match="step_percent"):
        slowdown_by_size(res, 100e9, step_percent=0)
    with pytest.raises(ConfigError, match="line rates"):
        fct_slowdown(res, 0.0)


def test_no_completed_flow_gives_an_empty_table_not_an_error() -> None:
    t = bucket_slowdowns(np.array([1e3, 2e3]), np.array([np.nan, np.nan]))
    assert t.buckets == () and t.incomplete == 2 and t.short.flows == 0 and t.overall.flows == 0
    text = format_slowdown_table(t)
    assert "2 flow(s) did not complete" in text and "-" in text
