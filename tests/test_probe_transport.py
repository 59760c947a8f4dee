"""The twin probe transport: the hash decides the path, faults act only where they are."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric import Routing, leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.twin.probe_transport import ProbeTransport, round_robin_schedule

F = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=4)
SRC, DST = "host0000/nic0", "host0002/nic0"


def _flows(n: int) -> list[tuple[str, str, FiveTuple]]:
    r = Routing(F)
    return [(SRC, DST, r.flow_tuple(SRC, DST, src_port=40000 + i, dst_port=47910)) for i in range(n)]


def test_paths_are_the_routing_hash_paths() -> None:
    tr = ProbeTransport(F)
    fl = _flows(32)
    ids = tr.register(fl)
    r = Routing(F)
    for i, (s, d, ft) in zip(ids, fl, strict=True):
        fwd, rev = tr.path_edges(int(i))
        assert fwd == r.path(s, d, ft)
        assert rev == r.path(d, s, FiveTuple(ft.dst_ip, ft.src_ip, ft.dst_port, ft.src_port))
    assert list(tr.register(fl)) == list(ids)  # idempotent


def test_gray_loss_rate_and_direction() -> None:
    tr0 = ProbeTransport(F)
    ids = tr0.register(_flows(64))
    # Fault the first-hop uplink direction taken by flow 0's request.
    e = tr0.path_edges(0)[0][1]
    subject = F.index.edge_id(e)
    tr = ProbeTransport(F, faults=FaultSchedule.of([Fault("gray-loss", subject, params={"loss": 0.2})]), seed=1)
    tr.register(_flows(64))
    crosses = np.array([e in tr.path_edges(int(i))[0] for i in ids])
    n = 20_000
    flow = np.repeat(ids, n // len(ids))
    b = tr.carry(flow, np.arange(flow.shape[0], dtype=np.int64) * 1000)
    lost = b.t_recv_ns < 0
    on = crosses[flow]
    # Requests crossing the link drop at 0.2: binomial sd sqrt(.2*.8/m), allow 5 sd.
    m = int(on.sum())
    assert abs(lost[on].mean() - 0.2) < 5 * (0.16 / m) ** 0.5
    assert not lost[~on].any()
    assert not b.req_arrived[lost].any()  # lost on the request path, as faulted


def test_cpu_starved_adds_responder_delay_not_loss() -> None:
    fl = _flows(8)
    tr = ProbeTransport(F, faults=FaultSchedule.of([Fault("cpu-starved", "host0002", params={"delay_ns": 1e6})]))
    ids = tr.register(fl)
    flow = np.repeat(ids, 500)
    b = tr.carry(flow, np.zeros(flow.shape[0], dtype=np.int64))
    assert (b.t_recv_ns >= 0).all()
    proc = b.t_resp_tx_ns - b.t_resp_rx_ns
    net = (b.t_recv_ns - b.t_send_ns) - proc
    assert np.median(proc) > 5e5
    assert np.median(net) < 1e5


def test_fault_windows_and_send_one_with_clock() -> None:
    fl = _flows(1)
    f = Fault("nic-fault", DST, start_ns=10, end_ns=20, params={"loss": 1.0})
    tr = ProbeTransport(F, faults=FaultSchedule.of([f]))
    clock = SimClock(0)
    assert not tr.send_one(*fl[0], seq=1, clock=clock).lost
    clock.set(15)
    assert tr.send_one(*fl[0], seq=2, clock=clock).lost
    clock.set(25)
    assert not tr.send_one(*fl[0], seq=3, clock=clock).lost


def test_bad_fault_subject_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nosuch"):
        ProbeTransport(F, faults=FaultSchedule.of([Fault("switch-fault", "nosuch")]))


def test_round_robin_schedule_rate() -> None:
    groups = [np.arange(5), np.arange(5, 8)]
    flow, t = round_robin_schedule(groups, rate_pps=100, start_ns=0, duration_ns=10**9,
                                   rng=np.random.default_rng(0))
    assert flow.shape[0] == 200
    assert (np.diff(t) >= 0).all()
    assert np.bincount(flow, minlength=8)[:5].sum() == 100
