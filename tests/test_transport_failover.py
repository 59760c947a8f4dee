"""A link fails under running traffic in the fluid transport engine: re-routing and recovery."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.transport import FluidTransport, TransportConfig
from fabricscope.sim.transport.failover import failover_run
from fabricscope.sim.workload.traffic import permutation

_FAB = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=4)
_NICS = [n.id for n in _FAB.nics]


def _cable(a: str, b: str) -> str:
    return next(f"{lk.a}|{lk.b}" for lk in _FAB.links if {lk.a.split(":")[0], lk.b.split(":")[0]} == {a, b})


def _uplink_weights(ft: FluidTransport, flow: int, leaf: str) -> dict[str, float]:
    segs = ft.segs
    ix = _FAB.index
    out: dict[str, float] = {}
    for s in np.flatnonzero(segs.flow == flow):
        eid = ix.edge_id(int(segs.edge[s]))
        if eid.startswith(leaf + ":") and "spine" in eid:
            out[eid] = out.get(eid, 0.0) + float(segs.weight[s])
    return out


@pytest.mark.parametrize("local", [True, False])
def test_a_sprayed_flow_moves_its_share_off_a_failed_uplink(local: bool) -> None:
    w = Workload("one", (FlowSpec(0, _NICS[0], _NICS[12], 1e9),))
    ft = FluidTransport(_FAB, w, config=TransportConfig(cc="nscc"), lb="spray")
    ft.advance_to(20e3)
    before = _uplink_weights(ft, 0, "leaf-000")
    assert len(before) == 4 and all(x == pytest.approx(0.25) for x in before.values())
    edges = ft.fail_link(_cable("leaf-000", "spine-00"))
    assert ft.flows_through(edges).tolist() == [True]
    assert ft.reroute(local=local) == 1
    after = _uplink_weights(ft, 0, "leaf-000")
    down = [k for k in after if "spine-00" in k]
    assert [after[k] for k in down] == [0.0]
    assert sum(after.values()) == pytest.approx(1.0)
    assert all(v == pytest.approx(1 / 3) for k, v in after.items() if k not in down)
    assert not ft.flows_through(edges).any()


def test_a_remote_failure_is_invisible_locally_and_moved_at_the_sender() -> None:
    # the spine -> leaf-003 direction fails: leaf-000 has nothing local to react to
    w = Workload("one", (FlowSpec(0, _NICS[0], _NICS[12], 1e9),))
    ft = FluidTransport(_FAB, w, config=TransportConfig(cc="nscc"), lb="spray")
    leaf_port, spine_port = _cable("leaf-003", "spine-01").split("|")
    ft.fail_link(f"{spine_port}->{leaf_port}")
    assert ft.reroute(local=True) == 0
    assert ft.reroute(local=False) == 1
    after = _uplink_weights(ft, 0, "leaf-000")
    assert [v for k, v in after.items() if "spine-01" in k] == [0.0]


def test_ecmp_rehash_puts_the_whole_flow_on_one_live_path() -> None:
    w = permutation(_FAB, 1e9, seed=3)
    ft = FluidTransport(_FAB, w, config=TransportConfig(cc="nscc"), lb="spray")
    edges = ft.fail_link(_cable("leaf-000", "spine-00"))
    hit = ft.flows_through(edges)
    ft.reroute(local=False, pick=True, flows=hit)
    for f in np.flatnonzero(hit):
        src_leaf = "leaf-000" if w.flows[f].src in _NICS[:4] else None
        if src_leaf:
            ws = _uplink_weights(ft, int(f), src_leaf)
            live = [v for k, v in ws.items() if "spine-00" not in k]
            # the dead quarter went to exactly one of the three live uplinks
            assert sorted(round(v, 6) for v in live) == [0.25, 0.25, 0.5]


def _small_run(scheme: str, *, up_only: bool = False, **kw: float) -> object:
    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=8)
    w = permutation(fab, 1e12, seed=1)
    # a leaf-000 uplink that an ECMP flow uses (so that every scheme has flows on it)
    ecmp = FluidTransport(fab, w, config=TransportConfig(cc="nscc"), lb="ecmp")
    ix = fab.index
    used = {ix.edge_id(int(e)) for e in ecmp.segs.edge}
    link = next(f"{lk.a}|{lk.b}" for lk in fab.links
                if lk.a.startswith("leaf-000:") and "spine" in lk.b and f"{lk.a}->{lk.b}" in used)
    if up_only:  # only the leaf's own direction: every flow hit is one the leaf can move
        link = link.replace("|", "->")
    return failover_run(fab, w, scheme=scheme, link=link, fail_at_ns=150e3, until_ns=kw.get("until", 700e3),
                        converge_ns=kw.get("converge", 300e3), bin_ns=5e3)


def test_reps_and_adaptive_routing_recover_long_before_reconvergence_and_ecmp_waits_for_it() -> None:
    runs = {s: _small_run(s) for s in ("ecmp", "oblivious", "reps", "ar")}
    ecmp, obl, reps, ar = (runs[s] for s in ("ecmp", "oblivious", "reps", "ar"))
    for r in runs.values():
        assert r.pre_affected_gbps > 0 and r.n_affected > 0  # type: ignore[attr-defined]
    # ECMP: the hashed flows are black-holed until routing reconverges at 300 us
    assert ecmp.min_fraction < 1e-3  # type: ignore[attr-defined]  (1e-6 of each flow rides on every path)
    assert ecmp.recovery_us is None or ecmp.recovery_us > 300.0  # type: ignore[attr-defined]
    # REPS stops recycling the lost entropies on its own, well before 300 us
    assert reps.recovery_us is not None and reps.recovery_us < 300.0  # type: ignore[attr-defined]
    # adaptive routing moves the leaf's own direction at once, but the spine -> leaf direction
    # has no alternative at the spine (2 tiers): those flows lose 1/8 of their bytes until
    # routing reconverges, more than 10 %; REPS, at the senders, sees both directions
    assert ar.recovery_us is not None and ar.recovery_us >= 300.0  # type: ignore[attr-defined]
    assert reps.min_fraction > ar.min_fraction  # type: ignore[attr-defined]
    ar_up = _small_run("ar", up_only=True)
    reps_up = _small_run("reps", up_only=True)
    assert ar_up.recovery_us is not None and ar_up.recovery_us < 50.0  # type: ignore[attr-defined]
    # a failure on the leaf's own direction: both move within the first bins
    assert reps_up.recovery_us is not None and reps_up.recovery_us < 100.0  # type: ignore[attr-defined]
    assert ar_up.reroute_us[0] == pytest.approx(1.0)  # type: ignore[attr-defined]
    # oblivious spraying is REPS without the reaction: the same until REPS moves, then it keeps
    # losing until reconvergence
    assert obl.min_fraction <= reps.min_fraction  # type: ignore[attr-defined]
    assert obl.recovery_us is None or obl.recovery_us >= 300.0 > reps.recovery_us  # type: ignore[attr-defined]


def test_failover_rejects_what_it_cannot_measure() -> None:
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
    w = Workload("one", (FlowSpec(0, "host0000/nic0", "host0001/nic0", 1e12),))
    link = next(f"{lk.a}|{lk.b}" for lk in fab.links if lk.a.startswith("leaf-000:") and lk.b.startswith("spine-00:"))
    with pytest.raises(ConfigError, match="no flow crosses"):
        failover_run(fab, w, scheme="reps", link=link, fail_at_ns=100e3, until_ns=200e3, converge_ns=50e3)
    with pytest.raises(ConfigError, match="unknown 'warp'"):
        failover_run(fab, w, scheme="warp", link=link, fail_at_ns=100e3, until_ns=200e3, converge_ns=50e3)
    w2 = Workload("one", (FlowSpec(0, "host0000/nic0", "host0002/nic0", 1e5),))
    with pytest.raises(ConfigError, match="finished before the end"):
        failover_run(fab, w2, scheme="ecmp", link=link, fail_at_ns=100e3, until_ns=200e3, converge_ns=50e3)


# ------------------------------------------------------------------ REPS (--lb reps)
def test_reps_names_and_the_ideal_engine_refusing_it() -> None:
    from fabricscope.sim.engine import simulate
    from fabricscope.sim.loadbalance import check_scheme, reps_paths

    assert check_scheme("reps") == "reps" and reps_paths("reps") == 128 and reps_paths("reps:paths=64") == 64
    with pytest.raises(ConfigError, match="expected reps or reps:paths=N"):
        check_scheme("reps:paths=x")
    w = Workload("one", (FlowSpec(0, _NICS[0], _NICS[12], 1e6),))
    with pytest.raises(ConfigError, match="lb reps: recycles entropies on ECN marks"):
        simulate(_FAB, w, lb="reps")


def test_reps_takes_traffic_off_a_slow_uplink_that_oblivious_spraying_keeps_using() -> None:
    from fabricscope.sim.faults import Fault
    from fabricscope.sim.transport import simulate_transport

    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=8)
    w = permutation(fab, 2e6, seed=2)
    slow = next(f"{lk.a}|{lk.b}" for lk in fab.links if lk.a.startswith("leaf-000:") and lk.b.startswith("spine-00:"))
    faults = [Fault("link-degraded", slow, params={"factor": 0.25})]
    cfg = TransportConfig(cc="nscc")
    obl = simulate_transport(fab, w, config=cfg, lb="oblivious:paths=64", faults=faults, seed=2)
    reps = simulate_transport(fab, w, config=cfg, lb="reps:paths=64", faults=faults, seed=2)
    assert obl.unfinished == reps.unfinished == 0
    e = fab.edge_index(slow.replace("|", "->"))
    # REPS moves bytes off the slow uplink, so it carries less and the slowest flow ends sooner
    assert reps.stats.served_bytes[e] < 0.7 * obl.stats.served_bytes[e]
    assert np.nanmax(reps.sim.fct_ns) < 0.8 * np.nanmax(obl.sim.fct_ns)


def test_reps_rides_out_a_failure_without_waiting_for_routing() -> None:
    r = _small_run("reps")
    # one RTT after the failure the lost entropies are no longer recycled: no timeout, no
    # reconvergence needed (the 300 us reconvergence comes after the recovery)
    assert r.recovery_us is not None and r.recovery_us < 100.0  # type: ignore[attr-defined]
    assert r.min_fraction > 0.8  # type: ignore[attr-defined]


def test_reps_moves_flows_between_the_planes_of_their_nics() -> None:
    from fabricscope.fabric.builders import multi_plane_fabric
    from fabricscope.sim.faults import Fault
    from fabricscope.sim.transport import simulate_transport

    fab = multi_plane_fabric(16, planes=2, gpus_per_server=1, nic_gbps=200, radix=16)
    leaf0 = fab.leaves_of_nic["host0000/nic0"][0]  # a plane-0 leaf
    w = permutation(fab, 4e6, seed=1)
    ups = [f"{lk.a}|{lk.b}" for lk in fab.links if lk.a.startswith(leaf0 + ":") and "spine" in lk.b]
    slow = [Fault("link-degraded", u, params={"factor": 0.25}) for u in ups]
    cfg = TransportConfig(cc="nscc")
    obl = simulate_transport(fab, w, config=cfg, lb="oblivious:paths=32", faults=slow, seed=1)
    reps = simulate_transport(fab, w, config=cfg, lb="reps:paths=32", faults=slow, seed=1)
    edges = [fab.edge_index(u.replace("|", "->")) for u in ups]
    on_slow = [float(r.stats.served_bytes[edges].sum()) for r in (obl, reps)]
    # the flows of that leaf move bytes to their NICs' other plane: fewer on the slow links,
    # and the slowest flow ends sooner
    assert on_slow[1] < 0.9 * on_slow[0]
    assert np.nanmax(reps.sim.fct_ns) < 0.7 * np.nanmax(obl.sim.fct_ns)
