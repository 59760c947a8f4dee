"""HPCC on in-band telemetry (Li et al., SIGCOMM'19): near-zero queues at utilization eta."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import (
    HpccConfig,
    TransportConfig,
    dcqcn_fixed_point,
    simulate_transport,
)


def _bottleneck(n: int, cc: str, eta: float = 0.95) -> tuple[float, float]:
    """(mean queue bytes, utilization) of ``n`` long flows into one 100G link over the
    second half of 10 ms (NICs at 400G, so the senders could overrun it 4x)."""
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=n, spines=1, host_gbps=400, uplink_gbps=100)
    nics = [x.id for x in fab.nics]
    w = Workload("hpcc", tuple(FlowSpec(i, nics[i], nics[n], 1e12) for i in range(n)))
    ix = fab.index
    up = [e for e in range(ix.n_edges) if ix.node_ids[ix.src[e]] == "leaf-000" and ix.tier[ix.dst[e]] == 2]
    cfg = TransportConfig(cc=cc, hpcc=HpccConfig(eta=eta), max_time_ns=10e6)  # type: ignore[arg-type]
    half = TransportConfig(cc=cc, hpcc=HpccConfig(eta=eta), max_time_ns=5e6)  # type: ignore[arg-type]
    r = simulate_transport(fab, w, config=cfg, trace_edges=up, trace_every_ns=1000.0)
    r5 = simulate_transport(fab, w, config=half)
    served = r.stats.served_bytes[up[0]] - r5.stats.served_bytes[up[0]]
    util = served / (100e9 / 8 * (r.stats.sim_time_ns - r5.stats.sim_time_ns) / 1e9)
    t, q = r.queue_trace_t_ns, r.queue_trace_bytes[:, 0]
    return float(q[t > t[-1] / 2].mean()), float(util)


@pytest.mark.parametrize("n", [1, 4, 16])
def test_hpcc_holds_the_queue_near_zero_at_eta(n: int) -> None:
    q, util = _bottleneck(n, "hpcc")
    assert q < 1_000  # bytes: less than one packet of standing queue
    assert util == pytest.approx(0.95, abs=0.02)


def test_eta_sets_the_utilization() -> None:
    _, util = _bottleneck(4, "hpcc", eta=0.8)
    assert util == pytest.approx(0.8, abs=0.02)


def test_hpcc_queue_is_far_below_dcqcn() -> None:
    """Where DCQCN settles at its fixed point (71.9 KB for 16 flows on 100G, reached by the
    engine in test_transport_dcqcn.py), HPCC keeps less than a packet."""
    q_h, _ = _bottleneck(16, "hpcc")
    assert q_h < dcqcn_fixed_point(16, 100e9)[1] / 50


def test_hpcc_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"hpcc.eta: must be in \(0, 1\]"):
        TransportConfig(cc="hpcc", hpcc=HpccConfig(eta=1.5)).validate()
    with pytest.raises(ConfigError, match=r"hpcc\.wai: must be > 0"):
        TransportConfig(cc="hpcc", hpcc=HpccConfig(wai_bytes=0)).validate()
    assert np.isfinite(HpccConfig().wai_bytes)
