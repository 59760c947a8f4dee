"""PFC in the fluid transport engine: pause storms, head-of-line blocking, deadlock, watchdog.

IEEE 802.1Qbb pauses an upstream sender when an ingress queue passes XOFF. A receiver that
stops accepting (a stuck NIC sending PAUSE forever) therefore pauses every link whose bytes
wait behind a paused queue, hop by hop: the prediction below is computed from the routes
alone (which ingress feeds which egress), never from the engine's state. A cyclic buffer
dependency (routes around a ring, as a non-up-down route after a link failure makes) stops
every link on the cycle for good; the watchdog breaks it within its detection time.
"""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import FabricBuilder, leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.loadbalance import PathTable
from fabricscope.sim.transport import BufferConfig, FluidTransport, PfcConfig, TransportConfig


def _predicted_paused(sim: FluidTransport, stuck_edges: set[int]) -> set[int]:
    """Links that must end up paused: those into the stuck NIC, then every link whose bytes
    enter a switch and wait in an egress queue that is itself paused (fixpoint)."""
    segs = sim.segs
    paused = set(stuck_edges)
    while True:
        more = {int(g) for e, g in zip(segs.edge.tolist(), segs.ingress.tolist(), strict=True)
                if e in paused and g >= 0} - paused
        if not more:
            return paused
        paused |= more


def _storm_setup() -> tuple[Fabric, Workload, str]:
    fab = leaf_spine_fabric(leaves=3, hosts_per_leaf=2, spines=2)
    nics = [n.id for n in fab.nics]
    stuck = nics[0]
    flows = [FlowSpec(0, nics[2], stuck, 50e6), FlowSpec(1, nics[4], stuck, 50e6)]
    # Every other NIC sends to every NIC on another leaf except the stuck one: some of these
    # share a queue with the stuck flows (head-of-line victims), some do not.
    k = 2
    for i in range(1, len(nics)):
        for j in range(1, len(nics)):
            if i // 2 != j // 2:  # NIC i sits on leaf i // 2
                flows.append(FlowSpec(k, nics[i], nics[j], 50e6))
                k += 1
    return fab, Workload("storm", tuple(flows)), stuck


def test_pause_storm_spreads_to_the_predicted_hops() -> None:
    fab, w, stuck = _storm_setup()
    ix = fab.index
    cfg = TransportConfig(cc="none", pfc=PfcConfig(enabled=True), buffer=BufferConfig(size_bytes=4e6),
                          max_time_ns=1.5e6)
    sim = FluidTransport(fab, w, config=cfg, stuck_nics=[stuck])
    first = np.full(ix.n_edges, np.inf)
    delivered = []
    for k in range(1, 1501):
        sim.advance_to(k * 1000.0)
        newly = (sim.stats().paused_ns > 0) & ~np.isfinite(first)
        first[newly] = k
        if k in (1000, 1500):
            delivered.append(sim.delivered.copy())
    stuck_edges = {int(e) for e in np.flatnonzero(ix.dst == ix.node_of[stuck])}
    want = _predicted_paused(sim, stuck_edges)
    got = {int(e) for e in np.flatnonzero(np.isfinite(first))}
    assert got == want
    assert len(want) > 6  # it did spread past the first hops
    # Hop order: a link pauses only after the queue it feeds was paused.
    segs = sim.segs
    for e, g in zip(segs.edge.tolist(), segs.ingress.tolist(), strict=True):
        if g >= 0 and g in want and e in want:
            assert first[g] >= first[e]
    # Flows that cross a paused link stop (head-of-line blocking of innocent flows too);
    # the others keep moving.
    progress = delivered[1] - delivered[0]
    crosses = np.zeros(len(w.flows), dtype=bool)
    crosses[segs.flow[np.isin(segs.edge, list(want))]] = True
    assert (progress[crosses] < 1.0).all()
    innocent_blocked = crosses.copy()
    innocent_blocked[:2] = False
    assert innocent_blocked.any(), "the setup must have head-of-line victims"
    assert (progress[~crosses] > 1e6).all()


def _ring() -> tuple[Fabric, Workload, PathTable, list[int]]:
    """Four switches in a ring, one NIC each; flow i goes three hops around the ring."""
    b = FabricBuilder("ring4")
    sw = [b.switch(f"leaf-{i}", "leaf") for i in range(4)]
    nics = []
    for i in range(4):
        h = b.host(f"host{i}", 1)
        nic = b.nic(h, 0, gpu=0)
        b.cable(nic, sw[i], 100.0, a_prefix="p")
        nics.append(nic)
    for i in range(4):
        b.cable(sw[i], sw[(i + 1) % 4], 100.0)
    fab = b.build({"kind": "ring"})
    ix = fab.index

    def edge(x: str, y: str) -> int:
        return int(np.flatnonzero((ix.src == ix.node_of[x]) & (ix.dst == ix.node_of[y]))[0])

    rows = []
    for i in range(4):
        hops = [sw[(i + k) % 4] for k in range(4)]
        rows.append([edge(nics[i], hops[0])] + [edge(hops[k], hops[k + 1]) for k in range(3)]
                    + [edge(hops[3], nics[(i + 3) % 4])])
    paths = PathTable(np.arange(0, 21, 5, dtype=np.int64), np.array([e for r in rows for e in r], dtype=np.int64),
                      np.ones(20), np.zeros(4, dtype=bool))
    w = Workload("ring", tuple(FlowSpec(i, nics[i], nics[(i + 3) % 4], 50e6) for i in range(4)))
    return fab, w, paths, [edge(sw[i], sw[(i + 1) % 4]) for i in range(4)]


def _cycle_throughput(watchdog_ns: float, action: str, t_us: int) -> tuple[np.ndarray, FluidTransport]:
    fab, w, paths, cyc = _ring()
    cfg = TransportConfig(
        cc="none", buffer=BufferConfig(size_bytes=2e6), max_time_ns=t_us * 1e3,
        pfc=PfcConfig(enabled=True, watchdog_ns=watchdog_ns, restore_ns=300e3, watchdog_action=action),  # type: ignore[arg-type]
    )
    sim = FluidTransport(fab, w, config=cfg, paths=paths)
    served = []
    for k in range(1, t_us + 1):
        sim.advance_to(k * 1000.0)
        served.append(sim.stats().served_bytes[cyc].sum())
    return np.diff(np.array([0.0, *served])), sim


def test_cyclic_buffer_dependency_deadlocks() -> None:
    thr, sim = _cycle_throughput(0.0, "drop", 1000)
    stop = int(np.flatnonzero(thr > 0)[-1]) + 1  # the last microsecond anything moved
    assert stop < 200  # forms within the first 200 us
    assert (thr[stop:] == 0).all()  # and never clears: throughput zero on the cycle
    assert sim.stats().paused_ns.max() > 700e3
    assert np.isnan(sim.result().sim.fct_ns).all()


@pytest.mark.parametrize("action", ["forward", "drop"])
def test_watchdog_breaks_the_deadlock_within_its_time(action: str) -> None:
    detect_us = 100
    base, _ = _cycle_throughput(0.0, "drop", 400)
    formed = int(np.flatnonzero(base > 0)[-1]) + 1
    thr, sim = _cycle_throughput(detect_us * 1e3, action, 1000)
    assert sim.stats().watchdog_events.sum() > 0
    if action == "forward":  # the stormed queues transmit again as soon as it fires
        resumed = formed + int(np.flatnonzero(thr[formed:] > 0)[0])
        assert resumed - formed <= detect_us + 2
    else:  # "drop" flushes the stormed queues: the switch buffers empty at once
        assert sim.stats().drop_bytes.sum() > 0
        assert thr[formed + detect_us + 2: formed + detect_us + 290].sum() == 0  # dropping, not forwarding
        assert thr[formed + detect_us + 290: formed + detect_us + 320].sum() > 0  # restored (300 us)


def test_without_pfc_a_full_buffer_drops_and_flows_still_finish() -> None:
    fab = leaf_spine_fabric(leaves=1, hosts_per_leaf=9, spines=1)
    nics = [n.id for n in fab.nics]
    w = Workload("incast8", tuple(FlowSpec(i, nics[i + 1], nics[0], 2e6) for i in range(8)))
    cfg = TransportConfig(cc="none", pfc=PfcConfig(enabled=False), buffer=BufferConfig(size_bytes=1e6))
    sim = FluidTransport(fab, w, config=cfg)
    sim.advance_to(cfg.max_time_ns)
    r = sim.result()
    assert r.stats.drop_bytes.sum() > 0 and r.stats.pause_frames.sum() == 0
    assert np.isfinite(r.sim.fct_ns).all()
    # Dynamic threshold: one queue never holds more than alpha/(1+alpha) of the buffer.
    assert r.stats.max_queue_bytes.max() <= 0.5e6 * 1.01
    assert r.sim.completion_ns > 8 * 2e6 * 8 / 100e9 * 1e9  # slower than the ideal 1.28 ms
