"""Optic faults in the live twin: each mode's DOM signature at both ends, the RS(544,514) frame-loss
cliff, and the same loss in the twin's counters and in its probe transport."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple
from fabricscope.service.gnmi_twin import parse_fault
from fabricscope.service.supervise_twin import parse_twin_fault
from fabricscope.sim.clock import SimClock
from fabricscope.sim.faults import OPTIC_MODES, Fault, FaultSchedule, optic_mode, param_value
from fabricscope.twin import optics_fleet
from fabricscope.twin import optics_physics as op
from fabricscope.twin.probe_transport import ProbeTransport
from fabricscope.twin.state import NS, Twin, TwinConfig, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
PORT = "leaf-000:eth3"
PEER = "spine-00:eth1"
INTO_PEER = f"{PORT}->{PEER}"
INTO_PORT = f"{PEER}->{PORT}"
DAY = 86_400.0  # accel that makes one simulated second one day
JITTER_DB = 0.02  # the twin's rx jitter sd (temperature: 5x the same draw)


def _twin(faults: list[Fault], *, seed: int = 3, noise: float = 0.01) -> tuple[Twin, SimClock]:
    clock = SimClock()
    tw = Twin(FAB, clock=clock, faults=FaultSchedule.of(faults),
              load_bps=background_load(FAB, utilization=0.3, seed=1), rng=seed,
              config=TwinConfig(noise=noise))
    return tw, clock


def _to(tw: Twin, clock: SimClock, t_s: float, step_s: float = 1.0) -> None:
    while clock.now_ns() < round(t_s * NS):
        clock.advance(min(int(step_s * NS), round(t_s * NS) - clock.now_ns()))
        tw.sync()


def _dom(tw: Twin, port: str) -> dict[str, np.ndarray]:
    row = tw.port_row[port]
    return {k: tw.field(k)[row].copy() for k in
            ("temperature_c", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm", "pre_fec_ber")}


def _base(tw: Twin, port: str) -> dict[str, np.ndarray]:
    row = tw.port_row[port]
    return {k: v[row].copy() for k, v in tw._optic_base.items()}


def _fault(mode: str, rate: float, *, start_s: float = 0.0, **kw: float) -> Fault:
    return Fault("optic-degrading", PORT, int(start_s * NS), None,
                 {"mode": float(OPTIC_MODES[mode]), "rate": rate, "accel": DAY, **kw})


# ------------------------------------------------------------------ the FEC cliff, by hand
def _tail(p: float, n: int = 544, t: int = 15) -> float:
    """P(X > t), X ~ Bin(n, p), summed term by term with exact binomial coefficients."""
    return math.fsum(math.comb(n, k) * p**k * (1.0 - p) ** (n - k) for k in range(t + 1, n + 1))


_K = np.arange(16, 545)
_LOG_COMB = np.array([math.log(math.comb(544, int(k))) for k in _K])


def _tail_many(p: np.ndarray) -> np.ndarray:
    """:func:`_tail` for many ``p`` at once (the same sum, in logs of the exact coefficients)."""
    lp = np.log(p)[:, None]
    lq = np.log1p(-p)[:, None]
    terms = np.exp(_LOG_COMB[None, :] + _K[None, :] * lp + (544 - _K)[None, :] * lq)
    return np.asarray(terms.sum(axis=1))


def _hand_ber(rx_dbm: float, floor: float = 1e-8, sens: float = -11.0) -> float:
    q = op.Q_LIMIT * 10 ** ((rx_dbm - sens) / 10)
    return min(floor + 0.5 * math.erfc(q / math.sqrt(2)), 0.5)


def _hand_frame_loss(ber: float, frame_bytes: int) -> float:
    cw = math.ceil(frame_bytes * 8 / 5140)
    ps = 1 - (1 - ber) ** 10
    return 1 - (1 - _tail(ps)) ** cw


def _hand_frame_loss_many(ber: np.ndarray, frame_bytes: int) -> np.ndarray:
    cw = math.ceil(frame_bytes * 8 / 5140)
    ps = 1 - (1 - ber) ** 10
    return np.asarray(1 - (1 - _tail_many(ps)) ** cw)


@pytest.mark.parametrize("ber", [5e-4, 1.5e-3])
def test_codeword_and_frame_loss_match_a_hand_binomial_tail(ber: float) -> None:
    ps = 1 - (1 - ber) ** 10
    assert float(op.symbol_error_prob(ber)) == pytest.approx(ps, rel=1e-12)
    assert float(op.codeword_error_prob(ber)) == pytest.approx(_tail(ps), rel=1e-8)
    for size in (94, 4096):
        assert float(op.frame_loss(ber, frame_bytes=size)) == pytest.approx(
            _hand_frame_loss(ber, size), rel=1e-8)
        assert float(_hand_frame_loss_many(np.array([ber]), size)[0]) == pytest.approx(
            _hand_frame_loss(ber, size), rel=1e-8)


def test_the_cliff() -> None:
    assert [op.codewords_per_frame(b) for b in (64, 642, 643, 4096, 9000)] == [1, 1, 2, 7, 15]
    fl = {b: float(op.frame_loss(b, frame_bytes=4096)) for b in (2.4e-4, 5e-4, 1e-3, 2e-3, 3e-3)}
    assert fl[2.4e-4] < 1e-10  # at the KP4 limit: codeword error ~8e-13
    assert fl[5e-4] < 1e-6
    assert 1e-4 < fl[1e-3] < 1e-2
    assert fl[2e-3] > 0.3 and fl[3e-3] > 0.99
    # the fleet generator grades on the same limit and Q scale
    assert op.KP4_BER_LIMIT == optics_fleet.KP4_BER_LIMIT
    assert math.isclose(op.Q_LIMIT, optics_fleet._Q_LIMIT, rel_tol=1e-9)
    assert float(op.pre_fec_ber(op.SENSITIVITY_DBM, floor=0.0)) == pytest.approx(2.4e-4, rel=1e-9)


# ------------------------------------------------------------------ DOM signatures
def test_dirty_connector_dims_the_peer_and_half_this_end_tx_and_bias_normal() -> None:
    tw, clock = _twin([_fault("dirty-connector", 1.0)])  # 1 dB/day x 86400: 1 dB per second
    _to(tw, clock, 4.0)
    here, there = _dom(tw, PORT), _dom(tw, PEER)
    b_here, b_there = _base(tw, PORT), _base(tw, PEER)
    tol = 5 * JITTER_DB
    np.testing.assert_allclose(b_there["rx_power_dbm"] - there["rx_power_dbm"], 4.0, atol=tol)
    np.testing.assert_allclose(b_here["rx_power_dbm"] - here["rx_power_dbm"], 2.0, atol=tol)
    for d, b in ((here, b_here), (there, b_there)):
        np.testing.assert_allclose(d["tx_power_dbm"], b["tx_power_dbm"], atol=1e-12)
        np.testing.assert_allclose(d["tx_bias_ma"], b["tx_bias_ma"], atol=1e-12)
        np.testing.assert_allclose(d["temperature_c"], b["temperature_c"], atol=5 * 5 * JITTER_DB)
    # 5.5 dB of margin left at the peer: BER still near its floor (< 1e-6)
    assert there["pre_fec_ber"].max() < 1e-6


def test_aging_laser_raises_bias_first_then_tx_fades_and_the_peer_rx_follows() -> None:
    tw, clock = _twin([_fault("aging-laser", 1.0, lane=2)])  # threshold +1 mA per second
    base, pbase = _base(tw, PORT), _base(tw, PEER)
    first_bias = first_tx = None
    for t in range(1, 11):
        _to(tw, clock, float(t))
        d = _dom(tw, PORT)
        bias_up = d["tx_bias_ma"][2] - base["tx_bias_ma"][2]
        tx_down = base["tx_power_dbm"][2] - d["tx_power_dbm"][2]
        if first_bias is None and bias_up > 0.5:
            first_bias = t
        if first_tx is None and tx_down > 0.5:
            first_tx = t
            # APC: power fades only once the bias sits at the driver's clamp
            assert d["tx_bias_ma"][2] - base["tx_bias_ma"][2] == pytest.approx(
                op.BIAS_CLAMP_MA - op.NOMINAL_BIAS_MA)
        for lane in (0, 1, 3):  # the other lasers are untouched
            assert d["tx_bias_ma"][lane] == base["tx_bias_ma"][lane]
    assert first_bias is not None and first_tx is not None and first_bias < first_tx
    # at t = 8: I_th = 1 + 8 = 9 mA, clamp 12, P_set/eta = 6: tx = 10 log10(3/6) = -3.01 dB
    tw, clock = _twin([_fault("aging-laser", 1.0, lane=2)])
    _to(tw, clock, 8.0)
    d, p = _dom(tw, PORT), _dom(tw, PEER)
    drop = base["tx_power_dbm"][2] - d["tx_power_dbm"][2]
    assert drop == pytest.approx(10 * math.log10(2), abs=1e-9)
    assert pbase["rx_power_dbm"][2] - p["rx_power_dbm"][2] == pytest.approx(
        10 * math.log10(2), abs=5 * JITTER_DB)
    np.testing.assert_allclose(p["rx_power_dbm"][[0, 1, 3]], pbase["rx_power_dbm"][[0, 1, 3]],
                               atol=5 * JITTER_DB)
    # near sensitivity the peer's BER climbs: at t = 10.3, tx = 10 log10(0.7 / 6) = -9.33 dB
    # leaves the peer 0.17 dB above its sensitivity
    tw, clock = _twin([_fault("aging-laser", 1.0, lane=2)])
    _to(tw, clock, 10.3, step_s=0.1)
    ber = _dom(tw, PEER)["pre_fec_ber"]
    rx_true = op.NOMINAL_RX_DBM + 10 * math.log10((op.BIAS_CLAMP_MA - 1.0 - 10.3) / 6.0)
    expected = pbase["pre_fec_ber"][2] + _hand_ber(rx_true, floor=0.0)
    assert ber[2] == pytest.approx(expected, rel=1e-6)
    assert ber[2] > 1e-4 and ber[[0, 1, 3]].max() < 1e-6


def test_bent_fiber_dims_both_ends_with_a_temperature_correlated_wander() -> None:
    accel = DAY / 10  # one simulated day per 10 s: the swing is sampled 20 times a cycle
    f = Fault("optic-degrading", PORT, 0, None, {"mode": 3.0, "rate": 1.0, "accel": accel})
    tw, clock = _twin([f])
    b_here, b_there = _base(tw, PORT), _base(tw, PEER)
    rx_dev: dict[str, list[float]] = {PORT: [], PEER: []}
    t_dev: dict[str, list[float]] = {PORT: [], PEER: []}
    for k in range(20, 81):  # days 1..4: past one unit the wander is at full swing
        _to(tw, clock, k * 0.5, step_s=0.5)
        days = k * 0.5 / 10
        for port, b in ((PORT, b_here), (PEER, b_there)):
            d = _dom(tw, port)
            rx_dev[port].append(float(np.mean(d["rx_power_dbm"] - b["rx_power_dbm"])) + days)
            t_dev[port].append(float(np.mean(d["temperature_c"] - b["temperature_c"])))
    for port in (PORT, PEER):
        x, y = np.array(t_dev[port]), np.array(rx_dev[port])
        slope = np.polyfit(x, y, 1)[0]
        # rx wanders -0.15 dB per degC of the cable's 2 degC swing; lane-mean jitter (sd 0.01 dB,
        # shared 5x with temperature) shifts the fit by < 0.005 and its sd is ~0.001
        assert slope == pytest.approx(-op.BEND_DB_PER_C, abs=0.01)
        assert np.corrcoef(x, y)[0, 1] < -0.99
        assert abs(float(np.mean(y))) < 0.05  # the trend: rx down 1 dB per day at both ends
        assert 1.5 < x.max() < 2.5 and -2.5 < x.min() < -1.5


def test_hot_module_heats_raises_bias_with_it_and_dims_tx_slightly() -> None:
    tw, clock = _twin([_fault("hot-module", 1.0)])  # 3 degC per second
    _to(tw, clock, 4.0)
    d, b = _dom(tw, PORT), _base(tw, PORT)
    p, pb = _dom(tw, PEER), _base(tw, PEER)
    np.testing.assert_allclose(d["temperature_c"] - b["temperature_c"], 12.0, atol=0.5)
    # APC: I_th(T) = 1 mA exp(dT / 60 K): +0.221 mA on every lane; tx -0.01 dB/degC
    np.testing.assert_allclose(d["tx_bias_ma"] - b["tx_bias_ma"], math.expm1(12 / 60), rtol=1e-9)
    np.testing.assert_allclose(b["tx_power_dbm"] - d["tx_power_dbm"], 0.12, atol=1e-9)
    np.testing.assert_allclose(p["temperature_c"], pb["temperature_c"], atol=0.5)
    np.testing.assert_allclose(p["tx_bias_ma"], pb["tx_bias_ma"], atol=1e-12)
    np.testing.assert_allclose(pb["rx_power_dbm"] - p["rx_power_dbm"], 0.12, atol=5 * JITTER_DB)


def test_generic_mode_is_the_historical_drift_and_touches_no_counter_or_probe() -> None:
    old = Fault("optic-degrading", PORT, 0, None, {"rate": 1.0, "accel": DAY})
    new = Fault("optic-degrading", PORT, 0, None, {"rate": 1.0, "accel": DAY, "mode": 0.0})
    a, ca = _twin([old])
    b, cb = _twin([new])
    c, cc = _twin([])
    for tw, clock in ((a, ca), (b, cb), (c, cc)):
        _to(tw, clock, 12.0)
    for name in ("in_pkts", "in_fcs", "in_errors", "out_pkts", "rx_power_dbm", "pre_fec_ber",
                 "tx_bias_ma", "temperature_c"):
        np.testing.assert_array_equal(a.field(name), b.field(name))
    for name in ("in_pkts", "in_fcs", "in_errors"):  # 12 dB of generic drift: no frame lost
        np.testing.assert_array_equal(a.field(name), c.field(name))
    row = a.port_row[PORT]
    assert a.field("rx_power_dbm")[row].mean() < c.field("rx_power_dbm")[row].mean() - 11
    flows = [("host0000/nic0", "host0002/nic0", FiveTuple("x", "y", 4000 + i, 4791, 17))
             for i in range(32)]
    t = np.arange(2048, dtype=np.int64) * 5_000_000
    batches = []
    for faults in ([old], []):
        tr = ProbeTransport(FAB, faults=FaultSchedule.of(faults), seed=5)
        j = tr.register(flows)
        batches.append(tr.carry(np.tile(j, len(t) // len(j)), t))
    np.testing.assert_array_equal(batches[0].t_recv_ns, batches[1].t_recv_ns)


# ------------------------------------------------------------------ counters and probes agree
RATE = 0.02  # dB/day x 86400: 0.02 dB of connector loss per second


def _connector_fl(t_s: np.ndarray, frame_bytes: int) -> np.ndarray:
    """Hand-computed loss of frames into the peer of a connector dirtying RATE dB per second."""
    ber = np.array([_hand_ber(op.NOMINAL_RX_DBM - RATE * t) for t in t_s])
    return _hand_frame_loss_many(ber, frame_bytes)


def test_crc_errors_are_the_carried_frames_times_the_frame_loss() -> None:
    t0, t1 = 495.0, 515.0  # peer rx margin 9.5 - (9.9 .. 10.3) dB: on the cliff
    tw, clock = _twin([_fault("dirty-connector", RATE)])
    _to(tw, clock, t0)
    e_in, e_back = FAB.edge_index(INTO_PEER), FAB.edge_index(INTO_PORT)
    before = {k: tw.field(k).copy() for k in ("out_pkts", "in_pkts", "in_fcs", "in_errors")}
    _to(tw, clock, t1)
    inc = {k: tw.field(k) - v for k, v in before.items()}
    # expected: the time-average of the hand-computed loss of 4,096-byte frames
    grid = np.linspace(t0, t1, 2001)
    fl = _connector_fl(grid, 4096)
    expected = float(np.trapezoid(fl, grid) / (t1 - t0))
    assert 1e-3 < expected < 0.5
    # tolerance: the per-step load noise N(1, 0.01) weights the 20 one-second steps' losses
    # phi_i unevenly: the weighted mean moves by sum(eps_i (phi_i - mean)) / 20, sd
    # 0.01 sqrt(sum (phi_i - mean)^2) / 20 (5 sd); plus the midpoint rule's error over the
    # twin's 0.25 s sub-steps, at most h^2/24 max|f''| per unit time
    phi = np.array([fl[100 * i: 100 * i + 101].mean() for i in range(20)])
    sd = 0.01 * math.sqrt(float(((phi - phi.mean()) ** 2).sum())) / 20
    h = 0.25
    d2 = np.abs(np.gradient(np.gradient(fl, grid), grid)).max()
    tol = 5 * sd + h * h / 24 * d2
    ratio = float(inc["in_fcs"][e_in] / inc["out_pkts"][e_in])
    assert abs(ratio - expected) < tol, (ratio, expected, tol)
    assert inc["in_errors"][e_in] == pytest.approx(inc["in_fcs"][e_in], rel=1e-12)
    arrived = inc["out_pkts"][e_in] - inc["in_fcs"][e_in]
    assert inc["in_pkts"][e_in] == pytest.approx(arrived, rel=1e-12)
    # the other direction keeps 9.5 - 5 dB of margin, every other link is clean
    assert inc["in_fcs"][e_back] < 1e-9 * inc["out_pkts"][e_back]
    others = np.ones(FAB.index.n_edges, dtype=bool)
    others[[e_in, e_back]] = False
    assert not inc["in_fcs"][others].any()
    # served on the peer's interface as FCS and CRC errors
    lv = [lf for lf in tw.leaves("spine-00") if lf.path.endswith(
        ("interface[name=eth1]/state/counters/in-fcs-errors",
         "interface[name=eth1]/ethernet/state/counters/in-crc-errors"))]
    assert len(lv) == 2 and tw.read(lv) == [int(tw.field("in_fcs")[e_in])] * 2


def test_probe_loss_across_the_degraded_link_is_the_same_physics() -> None:
    tr = ProbeTransport(FAB, faults=FaultSchedule.of([_fault("dirty-connector", RATE)]), seed=11)
    flows = [(s, d, FiveTuple("x", "y", 1024 + i, 4791, 17))
             for i in range(64) for s, d in (("host0000/nic0", "host0002/nic0"),
                                             ("host0001/nic0", "host0003/nic0"))]
    j = tr.register(flows)
    e_in = FAB.edge_index(INTO_PEER)
    crossing = np.array([e_in in tr.path_edges(int(k))[0] for k in j])
    assert 0 < crossing.sum() < len(j)  # ECMP: some flows take spine-00, some spine-01
    n = 40_000
    rng = np.random.default_rng(2)
    t_send = np.sort(rng.uniform(515.0, 530.0, n))  # peer margin -0.8 .. -1.1 dB: 1 codeword lost
    flow = rng.choice(j, n)
    b = tr.carry(flow, (t_send * NS).astype(np.int64))
    on = crossing[np.searchsorted(j, flow)]
    p = _connector_fl(t_send[on], tr.probe_frame_bytes)
    assert 0.02 < p.mean() < 0.8
    lost = int((~b.req_arrived[on]).sum())
    sd = math.sqrt(float((p * (1 - p)).sum()))
    assert abs(lost - p.sum()) < 5 * sd, (lost, p.sum(), sd)
    assert b.req_arrived[~on].all()  # probes on the other spine never meet the optic
    # replies cross into this port, where the loss is half as deep: nothing lost there
    back = on & b.req_arrived
    assert (b.t_recv_ns[back] >= 0).all()


# ------------------------------------------------------------------ parsing
def test_mode_names_and_codes_both_parse() -> None:
    f = parse_twin_fault(f"optic-degrading:{PORT}@10s,mode=aging-laser,rate=2", FAB)
    assert f.params["mode"] == 1.0 and f.params["rate"] == 2.0 and optic_mode(f) == "aging-laser"
    assert parse_twin_fault(f"optic-degrading:{PORT},mode=2", FAB).params["mode"] == 2.0
    g = parse_fault(f"optic-degrading {PORT} start=1s mode=bent-fiber accel=6000")
    assert optic_mode(g) == "bent-fiber" and g.params == {"mode": 3.0, "accel": 6000.0}
    assert parse_fault(f"optic-degrading {PORT} mode=4").params["mode"] == 4.0
    assert optic_mode(Fault("optic-degrading", PORT)) == "generic"
    assert param_value("gray-loss", "loss", "0.02", source="x") == 0.02
    # the parsed fault drives the twin
    tw, _ = _twin([Fault(f.kind, f.subject, 0, None, dict(f.params))])
    assert tw.faults.faults[0].params["mode"] == 1.0


@pytest.mark.parametrize("text", [f"optic-degrading:{PORT},mode=aging",
                                  f"optic-degrading:{PORT},mode=7"])
def test_a_bad_mode_is_a_one_line_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_twin_fault(text, FAB)
    msg = str(ei.value)
    assert "\n" not in msg and "mode" in msg and text.rsplit("=", 1)[1] in msg
    assert all(name in msg for name in OPTIC_MODES)
    with pytest.raises(ConfigError, match="mode"):
        parse_fault(f"optic-degrading {PORT} mode=dirty")
    with pytest.raises(ConfigError, match="mode"):
        _twin([Fault("optic-degrading", PORT, 0, None, {"mode": 9.0})])
    with pytest.raises(ConfigError, match="lane"):
        _twin([_fault("aging-laser", 1.0, lane=4)])
    with pytest.raises(ConfigError, match="mode"):
        ProbeTransport(FAB, faults=FaultSchedule.of([Fault("optic-degrading", PORT, 0, None,
                                                           {"mode": 1.5})]))


def test_probe_instrument_passes_optic_modes_that_lose_frames() -> None:
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.model.errors import ConfigError
    from fabricscope.service.probe_twin import parse_probe_fault, probe_visible
    from fabricscope.sim.faults import Fault

    port = "leaf-p0-r2-00:eth1"
    assert probe_visible(Fault("optic-degrading", port, params={"mode": 2.0}))
    assert not probe_visible(Fault("optic-degrading", port))  # generic: readings only
    fab = rail_optimized_fabric(8)
    f = parse_probe_fault(f"optic-degrading:{port},mode=dirty-connector", fab)
    assert f.params["mode"] == 2.0
    with pytest.raises(ConfigError, match="not visible to probes"):
        parse_probe_fault(f"optic-degrading:{port}", fab)
