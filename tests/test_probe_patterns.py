"""The path model's shared rows: untraced flows of one NIC pair share one pattern, bound in
bulk from ``Routing.spray_many``; the rows and the findings equal those of the flow-by-flow
candidate resolver (the reference the bulk paths replace)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.builders import fat_tree_fabric, rail_optimized_fabric
from fabricscope.fabric.inventory import port_device
from fabricscope.fabric.routing import Routing
from fabricscope.model.records import FiveTuple
from fabricscope.probe.analysis import Baseline, Observations, analyze
from fabricscope.probe.localize import PathModel
from fabricscope.service.probe_twin import TwinMesh
from fabricscope.sim.faults import Fault, FaultSchedule

SHAPES = {
    "ls": lambda: leaf_spine_fabric(leaves=5, hosts_per_leaf=2, spines=3),
    "fat": lambda: fat_tree_fabric(k=4),
    "rail": lambda: rail_optimized_fabric(8, gpus_per_server=4),
}


@lru_cache(maxsize=4)
def mesh(shape: str) -> TwinMesh:
    return TwinMesh(SHAPES[shape](), seed=11)


def resolver_model(routing: Routing) -> PathModel:
    """Flow by flow: each flow's candidate set from ``spray_weights`` (its own pattern)."""

    def resolve(src: str, dst: str, ft: FiveTuple) -> dict[int, float]:
        return dict(routing.spray_weights(src, dst))

    return PathModel(routing.fabric, resolve)


def bulk_model(routing: Routing, obs: Observations) -> PathModel:
    node = routing.fabric.index.node_of
    s = np.array([node[a] for a, _, _ in obs.flows], dtype=np.int64)
    t = np.array([node[b] for _, b, _ in obs.flows], dtype=np.int64)
    m = PathModel(routing.fabric)
    m.bind_candidates(obs.flows, s, t, spray=routing.spray_many)
    return m


def probe(m: TwinMesh, faults: list[Fault], seed: int, seconds: float = 20.0) -> Observations:
    tr = m.transport_for(FaultSchedule.of(faults), seed, background_loss=1e-5)
    return m.probe(tr, start_ns=0, duration_ns=int(seconds * 1e9), seed=seed + 1)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("failed", [False, True])
def test_bulk_rows_equal_the_flow_by_flow_rows(shape: str, failed: bool) -> None:
    m = mesh(shape)
    f = m.fabric
    # A failed switch-to-switch cable: the candidate sets of the pairs that used it shrink.
    core = [ln.id for ln in f.links if all(f.devices[port_device(x)].is_switch for x in (ln.a, ln.b))]
    routing = Routing(f, failed_links=[core[len(core) // 2]] if failed else [])
    obs = probe(m, [], seed=3, seconds=2.0)
    flows = list(obs.flows)
    bulk = bulk_model(routing, obs)
    ref = resolver_model(routing)
    ref.rows(flows)
    # One pattern per NIC pair and direction, not per flow.
    P, _, _ = bulk.patterns
    pairs = {(a, b) for a, b, _ in flows} | {(b, a) for a, b, _ in flows}
    assert P.shape[0] == len(pairs) < 2 * len(flows)
    for got, want in zip(bulk.matrices, ref.matrices, strict=True):
        assert got.shape == want.shape
        assert abs(got - want).max() < 1e-12
    for got, want in zip(bulk.hops_one_way(), ref.hops_one_way(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="exactly one"):
        PathModel(f).bind_candidates(flows, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_findings_on_shared_patterns_equal_the_flow_by_flow_findings(shape: str) -> None:
    m = mesh(shape)
    ix = m.fabric.index
    routing = Routing(m.fabric)
    rng = np.random.default_rng(7)
    faults = [Fault("gray-loss", ix.edge_id(int(rng.integers(ix.n_edges))), params={"loss": 0.05}),
              Fault("nic-fault", m.fabric.nics[int(rng.integers(len(m.fabric.nics)))].id,
                    params={"loss": 0.03})]
    obs = probe(m, faults, seed=5)
    got = analyze(m.fabric, bulk_model(routing, obs), obs, Baseline(loss_per_hop=1e-5))
    want = analyze(m.fabric, resolver_model(routing), obs, Baseline(loss_per_hop=1e-5))
    assert got, "the faults must be seen for the comparison to mean anything"
    assert [(f.kind, f.subject) for f in got] == [(f.kind, f.subject) for f in want]
    for a, b in zip(got, want, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-9)
        assert float(a.details["loss"]) == pytest.approx(float(b.details["loss"]), rel=1e-9)
