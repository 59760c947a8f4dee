"""The learned optics failure predictor: features series, training, calibration, files, output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.optics.features import DAY_NS, HOUR_NS, feature_series, lane_features
from fabricscope.optics.grade import grade_fleet, single_factor_flags, threshold_alarms
from fabricscope.optics.history import METRICS, FleetHistory, module_table, sort_rows
from fabricscope.optics.predict import (
    NO_FAILURE,
    Model,
    default_model,
    episode_scores,
    eval_times,
    model_inputs,
    predict_fleet,
    train,
    training_examples,
)
from fabricscope.optics.readers.table import Labels
from fabricscope.twin.optics_fleet import Fleet, FleetConfig, generate_fleet

# a small training fleet with more failures than the default (80 of 400 modules), sampled
# every 30 minutes so that 21 days stay cheap
_CFG = FleetConfig(modules=400, days=21, sample_s=1800, fail_fraction=0.2)


def _labels(fleet: Fleet) -> Labels:
    lab = fleet.labels
    return Labels(device=tuple(x.device for x in lab), port=tuple(x.port for x in lab),
                  serial=tuple(x.serial for x in lab),
                  failure_ts=np.array([x.failure_ts_ns for x in lab], dtype=np.int64),
                  cause=tuple(x.cause for x in lab))


@pytest.fixture(scope="module")
def fleet_a() -> Fleet:
    return generate_fleet(_CFG, seed=11)


@pytest.fixture(scope="module")
def fleet_b() -> Fleet:
    return generate_fleet(FleetConfig(modules=300, days=14, sample_s=900, fail_fraction=0.1,
                                      vendor_mix={"Cobalt": 0.6, "Eagle": 0.4}), seed=12)


@pytest.fixture(scope="module")
def model_a(fleet_a: Fleet) -> Model:
    ex = training_examples(fleet_a.history, _labels(fleet_a), peers=fleet_a.peers)
    return train([ex], seed=0)


def test_feature_series_equals_lane_features(fleet_a: Fleet) -> None:
    h = fleet_a.history
    times = eval_times(h)
    assert len(times) == 18  # days 3 .. 20 (the last sample is before day 21)
    series = list(feature_series(h, times, peers=fleet_a.peers))
    for k in (0, 8, 17):
        ref = lane_features(h, at_ns=times[k], peers=fleet_a.peers)
        got = series[k]
        assert got.at_ns == times[k]
        np.testing.assert_array_equal(got.module, ref.module)
        np.testing.assert_array_equal(got.lane, ref.lane)
        assert got.names == ref.names
        for name in ref.names:
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-9, atol=1e-12,
                                       equal_nan=True, err_msg=name)


def test_feature_series_off_hour_falls_back(fleet_a: Fleet) -> None:
    t = eval_times(fleet_a.history)[2] + 17 * 60 * 10**9
    (got,) = feature_series(fleet_a.history, [t])
    ref = lane_features(fleet_a.history, at_ns=t)
    np.testing.assert_allclose(got["rx_power_dbm.level.1d"], ref["rx_power_dbm.level.1d"],
                               equal_nan=True)


def test_training_examples_labels_and_censoring(fleet_a: Fleet) -> None:
    ex = training_examples(fleet_a.history, _labels(fleet_a), peers=fleet_a.peers)
    end = int(fleet_a.history.ts.max())
    assert ex.times.max() + 7 * DAY_NS <= end  # censored times left out
    assert ex.X.shape == (ex.y.shape[0], len(ex.names))
    assert "data.span_hours.max" not in ex.names
    fail = {(t.device, t.port): t.failure_ts_ns for t in fleet_a.truth if t.fails_in_window}
    mods = fleet_a.history.modules
    for g, t, y in zip(ex.groups.tolist(), ex.times.tolist(), ex.y.tolist(), strict=True):
        ft = fail.get((mods.device[g], mods.port[g]))
        assert ft is None or ft > t  # already failed: left out
        assert y == int(ft is not None and ft <= t + 7 * DAY_NS)


def test_episode_scores_hand_made() -> None:
    day = DAY_NS
    times = np.arange(10) * day
    fail = np.array([9 * day + 1, 5 * day, NO_FAILURE, NO_FAILURE, 9 * day], dtype=np.int64)
    flags = np.zeros((10, 5), dtype=bool)
    flags[2:4, 0] = True        # module 0 at day 2 (7 d + 1 ns ahead: false), day 3 (a hit)
    flags[4, 1] = True          # module 1 flagged 1 day ahead: a hit with lead 1 day
    flags[[1, 2, 6], 2] = True  # healthy: two runs of false flags = 2 false positives
    s = episode_scores(times, flags, fail)  # module 3 never flagged, module 4 missed
    assert (s.tp, s.fp, s.fn) == (2, 3, 1)
    assert s.false_flags == 4
    assert sorted(s.lead_days) == pytest.approx([1.0, 6.0 + 1 / day])
    assert s.f1 == pytest.approx(4 / 8)


def test_calibration_monotone_and_bounded(model_a: Model, fleet_b: Fleet) -> None:
    cx, cy = np.asarray(model_a.calibration_x), np.asarray(model_a.calibration_y)
    assert cx.size >= 2 and np.all(np.diff(cx) > 0) and np.all(np.diff(cy) >= 0)
    assert cy.min() >= 0.0 and cy.max() <= 1.0
    raw = np.linspace(-0.5, 1.5, 401)
    r = model_a.calibrate(raw)
    assert np.all(np.diff(r) >= 0) and r.min() >= 0 and r.max() <= 1
    assert 0 < model_a.threshold <= 1


def test_save_load_round_trip(model_a: Model, fleet_b: Fleet, tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    model_a.save(p)
    back = Model.load(p)
    assert back.feature_names == model_a.feature_names
    assert back.threshold == model_a.threshold
    at = eval_times(fleet_b.history)[-1]
    a = predict_fleet(fleet_b.history, model_a, at_ns=at, peers=fleet_b.peers)
    b = predict_fleet(fleet_b.history, back, at_ns=at, peers=fleet_b.peers)
    assert [m.risk for m in a.modules] == [m.risk for m in b.modules]
    assert "pickle" not in p.read_text()[:200]


def test_bad_model_files(model_a: Model, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    cases = {
        "not json {": "not a JSON optics model",
        json.dumps({"hello": 1}): "not a fabricscope optics model",
        json.dumps({**model_a.to_json(), "version": 99}): "version",
        json.dumps({**model_a.to_json(), "lightgbm_model": "tree\nnonsense"}): "lightgbm_model",
        json.dumps({**model_a.to_json(), "feature_names": ["a"]}): "feature_names",
        json.dumps({k: v for k, v in model_a.to_json().items() if k != "threshold"}):
            "threshold",
    }
    for text, what in cases.items():
        bad.write_text(text)
        with pytest.raises(ConfigError, match=what) as err:
            Model.load(bad)
        assert str(bad) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        Model.load(tmp_path / "missing.json")


def _episode_f1(fleet: Fleet, flag_fn: object) -> float:
    h = fleet.history
    times = eval_times(h)
    fail = np.full(len(h.modules), NO_FAILURE, dtype=np.int64)
    idx = h.modules.index()
    for t in fleet.truth:
        if t.failure_ts_ns is not None:
            fail[idx[(t.device, t.port)]] = t.failure_ts_ns
    flags = np.zeros((len(times), len(h.modules)), dtype=bool)
    for e, f in enumerate(feature_series(h, times, peers=fleet.peers)):
        flags[e] = flag_fn(f)  # type: ignore[operator]
    return episode_scores(times, flags, fail).f1


def test_model_beats_baselines_on_another_seed(fleet_b: Fleet) -> None:
    # The shipped model (trained on seeds 100-104, 1,500 modules each) scored on seed 12
    # (other vendor mix, a vendor it never saw). A model trained here on one 400-module fleet
    # does not beat single-factor scoring (F1 0.24 vs 0.29 on this pair): 80 failures are too
    # few for ~560 columns, so the test uses the shipped model. Tried on seed 12 only; on the
    # three 1,500-module benchmark fleets the model led the better baseline by 0.05-0.29 F1.
    model = default_model()
    h, peers = fleet_b.history, fleet_b.peers

    def model_flags(f: object) -> np.ndarray:
        gr = grade_fleet(h, at_ns=f.at_ns, peers=peers, features=f)  # type: ignore[attr-defined]
        mf, cols = model_inputs(f, gr, peers)  # type: ignore[arg-type]
        out = np.zeros(len(h.modules), dtype=bool)
        x = np.stack([cols.get(c, np.full(len(mf), np.nan)) for c in model.feature_names], 1)
        out[mf.module] = model.risk(x) >= model.threshold
        return out

    f_model = _episode_f1(fleet_b, model_flags)
    f_thr = _episode_f1(fleet_b, lambda f: threshold_alarms(h, at_ns=f.at_ns))
    f_sf = _episode_f1(fleet_b, lambda f: single_factor_flags(h, at_ns=f.at_ns, peers=peers,
                                                              features=f))
    assert f_model > max(f_thr, f_sf)


def test_predict_fleet_json_shape(model_a: Model, fleet_b: Fleet) -> None:
    at = eval_times(fleet_b.history)[-1]
    pred = predict_fleet(fleet_b.history, model_a, at_ns=at, peers=fleet_b.peers)
    js = json.loads(json.dumps(pred.to_json(), allow_nan=False))
    assert len(js["modules"]) == len(fleet_b.history.modules)
    keys = {"device", "port", "serial", "grade", "risk", "predicted_failure", "eta_days",
            "reasons", "action"}
    for m in js["modules"]:
        assert keys <= set(m)
        assert m["risk"] is None or 0 <= m["risk"] <= 1
        assert m["predicted_failure"] == (m["risk"] is not None and
                                          m["risk"] >= model_a.threshold - 5e-5)
        if m["predicted_failure"]:
            assert m["action"] not in ("none", "no action now: watch the trend")
    s = js["summary"]
    assert sum(s["grades"].values()) == len(js["modules"])
    assert s["predicted_failures"] == sum(m["predicted_failure"] for m in js["modules"])
    risks = [t["risk"] for t in s["top_risks"]]
    assert risks == sorted(risks, reverse=True) and len(risks) == 10
    assert sum(v["modules"] for v in s["by_vendor"].values()) == len(js["modules"])


def _ramp_history(slope_db_day: float, *, days: int = 9, seed: int = 5) -> FleetHistory:
    """Two 1-lane modules at 600 s: module 0's rx falls ``slope`` dB/day, module 1 is flat."""
    rng = np.random.default_rng(seed)
    n = days * 144
    t = 1_735_689_600 * 10**9 + np.arange(n, dtype=np.int64) * 600 * 10**9
    days_f = (t - t[0]) / DAY_NS
    cols: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for mod in (0, 1):
        base = {"temperature_c": 40.0, "vcc_v": 3.3, "tx_bias_ma": 7.0, "tx_power_dbm": 1.0,
                "rx_power_dbm": -2.0}
        for m in METRICS:
            x = base[m] + rng.normal(0, 0.03, n)
            if m == "rx_power_dbm" and mod == 0:
                x = x - slope_db_day * days_f
            cols[m].append(x)
    ts = np.concatenate([t, t])
    module = np.repeat(np.array([0, 1], dtype=np.int32), n)
    lane = np.zeros(2 * n, dtype=np.int32)
    th = {f"{m}_{k}": v for m, vals in {
        "temperature_c": (75, 70, 0, -5), "vcc_v": (3.63, 3.465, 3.135, 2.97),
        "tx_bias_ma": (130, 125, 15, 10), "tx_power_dbm": (5, 3, -7.5, -10.5),
        "rx_power_dbm": (3.4, 2.4, -9.5, -13.5)}.items()
        for k, v in zip(("high_alarm", "high_warn", "low_warn", "low_alarm"), vals, strict=True)}
    rows = [{"device": "leaf-1", "port": f"Ethernet{8 * i}", "vendor": "Acme",
             "part_number": "P-DR4", "serial": f"S{i}", "media": "400GBASE-DR4", **th}
            for i in (0, 1)]
    ts, module, lane, met = sort_rows(ts, module, lane,
                                      {m: np.concatenate(v) for m, v in cols.items()})
    return FleetHistory(ts=ts, module=module, lane=lane, metrics=met,
                        modules=module_table(rows, lanes=[1, 1]))


def test_eta_days_on_a_ramp() -> None:
    slope = 0.5
    h = _ramp_history(slope)
    at = 1_735_689_600 * 10**9 + 8 * DAY_NS
    pred = predict_fleet(h, default_model(), at_ns=at)
    ramp, flat = pred.modules
    # level at `at` is -2 - 8 * 0.5 = -6 dBm; the low alarm -13.5 is 7.5 dB away: 15 days.
    # The hourly means have sigma 0.03 / sqrt(6); the 3-day slope's standard error is about
    # 0.003 dB/day (0.6 %), so 3 % is five standard errors.
    assert ramp.eta_days == pytest.approx(7.5 / slope, rel=0.03)
    assert flat.eta_days is None
    assert at % HOUR_NS == 0


def test_default_model_loads_and_predicts(fleet_b: Fleet) -> None:
    m = default_model()
    assert m is default_model()  # loaded once
    assert m.horizon_ns == 7 * DAY_NS and 0 < m.threshold <= 1
    assert len(m.feature_names) > 100 and m.metadata.get("fleets")
    at = eval_times(fleet_b.history)[4]
    pred = predict_fleet(fleet_b.history, at_ns=at, peers=fleet_b.peers)
    risks = np.array([x.risk for x in pred.modules if x.risk is not None])
    assert risks.size > 0.9 * len(pred) and np.all((risks >= 0) & (risks <= 1))
    # modules that fail within the horizon of `at` get a higher mean risk than the others
    fail = {(t.device, t.port): t.failure_ts_ns for t in fleet_b.truth
            if t.failure_ts_ns is not None and t.mode != "sudden-death"}
    soon = [x.risk for x in pred.modules if x.risk is not None and
            at < fail.get((x.device, x.port), -1) <= at + 7 * DAY_NS]
    rest = [x.risk for x in pred.modules if x.risk is not None and
            (x.device, x.port) not in fail]
    assert soon and np.mean(soon) > 5 * np.mean(rest)
    assert not math.isnan(float(np.mean(risks)))


def test_eval_times_offset_and_bad_offset(fleet_b: Fleet) -> None:
    daily = eval_times(fleet_b.history)
    six = eval_times(fleet_b.history, every_ns=12 * HOUR_NS, offset_ns=6 * HOUR_NS)
    assert all(t % (12 * HOUR_NS) == 6 * HOUR_NS for t in six)
    assert six[0] >= int(fleet_b.history.ts.min()) + 3 * DAY_NS
    assert six[0] - (int(fleet_b.history.ts.min()) + 3 * DAY_NS) < 12 * HOUR_NS
    assert set(daily) <= set(eval_times(fleet_b.history, every_ns=6 * HOUR_NS))
    for bad in (-HOUR_NS, 12 * HOUR_NS, 30 * 60 * 10**9):
        with pytest.raises(ConfigError, match="eval_offset_ns"):
            eval_times(fleet_b.history, every_ns=12 * HOUR_NS, offset_ns=bad)


def test_train_by_fleet_calibrates_on_the_calibration_fleet(fleet_a: Fleet, fleet_b: Fleet
                                                             ) -> None:
    fleet_c = generate_fleet(FleetConfig(modules=300, days=14, sample_s=1800,
                                         fail_fraction=0.15), seed=13)
    ex = [training_examples(f.history, _labels(f), peers=f.peers)
          for f in (fleet_a, fleet_b, fleet_c)]
    m = train([ex[0]], validation=[ex[1]], calibration=[ex[2]], seed=0)
    assert m.metadata["split"] == "by fleet"
    # the isotonic map is fit on the calibration fleet: its mean risk matches its base rate
    # (isotonic regression preserves the mean of the labels it is fit on)
    r = m.risk(ex[2].X)
    assert abs(float(r.mean()) - float(ex[2].y.mean())) < 1e-6
    assert 0.0 < m.threshold <= 1.0
    with pytest.raises(ConfigError, match="validation"):
        train([ex[0]], calibration=[ex[2]])


def test_model_inputs_new_columns(fleet_a: Fleet) -> None:
    at = int(fleet_a.history.ts.max()) // DAY_NS * DAY_NS
    gr = grade_fleet(fleet_a.history, at_ns=at, peers=fleet_a.peers)
    mf, cols = model_inputs(gr.features, gr, fleet_a.peers)
    n = mf.module.shape[0]
    for c in ("eta.alarm_days.3d", "eta.alarm_days.1d", "link.dir_asym_change_db",
              "peer.link.dir_asym_change_db", "peer.tx_power_dbm.margin.low_alarm.min",
              "device_diff.temperature_c.level.1d.max"):
        assert cols[c].shape == (n,), c
    # with the cabling, the far end's columns are there for most modules
    a, p = cols["link.dir_asym_change_db"], cols["peer.link.dir_asym_change_db"]
    ok = np.isfinite(a) & np.isfinite(p)
    assert ok.mean() > 0.5
    # each module's median-relative temperature: about half of a switch above its median
    d = cols["device_diff.temperature_c.level.1d.max"]
    assert 0.3 < float((d[np.isfinite(d)] > 0).mean()) < 0.7
