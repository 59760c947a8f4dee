"""Learned prediction of optical-module failures within a horizon, calibrated, with a threshold.

The model is gradient-boosted trees (LightGBM, binary objective; docs/design/optics-prediction.md
says why LightGBM) over the module-level time-series features of
:mod:`fabricscope.optics.features` (worst / mean lane of every margin, trend, drift, link-loss,
population and counter feature) plus the grading scores of :mod:`fabricscope.optics.grade`, at
daily evaluation times. Labels come from a failure-labels table (an RMA / ticket export): an
example ``(module, t)`` is positive when the module fails in ``(t, t + horizon]``.

* **Time-based splits.** Per training fleet, the earliest 60 % of the evaluation times train,
  the next 20 % stop the boosting early, the last 20 % calibrate and choose the threshold (never
  a random split: neighbouring days of one module are near-duplicates, and a deployed model
  always predicts the future from the past).
* **Calibration.** Isotonic regression (``scipy.optimize.isotonic_regression``, the pool
  adjacent violators algorithm; Zadrozny & Elkan, KDD'02) of the labels on the raw score over
  the calibration block, stored as a step function: ``risk`` is then an estimate of the
  probability of failure within the horizon, whatever class weights training used.
* **Threshold.** The calibrated risk at which ``predicted_failure`` turns on maximizes, on the
  calibration block, the module-level F1 of the rule "fails within the horizon, flagged at
  least a day ahead" (:func:`episode_scores`, the benchmark's own scorer).
* **Link pairs.** After scoring, a module whose receive-side evidence the far end of its link
  explains gets a low risk (:func:`pair_attribution`): one fault, one end flagged.

The model file is JSON holding LightGBM's text model format (no pickle: a model file is data,
never code). Pure: numpy, scipy, lightgbm; time is a parameter (``at_ns``).
"""

from __future__ import annotations

import functools
import importlib.resources
import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import lightgbm as lgb
import numpy as np
import numpy.typing as npt
from scipy.optimize import isotonic_regression

from fabricscope.model.errors import ConfigError
from fabricscope.optics.catalog import GENERIC, PART_CLASSES, part_class
from fabricscope.optics.features import (
    DAY_NS,
    HOUR_NS,
    LaneFeatures,
    ModuleFeatures,
    feature_series,
    module_features,
    window_label,
)
from fabricscope.optics.grade import GRADES, FleetGrades, grade_fleet
from fabricscope.optics.history import METRICS, FleetHistory
from fabricscope.optics.readers.table import Labels

__all__ = [
    "DEFAULT_HORIZON_NS",
    "MODEL_FORMAT",
    "NO_FAILURE",
    "PAIR_EXPLAINED_RISK",
    "EpisodeScores",
    "Examples",
    "FleetPredictions",
    "Model",
    "ModulePrediction",
    "default_model",
    "episode_scores",
    "eval_times",
    "failure_times",
    "feature_series",
    "model_inputs",
    "pair_attribution",
    "peer_rows",
    "predict_fleet",
    "train",
    "training_examples",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

DEFAULT_HORIZON_NS = 7 * DAY_NS
MODEL_FORMAT = "fabricscope-optics-model"
MODEL_VERSION = 1
#: failure time of a module that never fails
NO_FAILURE = np.iinfo(np.int64).max
#: candidate feature names left out of the model: the history's length says nothing of health
_EXCLUDED_PREFIXES = ("data.span_hours",)
#: health columns of the far-end module given to the model (``peer.`` / ``peer_diff.``)
_PEER_COLUMNS = ("rx_power_dbm.margin.low_alarm.min", "rx_power_dbm.margin.low_warn.min",
                 "rx_power_dbm.slope.3d.min", "rx_power_dbm.lane_dev_change.min",
                 "ber.fec_margin_dec.min", "ber.slope.3d.max", "link.loss_in_change_db.max",
                 "grade.score", "tx_power_dbm.margin.low_alarm.min",
                 "tx_bias_ma.margin.high_alarm.max", "bias.drift_rel.3d.max")
#: module columns compared with the median of the modules on the same switch
_DEVICE_COLUMNS = ("temperature_c.margin.high_alarm.min", "temperature_c.level.1d.max")
_PART_CLASSES: tuple[str, ...] = (*(pc.name for pc in PART_CLASSES), GENERIC.name)
_REPLACE_ACTION = "replace the module at the next maintenance window"
_WATCH = "no action now: watch the trend"
_FAR_END_REASON: Mapping[str, Any] = {
    "code": "link.far_end_cause", "severity": 0.0, "lane": None,
    "evidence": "the far end of the link explains this module's receive-side evidence (its "
                "laser's power fell, or its own direction lost more light): risk lowered"}
_ETA_MAX_DAYS = 90.0
_TREND_T = 3.0
_DEFAULT_PARAMS: Mapping[str, Any] = {
    "objective": "binary", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 40,
    "feature_fraction": 0.5, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
    "max_bin": 127, "metric": "average_precision", "verbose": -1, "num_threads": 1,
    "deterministic": True, "force_col_wise": True, "bin_construct_sample_cnt": 50_000,
}
_MAX_ROUNDS = 500
_EARLY_STOP = 40
#: link-pair attribution (:func:`pair_attribution`): the far transmitter fell at least this
#: much (dB, worst lane) ...
_PAIR_FAR_TX_DB = 1.0
#: ... and this end's incoming-loss change is at most this share of that fall
_PAIR_LOSS_SHARE = 0.5
#: both directions of the link lost at least this much (dB) ...
_PAIR_MIN_LOSS_DB = 0.5
#: ... and the far end's incoming direction lost at least this factor more than ours
_PAIR_LOSS_RATIO = 1.15
#: this end's own laser: a 3-day relative bias drift above this is evidence of its own
_PAIR_OWN_BIAS_DRIFT = 0.1
#: risk of a module whose evidence the far end explains (on the development fleets 105-107,
#: none of the 76 (module, time) examples the rule demoted failed within 7 days)
PAIR_EXPLAINED_RISK = 0.05


# ------------------------------------------------------------------------- model inputs
def model_inputs(features: LaneFeatures, grades: FleetGrades | None = None,
                 peers: Mapping[str, str] | None = None
                 ) -> tuple[ModuleFeatures, dict[str, F64]]:
    """Candidate model columns per module with data: module features, grading scores, identity.

    Returns the :class:`ModuleFeatures` (its ``module`` says which module each row is) and
    ``name -> column``. ``module.part_class`` is the catalog part class as a category code
    (LightGBM's categorical split), ``module.lanes`` the lane count. With ``peers`` (the
    cabling), ``peer.<c>`` / ``peer_diff.<c>`` give a few health columns of the module at the
    far end and this module's minus the far end's: a degrading link shows at both ends, and the
    end that fails is the one closer to its alarm (CorrOpt's two-ended view).
    """
    mf = module_features(features)
    cols = {k: np.asarray(v, dtype=np.float64) for k, v in mf.values.items()
            if not k.startswith(_EXCLUDED_PREFIXES)}
    mods = features.modules
    idx = mf.module.astype(np.int64)
    if grades is not None:
        cols["grade.score"] = np.asarray(grades.score, dtype=np.float64)[idx]
        cols["grade.single_factor"] = np.asarray(grades.single_factor, dtype=np.float64)[idx]
        cols["grade.multi_factor"] = np.asarray(grades.multi_factor, dtype=np.float64)[idx]
    codes = {name: float(k) for k, name in enumerate(_PART_CLASSES)}
    cls = np.array([codes[part_class(mods.media[i], mods.part_number[i]).name]
                    for i in idx.tolist()], dtype=np.float64)
    cols["module.part_class"] = cls
    cols["module.lanes"] = mf.lanes.astype(np.float64)
    if len(features):
        # time to the alarm crossing from the 3-day and the 1-day trend (soonest lane), so
        # that the model can tell "fails within the horizon" from "degrading, fails later"
        for w in (3 * DAY_NS, DAY_NS):
            cols[f"eta.alarm_days.{window_label(w)}"] = _eta(features, window_ns=w)[idx]
    nan = np.full(idx.size, np.nan)
    # this module against its switch: a failing airflow warms every module of a switch, the
    # module that fails is the one running hotter than its neighbours
    dev = np.array([mods.device[i] for i in idx.tolist()], dtype=object)
    if idx.size:
        _, dcode = np.unique(dev, return_inverse=True)
        order = np.argsort(dcode, kind="stable")
        cuts = np.flatnonzero(np.diff(dcode[order])) + 1
        for c in _DEVICE_COLUMNS:
            own = cols.get(c)
            if own is None:
                continue
            med = np.full(idx.size, np.nan)
            for grp in np.split(order, cuts):
                v = own[grp]
                fin = v[np.isfinite(v)]
                if fin.size:
                    med[grp] = np.median(fin)
            cols[f"device_diff.{c}"] = own - med
    lin = cols.get("link.loss_in_change_db.max", nan)
    lout = cols.get("link.loss_out_change_db.max", nan)
    # which direction of the link lost more (this end's receive side minus its transmit side)
    cols["link.dir_asym_change_db"] = lin - lout
    prow = peer_rows(mf, peers)
    ok = prow >= 0
    peer_cols = (*_PEER_COLUMNS, "link.dir_asym_change_db", "eta.alarm_days.3d")
    for c in peer_cols:
        own = cols.get(c)
        pv = np.full(idx.size, np.nan)
        if own is not None:
            pv[ok] = own[prow[ok]]
        cols[f"peer.{c}"] = pv
        cols[f"peer_diff.{c}"] = (own if own is not None else np.full(idx.size, np.nan)) - pv
    return mf, cols


def peer_rows(mf: ModuleFeatures, peers: Mapping[str, str] | None) -> I64:
    """For each row of ``mf`` (a module with data), the row of its far-end module in ``mf``
    (``-1``: no cabling entry, or the far end has no data). ``peers`` is the inventory's
    cabling, ``device:port -> device:port``."""
    mods = mf.modules
    idx = mf.module.astype(np.int64)
    prow = np.full(idx.size, -1, dtype=np.int64)
    if not peers:
        return prow
    row = np.full(len(mods), -1, dtype=np.int64)
    row[idx] = np.arange(idx.size)
    index = {mods.key(i): i for i in range(len(mods))}
    for k, i in enumerate(idx.tolist()):
        j = index.get(peers.get(mods.key(i), ""), -1)
        prow[k] = row[j] if j >= 0 else -1
    return prow


def pair_attribution(risk: F64, cols: Mapping[str, F64], prow: I64) -> tuple[F64, BoolA]:
    """Decide which end of a link is the cause when the evidence shows at both ends.

    One fault is seen at both ends of a link: the far laser's falling power is this end's
    falling receive power, and a dirty mating pair or a damaged fiber loses light in both
    directions (the far end's side more when the far end is the one failing). Per module with
    a far end (``prow``, :func:`peer_rows`), the evidence is *explained by the far end*, and
    the module's risk is lowered to :data:`PAIR_EXPLAINED_RISK`, when

    * its own laser shows nothing (3-day relative bias drift <= 0.1), the far end has data and
      its risk is at least this module's, and
    * either the far transmitter fell >= 1 dB (``link.peer_tx_change_db.min``) while this
      end's incoming-loss change (``link.loss_in_change_db.max``) is at most half of that fall
      (the received power fell because less light was sent, not because the link lost it),
    * or both directions lost >= 0.5 dB and the far end's incoming direction lost >= 1.15x
      this end's (a two-way loss: the end that lost more reaches its alarm first).

    This is CorrOpt's per-direction view of a link (Zhuo et al., "Understanding and Mitigating
    Packet Corruption in Data Center Networks", SIGCOMM 2017: corruption is mostly one
    direction of a link, and the optical power at its two ends points at the part to repair),
    applied after scoring. Inputs are the fleet's own data (history and cabling); nothing is learned.
    Returns the adjusted risks and which rows were explained.
    """
    r = np.asarray(risk, dtype=np.float64)
    n = r.shape[0]
    nan = np.full(n, np.nan)
    la = np.asarray(cols.get("link.loss_in_change_db.max", nan), dtype=np.float64)
    lb = np.asarray(cols.get("peer.link.loss_in_change_db.max", nan), dtype=np.float64)
    ptx = np.asarray(cols.get("link.peer_tx_change_db.min", nan), dtype=np.float64)
    own = np.asarray(cols.get("bias.drift_rel.3d.max", nan), dtype=np.float64)
    has = prow >= 0
    rb = np.full(n, np.nan)
    rb[has] = r[prow[has]]
    with np.errstate(invalid="ignore"):
        own_ok = ~(own > _PAIR_OWN_BIAS_DRIFT)
        peer_ok = has & ~(rb < r)
        far_laser = (ptx <= -_PAIR_FAR_TX_DB) & ~(la > _PAIR_LOSS_SHARE * -ptx)
        other_side = (la >= _PAIR_MIN_LOSS_DB) & (lb >= _PAIR_LOSS_RATIO * la)
        explained = own_ok & peer_ok & (far_laser | other_side) & (r > PAIR_EXPLAINED_RISK)
    out = np.where(explained, PAIR_EXPLAINED_RISK, r)
    return out, explained


def _matrix(cols: Mapping[str, F64], names: Sequence[str], n: int) -> npt.NDArray[np.float32]:
    nan = np.full(n, np.nan)
    return np.stack([cols.get(c, nan) for c in names], axis=1).astype(np.float32) if names \
        else np.zeros((n, 0), dtype=np.float32)


# ------------------------------------------------------------------------ labels, examples
def failure_times(modules: Any, labels: Labels) -> tuple[I64, list[str]]:
    """Failure time per module row (``NO_FAILURE`` where none), matched by device + port, else
    by serial; labels naming no module of the table are returned as warning lines."""
    n = len(modules)
    out = np.full(n, NO_FAILURE, dtype=np.int64)
    by_port = {(d, p): i for i, (d, p) in enumerate(zip(modules.device, modules.port,
                                                        strict=True))}
    by_serial = {s: i for i, s in enumerate(modules.serial) if s}
    warnings: list[str] = []
    for k in range(len(labels)):
        i = by_port.get((labels.device[k], labels.port[k]))
        if i is None:
            i = by_serial.get(labels.serial[k])
        if i is None:
            warnings.append(f"optics labels: record {k + 1}: device/port/serial: "
                            f"{labels.device[k]}:{labels.port[k]} / {labels.serial[k]!r}: "
                            "no such module in the history: ignored")
            continue
        out[i] = min(int(out[i]), int(labels.failure_ts[k]))
    return out, warnings


def eval_times(history: FleetHistory, *, every_ns: int = DAY_NS,
               min_history_ns: int = 3 * DAY_NS, end_ns: int | None = None,
               offset_ns: int = 0) -> list[int]:
    """Evaluation times: multiples of ``every_ns`` (00:00 UTC daily) plus ``offset_ns`` (whole
    hours, below ``every_ns``) from the first sample + ``min_history_ns`` to ``end_ns``
    (default: the last sample)."""
    if every_ns <= 0 or every_ns % HOUR_NS:
        raise ConfigError(f"optics predict: eval_every_ns: must be whole hours > 0, "
                          f"got {every_ns}")
    if not 0 <= offset_ns < every_ns or offset_ns % HOUR_NS:
        raise ConfigError(f"optics predict: eval_offset_ns: must be whole hours below "
                          f"eval_every_ns, got {offset_ns}")
    if len(history) == 0:
        return []
    first = int(history.ts.min()) + int(min_history_ns) - offset_ns
    last = int(history.ts.max()) if end_ns is None else int(end_ns)
    t = -(-first // every_ns) * every_ns + offset_ns
    return list(range(t, last + 1, every_ns))


class Examples(NamedTuple):
    """Training examples of one fleet: rows are (module, evaluation time).

    ``X`` (float32, columns ``names``), ``y`` (1: fails within the horizon), ``groups`` (the
    module row), ``times`` (the evaluation time, ns), ``fail_ts`` (the module's labelled
    failure time, :data:`NO_FAILURE` if none: the threshold is chosen on episodes).
    """

    X: npt.NDArray[np.float32]
    y: npt.NDArray[np.int8]
    groups: I64
    times: I64
    names: tuple[str, ...]
    fail_ts: I64


def training_examples(
    history: FleetHistory,
    labels: Labels,
    *,
    horizon_ns: int = DEFAULT_HORIZON_NS,
    eval_every_ns: int = DAY_NS,
    min_history_ns: int = 3 * DAY_NS,
    peers: Mapping[str, str] | None = None,
    label_end_ns: int | None = None,
    eval_offset_ns: int = 0,
) -> Examples:
    """Module-level features at each evaluation time with the label "fails in (t, t + horizon]".

    Only data at or before ``t`` enters the features of time ``t``. Modules already failed at
    ``t`` are left out, and so are times whose horizon reaches past ``label_end_ns`` (default:
    the last sample): a module that has not failed by the end of the labels may still fail
    within the horizon (right censoring), so such negatives are not known.
    """
    if horizon_ns <= 0:
        raise ConfigError(f"optics predict: horizon_ns: must be > 0, got {horizon_ns}")
    end = int(history.ts.max()) if label_end_ns is None and len(history) else label_end_ns
    fail, _ = failure_times(history.modules, labels)
    times = [t for t in eval_times(history, every_ns=eval_every_ns,
                                   min_history_ns=min_history_ns, offset_ns=eval_offset_ns)
             if end is not None and t + horizon_ns <= end]
    xs, ys, gs, tt, ff = [], [], [], [], []
    names: tuple[str, ...] = ()
    for f in feature_series(history, times, peers=peers):
        gr = grade_fleet(history, at_ns=f.at_ns, peers=peers, features=f)
        mf, cols = model_inputs(f, gr, peers)
        if not names:
            names = tuple(sorted(cols))
        idx = mf.module.astype(np.int64)
        t = f.at_ns
        alive = fail[idx] > t
        x = _matrix(cols, names, idx.shape[0])[alive]
        y = (fail[idx][alive] <= t + horizon_ns).astype(np.int8)
        xs.append(x)
        ys.append(y)
        gs.append(idx[alive])
        tt.append(np.full(y.shape[0], t, dtype=np.int64))
        ff.append(fail[idx][alive])
    if not xs:
        raise ConfigError("optics predict: no training example: the history is shorter than "
                          f"min_history + horizon ({(min_history_ns + horizon_ns) / DAY_NS:g} "
                          "days)")
    return Examples(np.concatenate(xs), np.concatenate(ys), np.concatenate(gs),
                    np.concatenate(tt), names, np.concatenate(ff))


# ----------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class EpisodeScores:
    """Module-level scores of flags at evaluation times (see :func:`episode_scores`)."""

    tp: int
    fp: int
    fn: int
    precision: float
    recall: float
    f1: float
    false_flags: int
    module_days: float
    false_alarms_per_1000_per_day: float
    lead_days: tuple[float, ...]

    @property
    def median_lead_days(self) -> float:
        return float(np.median(self.lead_days)) if self.lead_days else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "precision": _r(self.precision),
                "recall": _r(self.recall), "f1": _r(self.f1), "false_flags": self.false_flags,
                "module_days": round(self.module_days, 1),
                "false_alarms_per_1000_modules_per_day": _r(self.false_alarms_per_1000_per_day),
                "median_lead_days": _r(self.median_lead_days)}


def _r(v: float) -> float | None:
    return round(float(v), 4) if math.isfinite(v) else None


def episode_scores(
    times: Sequence[int] | I64,
    flags: BoolA,
    fail_ts: I64,
    *,
    horizon_ns: int = DEFAULT_HORIZON_NS,
    min_lead_ns: int = DAY_NS,
    evaluated: BoolA | None = None,
    include: BoolA | None = None,
) -> EpisodeScores:
    """Score ``flags[e, m]`` (module ``m`` flagged at ``times[e]``) against failure times.

    The rule "fails within the horizon, flagged at least ``min_lead`` ahead": a failing module
    (``fail_ts[m] = T``) with an evaluated time in ``[T - horizon, T - min_lead]`` is a
    positive; it is a true positive if flagged at one of those times (lead: ``T`` minus the
    first such flag), else a false negative. A flag at ``t`` on a module that does not fail in
    ``(t, t + horizon]`` is false; each run of consecutive false flags of one module counts one
    false positive, and every false flag counts towards the false alarms per 1,000 modules per
    day. Flags in the last ``min_lead`` before a failure are neither. ``evaluated`` (default:
    not yet failed) masks (time, module) pairs out; ``include`` masks modules out entirely.
    """
    t = np.asarray(times, dtype=np.int64)
    fl = np.asarray(flags, dtype=bool)
    ne, nm = fl.shape
    if t.shape[0] != ne or fail_ts.shape[0] != nm:
        raise ConfigError(f"optics scores: shapes: times {t.shape}, flags {fl.shape}, "
                          f"fail_ts {fail_ts.shape} do not agree")
    ev = (fail_ts[None, :] > t[:, None]) if evaluated is None else np.asarray(evaluated, bool)
    if include is not None:
        ev = ev & np.asarray(include, bool)[None, :]
    fl = fl & ev
    T = fail_ts[None, :].astype(np.float64)
    tt = t[:, None].astype(np.float64)
    fails = fail_ts != NO_FAILURE
    window = fails[None, :] & (tt >= T - horizon_ns) & (tt <= T - min_lead_ns) & ev
    within = fails[None, :] & (tt < T) & (tt + horizon_ns >= T)
    false = fl & ~within
    good = fl & window
    positive = window.any(axis=0)
    hit = good.any(axis=0)
    tp = int((positive & hit).sum())
    fn = int((positive & ~hit).sum())
    starts = false.copy()
    starts[1:] &= ~false[:-1]
    fp = int(starts.sum())
    first = np.argmax(good, axis=0)
    lead = (fail_ts - t[first]) / DAY_NS
    leads = tuple(float(x) for x in lead[positive & hit])
    step = float(np.median(np.diff(t))) / DAY_NS if ne > 1 else 1.0
    mdays = float(ev.sum()) * step
    nf = int(false.sum())
    prec = tp / (tp + fp) if tp + fp else math.nan
    rec = tp / (tp + fn) if tp + fn else math.nan
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else math.nan
    return EpisodeScores(tp, fp, fn, prec, rec, f1, nf, mdays,
                         1000.0 * nf / mdays if mdays else math.nan, leads)


# ------------------------------------------------------------------------------ model
@dataclass(frozen=True)
class Model:
    """A trained failure predictor: LightGBM text model + isotonic calibration + threshold.

    ``calibration_x`` / ``calibration_y``: the isotonic step function, ``risk = y[k]`` for the
    last knot ``x[k] <= raw score`` (``y[0]`` below the first). ``threshold``: calibrated risk
    at which a module is flagged. ``categorical``: names of categorical columns.
    """

    booster_text: str
    feature_names: tuple[str, ...]
    calibration_x: tuple[float, ...]
    calibration_y: tuple[float, ...]
    threshold: float
    horizon_ns: int = DEFAULT_HORIZON_NS
    categorical: tuple[str, ...] = ("module.part_class",)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def booster(self) -> lgb.Booster:
        return lgb.Booster(model_str=self.booster_text)

    def raw_score(self, X: npt.ArrayLike) -> F64:
        """The booster's probability (before calibration) of each row of ``X``."""
        x = np.asarray(X, dtype=np.float64)
        if x.shape[0] == 0:
            return np.zeros(0)
        out: F64 = np.asarray(self.booster.predict(x, num_threads=2), dtype=np.float64)
        return out

    def calibrate(self, raw: F64) -> F64:
        """Calibrated risk of raw scores (the isotonic step function), in [0, 1]."""
        kx = np.asarray(self.calibration_x)
        ky = np.asarray(self.calibration_y)
        if kx.size == 0:
            return np.clip(raw, 0.0, 1.0)
        k = np.clip(np.searchsorted(kx, raw, side="right") - 1, 0, kx.size - 1)
        out: F64 = np.clip(ky[k], 0.0, 1.0)
        return out

    def risk(self, X: npt.ArrayLike) -> F64:
        """Calibrated probability of failure within the horizon per row of ``X``."""
        return self.calibrate(self.raw_score(X))

    def to_json(self) -> dict[str, Any]:
        return {"format": MODEL_FORMAT, "version": MODEL_VERSION,
                "horizon_ns": int(self.horizon_ns), "threshold": float(self.threshold),
                "feature_names": list(self.feature_names), "categorical": list(self.categorical),
                "part_classes": list(_PART_CLASSES),
                "calibration": {"x": list(self.calibration_x), "y": list(self.calibration_y)},
                "metadata": dict(self.metadata), "lightgbm_model": self.booster_text}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model as JSON (the LightGBM text model inside; never pickle)."""
        p = os.fspath(path)
        try:
            with open(p, "w", encoding="utf-8") as fh:
                json.dump(self.to_json(), fh, separators=(",", ":"))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot write the optics model: {exc.strerror}") from exc

    @classmethod
    def from_json(cls, d: object, where: str) -> Model:
        """A model from its JSON object; :class:`ConfigError` naming ``where`` if it is not one."""
        if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
            raise ConfigError(f"{where}: not a fabricscope optics model (no \"format\": "
                              f"\"{MODEL_FORMAT}\")")
        if d.get("version") != MODEL_VERSION:
            raise ConfigError(f"{where}: version: {d.get('version')!r}: this fabricscope reads "
                              f"optics model version {MODEL_VERSION}")
        try:
            cal = d["calibration"]
            names = tuple(str(x) for x in d["feature_names"])
            cx = tuple(float(x) for x in cal["x"])
            cy = tuple(float(x) for x in cal["y"])
            thr = float(d["threshold"])
            hor = int(d["horizon_ns"])
            text = d["lightgbm_model"]
            cat = tuple(str(x) for x in d.get("categorical", ()))
            meta = d.get("metadata", {})
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: optics model: field {exc}: missing or wrong type") \
                from None
        if tuple(d.get("part_classes", _PART_CLASSES)) != _PART_CLASSES:
            raise ConfigError(f"{where}: part_classes: the model's part-class codes differ from "
                              "this fabricscope's catalog: retrain the model")
        if not isinstance(text, str) or not text.startswith("tree"):
            raise ConfigError(f"{where}: lightgbm_model: not a LightGBM text model")
        if len(cx) != len(cy) or any(b < a for a, b in itertools.pairwise(cx)) or \
                any(b < a for a, b in itertools.pairwise(cy)):
            raise ConfigError(f"{where}: calibration: x and y must be rising and of equal length")
        if not 0.0 <= thr <= 1.0 or hor <= 0:
            raise ConfigError(f"{where}: threshold {thr!r} / horizon_ns {hor!r}: out of range")
        model = cls(booster_text=text, feature_names=names, calibration_x=cx, calibration_y=cy,
                    threshold=thr, horizon_ns=hor, categorical=cat,
                    metadata=meta if isinstance(meta, dict) else {})
        try:
            nf = model.booster.num_feature()
        except lgb.basic.LightGBMError as exc:
            raise ConfigError(f"{where}: lightgbm_model: {str(exc).splitlines()[0]}") from None
        if nf != len(names):
            raise ConfigError(f"{where}: feature_names: {len(names)} names for a booster of "
                              f"{nf} features")
        return model

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Model:
        """Read a model written by :meth:`save`; a bad or foreign file is a :class:`ConfigError`."""
        p = os.fspath(path)
        try:
            with open(p, encoding="utf-8") as fh:
                d = json.load(fh)
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the optics model: {exc.strerror}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: not a JSON optics model: {exc}") from None
        return cls.from_json(d, p)


@functools.lru_cache(maxsize=1)
def default_model() -> Model:
    """The shipped model (``model_default.json``, package data; scripts/train_optics_model.py)."""
    res = importlib.resources.files("fabricscope.optics").joinpath("model_default.json")
    where = "fabricscope.optics/model_default.json"
    try:
        d = json.loads(res.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: the shipped optics model cannot be read: {exc}") from None
    return Model.from_json(d, where)


def _split_blocks(times: I64, fractions: tuple[float, float]) -> npt.NDArray[np.int8]:
    """0 (train), 1 (early stopping), 2 (calibration) per row, by the rank of its time."""
    uniq = np.unique(times)
    n = uniq.shape[0]
    a = max(1, round(fractions[0] * n))
    b = max(a + 1, round((fractions[0] + fractions[1]) * n))
    rank = np.searchsorted(uniq, times)
    return np.where(rank < a, 0, np.where(rank < b, 1, 2)).astype(np.int8)


def _choose_threshold(risk_by_block: Sequence[tuple[I64, F64, I64, I64]], horizon_ns: int
                      ) -> tuple[float, float]:
    """The calibrated risk maximizing the episode F1 over the calibration blocks of all fleets.

    Each block is ``(times, risk, groups, fail_ts_of_groups)`` rows; returns (threshold, F1).
    """
    cands = np.unique(np.concatenate([r for _, r, _, _ in risk_by_block]))
    cands = cands[cands > 0]
    if cands.size > 200:
        cands = np.unique(np.quantile(cands, np.linspace(0, 1, 200)))
    best = (1.0, -1.0)
    mats = []
    for t, r, g, ft in risk_by_block:
        ut, ti = np.unique(t, return_inverse=True)
        um, mi = np.unique(g, return_inverse=True)
        risk = np.full((ut.size, um.size), -1.0)
        risk[ti, mi] = r
        fail = np.full(um.size, NO_FAILURE, dtype=np.int64)
        fail[mi] = ft
        ev = risk >= 0
        mats.append((ut, risk, fail, ev))
    for c in cands.tolist():
        tp = fp = fn = 0
        for ut, risk, fail, ev in mats:
            s = episode_scores(ut, risk >= c, fail, horizon_ns=horizon_ns, evaluated=ev)
            tp, fp, fn = tp + s.tp, fp + s.fp, fn + s.fn
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
        if f1 > best[1]:
            best = (float(c), f1)
    return best


def train(
    examples: Sequence[Examples],
    *,
    seed: int = 0,
    params: Mapping[str, Any] | None = None,
    horizon_ns: int = DEFAULT_HORIZON_NS,
    blocks: tuple[float, float] = (0.6, 0.2),
    metadata: Mapping[str, Any] | None = None,
    validation: Sequence[Examples] = (),
    calibration: Sequence[Examples] = (),
) -> Model:
    """Train, calibrate and threshold a :class:`Model` on examples of one or more fleets.

    Per fleet, rows are split by evaluation time (``blocks``: the earliest 60 % train, the next
    20 % stop boosting early, the rest calibrate). The booster (LightGBM, binary objective,
    ``scale_pos_weight`` = negatives / positives: the rare class weighs as much as the common)
    is fit on the train block with early stopping on the second, then refit on both with that
    many rounds; isotonic regression on the calibration block maps its score to a probability,
    and the threshold maximizes the episode F1 there. ``params`` override LightGBM's.

    With ``validation`` and ``calibration`` fleets (whole fleets, all their times), the split is
    by fleet instead: every row of ``examples`` trains, ``validation`` stops the boosting early
    (no refit), ``calibration`` fits the isotonic map on all its rows and chooses the
    threshold on its rows at 00:00 UTC (the daily protocol the benchmark scores first). Fleets unlike
    the training ones then set the threshold, as the fleets a model is deployed on will be.
    """
    if not examples:
        raise ConfigError("optics train: no examples")
    names = examples[0].names
    for ex in (*examples[1:], *validation, *calibration):
        if ex.names != names:
            raise ConfigError("optics train: examples of different fleets have different "
                              "feature columns")
    if calibration:
        if not validation:
            raise ConfigError("optics train: calibration fleets need validation fleets too")
        allx = [*examples, *validation, *calibration]
        split = ([np.zeros(ex.y.shape[0], dtype=np.int8) for ex in examples]
                 + [np.ones(ex.y.shape[0], dtype=np.int8) for ex in validation]
                 + [np.full(ex.y.shape[0], 2, dtype=np.int8) for ex in calibration])
        return _train_blocks(allx, split, seed=seed, params=params, horizon_ns=horizon_ns,
                             metadata={**(metadata or {}), "split": "by fleet",
                                       "threshold_times": "00:00 UTC of the calibration fleets"},
                             refit=False, blocks=None, threshold_every_ns=DAY_NS)
    split = [_split_blocks(ex.times, blocks) for ex in examples]
    return _train_blocks(list(examples), split, seed=seed, params=params,
                         horizon_ns=horizon_ns, metadata=metadata, refit=True, blocks=blocks)


def _train_blocks(examples: Sequence[Examples], split: Sequence[npt.NDArray[np.int8]], *,
                  seed: int, params: Mapping[str, Any] | None, horizon_ns: int,
                  metadata: Mapping[str, Any] | None, refit: bool,
                  blocks: tuple[float, float] | None, threshold_every_ns: int = 1) -> Model:
    """:func:`train` on rows already assigned to blocks 0 (train), 1 (stop), 2 (calibrate)."""
    names = examples[0].names
    X = np.concatenate([ex.X for ex in examples])
    y = np.concatenate([ex.y for ex in examples]).astype(np.float64)
    blk = np.concatenate(split)
    if y[blk == 0].sum() == 0 or y[blk == 2].sum() == 0:
        raise ConfigError("optics train: the training or calibration block has no failure: "
                          "give a longer history or more labels")
    p = dict(_DEFAULT_PARAMS)
    p["seed"] = int(seed)
    p.update(params or {})
    pos = float(y[blk == 0].sum())
    p.setdefault("scale_pos_weight", (float((blk == 0).sum()) - pos) / pos)
    cat = [names.index(c) for c in ("module.part_class",) if c in names]
    both = np.flatnonzero(blk <= 1)
    # one binning of train + early-stopping rows, shared by both fits (subsets keep the bins)
    dall = lgb.Dataset(X[both], y[both], feature_name=list(names), categorical_feature=cat,
                       params={k: p[k] for k in ("max_bin", "bin_construct_sample_cnt", "verbose")
                               if k in p}, free_raw_data=False).construct()
    sub = blk[both]
    dtr = dall.subset(np.flatnonzero(sub == 0).tolist())
    dva = dall.subset(np.flatnonzero(sub == 1).tolist())
    bst = lgb.train(p, dtr, num_boost_round=_MAX_ROUNDS, valid_sets=[dva],
                    callbacks=[lgb.early_stopping(_EARLY_STOP, verbose=False)])
    rounds = max(1, int(bst.best_iteration or bst.current_iteration()))
    if refit:
        p2 = dict(p)
        pos2 = float(y[both].sum())
        p2["scale_pos_weight"] = (float(both.size) - pos2) / max(pos2, 1.0)
        final = lgb.train(p2, dall, num_boost_round=rounds)
        text = final.model_to_string()
    else:
        final = bst
        text = bst.model_to_string(num_iteration=rounds)
    cal = blk == 2
    raw = np.asarray(final.predict(X[cal].astype(np.float64), num_threads=2,
                                   num_iteration=rounds), dtype=np.float64)
    order = np.argsort(raw, kind="stable")
    iso = isotonic_regression(y[cal][order], increasing=True)
    fitted = np.asarray(iso.x)
    starts = np.asarray(iso.blocks[:-1])
    kx = raw[order][starts]
    ky = fitted[starts]
    model0 = Model(booster_text=text, feature_names=names, calibration_x=tuple(kx.tolist()),
                   calibration_y=tuple(ky.tolist()), threshold=0.5, horizon_ns=horizon_ns)
    r_cal = model0.calibrate(raw)
    per_block = []
    off = 0
    for ex, sp in zip(examples, split, strict=True):
        c = sp == 2
        k = int(c.sum())
        if k == 0:
            continue
        # the threshold is chosen on the times of the scoring protocol (daily at 00:00 UTC)
        on = (ex.times[c] % threshold_every_ns) == 0
        per_block.append((ex.times[c][on], r_cal[off:off + k][on], ex.groups[c][on],
                          ex.fail_ts[c][on]))
        off += k
    thr, f1 = _choose_threshold(per_block, horizon_ns)
    meta = dict(metadata or {})
    meta.update({"rounds": rounds, "calibration_f1": round(f1, 4),
                 "examples": int(y.shape[0]), "positives": int(y.sum()),
                 "lightgbm": lgb.__version__, "seed": int(seed),
                 "blocks": list(blocks) if blocks else None, "params": {k: v for k, v in p.items()
                                                    if k != "scale_pos_weight"}})
    return Model(booster_text=text, feature_names=names, calibration_x=model0.calibration_x,
                 calibration_y=model0.calibration_y, threshold=thr, horizon_ns=horizon_ns,
                 metadata=meta)


# --------------------------------------------------------------------------- prediction
@dataclass(frozen=True, slots=True)
class ModulePrediction:
    """The prediction of one module (one object of ``--json``)."""

    device: str
    port: str
    serial: str
    vendor: str
    part_number: str
    grade: str
    risk: float | None
    predicted_failure: bool
    eta_days: float | None
    reasons: tuple[Mapping[str, Any], ...]
    action: str

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "port": self.port, "serial": self.serial,
                "vendor": self.vendor, "part_number": self.part_number, "grade": self.grade,
                "risk": None if self.risk is None else round(self.risk, 4),
                "predicted_failure": self.predicted_failure,
                "eta_days": None if self.eta_days is None else round(self.eta_days, 2),
                "reasons": [dict(r) for r in self.reasons], "action": self.action}


@dataclass(frozen=True)
class FleetPredictions:
    """Predictions of every module of the history at ``at_ns``, and the fleet summary."""

    at_ns: int
    horizon_ns: int
    threshold: float
    modules: tuple[ModulePrediction, ...]
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.modules)

    def summary(self, *, top: int = 10) -> dict[str, Any]:
        """Counts per grade, predicted failures, top risks, per vendor / part risk."""
        grades = {g: 0 for g in (*GRADES, "no-data")}
        groups: dict[str, dict[str, dict[str, float]]] = {"vendor": {}, "part_number": {}}
        for m in self.modules:
            grades[m.grade] = grades.get(m.grade, 0) + 1
            for key, name in (("vendor", m.vendor), ("part_number", m.part_number)):
                s = groups[key].setdefault(name, {"modules": 0, "predicted_failures": 0,
                                                  "expected_failures": 0.0})
                s["modules"] += 1
                s["predicted_failures"] += int(m.predicted_failure)
                s["expected_failures"] += m.risk or 0.0
        ranked = sorted((m for m in self.modules if m.risk is not None),
                        key=lambda m: -(m.risk or 0.0))[:top]

        def fin(d: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
            return {k: {"modules": int(v["modules"]),
                        "predicted_failures": int(v["predicted_failures"]),
                        "expected_failures": round(v["expected_failures"], 2),
                        "mean_risk": round(v["expected_failures"] / max(v["modules"], 1), 4)}
                    for k, v in sorted(d.items(), key=lambda kv: -kv[1]["expected_failures"])}

        return {"at_ns": self.at_ns, "horizon_days": self.horizon_ns / DAY_NS,
                "threshold": round(self.threshold, 4), "modules": len(self.modules),
                "grades": grades,
                "predicted_failures": sum(m.predicted_failure for m in self.modules),
                "top_risks": [{"module": f"{m.device}:{m.port}", "serial": m.serial,
                               "risk": round(m.risk or 0.0, 4), "grade": m.grade,
                               "eta_days": None if m.eta_days is None else round(m.eta_days, 2),
                               "action": m.action} for m in ranked],
                "by_vendor": fin(groups["vendor"]), "by_part_number": fin(groups["part_number"]),
                "warnings": list(self.warnings)}

    def to_json(self) -> dict[str, Any]:
        """``{"summary": ..., "modules": [one object per module]}`` (JSON-ready, no NaN)."""
        return {"summary": self.summary(), "modules": [m.to_json() for m in self.modules]}


def _eta(f: LaneFeatures, *, window_ns: int = 3 * DAY_NS) -> F64:
    """Days until the worst metric's trend (over ``window_ns``, default 3 days; the shortest
    feature window at least that long) reaches its alarm, per module (NaN: none).

    Per lane and metric, the margin to the alarm on the side the trend heads to, over the
    slope, where the trend is significant (|t| >= 3): rx / tx power low, bias and temperature
    high, Vcc both sides, and pre-FEC BER to the RS(544,514) limit (decades over decades/day).
    """
    v = f.values
    n = len(f)
    lab3 = next((window_label(w) for w in f.windows if w >= window_ns),
                window_label(f.windows[-1]))
    best = np.full(n, np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        for m in METRICS:
            s = v.get(f"{m}.slope.{lab3}")
            st = v.get(f"{m}.slope_t.{lab3}")
            if s is None or st is None:
                continue
            lo = v[f"{m}.margin.low_alarm"]
            hi = v[f"{m}.margin.high_alarm"]
            down = np.where((st <= -_TREND_T) & (s < 0) & (lo > 0), lo / -s, np.inf)
            up = np.where((st >= _TREND_T) & (s > 0) & (hi > 0), hi / s, np.inf)
            best = np.fmin(best, np.fmin(down, up))
        s, st = v.get(f"ber.slope.{lab3}"), v.get(f"ber.slope_t.{lab3}")
        mg = v.get("ber.fec_margin_dec")
        if s is not None and st is not None and mg is not None:
            best = np.fmin(best, np.where((st >= _TREND_T) & (s > 0) & (mg > 0), mg / s, np.inf))
    best = np.where(np.isfinite(best), best, np.inf)
    out = np.full(len(f.modules), np.inf)
    np.fmin.at(out, f.module.astype(np.int64), best)
    return np.where(out <= _ETA_MAX_DAYS, out, np.nan)


def predict_fleet(
    history: FleetHistory,
    model: Model | None = None,
    *,
    at_ns: int,
    peers: Mapping[str, str] | None = None,
    grades: FleetGrades | None = None,
    attribute_pairs: bool = True,
) -> FleetPredictions:
    """Grade and predict every module of ``history`` at ``at_ns`` (data after it is ignored).

    ``model`` defaults to :func:`default_model`. Per module: the grade, reasons and action of
    :func:`~fabricscope.optics.grade.grade_fleet`, the calibrated ``risk`` of failure within
    the model's horizon, ``predicted_failure`` (risk >= the model's threshold), ``eta_days``
    (when a significant trend reaches an alarm, :func:`_eta`), and, where the model predicts a
    failure that grading gives no action for, "replace the module at the next maintenance
    window". Modules without data by ``at_ns`` get grade ``no-data`` and no risk. With
    ``attribute_pairs`` (default) and the cabling (``peers``), a module whose evidence the far
    end of its link explains gets :data:`PAIR_EXPLAINED_RISK` and the reason
    ``link.far_end_cause`` (:func:`pair_attribution`).
    """
    mdl = model if model is not None else default_model()
    gr = grades if grades is not None else grade_fleet(history, at_ns=at_ns, peers=peers)
    if gr.features.at_ns != at_ns:
        raise ConfigError(f"optics predict: grades were computed at {gr.features.at_ns}, not "
                          f"at_ns {at_ns}")
    f = gr.features
    mf, cols = model_inputs(f, gr, peers)
    idx = mf.module.astype(np.int64)
    nmod = len(f.modules)
    risk = np.full(nmod, np.nan)
    explained = np.zeros(nmod, dtype=bool)
    if idx.size:
        r0 = mdl.risk(_matrix(cols, mdl.feature_names, idx.shape[0]))
        if attribute_pairs:
            r0, ex = pair_attribution(r0, cols, peer_rows(mf, peers))
            explained[idx] = ex
        risk[idx] = r0
    eta = _eta(f) if len(f) else np.full(nmod, np.nan)
    mods = f.modules
    out = []
    for i in range(nmod):
        r = float(risk[i])
        has = math.isfinite(r)
        flag = has and r >= mdl.threshold
        acts = gr.actions[i]
        action = acts[0] if acts else "none"
        if flag and action in ("none", _WATCH):
            action = _REPLACE_ACTION
        e = float(eta[i])
        out.append(ModulePrediction(
            device=mods.device[i], port=mods.port[i], serial=mods.serial[i],
            vendor=mods.vendor[i], part_number=mods.part_number[i], grade=gr.grade[i],
            risk=r if has else None, predicted_failure=bool(flag),
            eta_days=e if math.isfinite(e) else None,
            reasons=tuple({"code": x.code, "severity": round(x.severity, 3), "lane": x.lane,
                           "evidence": x.evidence} for x in gr.reasons[i])
            + ((_FAR_END_REASON,) if explained[i] else ()),
            action=action))
    return FleetPredictions(at_ns=int(at_ns), horizon_ns=mdl.horizon_ns,
                            threshold=mdl.threshold, modules=tuple(out), warnings=gr.warnings)
