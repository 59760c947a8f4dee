"""The synthetic optics fleet: config validation, determinism, files, and each mode's signature."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fabricscope.model.errors import ConfigError
from fabricscope.optics.history import ALL_METRICS, COLUMNS, THRESHOLD_COLUMNS, FleetHistory
from fabricscope.twin.optics_fleet import (
    KP4_BER_LIMIT,
    LOS_DBM,
    MEDIA,
    Fleet,
    FleetConfig,
    ModuleTruth,
    VendorProfile,
    generate_fleet,
    to_history,
    write_fleet,
)

H = 3600 * 10**9
DAY = 24 * H

SMALL = FleetConfig(modules=60, days=3.0, sample_s=1800)
#: many failures, every mode, no late ones: for the signature tests
MODES_CFG = FleetConfig(modules=300, days=10.0, sample_s=1800, fail_fraction=0.2,
                        late_fraction=0.0, parked_fraction=0.04, reseat_fraction=0.03,
                        lead_days=(1.5, 6.0))


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return generate_fleet(MODES_CFG, seed=11)


class View:
    """Per (module, lane) series of a history, with window medians."""

    def __init__(self, h: FleetHistory) -> None:
        self.h = h
        starts, ends = h.lane_rows()
        self.rows = {(int(h.module[s]), int(h.lane[s])): (int(s), int(e))
                     for s, e in zip(starts, ends, strict=True)}
        self.index = h.modules.index()

    def series(self, m: int, lane: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.rows[(m, lane)]
        return self.h.ts[s:e], self.h.metrics[metric][s:e].astype(np.float64)

    def med(self, m: int, lane: int, metric: str, t0: int, t1: int) -> float:
        ts, v = self.series(m, lane, metric)
        sel = (ts >= t0) & (ts < t1) & np.isfinite(v) & (v > LOS_DBM)
        return float(np.median(v[sel])) if sel.any() else math.nan

    def before(self, m: int, lane: int, metric: str, t: int, k: int = 4) -> np.ndarray:
        """The last ``k`` real readings before ``t`` (gaps, N/A and dark skipped)."""
        ts, v = self.series(m, lane, metric)
        ok = (ts < t) & np.isfinite(v) & (v > LOS_DBM)
        return np.asarray(v[ok][-k:])

    def at(self, m: int, lane: int, metric: str, t: int, k: int = 4) -> float:
        """Median of :meth:`before`."""
        v = self.before(m, lane, metric, t, k)
        assert v.shape[0] > 0, (m, lane, metric)
        return float(np.median(v))

    def mean(self, m: int, lane: int, metric: str, t0: int, t1: int) -> float:
        ts, v = self.series(m, lane, metric)
        sel = (ts >= t0) & (ts < t1) & np.isfinite(v)
        return float(np.mean(v[sel])) if sel.any() else math.nan

    def module_of(self, key: str) -> int:
        d, p = key.split(":")
        return self.index[(d, p)]


@pytest.fixture(scope="module")
def view(fleet: Fleet) -> View:
    return View(fleet.history)


def of_mode(f: Fleet, mode: str, pred: Callable[[ModuleTruth], bool] = lambda t: True
            ) -> list[tuple[int, ModuleTruth]]:
    return [(i, t) for i, t in enumerate(f.truth) if t.mode == mode and pred(t)]


def clean_onset(t: ModuleTruth) -> bool:
    """Degradation starts a day into the window (a clean baseline before it)."""
    assert t.onset_ts_ns is not None
    return t.onset_ts_ns >= MODES_CFG.start_ts_ns + DAY


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"modules": 1}, "modules"),
    ({"modules": 10.5}, "modules"),
    ({"days": 0}, "days"),
    ({"sample_s": 0}, "sample_s"),
    ({"days": 0.05, "sample_s": 86400}, "fewer than 2 samples"),
    ({"media_mix": {"400GBASE-XX9": 1.0}}, "media_mix"),
    ({"media_mix": {}}, "media_mix"),
    ({"mode_mix": {"gremlins": 1.0}}, "mode_mix"),
    ({"mode_mix": {"connector": -1.0}}, "mode_mix"),
    ({"vendor_mix": {"A": 0.0}}, "vendor_mix"),
    ({"vendor_profiles": {"Acme": 3}}, "vendor_profiles"),
    ({"fail_fraction": 0.9}, "fail_fraction"),
    ({"fail_fraction": 0.3, "parked_fraction": 0.2}, "<= 0.4"),
    ({"lead_days": (5.0, 1.0)}, "lead_days"),
    ({"lead_days": 3.0}, "lead_days"),
    ({"jitter_s": 500.0}, "jitter_s"),
    ({"diurnal_c": (1.0, 9.0)}, "diurnal_c"),
    ({"missing_rate": float("nan")}, "missing_rate"),
    ({"ports_per_switch": True}, "ports_per_switch"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("+", r"\+")):
        FleetConfig(**kwargs)  # type: ignore[arg-type]


def test_vendor_profile_and_seed_validation() -> None:
    with pytest.raises(ConfigError, match="noise_scale"):
        VendorProfile(noise_scale=0.0)
    with pytest.raises(ConfigError, match="seed"):
        generate_fleet(SMALL, seed=-1)
    with pytest.raises(ConfigError, match="chunk_modules"):
        write_fleet(SMALL, "/nonexistent-never-created", seed=1, chunk_modules=0)
    # too many hot modules for the switches: a ConfigError, not a traceback
    with pytest.raises(ConfigError, match="hot-module"):
        generate_fleet(FleetConfig(modules=8, days=1.0, ports_per_switch=2, fail_fraction=0.4,
                                   late_fraction=0.0, parked_fraction=0.0, reseat_fraction=0.0,
                                   mode_mix={"hot-module": 1.0}), seed=1)


def test_media_catalog_lets_a_laser_fail_before_the_far_receiver() -> None:
    # an aging laser must cross its own tx alarm while the far end still receives: the far rx
    # at that moment (tx alarm - worst loss) stays above the worst receiver's failure level
    for name, s in MEDIA.items():
        far_rx = s.thresholds["tx_power_dbm_low_alarm"] - s.loss_db[1] - 0.5
        worst_sens = s.thresholds["rx_power_dbm_low_alarm"] + s.sens_db[1] + 0.5  # part variant
        assert far_rx > worst_sens, name
        assert s.lanes == (8 if name.endswith("8") else 4)


# ------------------------------------------------------------------------------ determinism
def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    a, b, c = (generate_fleet(SMALL, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a.history.ts, b.history.ts)
    for k in ALL_METRICS:
        assert np.array_equal(a.history.metrics[k], b.history.metrics[k], equal_nan=True), k
    assert a.truth == b.truth and a.labels == b.labels
    n = min(len(a.history), len(c.history))
    assert not np.array_equal(a.history.ts[:n], c.history.ts[:n])
    assert not np.allclose(a.history.metrics["rx_power_dbm"][:n],
                           c.history.metrics["rx_power_dbm"][:n], equal_nan=True)
    assert [t.serial for t in a.truth] != [t.serial for t in c.truth]


def test_history_shape_sorted_and_identity() -> None:
    h = to_history(SMALL, seed=2)
    key = h.module.astype(np.int64) * 64 + h.lane
    assert np.all(np.diff(key) >= 0)
    same = np.diff(key) == 0
    assert np.all(np.diff(h.ts)[same] >= 0)  # ts ordered inside each lane (duplicates equal)
    assert set(h.metrics) == set(ALL_METRICS)
    assert all(v.dtype == np.float32 for v in h.metrics.values())
    mt = h.modules
    assert len(set(mt.serial)) == len(mt) == SMALL.modules
    for i in range(len(mt)):
        assert mt.lanes[i] == MEDIA[mt.media[i]].lanes
        assert set(np.unique(h.lane[h.module == i]).tolist()) <= set(range(int(mt.lanes[i])))
    assert all(p.startswith("Ethernet") and int(p[8:]) % 8 == 0 for p in mt.port)


def test_written_files_match_memory_and_columns(tmp_path: Path) -> None:
    mem = generate_fleet(SMALL, seed=4)
    files = write_fleet(SMALL, tmp_path, seed=4, chunk_modules=6)  # another chunking
    pf = pq.ParquetFile(files.history)
    assert pf.metadata.num_row_groups == files.row_groups == 10
    table = pf.read()
    assert tuple(table.column_names) == COLUMNS
    assert table.num_rows == files.rows == len(mem.history)
    h = mem.history
    assert np.array_equal(table.column("ts").to_numpy(), h.ts)
    assert np.array_equal(table.column("lane").to_numpy(), h.lane)
    for k in ALL_METRICS:
        col = table.column(k).to_numpy()
        assert col.dtype == np.float32
        assert np.array_equal(col, h.metrics[k], equal_nan=True), k
    mt = h.modules
    for c, attr in (("device", mt.device), ("port", mt.port), ("serial", mt.serial),
                    ("vendor", mt.vendor), ("part_number", mt.part_number), ("media", mt.media)):
        got = table.column(c).to_pylist()
        assert got == [attr[int(m)] for m in h.module], c
    for c in THRESHOLD_COLUMNS:
        got = table.column(c).to_numpy()
        assert np.array_equal(got, mt.thresholds[c][h.module], equal_nan=True), c
    # the per-module names keep their dictionaries: every row group's data pages are
    # dictionary-encoded (a dictionary repeating entries made pyarrow fall back to plain)
    names_at = {n: i for i, n in enumerate(pf.schema_arrow.names)}
    for g in range(pf.metadata.num_row_groups):
        rg = pf.metadata.row_group(g)
        for c in ("device", "port", "vendor", "part_number", "media"):
            col = rg.column(names_at[c])
            assert "RLE_DICTIONARY" in col.encodings, (g, c, col.encodings)
            assert col.data_page_offset > (col.dictionary_page_offset or 0), (g, c)
    # some modules report no thresholds (NaN: the catalog fills in), most do
    missing = np.isnan(mt.thresholds["rx_power_dbm_low_alarm"])
    assert 0 < missing.sum() < len(mt) // 2
    # labels.csv / truth.json / links.csv agree with the in-memory fleet
    with files.labels.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["device"], r["port"], r["serial"], int(r["failure_ts_ns"]), r["cause"])
            for r in rows] == [(x.device, x.port, x.serial, x.failure_ts_ns, x.cause)
                               for x in mem.labels]
    doc = json.loads(files.truth.read_text())
    assert doc["seed"] == 4 and len(doc["modules"]) == SMALL.modules
    assert [m["serial"] for m in doc["modules"]] == [t.serial for t in mem.truth]
    assert [m["mode"] for m in doc["modules"]] == [t.mode for t in mem.truth]
    # late degraders: visible inside the window, failing after it, so not labelled
    late = [t for t in mem.truth if t.params.get("late") == 1.0]
    assert len(late) == round(SMALL.late_fraction * SMALL.modules) >= 1
    for t in late:
        assert t.failure_ts_ns is not None and t.onset_ts_ns is not None
        assert t.onset_ts_ns < SMALL.end_ts_ns <= t.failure_ts_ns and not t.fails_in_window
        assert t.serial not in {x.serial for x in mem.labels}
    with files.links.open() as f:
        links = list(csv.DictReader(f))
    assert {f"{r['device_a']}:{r['port_a']}": f"{r['device_b']}:{r['port_b']}" for r in links} \
        == {a: b for a, b in mem.peers.items() if a.startswith("leaf")}


# ------------------------------------------------------------------------------ truth / labels
def test_labels_are_exactly_the_in_window_failures(fleet: Fleet) -> None:
    cfg = fleet.config
    want = {(t.device, t.port, t.serial, t.failure_ts_ns, t.mode)
            for t in fleet.truth if t.fails_in_window}
    got = {(x.device, x.port, x.serial, x.failure_ts_ns, x.cause) for x in fleet.labels}
    assert got == want
    assert len(got) == round(cfg.fail_fraction * cfg.modules)
    for x in fleet.labels:
        assert cfg.start_ts_ns < x.failure_ts_ns < cfg.end_ts_ns
    # no two failures on one link, peers are mutual and on other switches
    failed = {f"{x.device}:{x.port}" for x in fleet.labels}
    assert not any(fleet.peers.get(k) in failed for k in failed)
    for a, b in fleet.peers.items():
        assert fleet.peers[b] == a and a.split(":")[0] != b.split(":")[0]


def test_failed_modules_stop_reporting_or_report_na(fleet: Fleet, view: View) -> None:
    kinds = set()
    for i, t in enumerate(fleet.truth):
        if not t.fails_in_window:
            continue
        assert t.failure_ts_ns is not None
        ts, v = view.series(i, 0, "tx_power_dbm")
        after = ts >= t.failure_ts_ns + H // 60
        if after.any():
            kinds.add("na")
            assert np.all(np.isnan(v[after]))
            for k in ALL_METRICS:
                assert np.all(np.isnan(view.series(i, 0, k)[1][after])), k
        else:
            kinds.add("silent")
        assert (ts < t.failure_ts_ns - H).any()  # it did report before
        # the far end sees no light afterwards
        if t.peer:
            q = view.module_of(t.peer)
            pts, prx = view.series(q, 0, "rx_power_dbm")
            late = (pts > t.failure_ts_ns + H // 60) & np.isfinite(prx)
            assert np.all(prx[late] == LOS_DBM)
    assert kinds == {"na", "silent"}


def test_nuisance_modules_never_fail_and_stay_inside_their_alarms(fleet: Fleet, view: View
                                                                  ) -> None:
    seen: set[str] = set()
    for i, t in enumerate(fleet.truth):
        if not t.nuisances:
            continue
        seen.update(t.nuisances)
        assert t.mode == "healthy" and t.failure_ts_ns is None and not t.fails_in_window
        th = {c: float(v[i]) for c, v in _true_thresholds(fleet, i).items()}
        for lane in range(t.lanes):
            _, rx = view.series(i, lane, "rx_power_dbm")
            rx = rx[np.isfinite(rx) & (rx > LOS_DBM)]  # LOS: the far switch rebooting
            assert rx.min() > th["rx_power_dbm_low_alarm"], (t.nuisances, lane)
            _, ber = view.series(i, lane, "pre_fec_ber")
            assert np.nanmax(ber) < 0.1 * KP4_BER_LIMIT, t.nuisances
            _, tx = view.series(i, lane, "tx_power_dbm")
            assert np.nanmin(tx) > th["tx_power_dbm_low_alarm"]
            _, bias = view.series(i, lane, "tx_bias_ma")
            assert np.nanmax(bias) < th["tx_bias_ma_high_alarm"]
        _, temp = view.series(i, 0, "temperature_c")
        assert np.nanmax(temp) < th["temperature_c_high_alarm"]
    assert seen == {"parked", "reseat", "hot-neighbor"}


def _true_thresholds(f: Fleet, i: int) -> dict[str, np.ndarray]:
    """The module's own thresholds (truth has them also where the module reports none)."""
    th = f.truth[i].thresholds
    assert set(th) == set(THRESHOLD_COLUMNS)
    reported = f.history.modules.thresholds
    for c in THRESHOLD_COLUMNS:  # what it reports, it reports truly
        assert np.isnan(reported[c][i]) or reported[c][i] == th[c]
    return {c: np.full(len(f.truth), th[c]) for c in THRESHOLD_COLUMNS}


def test_parked_modules_sit_near_their_warning_for_the_whole_window(fleet: Fleet, view: View
                                                                    ) -> None:
    n = 0
    for i, t in enumerate(fleet.truth):
        if "parked" not in t.nuisances:
            continue
        metric = next(k[len("parked_metric_"):] for k in t.params if k.startswith("parked_metric_"))
        th = _true_thresholds(fleet, i)
        warn = float(th[f"{metric}_{'low' if metric.endswith('dbm') else 'high'}_warn"][i])
        ts, v = view.series(i, 0, metric)
        first = np.nanmedian(v[ts < fleet.config.start_ts_ns + DAY])
        last = np.nanmedian(v[ts >= fleet.config.end_ts_ns - DAY])
        scale = 3.5 if metric in ("temperature_c", "rx_power_dbm") else 0.08 * abs(warn) + 1.0
        assert abs(first - warn) < scale and abs(last - warn) < scale, (metric, first, warn)
        n += 1
    assert n == round(fleet.config.parked_fraction * fleet.config.modules)


# ------------------------------------------------------------------------------ signatures
def test_aging_laser_bias_climbs_at_flat_power_then_power_fades(fleet: Fleet, view: View) -> None:
    mods = of_mode(fleet, "aging-laser", clean_onset)
    assert len(mods) >= 3
    for i, t in mods:
        assert t.onset_ts_ns is not None and t.failure_ts_ns is not None and t.lane is not None
        on, tf, lane = t.onset_ts_ns, t.failure_ts_ns, t.lane
        quarter = on + (tf - on) // 4
        b0 = view.at(i, lane, "tx_bias_ma", on)
        b1 = view.at(i, lane, "tx_bias_ma", tf)
        p0 = view.at(i, lane, "tx_power_dbm", on)
        pq_ = view.at(i, lane, "tx_power_dbm", quarter + H)
        p1 = view.at(i, lane, "tx_power_dbm", tf, 2)
        alarm = t.thresholds["tx_bias_ma_high_alarm"]
        # the APC loop pushes bias up to its clamp (or past the alarm)...
        assert b1 > b0 + 0.5 * (min(t.params["bias_clamp_ma"], alarm) - b0), (b0, b1)
        assert b1 > 0.95 * min(t.params["bias_clamp_ma"], alarm)
        assert abs(pq_ - p0) < 0.3  # ...while the power holds
        if t.criterion == "tx_power_dbm<low_alarm":
            assert p1 < p0 - 3.0  # then the power fades
        else:
            assert t.criterion == "tx_bias_ma>high_alarm"
            assert t.params["bias_clamp_ma"] > alarm
        # the other lanes' lasers are fine
        for other in range(t.lanes):
            if other != lane:
                o0 = view.at(i, other, "tx_bias_ma", on)
                o1 = view.at(i, other, "tx_bias_ma", tf)
                assert abs(o1 / o0 - 1) < 0.1


def test_connector_drops_far_end_rx_while_the_transmitter_is_normal(fleet: Fleet, view: View
                                                                     ) -> None:
    mods = of_mode(fleet, "connector", clean_onset)
    assert len(mods) >= 3
    for i, t in mods:
        assert t.onset_ts_ns is not None and t.failure_ts_ns is not None and t.lane is not None
        on, tf, lane = t.onset_ts_ns, t.failure_ts_ns, t.lane
        q = view.module_of(t.peer)  # the transmitter across the dirty connector
        ts, rx = view.series(i, lane, "rx_power_dbm")
        before = view.at(i, lane, "rx_power_dbm", on)
        pre = rx[(ts > on) & (ts < tf) & np.isfinite(rx) & (rx > LOS_DBM)]
        assert pre.min() < before - 2.0
        if t.params["profile"] == 1.0:  # drift (steps: the last one comes with the failure)
            # the last reading sits where the drift has taken it: w * loss * progress^shape
            ts_ok = ts[(ts < tf) & np.isfinite(rx) & (rx > LOS_DBM)]
            prog = (ts_ok[-1] - on) / (tf - on)
            loss = t.params["worst_lane_weight"] * t.params["loss_at_failure_db"]
            drop = before - view.at(i, lane, "rx_power_dbm", tf, 1)
            assert abs(drop - loss * prog ** t.params["shape"]) < 0.6, (drop, loss, prog)
            if loss * (1 - prog ** t.params["shape"]) < 1.0:  # near the end: BER shows it
                ber = view.before(i, lane, "pre_fec_ber", tf, 1)[0]
                assert ber > 3 * view.at(i, lane, "pre_fec_ber", on, 12)
        for metric, tol in (("tx_power_dbm", 0.3), ("tx_bias_ma", 0.05)):
            a = view.at(q, lane, metric, on, 12)
            b = view.at(q, lane, metric, tf, 12)
            assert abs(b - a) < (tol if metric == "tx_power_dbm" else tol * a), metric


def test_bent_fiber_rx_wanders_with_the_room_temperature(fleet: Fleet, view: View) -> None:
    mods = of_mode(fleet, "bent-fiber", clean_onset)
    assert len(mods) >= 2
    for i, t in mods:
        assert t.onset_ts_ns is not None and t.failure_ts_ns is not None and t.lane is not None
        assert t.params["bend_db_per_c"] > 0
        on, tf, lane = t.onset_ts_ns, t.failure_ts_ns, t.lane
        q = view.module_of(t.peer)
        assert abs(view.med(q, lane, "tx_power_dbm", tf - DAY, tf)
                   - view.med(q, lane, "tx_power_dbm", on - DAY, on)) < 0.3
        assert view.at(i, lane, "rx_power_dbm", tf) \
            < view.med(i, lane, "rx_power_dbm", on - DAY, on) - 3.0


def test_hot_switch_warms_every_module_and_fails_a_few(fleet: Fleet, view: View) -> None:
    hot = [d for d in fleet.devices if d["hot"]]
    assert hot
    cfg = fleet.config
    t0, checked = cfg.start_ts_ns, 0
    for d in hot:
        mods = [i for i, t in enumerate(fleet.truth) if t.device == d["device"]]
        failing = [i for i in mods if fleet.truth[i].mode == "hot-module"]
        assert 1 <= len(failing) <= 3
        first_fail = min(int(fleet.truth[i].failure_ts_ns or 0) for i in failing)
        if first_fail < t0 + 2 * DAY:
            continue
        onset = int(d["fan_onset_ts_ns"])

        rise_c = float(d["fan_rise_c"])
        last, first = (first_fail - DAY, first_fail), (t0, t0 + DAY)
        for i in mods:
            # the fan ramp's mean over the module's own samples of two whole days (the
            # diurnal cycle cancels in a whole-day mean)
            ts = view.series(i, 0, "temperature_c")[0]
            ramp = rise_c * np.clip((ts - onset) / (first_fail - onset), 0.0, 1.0)
            in_last, in_first = (ts >= last[0]) & (ts < last[1]), (ts >= first[0]) & (ts < first[1])
            if not in_last.any() or not in_first.any():
                continue  # failed (another mode) before the fan's full day
            want = ramp[in_last].mean() - ramp[in_first].mean()
            rise = (view.mean(i, 0, "temperature_c", *last)
                    - view.mean(i, 0, "temperature_c", *first))
            if i in failing:
                assert rise > want - 0.5
            elif "hot-neighbor" in fleet.truth[i].nuisances:
                assert abs(rise - want) < 0.5, (rise, want)
            checked += want > 1.0
        for i in failing:
            t = fleet.truth[i]
            assert t.failure_ts_ns is not None
            temp = view.series(i, 0, "temperature_c")
            sel = (temp[0] < t.failure_ts_ns) & (temp[0] > t.failure_ts_ns - H)
            alarm = _true_thresholds(fleet, i)["temperature_c_high_alarm"][i]
            assert np.nanmax(temp[1][sel]) > alarm - 1.5
            b0 = view.med(i, 0, "tx_bias_ma", t0, t0 + DAY)
            b1 = view.at(i, 0, "tx_bias_ma", t.failure_ts_ns)
            assert b1 > b0  # bias follows temperature under APC
    assert checked >= 1
    others = [i for i, t in enumerate(fleet.truth)
              if not any(t.device == d["device"] for d in hot) and t.mode == "healthy"]
    drift = [view.med(i, 0, "temperature_c", cfg.end_ts_ns - DAY, cfg.end_ts_ns)
             - view.med(i, 0, "temperature_c", t0, t0 + DAY) for i in others[:60]]
    assert max(abs(x) for x in drift if not math.isnan(x)) < 1.0


def test_fec_degradation_raises_ber_and_counters_with_dom_normal(fleet: Fleet, view: View
                                                                  ) -> None:
    mods = of_mode(fleet, "fec-degradation", clean_onset)
    assert len(mods) >= 3
    counted = 0
    for i, t in mods:
        assert t.onset_ts_ns is not None and t.failure_ts_ns is not None and t.lane is not None
        on, tf, lane = t.onset_ts_ns, t.failure_ts_ns, t.lane
        limit = MEDIA[t.media].ber_limit
        assert view.at(i, lane, "pre_fec_ber", on) < 1e-5
        assert view.before(i, lane, "pre_fec_ber", tf, 3).max() > 0.1 * limit
        for metric, tol in (("tx_power_dbm", 0.3), ("rx_power_dbm", 0.4)):
            assert abs(view.at(i, lane, metric, tf) - view.at(i, lane, metric, on, 12)) < tol, metric
        ts, fec = view.series(i, lane, "fec_uncorrectable")
        sel = (ts > on) & (ts < tf) & np.isfinite(fec)
        counted += int(np.nanmax(fec[sel]) > np.nanmin(fec[sel]))
    assert counted >= len(mods) // 2  # bursty errors show as uncorrectable codewords first


def test_sudden_death_gives_no_warning(fleet: Fleet, view: View) -> None:
    hot = {d["device"] for d in fleet.devices if d["hot"]}  # a fan warms everyone there
    mods = of_mode(fleet, "sudden-death", lambda t: (t.failure_ts_ns or 0)
                   > MODES_CFG.start_ts_ns + 2 * DAY and t.device not in hot)
    healthy = [i for i, t in enumerate(fleet.truth)
               if t.mode == "healthy" and not t.nuisances][:100]
    assert len(mods) >= 3

    def change(i: int, t_end: int, metric: str) -> float:
        return abs(view.med(i, 0, metric, t_end - DAY, t_end)
                   - view.med(i, 0, metric, t_end - 2 * DAY, t_end - DAY))

    for metric in ("tx_power_dbm", "rx_power_dbm", "tx_bias_ma", "temperature_c"):
        ref = np.array([change(i, MODES_CFG.start_ts_ns + 3 * DAY, metric) for i in healthy])
        ref = ref[np.isfinite(ref)]
        got = np.array([change(i, int(t.failure_ts_ns or 0), metric) for i, t in mods])
        # the day before a sudden death looks like any healthy day: no larger on average
        # (4 standard errors of the healthy mean) and no single one beyond 3x healthy's 99%
        assert got.mean() <= ref.mean() + 4 * ref.std() / math.sqrt(got.shape[0]), metric
        assert got.max() <= 3 * float(np.quantile(ref, 0.99)), metric
    for i, t in mods:
        assert t.failure_ts_ns is not None and t.onset_ts_ns == t.failure_ts_ns
        ber = view.series(i, 0, "pre_fec_ber")
        assert np.nanmax(ber[1][ber[0] < t.failure_ts_ns]) < 1e-4


# ------------------------------------------------------------------------------ nuisances
def test_gaps_duplicates_na_and_reboots() -> None:
    cfg = FleetConfig(modules=200, days=4.0, sample_s=600, duplicate_rate=0.01,
                      missing_rate=0.01, nan_rate=0.002, reboots_per_device=1.0,
                      outages_per_device=0.0, fail_fraction=0.0, late_fraction=0.0,
                      parked_fraction=0.0, reseat_fraction=0.0)
    f = generate_fleet(cfg, seed=9)
    h = f.history
    starts, ends = h.lane_rows()
    n_samples = cfg.samples * len(starts)
    dups = sum(int((np.diff(h.ts[s:e]) == 0).sum()) for s, e in zip(starts, ends, strict=True))
    # duplicates are drawn per module sample (shared by its lanes): binomial on module rounds
    rounds = cfg.samples * cfg.modules
    mean, sd = cfg.duplicate_rate * rounds, math.sqrt(cfg.duplicate_rate * rounds)
    per_module_lanes = n_samples / rounds
    assert abs(dups / per_module_lanes - mean) < 5 * sd
    # rows present: missing samples and reboot downtime removed, duplicates added
    assert len(h) < n_samples * (1 + cfg.duplicate_rate)
    assert len(h) > n_samples * (1 - cfg.missing_rate - 0.05)
    # N/A readings at about nan_rate (tx power: no other source of NaN here)
    tx = h.metrics["tx_power_dbm"]
    rate = float(np.isnan(tx).mean())
    assert abs(rate - cfg.nan_rate) < 6 * math.sqrt(cfg.nan_rate / len(tx)) + 1e-4
    # jitter: samples off the grid by at most 0.4 of the interval
    off = (h.ts - cfg.start_ts_ns) % (cfg.sample_s * 10**9)
    off = np.minimum(off, cfg.sample_s * 10**9 - off)
    assert off.max() <= 0.4 * cfg.sample_s * 1e9 and off.max() > 0
    # a reboot zeroes the counters of its switch: stale counter values fall back to 0
    rebooted = {d["device"] for d in f.devices if d["reboots"]}
    stale = [i for i in range(cfg.modules)
             if h.modules.device[i] in rebooted
             and np.nanmax(h.metrics["crc_errors"][h.module == i]) > 0]
    assert stale, "seed 9 has stale counters on a rebooted switch"
    for i in stale:
        c = h.metrics["crc_errors"][(h.module == i) & (h.lane == 0)]
        c = c[np.isfinite(c)]
        assert c[-1] < c[0]  # zeroed at the reboot, nothing counted since
