"""A stored window as per-flow totals (one GROUP BY in DuckDB): the totals equal those of the
per-probe columns, and the analysis over them (with responder times read on demand) gives
the findings of the per-probe analysis, a starved host and a gray link included."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.records import FiveTuple, ProbeSample
from fabricscope.probe.analysis import (
    ANSWERED,
    LOST_UNKNOWN,
    REPLY_LOST,
    REQUEST_LOST,
    Baseline,
    FlowKey,
    Observations,
    WindowTotals,
    analyze,
    analyze_totals,
)
from fabricscope.probe.localize import PathModel
from fabricscope.service.probe_twin import TwinMesh
from fabricscope.sim.faults import Fault, FaultSchedule
from fabricscope.store.probes import ProbeStore

FT = FiveTuple("198.18.0.1", "198.18.0.2", 40000, 4791)


def assert_totals_equal(got: WindowTotals, want: WindowTotals) -> None:
    assert list(got.flows) == list(want.flows)
    assert (got.n_probes, got.window) == (want.n_probes, want.window)
    assert got.proc_median == want.proc_median or (np.isnan(got.proc_median) and np.isnan(want.proc_median))
    for name in ("sent", "lost", "lost_req", "lost_unknown"):
        np.testing.assert_array_equal(getattr(got.stats, name), getattr(want.stats, name), err_msg=name)


def test_totals_of_every_loss_status_equal_the_per_probe_totals(tmp_path: Path) -> None:
    samples, statuses = [], []
    for i in range(40):
        ft = FT._replace(src_port=40000 + i % 3)
        lost = i % 4 == 1
        samples.append(ProbeSample("a/nic0" if i % 5 else "c/nic0", "b/nic0", ft, i, 1000 * i,
                                   None if lost else 1000 * i + 50, None if lost else 1000 * i + 60 + i,
                                   None if lost else 1000 * i + 300))
        # ANSWERED on a lost probe means "direction unknown" (as lost_status reads it)
        statuses.append([REQUEST_LOST, REPLY_LOST, LOST_UNKNOWN, ANSWERED][(i // 4) % 4] if lost else ANSWERED)
    st = ProbeStore(tmp_path / "p.duckdb")
    st.insert(samples, statuses)
    for t0, t1 in ((None, None), (5_000, 30_000), (39_500, None), (10**9, None)):
        got = st.window_totals(t0_ns=t0, t1_ns=t1)
        obs = st.observations(t0_ns=t0, t1_ns=t1)
        assert_totals_equal(got, WindowTotals.of(obs))
    r = st.responder_times(t0_ns=5_000, t1_ns=30_000)
    nics, n, k = r.above(20.0)
    obs = st.observations(t0_ns=5_000, t1_ns=30_000)
    ok = obs.t_recv_ns != -1
    proc = obs.t_resp_tx_ns[ok] - obs.t_resp_rx_ns[ok]
    assert list(nics) == ["b/nic0"] and int(n[0]) == int(ok.sum()) and int(k[0]) == int((proc > 20).sum())
    np.testing.assert_array_equal(np.sort(r.times(["b/nic0"])), np.sort(proc.astype(float)))
    assert r.times([]).shape == (0,) and r.times(["x/nic0"]).shape == (0,)
    st.close()


@lru_cache(maxsize=1)
def mesh() -> TwinMesh:
    return TwinMesh(leaf_spine_fabric(leaves=4, hosts_per_leaf=3, spines=3), seed=5,
                    plan_kw={"rail_peers_per_leaf": 3})


def candidate_model(m: TwinMesh, flows: Sequence[FlowKey]) -> PathModel:
    """Bound to ``flows`` itself (the model knows bulk-bound flows by identity)."""
    node = m.fabric.index.node_of
    model = PathModel(m.fabric)
    model.bind_candidates(flows, np.array([node[a] for a, _, _ in flows]),
                          np.array([node[b] for _, b, _ in flows]), spray=Routing(m.fabric).spray_many)
    return model


@pytest.mark.parametrize("seed", [1, 2])
def test_analysis_of_stored_totals_equals_the_per_probe_analysis(tmp_path: Path, seed: int) -> None:
    m = mesh()
    ix = m.fabric.index
    rng = np.random.default_rng(seed)
    faults = [Fault("gray-loss", ix.edge_id(int(rng.integers(ix.n_edges))), params={"loss": 0.05}),
              Fault("cpu-starved", m.fabric.hosts[int(rng.integers(len(m.fabric.hosts)))].id)]
    tr = m.transport_for(FaultSchedule.of(faults), seed, background_loss=1e-5)
    probes: Observations = m.probe(tr, start_ns=0, duration_ns=20 * 10**9, seed=seed + 1)
    st = ProbeStore(tmp_path / "p.duckdb")
    st.insert_observations(probes)
    obs = st.observations()
    totals = st.window_totals()
    assert_totals_equal(totals, WindowTotals.of(obs))
    b_obs, b_tot = Baseline(), Baseline()
    b_obs.learn(obs, track_rtt=False)
    b_tot.learn_totals(totals)
    assert (b_obs.loss_per_hop, b_obs.proc_ns) == (b_tot.loss_per_hop, b_tot.proc_ns)
    want = analyze(m.fabric, candidate_model(m, obs.flows), obs, b_obs)
    got = analyze_totals(m.fabric, candidate_model(m, totals.flows), totals, st.responder_times(), b_tot)
    kinds = {f.kind for f in want}
    assert "cpu-starved" in kinds and len(kinds) >= 2, f"both faults must show: {kinds}"
    assert got == want
    st.close()


def test_stored_flows_index_iterate_and_bind_nodes_like_a_list(tmp_path: Path) -> None:
    st = ProbeStore(tmp_path / "p.duckdb")
    st.insert([ProbeSample(f"h{i % 3}/nic0", f"h{(i + 1) % 3}/nic0", FT._replace(src_port=40000 + i), i,
                           10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 5) for i in range(7)])
    flows = st.window_totals().flows
    want = list(st.observations().flows)
    assert [flows[i] for i in range(len(flows))] == want == list(flows)
    lazy = st.window_totals().flows  # nothing built yet: items one by one
    assert lazy[-1] == want[-1] and lazy[0] == want[0]
    assert list(flows[1:3]) == want[1:3]
    with pytest.raises(IndexError):
        flows[len(want)]
    node_of = {f"h{i}/nic0": 10 + i for i in range(3)}
    s, t = flows.bind_nodes(node_of)  # type: ignore[attr-defined]
    assert s.tolist() == [node_of[a] for a, _, _ in want] and t.tolist() == [node_of[b] for _, b, _ in want]
    with pytest.raises(KeyError):
        flows.bind_nodes({"h0/nic0": 1})  # type: ignore[attr-defined]
    st.close()
