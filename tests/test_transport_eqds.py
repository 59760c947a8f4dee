"""EQDS-like receiver-driven credits in the fluid transport engine (``--cc eqds``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import (
    TransportConfig,
    simulate_transport,
    transport_config_from_flags,
)
from fabricscope.sim.transport import eqds as EQ
from fabricscope.sim.transport.nscc import NsccConfig

_FAB = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=4)
_NICS = [n.id for n in _FAB.nics]
_LINK = 100e9 / 8 / 1e9  # bytes per ns


def _wire(size: float) -> float:
    return size + math.ceil(size / (4096 - 64)) * 64


# ------------------------------------------------------------------ configuration
def test_flags_select_eqds_lossy_trimming_and_trim_is_a_lossy_only_flag() -> None:
    cfg = transport_config_from_flags(cc="eqds")
    assert cfg is not None and cfg.cc == "eqds" and not cfg.pfc.enabled and cfg.nscc.trimming
    cfg = transport_config_from_flags(cc="eqds", trim=False)
    assert cfg is not None and not cfg.nscc.trimming
    with pytest.raises(ConfigError, match=r"--trim/--no-trim: only applies with --cc nscc or eqds"):
        transport_config_from_flags(cc="dcqcn", trim=True)
    with pytest.raises(ConfigError, match=r"--trim/--no-trim: only applies"):
        transport_config_from_flags(cc="ideal", trim=False)
    with pytest.raises(ConfigError, match=r"eqds\.pull_rate"):
        TransportConfig(cc="eqds", eqds=EQ.EqdsConfig(pull_rate=1.5)).validate()
    with pytest.raises(ConfigError, match=r"eqds\.max_window_bdp"):
        TransportConfig(cc="eqds", eqds=EQ.EqdsConfig(max_window_bdp=0.0)).validate()


# ------------------------------------------------------------------ the pull pacer
def _pull_once(sizes: list[float], rx: list[int], rate: float, *, sent: float = 0.0) -> np.ndarray:
    n = len(sizes)
    est = EQ.init_state(np.zeros(n), 0.0, EQ.EqdsConfig(speculative=False))
    hist = np.zeros((4, n))
    EQ.pull(est, np.ones(n, np.int8), np.array(sizes), np.array(rx, np.int64), np.full(n, 2, np.int64),
            np.zeros(n, np.int64), np.full(n, sent), np.zeros(n), hist, np.full(3, rate), np.zeros((3, 3)),
            5, 4, 1.0, 1e12)
    assert np.array_equal(hist[5 % 4], est[:, EQ.EQ_GRANTED])
    return est[:, EQ.EQ_GRANTED].copy()


def test_a_receiver_grants_its_rate_shared_and_water_filled() -> None:
    # three flows into receiver 0 at 3,000 B per step: equal shares ...
    g = _pull_once([1e6, 1e6, 1e6], [0, 0, 0], 3000.0)
    assert g == pytest.approx([1000.0, 1000.0, 1000.0])
    # ... a flow needing 100 B leaves the rest of its share to the others
    g = _pull_once([100.0, 1e6, 1e6], [0, 0, 0], 3000.0)
    assert g == pytest.approx([100.0, 1450.0, 1450.0])
    assert g.sum() == pytest.approx(3000.0)
    # receivers are independent
    g = _pull_once([1e6, 1e6, 1e6], [0, 1, 1], 3000.0)
    assert g == pytest.approx([3000.0, 1500.0, 1500.0])


def test_a_sender_drops_unspent_speculative_credit_at_the_first_grant() -> None:
    est = EQ.init_state(np.array([1e6]), 150e3, EQ.EqdsConfig())
    assert EQ.sender_credit(est, 0, 40e3, 0.0) == pytest.approx(110e3)  # speculating
    assert EQ.sender_credit(est, 0, 100e3, 5e3) == pytest.approx(5e3)  # 50 KB unsent: gone
    assert EQ.sender_credit(est, 0, 103e3, 5e3) == pytest.approx(2e3)
    assert est[0, EQ.EQ_SPEC] == pytest.approx(100e3)
    short = EQ.init_state(np.array([20e3]), 150e3, EQ.EqdsConfig())
    assert short[0, EQ.EQ_SPEC] == pytest.approx(20e3)  # a short flow is all speculative


# ------------------------------------------------------------------ in the engine
def test_a_lone_eqds_flow_runs_at_the_pull_rate_after_its_speculative_window() -> None:
    size = 2_000_000
    w = Workload("lone", (FlowSpec(0, _NICS[0], _NICS[9], size),))
    r = simulate_transport(_FAB, w, config=TransportConfig(cc="eqds"))
    ideal = float(simulate(_FAB, w).fct_ns[0])
    wire = _wire(size)
    spec = float(r.sim.meta["eqds_max_window_kb"]) * 1e3
    base = ideal + (wire - size) / _LINK
    # at most the whole of the non-speculative part at 0.99 of line rate; at least most of it
    slow = (wire - spec) / _LINK * (1 / 0.99 - 1)
    assert base + 0.5 * slow < r.sim.fct_ns[0] <= base + slow + 4 * r.stats.dt_ns
    assert r.stats.drop_bytes.sum() == 0.0 and r.unfinished == 0
    # without speculation the first byte waits for the first credit: one base RTT later
    r2 = simulate_transport(_FAB, w, config=TransportConfig(cc="eqds", eqds=EQ.EqdsConfig(speculative=False)))
    rtt = float(r.sim.meta["eqds_network_rtt_us"]) * 1e3
    assert r2.sim.fct_ns[0] - r.sim.fct_ns[0] == pytest.approx(rtt, rel=0.25)


@pytest.mark.parametrize("trimming", [True, False])
def test_an_eqds_incast_is_paced_by_the_receiver(trimming: bool) -> None:
    n, size = 24, 1e6
    w = Workload("incast", tuple(FlowSpec(i, _NICS[i + 8], _NICS[0], size) for i in range(n)))
    cfg = TransportConfig(cc="eqds", nscc=NsccConfig(trimming=trimming))
    r = simulate_transport(_FAB, w, config=cfg)
    f = np.sort(r.sim.fct_ns)
    assert np.isfinite(f).all() and r.unfinished == 0
    line, paced = n * _wire(size) / _LINK, n * _wire(size) / (0.99 * _LINK)
    # the receiver's link stays busy (at the pull rate once the unsolicited windows are in) and
    # its round robin ends the flows together
    assert line < f[-1] < 1.05 * paced
    assert f[0] > 0.95 * f[-1]
    # only the unsolicited first window can overflow a queue: after it, credits match the link
    spec = float(r.sim.meta["eqds_max_window_kb"]) * 1e3
    assert 0.0 < r.stats.drop_bytes.sum() < n * spec
    assert r.stats.trimmed_bytes is not None
    trimmed = r.stats.trimmed_bytes.sum()
    # with trimming every cut packet's header fits here (the header queue holds two port queues)
    assert trimmed == (pytest.approx(r.stats.drop_bytes.sum()) if trimming else 0.0)
    # a sender-driven incast without credits loses far more on the same fabric
    r_ns = simulate_transport(_FAB, w, config=TransportConfig(cc="nscc", nscc=NsccConfig(trimming=trimming)))
    assert r_ns.stats.drop_bytes.sum() > 1.2 * r.stats.drop_bytes.sum()


def test_receiver_credits_do_not_see_a_core_bottleneck_trimming_shares_it() -> None:
    # 4:1 oversubscribed: 8 hosts per leaf, one spine; 8 flows leaf 0 -> leaf 1 share one uplink
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=8, spines=1)
    nics = [n.id for n in fab.nics]
    size = 1e6
    w = Workload("x", tuple(FlowSpec(i, nics[i], nics[8 + i], size) for i in range(8)))
    r = simulate_transport(fab, w, config=TransportConfig(cc="eqds"))
    f = r.sim.fct_ns
    assert np.isfinite(f).all()
    ideal_last = 8 * size / _LINK
    assert f.max() > ideal_last  # the uplink is the bottleneck, receivers pull at line rate
    assert f.max() < 1.25 * ideal_last
    assert r.stats.drop_bytes.sum() > 0.0  # each sender's excess is trimmed at the uplink
