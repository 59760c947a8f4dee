"""NSCC (UEC sender CC) in the fluid transport engine and oblivious spraying over N entropies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate
from fabricscope.sim.flows import FlowSpec, Workload
from fabricscope.sim.loadbalance import PathFinder, check_scheme, oblivious_paths, route_flows
from fabricscope.sim.transport import (
    TransportConfig,
    simulate_transport,
    transport_config_from_flags,
)
from fabricscope.sim.transport import nscc as NS
from fabricscope.sim.workload.traffic import permutation

_FAB = leaf_spine_fabric(leaves=4, hosts_per_leaf=4, spines=4)
_NICS = [n.id for n in _FAB.nics]


# ------------------------------------------------------------------ oblivious spraying
@pytest.mark.parametrize("bad", ["oblivious", "oblivious:paths=0", "oblivious:paths=x", "oblivious:n=4",
                                 "oblivious:paths=70000"])
def test_bad_oblivious_names_are_clear_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"lb: .*oblivious"):
        check_scheme(bad)


def test_oblivious_name_round_trips() -> None:
    assert check_scheme("oblivious:paths=128") == "oblivious:paths=128"
    assert oblivious_paths("oblivious:paths=128") == 128


def _routes(fab, lb: str, seed: int = 0):  # type: ignore[no-untyped-def]
    from fabricscope.fabric.routing import Routing

    ix = fab.index
    w = permutation(fab, 1e6, seed=seed)
    src = np.array([ix.node_of[f.src] for f in w.flows], dtype=np.int64)
    dst = np.array([ix.node_of[f.dst] for f in w.flows], dtype=np.int64)
    sport = np.arange(src.shape[0], dtype=np.int64) + 49152
    return route_flows(PathFinder(Routing(fab)), check_scheme(lb), src, dst, sport,
                       rng=np.random.default_rng(seed)), src, dst


def _uplink_shares(fab, tab, src):  # type: ignore[no-untyped-def]
    """Per flow, the share of its bytes on each leaf -> spine link (inter-leaf flows only)."""
    ix = fab.index
    out = []
    for i in range(tab.n_flows):
        e, w = tab.row(i)
        up = [(int(x), float(y)) for x, y in zip(e, w, strict=True) if ix.tier[ix.dst[x]] > ix.tier[ix.src[x]]
              and ix.is_switch[ix.src[x]]]
        if up:
            out.append([y for _, y in up])
    return out


def test_oblivious_one_entropy_is_one_path_and_n_entropies_collide() -> None:
    fab = leaf_spine_fabric(leaves=16, hosts_per_leaf=8, spines=8)
    one, src, _ = _routes(fab, "oblivious:paths=1")
    assert not one.unroutable.any()
    assert np.all(one.weights == 1.0)
    n = 64
    tab, src, _ = _routes(fab, f"oblivious:paths={n}")
    shares = _uplink_shares(fab, tab, src)
    # every inter-leaf flow puts all of its bytes on uplinks, in multiples of 1/N
    for s in shares:
        assert sum(s) == pytest.approx(1.0)
        assert all(abs(x * n - round(x * n)) < 1e-9 for x in s)
    # Collisions: the share of a spine is Binomial(N, 1/8)/N, variance p(1-p)/N. Over
    # m = 8 x (flows) shares the sample variance has relative sd ~ sqrt(2 / m) (plus excess
    # kurtosis, small here); 5 of those is the tolerance.
    full = np.array([s + [0.0] * (8 - len(s)) for s in shares])
    var = float(((full - 1 / 8) ** 2).mean())
    want = (1 / 8) * (7 / 8) / n
    m = full.size
    assert var == pytest.approx(want, rel=5 * math.sqrt(2 / m) + 0.02)
    # the perfectly even split of ``spray`` has none of it
    even, _, _ = _routes(fab, "spray")
    assert all(np.allclose(s, 1 / 8) for s in _uplink_shares(fab, even, src))


def test_oblivious_is_deterministic_per_seed_and_changes_with_it() -> None:
    a, _, _ = _routes(_FAB, "oblivious:paths=16", seed=3)
    b, _, _ = _routes(_FAB, "oblivious:paths=16", seed=3)
    c, _, _ = _routes(_FAB, "oblivious:paths=16", seed=4)
    assert np.array_equal(a.edges, b.edges) and np.array_equal(a.weights, b.weights)
    assert not (a.edges.shape == c.edges.shape and np.array_equal(a.weights, c.weights)
                and np.array_equal(a.edges, c.edges))


def test_oblivious_many_entropies_approach_spray_in_the_ideal_engine() -> None:
    fab = leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=8)
    w = permutation(fab, 1e6, seed=0)
    spray = simulate(fab, w, lb="spray").fct_stats_us()
    few = simulate(fab, w, lb="oblivious:paths=4").fct_stats_us()
    many = simulate(fab, w, lb="oblivious:paths=4096").fct_stats_us()
    assert few["max"] > many["max"] >= spray["max"] * (1 - 1e-9)
    assert many["max"] == pytest.approx(spray["max"], rel=0.05)


# ------------------------------------------------------------------ the NSCC law
def _state(w: float = 150e3, t_ns: float = 10_000.0) -> tuple[np.ndarray, np.ndarray]:
    d = NS.derive(NS.NsccConfig(), network_rtt_ns=t_ns, link_bytes_per_ns=12.5, mtu=4096.0)
    st = NS.init_state(np.array([t_ns]), np.array([12.5]), 1.5, 4096.0)
    st[0, NS.NS_W] = w
    st[0, NS.NS_QA_END] = 1e12  # quick adapt out of the way unless a test wants it
    return st, d.params


def test_derived_parameters_follow_the_spec_scaling() -> None:
    d = NS.derive(NS.NsccConfig(), network_rtt_ns=12_000.0, link_bytes_per_ns=12.5, mtu=4096.0)
    # at the reference network (100G x 12 us) a = 1, b = t_q / 12 us = 0.75 with trimming
    assert d.target_qdelay_ns == pytest.approx(9000.0)
    assert d.params[NS.NP_FI] == pytest.approx(5 * 4096)
    assert d.params[NS.NP_ETA] == pytest.approx(0.15 * 4096)
    assert d.params[NS.NP_A] == pytest.approx(4 * 4096 * 0.75)
    bdp_pk = math.ceil(150e3 / 4096)
    assert d.kmin_bytes == math.ceil(0.2 * bdp_pk) * 4096 and d.kmax_bytes == math.ceil(0.8 * bdp_pk) * 4096
    assert d.port_cap_bytes == bdp_pk * 4096
    no_trim = NS.derive(NS.NsccConfig(trimming=False), network_rtt_ns=12_000.0, link_bytes_per_ns=12.5, mtu=4096.0)
    assert no_trim.target_qdelay_ns == pytest.approx(12_000.0) and no_trim.port_cap_bytes == 5 * d.port_cap_bytes


def test_marked_and_delayed_acks_cut_the_window_once_per_rtt() -> None:
    st, p = _state()
    tq = p[NS.NP_TQ]
    st[0, NS.NS_AVG] = 2 * tq
    w0 = st[0, NS.NS_W]
    NS.nscc_update(st, 0, 50_000.0, 4096.0, 0.0, 2 * tq, 1.0, 0.0, p)
    avg = st[0, NS.NS_AVG]
    cut = w0 * max(1 - 0.8 * (avg - tq) / avg, 0.5)
    # the same update also runs the once-per-network-RTT additive step (ETA)
    assert st[0, NS.NS_W] == pytest.approx(cut + p[NS.NP_ETA], rel=1e-6)
    w1 = st[0, NS.NS_W]
    NS.nscc_update(st, 0, 51_000.0, 8192.0, 0.0, 2 * tq, 1.0, 0.0, p)  # within one base RTT
    assert st[0, NS.NS_W] == pytest.approx(w1, rel=1e-3)
    NS.nscc_update(st, 0, 70_000.0, 12288.0, 0.0, 2 * tq, 1.0, 0.0, p)
    assert st[0, NS.NS_W] < w1 * 0.9


def test_an_empty_path_grows_the_window_and_marks_at_a_queue_shrink_it() -> None:
    def run(delay: float, mark: float) -> float:
        st, p = _state(w=60e3)
        t, acked = 0.0, 0.0
        for _ in range(400):
            t += 500.0
            acked += 3000.0
            NS.nscc_update(st, 0, t, acked, 0.0, delay * p[NS.NP_TQ], mark, 0.0, p)
        return float(st[0, NS.NS_W])

    st, _ = _state()
    assert run(0.0, 0.0) == pytest.approx(st[0, NS.NS_WMAX])  # fast increase to W_max
    assert run(1.5, 0.0) > 60e3  # delayed but unmarked: fair increase
    assert run(1.5, 1.0) < 30e3  # delayed and marked: multiplicative decrease
    assert run(0.5, 1.0) > 60e3  # marked below target: no decrease


def test_a_nack_removes_its_bytes_and_quick_adapt_resets_to_what_was_acknowledged() -> None:
    st, p = _state(w=100e3)
    NS.nscc_update(st, 0, 1000.0, 0.0, 8192.0, 0.0, 0.0, 0.0, p)
    assert st[0, NS.NS_W] == pytest.approx(100e3 - 8192.0)
    st, p = _state(w=150e3)
    st[0, NS.NS_QA_END] = 0.0
    NS.nscc_update(st, 0, 1000.0, 1000.0, 0.0, 0.0, 0.0, 0.0, p)  # arms the period
    end = st[0, NS.NS_QA_END]
    NS.nscc_update(st, 0, end + 1.0, 9000.0, 0.0, 5 * p[NS.NP_TQ], 1.0, 50e3, p)
    assert st[0, NS.NS_W] == pytest.approx(8000.0)  # the bytes acknowledged in the period
    assert st[0, NS.NS_IGNORE] == pytest.approx(50e3)


# ------------------------------------------------------------------ NSCC in the engine
def test_flags_select_nscc_lossy_with_htsim_ecn() -> None:
    cfg = transport_config_from_flags(cc="nscc")
    assert cfg is not None and cfg.cc == "nscc" and not cfg.pfc.enabled and cfg.nscc.ecn_bdp is not None
    cfg = transport_config_from_flags(cc="nscc", ecn="5KB,200KB,0.01", pfc=True)
    assert cfg is not None and cfg.pfc.enabled and cfg.nscc.ecn_bdp is None
    with pytest.raises(ConfigError, match=r"nscc\.gamma"):
        TransportConfig(cc="nscc", nscc=NS.NsccConfig(gamma=0.0)).validate()


def test_a_lone_nscc_flow_runs_at_line_rate_plus_headers() -> None:
    size = 2_000_000
    w = Workload("lone", (FlowSpec(0, _NICS[0], _NICS[9], size),))
    r = simulate_transport(_FAB, w, config=TransportConfig(cc="nscc"))
    ideal = simulate(_FAB, w)
    wire = size + math.ceil(size / (4096 - 64)) * 64
    extra = (wire - size) * 8 / 100e9 * 1e9
    assert r.sim.fct_ns[0] == pytest.approx(ideal.fct_ns[0] + extra, abs=2 * r.stats.dt_ns)
    assert r.stats.drop_bytes.sum() == 0.0


def test_nscc_incast_is_fair_bounded_and_complete() -> None:
    fab = leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=4)
    nics = [n.id for n in fab.nics]
    n, size = 16, 1e6
    w = Workload("incast", tuple(FlowSpec(i, nics[i + 8], nics[0], size) for i in range(n)))
    r = simulate_transport(fab, w, config=TransportConfig(cc="nscc"))
    f = np.sort(r.sim.fct_ns)
    assert np.isfinite(f).all() and r.unfinished == 0
    ideal_last = n * size * 8 / 100e9 * 1e9
    # the receiver link stays busy (headers and trims cost a little), flows finish together
    assert ideal_last < f[-1] < 1.15 * ideal_last
    assert np.median(f) > 0.9 * f[-1]
    cap = float(r.sim.meta["nscc_network_rtt_us"]) * 1e3 * 12.5
    assert r.stats.max_queue_bytes.max() <= (math.ceil(cap / 4096) + 1) * 4096
