"""DCQCN in the fluid transport engine: the fixed point of Zhu et al. (CoNEXT'16), SIMULATION.md §4.

The engine integrates the CoNEXT'16 rate equations per flow against a real egress queue with
RED marking, so N long flows into one bottleneck must settle where the model's fixed point
says. The test is deterministic (no randomness in the fluid engine); the 10 % bound is the
issue's target, the measured error is ~0.3 % (the mean over the last third of the run).
"""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import (
    NIC_DEFAULT,
    PAPER,
    TransportConfig,
    dcqcn_fixed_point,
    marking_probability,
    simulate_transport,
)

# SIMULATION.md §4 (KB): q* for N = 1, 2, 4, 8, 10, 16, 32; None = "~Kmax".
_TABLE = {
    40: (11.2, 20.2, 41.8, 93.8, 122.6, None, None),
    100: (6.9, 9.7, 16.4, 32.7, 41.8, 71.9, 165.4),
}
_NS = (1, 2, 4, 8, 10, 16, 32)


@pytest.mark.parametrize("gbps", [40, 100])
def test_fixed_point_solver_reproduces_the_table(gbps: int) -> None:
    for n, want in zip(_NS, _TABLE[gbps], strict=True):
        p, q = dcqcn_fixed_point(n, gbps * 1e9)
        if want is None:
            assert p > 0.01 and q == 200_000.0  # p* beyond pmax: the queue sits at Kmax
        else:
            assert q / 1e3 == pytest.approx(want, abs=0.05)  # the table rounds to 0.1 KB


def _bottleneck_queue(n: int, gbps: int, *, sim_ms: float = 200.0) -> float:
    """Mean queue (bytes) of ``n`` DCQCN flows into one ``gbps`` link over the last third.

    Senders sit on leaf 0 with NICs 4x faster than the leaf's single uplink (the bottleneck),
    so the line-rate cap of a NIC never binds: the CoNEXT'16 model has no such cap.
    """
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=n, spines=1, host_gbps=4 * gbps, uplink_gbps=gbps)
    nics = [x.id for x in fab.nics]
    w = Workload("fixed-point", tuple(FlowSpec(i, nics[i], nics[n], 1e12) for i in range(n)))
    ix = fab.index
    up = [e for e in range(ix.n_edges) if ix.node_ids[ix.src[e]] == "leaf-000" and ix.tier[ix.dst[e]] == 2]
    cfg = TransportConfig(cc="dcqcn", dcqcn=PAPER, mtu_bytes=1000, dt_ns=500.0, max_time_ns=sim_ms * 1e6)
    r = simulate_transport(fab, w, config=cfg, trace_edges=up, trace_every_ns=1000.0)
    assert r.unfinished == n  # the flows are long: they are still running at the end
    t, q = r.queue_trace_t_ns, r.queue_trace_bytes[:, 0]
    return float(q[t > t[-1] * 2 / 3].mean())


_ON_THE_STEP = pytest.mark.xfail(
    strict=True,
    reason="p* > pmax: the fixed point is on the RED step at Kmax; the delayed loop oscillates "
    "around it and the time-average queue is 18-33 % below Kmax (measured 164 / 135 KB)",
)
_CASES = [pytest.param(g, n, marks=_ON_THE_STEP) if g == 40 and n >= 16 else (g, n)
          for g in (40, 100) for n in _NS]


@pytest.mark.parametrize(("gbps", "n"), _CASES)
def test_engine_settles_at_the_fixed_point(gbps: int, n: int) -> None:
    _, want = dcqcn_fixed_point(n, gbps * 1e9)
    got = _bottleneck_queue(n, gbps)
    assert abs(got / want - 1) < 0.10, (got, want)


def test_queue_on_the_red_step_oscillates_up_to_kmax() -> None:
    """40G, N = 32 (the "~Kmax" case): the queue reaches Kmax and falls back, every cycle."""
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=32, spines=1, host_gbps=160, uplink_gbps=40)
    nics = [x.id for x in fab.nics]
    w = Workload("kmax", tuple(FlowSpec(i, nics[i], nics[32], 1e12) for i in range(32)))
    ix = fab.index
    up = [e for e in range(ix.n_edges) if ix.node_ids[ix.src[e]] == "leaf-000" and ix.tier[ix.dst[e]] == 2]
    cfg = TransportConfig(mtu_bytes=1000, dt_ns=500.0, max_time_ns=100e6)
    r = simulate_transport(fab, w, config=cfg, trace_edges=up, trace_every_ns=1000.0)
    q = r.queue_trace_bytes[r.queue_trace_t_ns > 50e6, 0]
    assert q.max() > 200_000.0 and q.min() < 100_000.0


def test_parameter_sets_are_distinct_and_valid() -> None:
    PAPER.validate()
    NIC_DEFAULT.validate()
    assert NIC_DEFAULT.tau_ns < PAPER.tau_ns and NIC_DEFAULT.byte_counter < PAPER.byte_counter
    # The NIC defaults' fixed point lies elsewhere (faster decrease, slower increase).
    assert dcqcn_fixed_point(4, 100e9, params=NIC_DEFAULT)[1] != dcqcn_fixed_point(4, 100e9)[1]


def test_marking_curve() -> None:
    assert marking_probability(5_000, 5_000, 200_000, 0.01) == 0.0
    assert marking_probability(102_500, 5_000, 200_000, 0.01) == pytest.approx(0.005)
    assert marking_probability(200_001, 5_000, 200_000, 0.01) == 1.0


def test_fixed_point_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        dcqcn_fixed_point(0, 100e9)


def test_senders_slow_down_when_marked() -> None:
    """4 line-rate senders into one receiver: DCQCN brings the queue below its PFC-free
    peak, while ``cc="none"`` keeps the senders at line rate and fills the buffer."""
    fab = leaf_spine_fabric(leaves=1, hosts_per_leaf=5, spines=1)
    nics = [x.id for x in fab.nics]
    w = Workload("incast4", tuple(FlowSpec(i, nics[i + 1], nics[0], 20e6) for i in range(4)))
    res = {}
    for cc in ("none", "dcqcn"):
        cfg = TransportConfig(cc=cc)  # type: ignore[arg-type]
        res[cc] = simulate_transport(fab, w, config=cfg)
    assert res["dcqcn"].stats.max_queue_bytes.max() < 0.5 * res["none"].stats.max_queue_bytes.max()
    assert res["dcqcn"].stats.marked_packets.sum() > 0
    assert np.isfinite(res["dcqcn"].sim.fct_ns).all()
