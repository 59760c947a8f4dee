"""Link-pair attribution (predict.pair_attribution): which end of a link is the cause."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.optics.features import DAY_NS, lane_features
from fabricscope.optics.history import METRICS, FleetHistory, module_table, sort_rows
from fabricscope.optics.predict import (
    PAIR_EXPLAINED_RISK,
    default_model,
    model_inputs,
    pair_attribution,
    peer_rows,
    predict_fleet,
)

_T0 = 1_735_689_600 * 10**9
_DAYS = 9
_PEERS = {"leaf-1:Ethernet0": "spine-1:Ethernet0", "spine-1:Ethernet0": "leaf-1:Ethernet0"}
_TH = {f"{m}_{k}": v for m, vals in {
    "temperature_c": (75, 70, 0, -5), "vcc_v": (3.63, 3.465, 3.135, 2.97),
    "tx_bias_ma": (13, 12, 2, 1), "tx_power_dbm": (5, 3, -7.5, -10.5),
    "rx_power_dbm": (3.4, 2.4, -9.5, -13.5)}.items()
    for k, v in zip(("high_alarm", "high_warn", "low_warn", "low_alarm"), vals, strict=True)}


def _link(*, tx_fall_a: float = 0.0, loss_ab: float = 0.0, loss_ba: float = 0.0,
          seed: int = 3) -> FleetHistory:
    """Two 1-lane modules cabled to each other (A = leaf-1:Ethernet0, B = spine-1:Ethernet0),
    600 s samples for 9 days; over the last 4 days A's transmit power falls ``tx_fall_a`` dB
    (its bias rising 40 % first, the APC loop, if it falls at all), the A -> B direction (B's receive side) gains
    ``loss_ab`` dB of loss and the B -> A direction (A's receive side) ``loss_ba`` dB.
    Received power = far transmit power - link loss (5 dB at the start)."""
    rng = np.random.default_rng(seed)
    n = _DAYS * 144
    t = _T0 + np.arange(n, dtype=np.int64) * 600 * 10**9
    ramp = np.clip(((t - t[0]) / DAY_NS - (_DAYS - 4)) / 4, 0.0, 1.0)
    tx = {0: 1.0 - tx_fall_a * ramp, 1: np.full(n, 1.0)}
    aging = 0.4 if tx_fall_a > 0 else 0.0
    bias = {0: 7.0 * (1 + aging * np.minimum(ramp * 2, 1.0)), 1: np.full(n, 7.0)}
    rx = {0: tx[1] - 5.0 - loss_ba * ramp, 1: tx[0] - 5.0 - loss_ab * ramp}
    cols: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for mod in (0, 1):
        val = {"temperature_c": np.full(n, 40.0), "vcc_v": np.full(n, 3.3),
               "tx_bias_ma": bias[mod], "tx_power_dbm": tx[mod], "rx_power_dbm": rx[mod]}
        for m in METRICS:
            cols[m].append(val[m] + rng.normal(0, 0.02, n))
    ts = np.concatenate([t, t])
    module = np.repeat(np.array([0, 1], dtype=np.int32), n)
    lane = np.zeros(2 * n, dtype=np.int32)
    rows = [{"device": d, "port": "Ethernet0", "vendor": "Acme", "part_number": "P-DR4",
             "serial": f"S{i}", "media": "400GBASE-DR4", **_TH}
            for i, d in enumerate(("leaf-1", "spine-1"))]
    ts, module, lane, met = sort_rows(ts, module, lane,
                                      {m: np.concatenate(v) for m, v in cols.items()})
    return FleetHistory(ts=ts, module=module, lane=lane, metrics=met,
                        modules=module_table(rows, lanes=[1, 1]))


def _attribute(h: FleetHistory, risk: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """pair_attribution of ``risk`` (A, B) with the columns computed from ``h`` at its end."""
    at = _T0 + _DAYS * DAY_NS
    mf, cols = model_inputs(lane_features(h, at_ns=at, peers=_PEERS), None, _PEERS)
    assert mf.module.tolist() == [0, 1]
    prow = peer_rows(mf, _PEERS)
    assert prow.tolist() == [1, 0]
    return pair_attribution(np.array(risk), cols, prow)


def test_far_laser_fading_explains_the_near_receiver() -> None:
    # A's laser fades 3 dB: B receives 3 dB less through a link that lost nothing
    r, ex = _attribute(_link(tx_fall_a=3.0), (0.9, 0.8))
    assert ex.tolist() == [False, True]
    assert r[0] == 0.9 and r[1] == PAIR_EXPLAINED_RISK


def test_two_way_loss_blames_the_end_that_lost_more() -> None:
    # a dirty mating pair: B's receive side lost 4 dB, A's 2 dB: B fails first, A is explained
    r, ex = _attribute(_link(loss_ab=4.0, loss_ba=2.0), (0.8, 0.9))
    assert ex.tolist() == [True, False]
    assert r[0] == PAIR_EXPLAINED_RISK and r[1] == 0.9
    # equal risks: still the end with the smaller loss is explained
    _, ex = _attribute(_link(loss_ab=4.0, loss_ba=2.0), (0.9, 0.9))
    assert ex.tolist() == [True, False]
    # the far end scored lower than this end: the model's own view wins, nothing changes
    r, ex = _attribute(_link(loss_ab=4.0, loss_ba=2.0), (0.9, 0.3))
    assert not ex.any() and r.tolist() == [0.9, 0.3]


def test_near_end_failing_far_end_healthy_is_kept() -> None:
    # only B's receive direction loses light (a bent fiber, a connector on B's side): B is
    # the failing end and keeps its risk; A has nothing to explain
    r, ex = _attribute(_link(loss_ab=4.0), (0.2, 0.9))
    assert not ex.any()
    assert r.tolist() == [0.2, 0.9]


def test_own_laser_evidence_is_never_explained_away() -> None:
    # A's laser fades and B's receive side also gained loss: B's drop is not only the far
    # laser (loss 3 dB > half of the 3 dB fall), and A (its own bias drifting) is kept
    r, ex = _attribute(_link(tx_fall_a=3.0, loss_ab=3.0), (0.9, 0.9))
    assert not ex.any()
    assert r.tolist() == [0.9, 0.9]


def test_without_cabling_nothing_changes() -> None:
    h = _link(tx_fall_a=3.0)
    at = _T0 + _DAYS * DAY_NS
    mf, cols = model_inputs(lane_features(h, at_ns=at), None, None)
    prow = peer_rows(mf, None)
    assert prow.tolist() == [-1, -1]
    r, ex = pair_attribution(np.array([0.9, 0.9]), cols, prow)
    assert not ex.any() and r.tolist() == [0.9, 0.9]


@pytest.mark.parametrize(("case", "explained"), [
    ({"tx_fall_a": 5.0}, False),  # the receiver's risk is already below the explained risk
    ({"loss_ab": 8.0, "loss_ba": 6.0}, True),  # A (0.30 here) is explained by B's side
    ({"loss_ab": 4.0}, False)])
def test_predict_fleet_applies_the_attribution(case: dict[str, float], explained: bool
                                               ) -> None:
    h = _link(**case)
    at = _T0 + _DAYS * DAY_NS
    on = predict_fleet(h, default_model(), at_ns=at, peers=_PEERS)
    off = predict_fleet(h, default_model(), at_ns=at, peers=_PEERS, attribute_pairs=False)
    raw = np.array([m.risk for m in off.modules], dtype=np.float64)
    mf, cols = model_inputs(lane_features(h, at_ns=at, peers=_PEERS), None, _PEERS)
    want, ex = pair_attribution(raw, cols, peer_rows(mf, _PEERS))
    assert [m.risk for m in on.modules] == want.tolist()
    assert bool(ex.any()) == explained
    thr = default_model().threshold
    for a, b, e in zip(on.modules, off.modules, ex.tolist(), strict=True):
        assert ("link.far_end_cause" in [x["code"] for x in a.reasons]) == e
        assert "link.far_end_cause" not in [x["code"] for x in b.reasons]
        assert a.predicted_failure == (a.risk is not None and a.risk >= thr)
