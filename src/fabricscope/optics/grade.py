"""Explainable health grades of every optical module, with reason codes, evidence and actions.

Each rule turns one feature of :mod:`fabricscope.optics.features` into a severity in [0, 1]
per lane: 0 below its first cut point, 0.25 ("moderate") at it, rising linearly to its second
cut point (1.0, or the rule's cap). A lane's score combines its rules by noisy-OR,
``1 - prod(1 - s)``, so two independent half-severe symptoms grade worse than one; a module
takes, per rule, its worst lane. Grades: ``good`` < 0.25 <= ``moderate`` < 0.5 <=
``needs-attention`` < 0.85 <= ``bad``. Every cut point is a field of :class:`GradeRules` and
docs/design/optics-grading.md gives the source of each.

Single-factor rules (the "single-factor score"): margin of the current level to the module's
own warning / alarm thresholds (SFF-8472 / SFF-8636 / CMIS threshold sets) and the days until
the 3-day trend reaches the warning, for rx power, tx power, bias, temperature and Vcc; the FEC
margin of the pre-FEC BER to the RS(544,514) limit 2.4e-4 (IEEE 802.3 clause 119).
Multi-factor rules (physics): temperature-compensated bias drift, tx power fading, connector
loss (link loss up while the far transmitter is fine: CorrOpt, SIGCOMM'17, clean rather than
replace), lane imbalance, thermal outliers against the part's population, same-switch warming
(the fan, not the module), BER and CRC trends, population outliers.

Actions follow from the reasons, cheapest likely fix first (CorrOpt's repair order: clean the
connectors before replacing optics); several degrading modules of one part number and serial
range add "RMA the batch". Pure: the features carry everything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError
from fabricscope.optics.dom import KP4_BER_LIMIT
from fabricscope.optics.features import (
    DAY_NS,
    LaneFeatures,
    filled_modules,
    first_after,
    lane_features,
    lane_runs,
    window_label,
)
from fabricscope.optics.history import METRICS, FleetHistory

__all__ = [
    "ACTIONS",
    "CODES",
    "GRADES",
    "FleetGrades",
    "GradeRules",
    "Reason",
    "grade_fleet",
    "single_factor_flags",
    "threshold_alarms",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

GRADES: tuple[str, ...] = ("good", "moderate", "needs-attention", "bad")
CODES: tuple[str, ...] = (
    "rx-power-low-margin", "tx-power-low-margin", "bias-drift", "bias-high", "tx-power-fading",
    "connector-loss", "lane-imbalance", "thermal", "switch-airflow", "fec-margin", "fec-rising",
    "crc-rising", "vcc-out-of-range", "population-outlier",
)
#: action key -> text, in the fixed order used to break ties
ACTIONS: Mapping[str, str] = {
    "check-airflow": "check the switch fan / airflow",
    "clean": "clean both connector ends",
    "reseat": "reseat the module",
    "patch-cord": "replace the patch cord",
    "replace": "replace the module",
    "rma": "RMA the batch",
    "watch": "no action now: watch the trend",
}
_CODE_ACTIONS: Mapping[str, tuple[str, ...]] = {
    "rx-power-low-margin": ("clean", "patch-cord"),
    "tx-power-low-margin": ("replace",),
    "bias-drift": ("replace",),
    "bias-high": ("replace",),
    "tx-power-fading": ("replace",),
    "connector-loss": ("clean", "patch-cord"),
    "lane-imbalance": ("clean", "replace"),
    "thermal": ("reseat", "replace"),
    "switch-airflow": ("check-airflow",),
    "vcc-out-of-range": ("reseat", "replace"),
    "population-outlier": ("watch",),
}
#: symptoms without a cause of their own: they act only when no cause code is present
_SYMPTOMS = frozenset({"fec-margin", "fec-rising", "crc-rising"})
_SYMPTOM_ACTIONS = ("clean", "reseat", "replace")
#: codes that point at the module itself (a batch RMA needs several of these)
_INTRINSIC = frozenset({"bias-drift", "bias-high", "tx-power-fading", "tx-power-low-margin",
                        "thermal"})
_SINGLE = ("rx-power-low-margin", "tx-power-low-margin", "bias-high", "thermal",
           "vcc-out-of-range", "fec-margin")


@dataclass(frozen=True, slots=True)
class GradeRules:
    """Cut points of the rules: ``(moderate_at, worst_at)`` pairs (see the design page)."""

    near_db: float = 1.0
    near_temp_c: float = 5.0
    near_vcc_v: float = 0.05
    near_bias_frac: float = 0.1
    eta_days: float = 7.0
    trend_t: float = 4.0
    bias_drift_rel: tuple[float, float] = (0.10, 0.50)
    fading_db: tuple[float, float] = (1.0, 3.0)
    connector_db: tuple[float, float] = (1.0, 4.0)
    peer_tx_ok_db: float = 0.5
    imbalance_db: tuple[float, float] = (1.5, 4.0)
    thermal_z: tuple[float, float] = (3.0, 10.0)
    warming_c: tuple[float, float] = (3.0, 15.0)
    airflow_min_modules: int = 2
    airflow_fraction: float = 0.25
    fec_margin_dec: tuple[float, float] = (2.0, 0.0)
    fec_rising_dec_day: tuple[float, float] = (0.1, 0.5)
    ber_active: float = 1e-9
    crc_per_hour: tuple[float, float] = (1.0, 1000.0)
    outlier_z: tuple[float, float] = (4.0, 10.0)
    batch_min: int = 3
    lot_suffix: int = 3
    cuts: tuple[float, float, float] = (0.25, 0.5, 0.85)

    def __post_init__(self) -> None:
        c = self.cuts
        if not 0 < c[0] < c[1] < c[2] <= 1:
            raise ConfigError(f"optics grade rules: cuts: must rise within (0, 1], got {c!r}")
        for name in ("batch_min", "airflow_min_modules", "lot_suffix"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"optics grade rules: {name}: must be an integer >= 0, got {v!r}")


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a module is not good: the code, its severity, the lane, and the numbers."""

    code: str
    severity: float
    lane: int | None
    evidence: str
    values: Mapping[str, float]


@dataclass(frozen=True)
class FleetGrades:
    """Grades of every module of the table (``no-data`` where it had no sample by ``at_ns``).

    ``score`` / ``single_factor`` / ``multi_factor`` are per module (NaN without data);
    ``lane_*`` arrays are per lane row of ``features``.
    """

    features: LaneFeatures
    grade: tuple[str, ...]
    score: F64
    single_factor: F64
    multi_factor: F64
    reasons: tuple[tuple[Reason, ...], ...]
    actions: tuple[tuple[str, ...], ...]
    lane_score: F64
    lane_grade: tuple[str, ...]
    batches: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.grade)

    def module(self, i: int) -> dict[str, Any]:
        """The JSON object of module ``i``."""
        mods = self.features.modules
        f = self.features
        lanes = np.flatnonzero(f.module == i)
        return {
            "device": mods.device[i], "port": mods.port[i], "serial": mods.serial[i],
            "vendor": mods.vendor[i], "part_number": mods.part_number[i], "media": mods.media[i],
            "grade": self.grade[i], "score": _num(self.score[i]),
            "single_factor_score": _num(self.single_factor[i]),
            "multi_factor_score": _num(self.multi_factor[i]),
            "reasons": [{"code": r.code, "severity": round(r.severity, 3), "lane": r.lane,
                         "evidence": r.evidence,
                         "values": {k: _num(v) for k, v in r.values.items()}}
                        for r in self.reasons[i]],
            "action": self.actions[i][0] if self.actions[i] else "none",
            "actions": list(self.actions[i]),
            "lanes": [{"lane": int(f.lane[k]), "grade": self.lane_grade[k],
                       "score": _num(self.lane_score[k])} for k in lanes.tolist()],
        }

    def summary(self) -> dict[str, Any]:
        """Counts per grade, per vendor / part counts of non-good modules, batch RMAs."""
        mods = self.features.modules
        counts = {g: 0 for g in (*GRADES, "no-data")}
        vendor: dict[str, int] = {}
        part: dict[str, int] = {}
        for i, g in enumerate(self.grade):
            counts[g] += 1
            if g not in ("good", "no-data"):
                vendor[mods.vendor[i]] = vendor.get(mods.vendor[i], 0) + 1
                part[mods.part_number[i]] = part.get(mods.part_number[i], 0) + 1
        return {"at_ns": self.features.at_ns, "modules": len(self.grade), "grades": counts,
                "non_good_by_vendor": dict(sorted(vendor.items(), key=lambda kv: -kv[1])),
                "non_good_by_part": dict(sorted(part.items(), key=lambda kv: -kv[1])),
                "batches": [dict(b) for b in self.batches],
                "warnings": list(self.warnings)}

    def to_json(self) -> dict[str, Any]:
        """``{"summary": ..., "modules": [one object per module]}`` (JSON-ready, no NaN)."""
        return {"summary": self.summary(), "modules": [self.module(i) for i in range(len(self))]}


def _num(v: float) -> float | None:
    v = float(v)
    return round(v, 6) if math.isfinite(v) else None


def _ramp(x: F64, lo: float, hi: float, s_lo: float = 0.25, s_hi: float = 1.0) -> F64:
    """0 before ``lo`` (or NaN), ``s_lo`` at ``lo`` rising linearly to ``s_hi`` at ``hi``.

    ``hi < lo`` ramps downwards (smaller is worse).
    """
    with np.errstate(invalid="ignore"):
        u = (x - lo) / (hi - lo)
        s = np.where(u >= 0, s_lo + (s_hi - s_lo) * np.clip(u, 0, 1), 0.0)
    return np.where(np.isnan(x), 0.0, s)


def _margin_sev(warn: F64, alarm: F64, near: F64 | float) -> F64:
    """Severity from the margin to a warning / alarm (positive: inside the threshold).

    Within ``near`` of the warning: moderate (0.25 .. 0.45); beyond the warning: needs
    attention (0.5 .. 0.85 on the way to the alarm); beyond the alarm: 1.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(warn < near, 0.25 + 0.2 * np.clip(1 - warn / near, 0, 1), 0.0)
        gap = np.maximum(-warn + alarm, 1e-9)
        s = np.where(warn < 0, 0.5 + 0.35 * np.clip(-warn / gap, 0, 1), s)
        s = np.where(alarm <= 0, 1.0, s)
    return np.where(np.isnan(warn), 0.0, s)


def _eta_sev(eta: F64, horizon: float) -> F64:
    """Severity of a trend that reaches the warning in ``eta`` days."""
    with np.errstate(invalid="ignore"):
        s = np.where(eta <= 2 * horizon, 0.3, 0.0)
        s = np.where(eta <= horizon, 0.5 + 0.35 * np.clip(1 - eta / horizon, 0, 1), s)
    return np.where(np.isnan(eta), 0.0, s)


def _label(f: LaneFeatures, at_least: int) -> str:
    for w in f.windows:
        if w >= at_least:
            return window_label(w)
    return window_label(f.windows[-1])


def _severities(f: LaneFeatures, r: GradeRules) -> tuple[dict[str, F64], dict[str, F64]]:
    """(single-factor, multi-factor) severities per code and lane."""
    n = len(f)
    v = f.values
    z = np.zeros(n)
    d1, d3 = _label(f, DAY_NS), _label(f, 3 * DAY_NS)
    sf: dict[str, F64] = {}
    mf: dict[str, F64] = {}
    hor = r.eta_days

    def margin(m: str, side: str, near: F64 | float) -> F64:
        return np.fmax(_margin_sev(v[f"{m}.margin.{side}_warn"], v[f"{m}.margin.{side}_alarm"],
                                   near), _eta_sev(v[f"{m}.eta_days.{side}_warn"], hor))

    sf["rx-power-low-margin"] = margin("rx_power_dbm", "low", r.near_db)
    sf["tx-power-low-margin"] = margin("tx_power_dbm", "low", r.near_db)
    th_bias = np.asarray(f.modules.thresholds["tx_bias_ma_high_warn"])[f.module] if n else z
    sf["bias-high"] = margin("tx_bias_ma", "high", np.abs(th_bias) * r.near_bias_frac)
    sf["thermal"] = margin("temperature_c", "high", r.near_temp_c)
    sf["vcc-out-of-range"] = np.fmax(margin("vcc_v", "high", r.near_vcc_v),
                                     margin("vcc_v", "low", r.near_vcc_v))
    fec = _ramp(-v["ber.fec_margin_dec"], -r.fec_margin_dec[0], -r.fec_margin_dec[1])
    unc = v[f"fec_unc.rate.{d1}"]
    sf["fec-margin"] = np.where(np.nan_to_num(unc) > 0, np.fmax(fec, 0.85), fec)
    # multi-factor
    drift = v[f"bias.drift_rel.{d1}"]
    noisy = np.nan_to_num(v[f"bias.drift_ma.{d1}"]) < np.nan_to_num(v["tx_bias_ma.noise"])
    mf["bias-drift"] = np.where(noisy, 0.0, _ramp(drift, *r.bias_drift_rel))
    drop = v["tx_power_dbm.baseline"] - v[f"tx_power_dbm.level.{d1}"]
    fading_trend = np.where((v[f"tx_power_dbm.slope_t.{d3}"] <= -r.trend_t)
                            & (v[f"tx_power_dbm.slope.{d3}"] <= -0.2), 0.3, 0.0)
    mf["tx-power-fading"] = np.fmax(_ramp(drop, *r.fading_db), fading_trend)
    ptx_ok = np.abs(v["link.peer_tx_change_db"]) <= r.peer_tx_ok_db
    mf["connector-loss"] = np.where(ptx_ok, _ramp(v["link.loss_in_change_db"], *r.connector_db), 0)
    imb = np.fmax(-v["rx_power_dbm.lane_dev_change"], -v["tx_power_dbm.lane_dev_change"])
    mf["lane-imbalance"] = _ramp(imb, *r.imbalance_db, s_hi=0.85)
    mf["thermal"] = _ramp(v["temperature_c.pop_z"], *r.thermal_z, s_hi=0.6)
    rise = v["temperature_c.rise"]
    need = np.maximum(r.airflow_min_modules, np.ceil(r.airflow_fraction * v["device.modules"]))
    airflow = (v["device.warming"] >= need) & (np.nan_to_num(rise) >= r.warming_c[0])
    mf["switch-airflow"] = np.where(airflow, np.fmax.reduce([
        _ramp(rise, *r.warming_c, s_hi=0.85), sf["thermal"], mf["thermal"]]), 0.0)
    sf["thermal"] = np.where(airflow, 0.0, sf["thermal"])
    mf["thermal"] = np.where(airflow, 0.0, mf["thermal"])
    active = v[f"ber.log_level.{d1}"] >= math.log10(r.ber_active)
    rising = (v[f"ber.slope_t.{d3}"] >= r.trend_t) & active
    mf["fec-rising"] = np.where(rising, _ramp(v[f"ber.slope.{d3}"], *r.fec_rising_dec_day,
                                              s_hi=0.85), 0.0)
    lab7 = window_label(f.windows[-1])
    c1, c7 = v[f"crc.rate.{d1}"], v[f"crc.rate.{lab7}"]
    with np.errstate(invalid="ignore", divide="ignore"):
        lc = np.log10(c1)
        crc_up = (c1 > 1.5 * c7) | (c1 >= 10 * r.crc_per_hour[0])
    mf["crc-rising"] = np.where(crc_up, _ramp(lc, math.log10(r.crc_per_hour[0]),
                                              math.log10(r.crc_per_hour[1])), 0.0)
    pz = np.fmax.reduce([np.abs(v[f"{m}.pop_z"]) for m in
                         ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")])
    mf["population-outlier"] = _ramp(pz, *r.outlier_z, s_hi=0.45)
    return sf, mf


def _noisy_or(cols: list[F64], n: int) -> F64:
    out = np.ones(n)
    for c in cols:
        out *= 1.0 - np.clip(c, 0, 1)
    return 1.0 - out


def _grade_of(score: F64, cuts: tuple[float, float, float]) -> list[str]:
    idx = np.searchsorted(np.asarray(cuts), np.nan_to_num(score, nan=0.0), side="right")
    return [GRADES[int(k)] for k in idx]


def grade_fleet(
    history: FleetHistory,
    *,
    at_ns: int,
    peers: Mapping[str, str] | None = None,
    features: LaneFeatures | None = None,
    rules: GradeRules | None = None,
) -> FleetGrades:
    """Grade every module of ``history`` at ``at_ns`` (see the module docstring).

    ``features`` (from :func:`~fabricscope.optics.features.lane_features` at the same
    ``at_ns``) saves computing them again; ``peers`` (``device:port`` -> far end) enables the
    connector-loss rule. Modules without a sample by ``at_ns`` grade ``no-data``.
    """
    r = rules or GradeRules()
    f = features if features is not None else lane_features(history, at_ns=at_ns, peers=peers)
    if features is not None and features.at_ns != at_ns:
        raise ConfigError(f"optics grade: features were computed at {features.at_ns}, "
                          f"not at_ns {at_ns}")
    n = len(f)
    nmod = len(f.modules)
    sf, mf = _severities(f, r)
    sev = {c: np.fmax(sf.get(c, np.zeros(n)), mf.get(c, np.zeros(n))) for c in CODES}
    lane_score = _noisy_or([sev[c] for c in CODES], n)
    lane_grade = tuple(_grade_of(lane_score, r.cuts))
    score = np.full(nmod, np.nan)
    single = np.full(nmod, np.nan)
    multi = np.full(nmod, np.nan)
    reasons: list[tuple[Reason, ...]] = [() for _ in range(nmod)]
    actions: list[tuple[str, ...]] = [() for _ in range(nmod)]
    grades = ["no-data"] * nmod
    if n:
        cut = np.concatenate([[0], np.flatnonzero(np.diff(f.module)) + 1])
        umod = f.module[cut].astype(np.int64)
        msev = np.stack([np.fmax.reduceat(sev[c], cut) for c in CODES], axis=1)
        msf = np.stack([np.fmax.reduceat(sf[c], cut) for c in _SINGLE], axis=1)
        mmf = np.stack([np.fmax.reduceat(mf[c], cut) for c in mf], axis=1)
        score[umod] = 1 - np.prod(1 - msev, axis=1)
        single[umod] = 1 - np.prod(1 - msf, axis=1)
        multi[umod] = 1 - np.prod(1 - mmf, axis=1)
        for i, g in zip(umod.tolist(), _grade_of(score[umod], r.cuts), strict=True):
            grades[i] = g
        bounds = np.concatenate([cut, [n]])
        flagged = np.flatnonzero(msev.max(axis=1) >= r.cuts[0])
        for j in flagged.tolist():
            i = int(umod[j])
            a, b = int(bounds[j]), int(bounds[j + 1])
            rs: list[Reason] = []
            for ci, code in enumerate(CODES):
                s = float(msev[j, ci])
                if s < r.cuts[0]:
                    continue
                k = a + int(np.argmax(sev[code][a:b]))
                rs.append(_reason(code, s, k, f, r))
            rs.sort(key=lambda x: -x.severity)
            reasons[i] = tuple(rs)
            actions[i] = _actions(rs)
    batches = _batches(f, grades, reasons, actions, r)
    return FleetGrades(features=f, grade=tuple(grades), score=score, single_factor=single,
                       multi_factor=multi, reasons=tuple(reasons), actions=tuple(actions),
                       lane_score=lane_score, lane_grade=lane_grade, batches=batches,
                       warnings=tuple(history.warnings) + f.warnings)


def _actions(rs: list[Reason]) -> tuple[str, ...]:
    """Actions of the reasons, the most severe cause first, ties in :data:`ACTIONS` order."""
    order = list(ACTIONS)
    best: dict[str, float] = {}
    causes = [x for x in rs if x.code not in _SYMPTOMS]
    for x in causes or rs:
        keys = _CODE_ACTIONS.get(x.code, _SYMPTOM_ACTIONS)
        for rank, key in enumerate(keys):
            # later steps of one code's sequence come after its first step
            best[key] = max(best.get(key, -1.0), x.severity - 1e-3 * rank)
    if len(best) > 1:
        best.pop("watch", None)
    ranked = sorted(best, key=lambda k: (-round(best[k], 2), order.index(k)))
    return tuple(ACTIONS[k] for k in ranked)


def _batches(f: LaneFeatures, grades: list[str], reasons: list[tuple[Reason, ...]],
             actions: list[tuple[str, ...]], r: GradeRules) -> tuple[Mapping[str, Any], ...]:
    """Groups of >= batch_min degrading modules of one part number and serial lot."""
    mods = f.modules
    groups: dict[tuple[str, str], list[int]] = {}
    for i, g in enumerate(grades):
        if g not in ("needs-attention", "bad"):
            continue
        if not any(x.code in _INTRINSIC for x in reasons[i]):
            continue
        s = mods.serial[i]
        lot = s[: max(1, len(s) - r.lot_suffix)] if s else ""
        groups.setdefault((mods.part_number[i], lot), []).append(i)
    out: list[Mapping[str, Any]] = []
    for (part, lot), members in sorted(groups.items()):
        if len(members) < max(1, r.batch_min) or not part:
            continue
        text = f"{ACTIONS['rma']} (part {part}, serials {lot}*: {len(members)} modules degrade)"
        for i in members:
            actions[i] = (*actions[i], text)
        out.append({"part_number": part, "serial_prefix": lot, "modules": len(members),
                    "ports": [mods.key(i) for i in members]})
    return tuple(out)


def _reason(code: str, sev: float, k: int, f: LaneFeatures, r: GradeRules) -> Reason:
    """The evidence line and numbers of ``code`` on lane row ``k``."""
    v = f.values
    mods = f.modules
    i = int(f.module[k])
    lane = int(f.lane[k])
    now, d1, d3 = window_label(f.windows[0]), _label(f, DAY_NS), _label(f, 3 * DAY_NS)

    def g(name: str) -> float:
        return float(v[name][k])

    def th(col: str) -> float:
        return float(mods.thresholds[col][i])

    def level(m: str) -> float:
        x = g(f"{m}.level.{now}")
        return x if math.isfinite(x) else g(f"{m}.last")

    def margin_text(m: str, unit: str, side: str, what: str) -> tuple[str, dict[str, float]]:
        x, warn = level(m), th(f"{m}_{side}_warn")
        marg, sig = g(f"{m}.margin.{side}_warn"), g(f"{m}.margin_sigma.{side}_warn")
        where = "inside" if marg >= 0 else "beyond"
        text = (f"lane {lane}: {what} {x:.2f} {unit} (1 h median), {abs(marg):.2f} {unit} {where} "
                f"the {side} warning {warn:.2f} {unit} ({sig:+.1f} sigma of its "
                f"{g(f'{m}.noise'):.2f} {unit} noise)")
        vals = {"level": x, "warning": warn, "alarm": th(f"{m}_{side}_alarm"), "margin": marg,
                "margin_sigma": sig}
        eta = g(f"{m}.eta_days.{side}_warn")
        if math.isfinite(eta):
            text += f"; the 3-day trend {g(f'{m}.slope.{d3}'):+.3f} {unit}/day reaches it in " \
                    f"{eta:.1f} days"
            vals["eta_days"] = eta
        return text, vals

    if code == "rx-power-low-margin":
        text, vals = margin_text("rx_power_dbm", "dBm", "low", "rx")
    elif code == "tx-power-low-margin":
        text, vals = margin_text("tx_power_dbm", "dBm", "low", "tx")
    elif code == "bias-high":
        text, vals = margin_text("tx_bias_ma", "mA", "high", "bias")
    elif code == "vcc-out-of-range":
        side = "high" if g("vcc_v.margin.high_warn") < g("vcc_v.margin.low_warn") else "low"
        text, vals = margin_text("vcc_v", "V", side, "vcc")
    elif code == "bias-drift":
        rel, dma = g(f"bias.drift_rel.{d1}"), g(f"bias.drift_ma.{d1}")
        base = g("tx_bias_ma.baseline")
        dtx = g(f"tx_power_dbm.level.{d1}") - g("tx_power_dbm.baseline")
        text = (f"lane {lane}: bias {g(f'tx_bias_ma.level.{d1}'):.2f} mA over the last day, "
                f"{dma:+.2f} mA ({rel:+.0%}) above what its temperature predicts from the first "
                f"days (baseline {base:.2f} mA); tx power moved {dtx:+.2f} dB, tx per bias "
                f"{g('tx.efficiency_change_db'):+.2f} dB: the laser is aging")
        vals = {"drift_ma": dma, "drift_rel": rel, "baseline_ma": base, "tx_change_db": dtx,
                "efficiency_change_db": g("tx.efficiency_change_db")}
    elif code == "tx-power-fading":
        base, x = g("tx_power_dbm.baseline"), g(f"tx_power_dbm.level.{d1}")
        text = (f"lane {lane}: tx {x:.2f} dBm over the last day, {base - x:.2f} dB below its "
                f"baseline {base:.2f} dBm (3-day slope {g(f'tx_power_dbm.slope.{d3}'):+.3f} "
                f"dB/day); bias drift {g(f'bias.drift_rel.{d1}'):+.0%}")
        vals = {"level_dbm": x, "baseline_dbm": base, "drop_db": base - x,
                "slope_db_day": g(f"tx_power_dbm.slope.{d3}")}
    elif code == "connector-loss":
        chg, loss, ptx = (g("link.loss_in_change_db"), g("link.loss_in_db"),
                          g("link.peer_tx_change_db"))
        text = (f"lane {lane}: loss of the link into this port up {chg:.2f} dB to {loss:.2f} dB "
                f"while the far transmitter moved only {ptx:+.2f} dB: a dirty connector or a "
                f"damaged fiber, not a laser (CorrOpt)")
        vals = {"loss_change_db": chg, "loss_db": loss, "peer_tx_change_db": ptx}
    elif code == "lane-imbalance":
        rx, tx = g("rx_power_dbm.lane_dev_change"), g("tx_power_dbm.lane_dev_change")
        m, x = ("rx", rx) if np.nan_to_num(-rx) >= np.nan_to_num(-tx) else ("tx", tx)
        dev = g(f"{m}_power_dbm.lane_dev")
        text = (f"lane {lane}: {m} power {dev:+.2f} dB from the module's median lane, "
                f"{x:+.2f} dB since the baseline")
        vals = {"lane_dev_db": dev, "lane_dev_change_db": x}
    elif code in ("thermal", "switch-airflow"):
        t, warn = level("temperature_c"), th("temperature_c_high_warn")
        zt, rise = g("temperature_c.pop_z"), g("temperature_c.rise")
        vals = {"temperature_c": t, "high_warn_c": warn, "pop_z": zt, "rise_c": rise}
        if code == "thermal":
            text = (f"temperature {t:.1f} C, {warn - t:.1f} C below the high warning {warn:.1f} C, "
                    f"z {zt:+.1f} against the {mods.part_number[i] or 'same-part'} population; "
                    f"up {rise:+.1f} C since the baseline")
        else:
            w, nd = g("device.warming"), g("device.modules")
            text = (f"temperature up {rise:.1f} C since the baseline to {t:.1f} C, like {w:.0f} "
                    f"of {nd:.0f} modules on {mods.device[i]}: the switch's airflow, not this "
                    f"module")
            vals.update(warming_modules=w, device_modules=nd)
    elif code == "fec-margin":
        ber = 10 ** -g("ber.fec_margin_dec") * KP4_BER_LIMIT
        unc = g(f"fec_unc.rate.{d1}")
        text = (f"pre-FEC BER {ber:.2e}: {g('ber.fec_margin_dec'):.2f} decades below the "
                f"RS(544,514) limit {KP4_BER_LIMIT:.1e}")
        if math.isfinite(unc) and unc > 0:
            text += f"; {unc:.1f} uncorrectable codewords per hour"
        vals = {"pre_fec_ber": ber, "margin_decades": g("ber.fec_margin_dec"),
                "uncorrectable_per_hour": unc}
    elif code == "fec-rising":
        s, t = g(f"ber.slope.{d3}"), g(f"ber.slope_t.{d3}")
        ber = 10 ** g(f"ber.log_level.{d1}")
        text = f"pre-FEC BER rising {s:+.2f} decades/day over 3 days (t {t:.1f}), now {ber:.2e}"
        vals = {"slope_dec_day": s, "slope_t": t, "pre_fec_ber": ber}
    elif code == "crc-rising":
        lab7 = window_label(f.windows[-1])
        c1, c7 = g(f"crc.rate.{d1}"), g(f"crc.rate.{lab7}")
        text = f"CRC errors {c1:.1f}/h over the last day vs {c7:.1f}/h over {lab7}"
        vals = {"rate_1d_per_hour": c1, "rate_per_hour": c7}
    else:  # population-outlier
        zs = {m: g(f"{m}.pop_z") for m in ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")}
        m = max(zs, key=lambda key: abs(np.nan_to_num(zs[key])))
        text = (f"lane {lane}: {m} {g(f'{m}.level.{d1}'):.2f} is {zs[m]:+.1f} robust sigmas from "
                f"the median of {mods.part_number[i] or 'same-part'} lanes")
        vals = {"metric_z": zs[m], **{f"{key}_z": val for key, val in zs.items()}}
    return Reason(code=code, severity=sev, lane=lane, evidence=text, values=vals)


def threshold_alarms(history: FleetHistory, *, at_ns: int) -> BoolA:
    """Plain vendor threshold alarms per module: any metric of any lane beyond a warning now.

    "Now" is each lane's last sample at or before ``at_ns``; thresholds are the module's own,
    filled like grading's. The baseline a learned predictor must beat (issue 12).
    """
    mods = filled_modules(history.modules)
    out = np.zeros(len(mods), dtype=bool)
    starts, ends = lane_runs(history)
    if starts.size == 0:
        return out
    g1 = first_after(history.ts, starts, ends, int(at_ns))
    last = (g1 - 1)[g1 > starts]
    mod = history.module[last].astype(np.int64)
    for m in METRICS:
        x = history.metrics[m][last].astype(np.float64)
        hi = np.asarray(mods.thresholds[f"{m}_high_warn"])[mod]
        lo = np.asarray(mods.thresholds[f"{m}_low_warn"])[mod]
        with np.errstate(invalid="ignore"):
            bad = (x > hi) | (x < lo)
        out[mod[bad]] = True
    return out


def single_factor_flags(
    history: FleetHistory,
    *,
    at_ns: int,
    peers: Mapping[str, str] | None = None,
    features: LaneFeatures | None = None,
    level: str = "needs-attention",
    rules: GradeRules | None = None,
) -> BoolA:
    """Modules whose single-factor score alone reaches ``level`` (the second baseline).

    Single factor: margins to the module's thresholds, their trends, the FEC margin; no
    physics features (drift, link loss, population, co-degradation).
    """
    r = rules or GradeRules()
    if level not in GRADES[1:]:
        raise ConfigError(f"optics single-factor flags: level: one of {GRADES[1:]}, got {level!r}")
    gr = grade_fleet(history, at_ns=at_ns, peers=peers, features=features, rules=r)
    cut = r.cuts[GRADES.index(level) - 1]
    return np.nan_to_num(gr.single_factor, nan=0.0) >= cut
