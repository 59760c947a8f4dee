"""Optics grading and lane features on hand-made fleets whose reasons are known by construction."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.optics.features import (
    DAY_NS,
    DEFAULT_THRESHOLDS,
    HOUR_NS,
    filled_modules,
    lane_features,
    module_features,
)
from fabricscope.optics.grade import (
    CODES,
    GRADES,
    FleetGrades,
    grade_fleet,
    single_factor_flags,
    threshold_alarms,
)
from fabricscope.optics.history import (
    ALL_METRICS,
    THRESHOLD_KINDS,
    FleetHistory,
    module_table,
)

START_NS = 19_675 * DAY_NS  # a UTC midnight
BIAS_TEMP_COEF = 0.015  # relative bias change per C (the APC loop drives more current when hot)


@dataclass
class Fleet:
    """Metric arrays of shape (modules, lanes, samples), edited by each scenario."""

    ts: np.ndarray
    m: dict[str, np.ndarray]
    rows: list[dict[str, object]]
    base_temp: np.ndarray
    peers: dict[str, str] = field(default_factory=dict)

    @property
    def t_day(self) -> np.ndarray:
        """Sample times in days since the start."""
        return (self.ts - START_NS) / DAY_NS

    def ramp(self, start_day: float, days: float) -> np.ndarray:
        """0 before ``start_day``, rising linearly to 1 over ``days``."""
        return np.clip((self.t_day - start_day) / days, 0.0, 1.0)

    def set_temperature(self, i: int, new: np.ndarray) -> None:
        """Module temperature and the bias it drives (the laser's temperature dependence)."""
        old = self.m["temperature_c"][i].copy()
        self.m["temperature_c"][i] = new
        self.m["tx_bias_ma"][i] *= 1 + BIAS_TEMP_COEF * (new - old)

    def history(self) -> FleetHistory:
        nm, nl, nt = self.m["temperature_c"].shape
        ts = np.tile(self.ts, nm * nl)
        module = np.repeat(np.arange(nm, dtype=np.int32), nl * nt)
        lane = np.tile(np.repeat(np.arange(nl, dtype=np.int32), nt), nm)
        metrics = {k: v.reshape(-1).astype(np.float32) for k, v in self.m.items()}
        for k in ALL_METRICS:
            metrics.setdefault(k, np.full(ts.shape[0], np.nan, dtype=np.float32))
        return FleetHistory(ts=ts, module=module, lane=lane, metrics=metrics,
                            modules=module_table(self.rows, lanes=[nl] * nm))


def make_fleet(n_modules: int, *, lanes: int = 4, days: float = 10, step_min: int = 10,
               seed: int = 0, per_device: int = 8, diurnal_c: float = 3.0) -> Fleet:
    """A healthy fleet: diurnal temperature, bias following temperature, noisy powers."""
    rng = np.random.default_rng(seed)
    nt = int(days * 24 * 60 // step_min)
    ts = START_NS + np.arange(nt, dtype=np.int64) * step_min * 60 * 10**9
    tod = 2 * math.pi * ((ts % DAY_NS) / DAY_NS)
    shape = (n_modules, lanes, nt)
    base_t = 40 + rng.normal(0, 2, (n_modules, 1, 1))
    temp = base_t + diurnal_c * np.sin(tod) + rng.normal(0, 0.15, (n_modules, 1, nt))
    temp = np.broadcast_to(temp, shape).copy()
    bias0 = 6.5 + rng.normal(0, 0.3, (n_modules, lanes, 1))
    bias = bias0 * (1 + BIAS_TEMP_COEF * (temp - base_t)) + rng.normal(0, 0.02, shape)
    tx = -1 + rng.normal(0, 0.3, (n_modules, lanes, 1)) + rng.normal(0, 0.05, shape)
    rx = -3 + rng.normal(0, 0.4, (n_modules, lanes, 1)) + rng.normal(0, 0.08, shape)
    vcc = 3.3 + rng.normal(0, 0.01, (n_modules, 1, 1)) + rng.normal(0, 0.003, (n_modules, 1, nt))
    ber = 10 ** (-8 + rng.normal(0, 0.1, (n_modules, 1, 1)) + rng.normal(0, 0.1, (n_modules, 1, nt)))
    m = {"temperature_c": temp, "tx_bias_ma": bias, "tx_power_dbm": tx, "rx_power_dbm": rx,
         "vcc_v": np.broadcast_to(vcc, shape).copy(),
         "pre_fec_ber": np.broadcast_to(ber, shape).copy(),
         "crc_errors": np.zeros(shape), "fec_uncorrectable": np.zeros(shape)}
    # the thresholds are given (as an EEPROM would), so the part catalog plays no part here
    th = {f"{k}_{kind}": v for k, vals in DEFAULT_THRESHOLDS.items()
          for kind, v in zip(THRESHOLD_KINDS, vals, strict=True)}
    rows: list[dict[str, object]] = [
        {"device": f"sw{i // per_device:03d}", "port": f"Ethernet{(i % per_device) * 8}",
         "vendor": "Acme", "part_number": "QDD-400G-DR4", "serial": f"L{i:03d}-{i:04d}",
         "media": "400GBASE-DR4", **th} for i in range(n_modules)]
    return Fleet(ts=ts, m=m, rows=rows, base_temp=base_t[:, 0, 0])


# module roles of the scenario fleet
PEER_TX, CONNECTOR, BIAS_DRIFT, TX_FADING, BER_HIGH, CRC_RESET, NOISY_NEAR, HOT = range(8)
AIRFLOW = tuple(range(8, 16))  # every module of sw001
ORDERED = (16, 17, 18, 19)  # rx -8, -9, -10, -14 dBm (own part numbers: no population)
RX_LEVELS = (-8.0, -9.0, -10.0, -14.0)
TEMP_TREND = 24  # +0.3 C/day over the whole history
HEALTHY = (20, 21, 22, 23, *range(25, 40))
PAIRED = tuple(range(26, 40))  # healthy links: 26 <-> 27, 28 <-> 29 ...
DAYS = 10.0
CRC_PER_SAMPLE = 1.0  # Poisson mean per 10-minute sample: 6 per hour


def key(f: Fleet, i: int) -> str:
    return f"{f.rows[i]['device']}:{f.rows[i]['port']}"


def scenario_fleet(seed: int = 7) -> Fleet:
    f = make_fleet(40, days=DAYS, seed=seed)
    rng = np.random.default_rng(seed + 1)
    m, nt = f.m, f.ts.shape[0]
    # connector: module 1 receives module 0's light; the loss of lane 0 grows 0 -> 4 dB over
    # the last 3 days while module 0's transmitter stays put
    for a, b in ((PEER_TX, CONNECTOR), *((h, h + 1) for h in PAIRED[::2])):
        m["rx_power_dbm"][b] = m["tx_power_dbm"][a] - 2.0 + rng.normal(0, 0.05, (4, nt))
        m["rx_power_dbm"][a] = m["tx_power_dbm"][b] - 2.0 + rng.normal(0, 0.05, (4, nt))
        f.peers[key(f, a)] = key(f, b)
        f.peers[key(f, b)] = key(f, a)
    m["rx_power_dbm"][CONNECTOR, 0] -= 4.0 * f.ramp(DAYS - 3, 3)
    # laser aging at constant power: the bias rises 30 % over the last 8 days (from a low
    # start, so it stays inside the vendor thresholds)
    m["tx_bias_ma"][BIAS_DRIFT] *= 0.75 * (1 + 0.3 * f.ramp(DAYS - 8, 8))
    # a fading transmitter: tx -2.5 dB over the last 5 days, bias unchanged
    m["tx_power_dbm"][TX_FADING] -= 2.5 * f.ramp(DAYS - 5, 5)
    # pre-FEC BER at 1e-4 for the last 2 days
    m["pre_fec_ber"][BER_HIGH, :, f.t_day >= DAYS - 2] = 1e-4
    # CRC: Poisson errors, the counter restarts from 0 twelve hours before the end
    inc = rng.poisson(CRC_PER_SAMPLE, nt).astype(np.float64)
    cum = 5000 + np.cumsum(inc)
    reset = int(np.searchsorted(f.t_day, DAYS - 0.5))
    cum[reset:] = np.cumsum(inc[reset:])
    m["crc_errors"][CRC_RESET] = cum
    f.rows[CRC_RESET]["crc_increments"] = float(inc[1:].sum())  # for the assertions
    # a healthy but noisy receiver parked 0.5 dB above its -9.5 dBm low warning
    m["rx_power_dbm"][NOISY_NEAR] = -9.0 + rng.normal(0, 0.3, (4, nt))
    # one module heating up on its own (+12 C over the day before the last)
    f.set_temperature(HOT, m["temperature_c"][HOT] + 12.0 * f.ramp(DAYS - 2, 1))
    # every module of one switch heating up: the switch's airflow
    for i in AIRFLOW:
        f.set_temperature(i, m["temperature_c"][i] + 8.0 * f.ramp(DAYS - 2, 1))
    for i, level in zip(ORDERED, RX_LEVELS, strict=True):
        m["rx_power_dbm"][i] = level + rng.normal(0, 0.05, (4, nt))
        f.rows[i]["part_number"] = f"ORDER-{i}"
    f.set_temperature(TEMP_TREND, m["temperature_c"][TEMP_TREND] + 0.3 * f.t_day)
    return f


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return scenario_fleet()


@pytest.fixture(scope="module")
def history(fleet: Fleet) -> FleetHistory:
    return fleet.history()


@pytest.fixture(scope="module")
def at_ns(fleet: Fleet) -> int:
    return int(fleet.ts[-1])


@pytest.fixture(scope="module")
def grades(fleet: Fleet, history: FleetHistory, at_ns: int) -> FleetGrades:
    return grade_fleet(history, at_ns=at_ns, peers=fleet.peers)


def codes(g: FleetGrades, i: int) -> set[str]:
    return {r.code for r in g.reasons[i]}


def rank(grade: str) -> int:
    return GRADES.index(grade)


# ----------------------------------------------------------------------------- grading
def test_diurnal_cycle_alone_grades_good(grades: FleetGrades) -> None:
    bad = {i: (grades.grade[i], sorted(codes(grades, i))) for i in (PEER_TX, *HEALTHY)
           if grades.grade[i] != "good"}
    assert not bad


def test_bias_ramp_at_constant_tx_is_bias_drift_not_fading(grades: FleetGrades) -> None:
    c = codes(grades, BIAS_DRIFT)
    assert "bias-drift" in c and "tx-power-fading" not in c
    assert rank(grades.grade[BIAS_DRIFT]) >= rank("needs-attention")
    assert grades.actions[BIAS_DRIFT][0] == "replace the module"
    drift = next(r for r in grades.reasons[BIAS_DRIFT] if r.code == "bias-drift")
    assert 0.2 <= drift.values["drift_rel"] <= 0.32  # 30 % at the end, the last day's median


def test_fading_tx_at_constant_bias_is_fading_not_drift(grades: FleetGrades) -> None:
    c = codes(grades, TX_FADING)
    assert "tx-power-fading" in c and "bias-drift" not in c


def test_far_end_rx_down_with_peer_tx_normal_is_connector_loss(grades: FleetGrades) -> None:
    c = codes(grades, CONNECTOR)
    assert "connector-loss" in c
    assert "tx-power-fading" not in c and "bias-drift" not in c
    r = next(r for r in grades.reasons[CONNECTOR] if r.code == "connector-loss")
    assert r.lane == 0
    assert grades.actions[CONNECTOR][0] == "clean both connector ends"
    assert grades.grade[PEER_TX] == "good"  # the transmitter feeding the dirty link is fine


def test_connector_loss_needs_the_peers(history: FleetHistory, at_ns: int) -> None:
    g = grade_fleet(history, at_ns=at_ns)
    assert "connector-loss" not in codes(g, CONNECTOR)
    assert "lane-imbalance" in codes(g, CONNECTOR)  # what is left without the cabling


def test_switch_wide_warming_is_airflow_not_thermal(grades: FleetGrades) -> None:
    for i in AIRFLOW:
        c = codes(grades, i)
        assert "switch-airflow" in c and "thermal" not in c, (i, c)
        assert "bias-drift" not in c  # the bias rose with the temperature only
        assert grades.actions[i][0] == "check the switch fan / airflow"


def test_one_hot_module_is_thermal_not_airflow(grades: FleetGrades) -> None:
    c = codes(grades, HOT)
    assert "thermal" in c and "switch-airflow" not in c and "bias-drift" not in c


def test_ber_near_kp4_limit_is_fec_margin(grades: FleetGrades) -> None:
    assert "fec-margin" in codes(grades, BER_HIGH)
    assert rank(grades.grade[BER_HIGH]) >= rank("needs-attention")
    r = next(r for r in grades.reasons[BER_HIGH] if r.code == "fec-margin")
    assert r.values["margin_decades"] == pytest.approx(math.log10(2.4), abs=0.01)


def test_noisy_module_near_its_warning_is_not_bad(grades: FleetGrades) -> None:
    assert grades.grade[NOISY_NEAR] != "bad"
    r = next(r for r in grades.reasons[NOISY_NEAR] if r.code == "rx-power-low-margin")
    assert r.severity < 0.5 and r.values["margin"] > 0


def test_grades_rise_with_depth_below_the_warning(grades: FleetGrades) -> None:
    got = [grades.grade[i] for i in ORDERED]
    assert got == ["good", "moderate", "needs-attention", "bad"]
    scores = [grades.score[i] for i in ORDERED]
    assert scores == sorted(scores)


def test_baselines(fleet: Fleet, history: FleetHistory, at_ns: int,
                   grades: FleetGrades) -> None:
    alarms = threshold_alarms(history, at_ns=at_ns)
    assert alarms[ORDERED[2]] and alarms[ORDERED[3]]
    assert not alarms[list(HEALTHY)].any()
    assert not alarms[BIAS_DRIFT]  # drifting but still inside the vendor thresholds
    single = single_factor_flags(history, at_ns=at_ns, peers=fleet.peers,
                                 features=grades.features)
    assert single[BER_HIGH] and single[ORDERED[2]]
    # the aging laser is > 7 days from its bias warning: only the physics sees it now
    assert not single[BIAS_DRIFT]
    assert rank(grades.grade[BIAS_DRIFT]) >= rank("needs-attention")


def test_json_shape(grades: FleetGrades) -> None:
    doc = grades.to_json()
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc
    assert len(doc["modules"]) == 40
    m = doc["modules"][BIAS_DRIFT]
    for k in ("device", "port", "serial", "grade", "reasons", "action", "actions", "lanes"):
        assert k in m
    assert m["serial"] == "L002-0002"
    assert all({"code", "evidence", "severity", "values"} <= set(r) for r in m["reasons"])
    assert all(r["code"] in CODES for mod in doc["modules"] for r in mod["reasons"])
    s = doc["summary"]
    assert sum(s["grades"].values()) == 40
    non_good = sum(1 for mod in doc["modules"] if mod["grade"] != "good")
    assert sum(s["non_good_by_part"].values()) == non_good
    assert s["non_good_by_vendor"] == {"Acme": non_good}


def test_batch_rma_when_several_of_one_lot_age(fleet: Fleet, at_ns: int) -> None:
    f = scenario_fleet(seed=11)
    lot = (HEALTHY[0], HEALTHY[2], HEALTHY[4])
    for n, i in enumerate(lot):  # one production lot, ZZ0001***
        f.m["tx_bias_ma"][i] *= 1 + 0.35 * f.ramp(DAYS - 5, 5)
        f.rows[i]["serial"] = f"ZZ0001{n:03d}"
    f.rows[HEALTHY[1]]["serial"] = "ZZ0001999"  # same lot, healthy
    g = grade_fleet(f.history(), at_ns=at_ns, peers=f.peers)
    lots = {(b["part_number"], b["serial_prefix"]): b["modules"] for b in g.summary()["batches"]}
    assert lots.get(("QDD-400G-DR4", "ZZ0001")) == 3
    assert all(any(a.startswith("RMA the batch") for a in g.actions[i]) for i in lot)
    assert not g.actions[HEALTHY[1]]
    f.rows[lot[2]]["serial"] = "YY0002000"  # two of a lot are not a batch
    g2 = grade_fleet(f.history(), at_ns=at_ns, peers=f.peers)
    assert ("QDD-400G-DR4", "ZZ0001") not in {
        (b["part_number"], b["serial_prefix"]) for b in g2.summary()["batches"]}


def test_no_data_modules_and_early_at(history: FleetHistory) -> None:
    g = grade_fleet(history, at_ns=START_NS - HOUR_NS)
    assert set(g.grade) == {"no-data"}
    assert g.summary()["grades"]["no-data"] == 40


# ----------------------------------------------------------------------------- features
def test_crc_rate_across_a_counter_reset(fleet: Fleet, grades: FleetGrades) -> None:
    f = grades.features
    rows = np.flatnonzero(f.module == CRC_RESET)
    rate = f["crc.rate.7d"][rows]
    # 7 days of Poisson increments at 6 / h: tolerance 4 sigma of the count
    n = 7 * 24 * 6 * CRC_PER_SAMPLE
    tol = 4 * math.sqrt(n) / (7 * 24)
    assert np.all(np.abs(rate - 6 * CRC_PER_SAMPLE) < tol), rate
    # rate 1d: the reset is inside it, the naive (last - first) would be negative
    assert np.all(f["crc.rate.1d"][rows] > 0)
    healthy = f["crc.rate.7d"][np.isin(f.module, HEALTHY)]
    assert np.all(healthy == 0)


def test_slopes_ignore_the_diurnal_cycle(fleet: Fleet, grades: FleetGrades) -> None:
    f = grades.features
    w = 72  # 3-day window of hourly means
    sigma = 0.15 / math.sqrt(6)  # hourly mean noise of the temperature
    se = sigma / (math.sqrt(w) * (w / 24) / math.sqrt(12))  # OLS slope s.e., per day
    trend = f["temperature_c.slope.3d"][f.module == TEMP_TREND]
    assert np.all(np.abs(trend - 0.3) < 6 * se + 0.02), trend
    flat = f["temperature_c.slope.3d"][np.isin(f.module, HEALTHY)]
    assert np.all(np.abs(flat) < 6 * se + 0.02), np.abs(flat).max()
    # bias follows the temperature by construction: its temperature-regressed slope is flat
    bias = f["tx_bias_ma.slope.3d"][np.isin(f.module, AIRFLOW)]
    assert np.all(np.abs(bias) < 0.05), np.abs(bias).max()


def test_fec_margin_and_link_loss_features(grades: FleetGrades) -> None:
    f = grades.features
    healthy = np.isin(f.module, HEALTHY)
    assert np.allclose(f["ber.fec_margin_dec"][healthy], math.log10(2.4e-4) + 8, atol=0.5)
    conn = (f.module == CONNECTOR) & (f.lane == 0)
    assert f["link.loss_in_change_db"][conn][0] == pytest.approx(4 * (1 - 1 / 6), abs=0.3)
    assert abs(f["link.peer_tx_change_db"][conn][0]) < 0.1
    assert np.all(np.isnan(f["link.loss_in_db"][f.module == HOT]))  # no peer given


def test_features_use_only_the_past(history: FleetHistory, at_ns: int) -> None:
    early = at_ns - 3 * DAY_NS  # before the BER step and the warming
    f = lane_features(history, at_ns=early)
    ber = f["ber.log_level.1h"][f.module == BER_HIGH]
    assert np.all(ber < -7)
    rise = f["temperature_c.rise"][np.isin(f.module, AIRFLOW)]
    assert np.all(np.abs(rise) < 1.5)


def test_module_features_aggregate_lanes(grades: FleetGrades) -> None:
    mf = module_features(grades.features)
    assert len(mf) == 40 and np.all(mf.lanes == 4)
    i = int(np.flatnonzero(mf.module == CONNECTOR)[0])
    assert mf.values["rx_power_dbm.imbalance"][i] > 2.5
    j = int(np.flatnonzero(mf.module == HEALTHY[0])[0])
    assert mf.values["rx_power_dbm.imbalance"][j] < mf.values["rx_power_dbm.imbalance"][i]
    names, x = mf.matrix()
    assert x.shape == (40, len(names))


def test_missing_thresholds_are_filled_given_ones_kept() -> None:
    rows: list[dict[str, object]] = [
        {"device": "sw0", "port": "Ethernet0", "media": "400GBASE-DR4",
         "rx_power_dbm_low_warn": -7.25},
        {"device": "sw0", "port": "Ethernet8", "media": "no-such-media"}]
    mods = filled_modules(module_table(rows, lanes=[4, 4]))
    assert mods.thresholds["rx_power_dbm_low_warn"][0] == -7.25
    assert not any(np.isnan(v).any() for v in mods.thresholds.values())
    for m in DEFAULT_THRESHOLDS:
        hi, hw, lw, la = (mods.thresholds[f"{m}_{k}"] for k in THRESHOLD_KINDS)
        assert np.all((hi >= hw) & (hw > lw) & (lw >= la)), m


def test_bad_parameters_are_config_errors(history: FleetHistory, at_ns: int) -> None:
    with pytest.raises(ConfigError, match="windows"):
        lane_features(history, at_ns=at_ns, windows=(30 * 60 * 10**9,))
    with pytest.raises(ConfigError, match="at_ns"):
        lane_features(history, at_ns=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="level"):
        single_factor_flags(history, at_ns=at_ns, level="terrible")
