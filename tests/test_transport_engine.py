"""The fluid transport engine against the ideal engine where they must agree, and its invariants."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import (
    BufferConfig,
    EcnConfig,
    FluidTransport,
    PfcConfig,
    TransportConfig,
    parse_ecn,
    simulate_transport,
)
from fabricscope.sim.workload.traffic import incast, permutation

_FAB = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=4)
_NICS = [n.id for n in _FAB.nics]


@pytest.mark.parametrize("lb", ["ecmp", "spray"])
def test_a_lone_flow_takes_what_the_ideal_engine_says(lb: str) -> None:
    """No contention: no queue, no mark, and the same FCT as max-min (within one step)."""
    w = Workload("lone", (FlowSpec(0, _NICS[0], _NICS[9], 2_000_000),))
    r = simulate_transport(_FAB, w, lb=lb)
    ideal = simulate(_FAB, w, lb=lb)
    assert r.sim.fct_ns[0] == pytest.approx(ideal.fct_ns[0], abs=r.stats.dt_ns)
    assert r.stats.max_queue_bytes.max() == 0.0
    assert r.stats.marked_packets.sum() == 0.0
    assert r.queueing_delay_ns[0] == 0.0


@pytest.mark.parametrize("lb", ["ecmp", "spray"])
def test_every_byte_arrives_and_nobody_beats_line_rate(lb: str) -> None:
    w = permutation(_FAB, 1_000_000, seed=3)
    sim = FluidTransport(_FAB, w, lb=lb)
    sim.advance_to(1e9)
    r = sim.result()
    assert r.unfinished == 0 and np.isfinite(r.sim.fct_ns).all()
    assert sim.delivered == pytest.approx(r.sim.size_bytes, rel=1e-6)
    lone = np.array([simulate(_FAB, Workload("lone", (f,)), lb=lb).fct_ns[0] for f in w.flows])
    assert (r.sim.fct_ns >= lone - r.stats.dt_ns - 1e-6).all()
    if lb == "ecmp":  # hash collisions cost time; fluid spraying is perfectly even (no queue)
        assert (r.sim.fct_ns > lone + 1_000).any()
    else:
        assert r.stats.max_queue_bytes.max() == 0.0


def test_queueing_delay_shows_in_the_rtt_of_incast_flows() -> None:
    w = incast(_FAB, 1_000_000, senders=8, receiver=_NICS[0], seed=0)
    r = simulate_transport(_FAB, w)
    assert (r.queueing_delay_ns > 1_000).all()  # microseconds of queueing on top of the base RTT
    assert r.stats.max_queue_bytes.max() > 10_000
    # Eight senders share one 100G port: the last one cannot finish before 8 MB / 100G.
    assert np.nanmax(r.sim.end_ns) > 8e6 * 8 / 100e9 * 1e9


def test_dependencies_start_when_the_parent_arrived() -> None:
    w = Workload("chain", (FlowSpec(0, _NICS[0], _NICS[5], 1e6), FlowSpec(1, _NICS[5], _NICS[10], 1e6, deps=(0,), gap_ns=3000)))
    r = simulate_transport(_FAB, w)
    ideal = simulate(_FAB, w)
    dt = r.stats.dt_ns
    assert r.sim.start_ns[1] >= r.sim.end_ns[0] + 3000 - 1e-6
    assert r.sim.start_ns[1] == pytest.approx(ideal.start_ns[1], abs=2 * dt)
    assert r.sim.end_ns[1] == pytest.approx(ideal.end_ns[1], abs=3 * dt)


def test_time_limit_leaves_flows_unfinished_and_says_so() -> None:
    w = Workload("long", (FlowSpec(0, _NICS[0], _NICS[5], 1e9),))
    r = simulate_transport(_FAB, w, config=TransportConfig(max_time_ns=50_000))
    assert r.unfinished == 1 and np.isnan(r.sim.fct_ns[0])
    assert r.sim.meta["unfinished"] == 1


def test_a_failed_uplink_reroutes_like_the_ideal_engine() -> None:
    link = next(ln.id for ln in _FAB.links if "leaf-000" in ln.id and "spine-00" in ln.id)
    w = permutation(_FAB, 500_000, seed=1)
    r = simulate_transport(_FAB, w, faults=[Fault("link-down", link, 0, None, {})])
    assert r.unfinished == 0 and np.isfinite(r.sim.fct_ns).all()
    edge = _FAB.edge_index(link.replace("|", "->"))
    assert r.stats.served_bytes[edge] == 0.0 and r.stats.served_bytes[edge ^ 1] == 0.0


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (TransportConfig(ecn=EcnConfig(300_000, 200_000, 0.01)), "kmin (300000 B) must not exceed kmax"),
        (TransportConfig(ecn=EcnConfig(5_000, 200_000, 0.0)), "pmax: must be in (0, 1]"),
        (TransportConfig(ecn=EcnConfig(5_000, 200_000, 1.5)), "pmax: must be in (0, 1]"),
        (TransportConfig(buffer=BufferConfig(size_bytes=1000)), "smaller than one MTU"),
        (TransportConfig(buffer=BufferConfig(size_bytes=-1)), "must be > 0"),
        (TransportConfig(pfc=PfcConfig(enabled=True, xoff_bytes=-5)), "pfc.xoff: must be > 0"),
        (TransportConfig(dt_ns=0), "dt: must be > 0"),
        (TransportConfig(pfc=PfcConfig(enabled=True), buffer=BufferConfig(size_bytes=20_000)), "cannot hold the PFC headroom"),
    ],
)
def test_impossible_settings_are_named(cfg: TransportConfig, needle: str) -> None:
    w = Workload("lone", (FlowSpec(0, _NICS[0], _NICS[9], 1e6),))
    with pytest.raises(ConfigError, match=None) as exc:
        simulate_transport(_FAB, w, config=cfg)
    assert needle in str(exc.value)


def test_unsupported_routing_and_fault_windows_are_refused() -> None:
    w = Workload("lone", (FlowSpec(0, _NICS[0], _NICS[9], 1e6),))
    with pytest.raises(ConfigError, match="not in the transport engine yet"):
        simulate_transport(_FAB, w, lb="dlb")
    link = _FAB.links[-1].id
    with pytest.raises(ConfigError, match="for the whole run only"):
        simulate_transport(_FAB, w, faults=[Fault("link-down", link, 1000, None, {})])
    pfc = TransportConfig(pfc=PfcConfig(enabled=True))
    with pytest.raises(ConfigError, match="is not a NIC"):
        simulate_transport(_FAB, w, config=pfc, stuck_nics=["leaf-000"])
    with pytest.raises(ConfigError, match="enable PfcConfig"):
        simulate_transport(_FAB, w, stuck_nics=[_NICS[9]])


@pytest.mark.parametrize("lb", ["ecmp", "spray"])
def test_segments_conserve_every_flow(lb: str) -> None:
    """A flow leaves its NIC whole (first weights sum to 1), every segment hands all its
    bytes on (child fractions sum to 1) and exactly the links into the destination end it."""
    w = permutation(_FAB, 1e6, seed=5)
    segs = FluidTransport(_FAB, w, lb=lb).segs
    first = np.bincount(segs.flow[segs.f0idx], weights=segs.weight[segs.f0idx], minlength=len(w.flows))
    assert first == pytest.approx(np.ones(len(w.flows)))
    sums = np.add.reduceat(segs.ch_frac, segs.ch_ptr[:-1][np.diff(segs.ch_ptr) > 0])
    assert sums == pytest.approx(np.ones(sums.shape[0]))
    assert ((np.diff(segs.ch_ptr) == 0) == segs.last).all()
    ix = _FAB.index
    dst = np.array([ix.node_of[f.dst] for f in w.flows])
    assert (ix.dst[segs.edge[segs.last]] == dst[segs.flow[segs.last]]).all()
    last_w = np.bincount(segs.flow[segs.last], weights=segs.weight[segs.last], minlength=len(w.flows))
    assert last_w == pytest.approx(np.ones(len(w.flows)))


def test_parse_ecn() -> None:
    assert parse_ecn("5KB,200KB,0.01") == EcnConfig(5_000, 200_000, 0.01)
    assert parse_ecn("0,1MB,10%").pmax == pytest.approx(0.1)
    for bad, needle in (("5KB,200KB", "expected KMIN,KMAX,PMAX"), ("-5KB,200KB,0.1", "kmin must be >= 0"),
                        ("300KB,200KB,0.1", "must not exceed kmax"), ("5KB,200KB,x", "pmax must be a number")):
        with pytest.raises(ConfigError, match=None) as exc:
            parse_ecn(bad)
        assert needle in str(exc.value)
