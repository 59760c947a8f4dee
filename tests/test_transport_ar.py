"""Switch adaptive routing on local queues (``--lb ar``) in the fluid transport engine.

A switch that sends every packet to the egress port whose queue drains soonest (DRILL's
join-the-shortest-queue, Ghorbani et al., SIGCOMM'17) levels its ports' queueing delays: on a
fabric whose bottleneck is a leaf's own uplinks, one of them slowed, the leaf's flows then
finish as if its uplinks were one pipe of their summed capacity. What a switch cannot see, a
queue at a far switch, stays out of its reach (that is what end-to-end schemes like REPS are
for).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import Workload
from fabricscope.sim.transport import PfcConfig, TransportConfig, simulate_transport
from fabricscope.sim.transport.results import TransportResult
from fabricscope.sim.workload.traffic import permutation

FLOW = 2e6


@cache
def _setup() -> tuple[Fabric, Workload, Fault, np.ndarray]:
    # 16 hosts per leaf over 8 spines: 2:1, the leaves' uplinks are the bottleneck
    fab = leaf_spine_fabric(leaves=8, hosts_per_leaf=16, spines=8)
    w = permutation(fab, FLOW, seed=1)
    up = next(p for p in fab.ports_of["leaf-000"] if fab.peer_port[p].startswith("spine"))
    slow = Fault("link-degraded", f"{up}->{fab.peer_port[up]}", 0, None, {"factor": 0.25})
    nics0 = {fab.peer_port[p].rsplit(":", 1)[0] for p in fab.ports_of["leaf-000"]
             if not fab.peer_port[p].startswith("spine")}
    mine = np.array([f.src in nics0 and f.dst not in nics0 for f in w.flows])
    assert mine.sum() >= 14  # leaf-000's senders whose flows cross its uplinks
    return fab, w, slow, mine


@cache
def _run(lb: str, cc: str, degraded: bool) -> TransportResult:
    fab, w, slow, _ = _setup()
    cfg = TransportConfig(cc=cc, pfc=PfcConfig(enabled=cc == "dcqcn"))  # type: ignore[arg-type]
    return simulate_transport(fab, w, config=cfg, lb=lb, faults=(slow,) if degraded else ())


def _last_us(r: TransportResult, sel: np.ndarray) -> float:
    return float(np.nanmax(r.sim.end_ns[sel]) - np.nanmin(r.sim.start_ns[sel])) / 1e3


@pytest.mark.parametrize("cc", ["nscc", "dcqcn"])
def test_a_leaf_levels_its_uplinks_and_loses_only_the_capacity_the_slow_one_lost(cc: str) -> None:
    """leaf-000's crossing flows: never faster than its uplinks' summed capacity allows, and
    slower than on the healthy fabric by that capacity's ratio (8 / 7.25) and at most 5 %
    more (the congestion control's own transient); spraying is held to the slow link."""
    fab, _, _, mine = _setup()
    r = _run("ar", cc, True)
    assert r.unfinished == 0
    ix = fab.index
    ups = [e for e in range(ix.n_edges) if ix.from_port[e].startswith("leaf-000:")
           and ix.to_port[e].startswith("spine")]
    full = ix.capacity_bps[ups].sum() / 8.0
    left = full - 0.75 * ix.capacity_bps[ups[0]] / 8.0
    bound_us = mine.sum() * FLOW / left * 1e6
    healthy = _last_us(_run("ar", cc, False), mine)
    last = _last_us(r, mine)
    assert bound_us <= last <= healthy * (full / left) * 1.05, (last, bound_us, healthy)
    spray = _run("spray", cc, True)
    assert _last_us(spray, mine) > 2 * last


def test_on_a_healthy_symmetric_fabric_it_is_spraying() -> None:
    ar, spray = _run("ar", "nscc", False), _run("spray", "nscc", False)
    np.testing.assert_allclose(ar.sim.fct_ns, spray.sim.fct_ns, rtol=1e-3)


def test_a_far_queue_is_out_of_a_switchs_sight() -> None:
    """The slow direction reversed (spine -> leaf-000): the senders' leaves see empty uplinks,
    so adaptive routing cannot steer around it; REPS, which reads the marks, does."""
    fab, w, _, _ = _setup()
    up = next(p for p in fab.ports_of["leaf-000"] if fab.peer_port[p].startswith("spine"))
    down = Fault("link-degraded", f"{fab.peer_port[up]}->{up}", 0, None, {"factor": 0.25})
    cfg = TransportConfig(cc="nscc")
    ar = simulate_transport(fab, w, config=cfg, lb="ar", faults=(down,))
    spray = simulate_transport(fab, w, config=cfg, lb="spray", faults=(down,))
    reps = simulate_transport(fab, w, config=cfg, lb="reps", faults=(down,))
    mx = {k: float(np.nanmax(v.sim.fct_ns)) for k, v in (("ar", ar), ("spray", spray), ("reps", reps))}
    assert mx["reps"] < 0.7 * mx["ar"] and mx["ar"] > 0.8 * mx["spray"], mx


def test_the_ideal_engine_refuses_it() -> None:
    fab, w, _, _ = _setup()
    with pytest.raises(ConfigError, match="lb ar: splits by switch queues"):
        simulate(fab, w, lb="ar")
