"""Time-series features of every module lane of an optics history, vectorized over the fleet.

One row per (module, lane) with data up to the evaluation time ``at_ns``. The history is cut
into an hourly grid that ends at ``at_ns`` (``lookback_ns`` long, 28 days by default); each
cell holds the mean, count and sum of squares of the 10-minute (or whatever) samples in that
hour, computed with ``numpy.add.reduceat`` over the contiguous (lane, hour) runs of the sorted
table, chunk by chunk (a few hundred chunks for a 10,000-module fleet, no loop per lane).
Everything else is computed on those hourly cells:

* ``<m>.last``: the last sample at or before ``at_ns`` (the last finite hourly mean if the
  last sample is missing); ``<m>.level.<w>``: the median of the hourly means of the window
  ``w`` (``1h``, ``1d``, ``3d``, ``7d`` by default); ``<m>.baseline``: the median of the
  lane's first ``baseline_ns`` (3 days) in the grid; ``<m>.noise``: the sample noise, pooled
  within-hour standard deviation over the longest window (floored at the DOM resolution).
* ``<m>.slope.<w>`` (units per day) and ``<m>.slope_t.<w>`` (its t statistic): least squares
  on the hourly means with the diurnal cycle regressed out (a 24 h sine / cosine pair, the
  Frisch-Waugh partial slope), and for bias and tx power also the module temperature, so a
  warm afternoon is not a trend and a warming switch is not laser aging. Windows shorter
  than 3 hourly cells get no slope.
* ``<m>.margin.<kind>`` / ``<m>.margin_sigma.<kind>``: distance of the current level (1 h
  median, else the last sample) to each threshold of the module (SFF-8472 section 9 /
  SFF-8636 / CMIS 5.x threshold set: high alarm, high warning, low warning, low alarm), in the
  metric's units and in sigmas of ``<m>.noise``; positive inside the thresholds.
  ``<m>.eta_days.low_warn`` / ``.high_warn``: days until the 3-day trend reaches the warning
  (only where the trend is significant, t >= 3, and heads there).
* ``bias.drift_ma.<w>`` / ``bias.drift_rel.<w>``: temperature-compensated bias drift, the
  window median of the bias residual after a least-squares fit of bias on temperature over the
  baseline days (laser aging: drive current rising at constant temperature; a 50 % rise is the
  usual end-of-life criterion of Telcordia GR-468-CORE style qualification).
  ``tx.efficiency_change_db``: change of tx power per bias (mW/mA, temperature-compensated
  bias) between the baseline and the last day, in dB (a falling slope efficiency).
* ``link.*`` (only with ``peers``): per-direction link loss, this end's tx minus the peer's rx
  on the same lane (``loss_out_db``) and the peer's tx minus this end's rx (``loss_in_db``),
  their change since the baseline, and the peer's tx change (``peer_tx_change_db``). CorrOpt
  (Zhuo et al., SIGCOMM'17) separates a dirty connector / damaged fiber (loss up, far
  transmitter fine) from a weak laser this way.
* ``<m>.lane_dev`` / ``<m>.lane_dev_change``: the lane's 1 d level minus the median of its
  module's lanes, and its change since the baseline (vendor lane offsets cancel).
* ``<m>.pop_z``: robust z score of the lane's 1 d level against every lane of the same
  ``part_number`` (median / 1.4826 MAD, the MAD floored; NaN for parts with < 8 lanes).
* ``temperature_c.rise``, ``device.warming``, ``device.modules``: the 1 d temperature minus
  the baseline, and how many modules of the same device rose >= 3 C (of how many with data):
  several warming modules on one switch point at its fan / airflow, not at a module.
* ``crc.rate.<w>`` / ``fec_unc.rate.<w>``: errors per hour of the cumulative counters over the
  window, per hour with counter samples. A drop of a cumulative counter starts a new segment
  whose origin is 0 (the counter restarted), so the first value after the drop is its
  increase: the ``rate()`` convention of Prometheus.
* ``ber.log_level.<w>``, ``ber.slope.<w>`` (decades per day), ``ber.fec_margin_dec``: log10 of
  the hourly mean pre-FEC BER, its trend, and the margin in decades of the current level to the
  RS(544,514) "KP4" correction limit 2.4e-4 (IEEE 802.3 clause 119;
  ../shared/reference/OPERATIONS.md section 2).

Thresholds missing from the source come from the per-part catalog
(``fabricscope.optics.catalog.fill_thresholds`` when that module is present) and then from
:data:`DEFAULT_THRESHOLDS` (:func:`filled_modules`). Pure: no I/O, ``at_ns`` is a parameter.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError
from fabricscope.optics.dom import KP4_BER_LIMIT
from fabricscope.optics.history import (
    METRICS,
    THRESHOLD_KINDS,
    FleetHistory,
    ModuleTable,
    empty_thresholds,
)

__all__ = [
    "BER_FLOOR",
    "DAY_NS",
    "DEFAULT_THRESHOLDS",
    "DEFAULT_WINDOWS",
    "HOUR_NS",
    "NOISE_FLOOR",
    "TARGET_CELLS",
    "GridPiece",
    "LaneFeatures",
    "LaneGrid",
    "ModuleFeatures",
    "check_feature_args",
    "chunk_features",
    "cross_lane",
    "feature_series",
    "filled_modules",
    "first_after",
    "grid_chunk",
    "grid_chunk_numpy",
    "grid_pieces",
    "lane_features",
    "lane_runs",
    "module_features",
    "window_label",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]
I32 = npt.NDArray[np.int32]

HOUR_NS = 3_600_000_000_000
DAY_NS = 24 * HOUR_NS
DEFAULT_WINDOWS: tuple[int, ...] = (HOUR_NS, DAY_NS, 3 * DAY_NS, 7 * DAY_NS)
#: pre-FEC BER below this is "error free" for the log scale
BER_FLOOR = 1e-12
#: Generic QSFP28-class thresholds (SFF-8636 typical values, OPERATIONS.md section 2), used only
#: where neither the source nor the per-part catalog gives one: (high_alarm, high_warn,
#: low_warn, low_alarm).
DEFAULT_THRESHOLDS: Mapping[str, tuple[float, float, float, float]] = {
    "temperature_c": (75.0, 70.0, 0.0, -5.0),
    "vcc_v": (3.63, 3.465, 3.135, 2.97),
    "tx_bias_ma": (10.0, 9.0, 1.0, 0.5),
    "tx_power_dbm": (5.0, 3.0, -7.5, -10.5),
    "rx_power_dbm": (3.4, 2.4, -9.5, -13.5),
}
#: noise floors (DOM resolution and rounding of common readers)
NOISE_FLOOR = {"temperature_c": 0.05, "vcc_v": 0.002, "tx_bias_ma": 0.02,
                "tx_power_dbm": 0.02, "rx_power_dbm": 0.02, "log_ber": 0.02}
#: MAD floors of the population z scores (a fleet of identical twins must not look noisy-free)
_POP_FLOOR = {"temperature_c": 1.0, "tx_bias_ma": 0.2, "tx_power_dbm": 0.3, "rx_power_dbm": 0.3}
_WARMING_C = 3.0
_MIN_POP = 8
#: metrics with a trend; ``log_ber`` is log10 of the hourly mean pre-FEC BER
_TREND = ("temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm", "log_ber")
_TEMP_REGRESSED = ("tx_bias_ma", "tx_power_dbm")
_COUNTERS = (("crc_errors", "crc"), ("fec_uncorrectable", "fec_unc"))
#: (lanes x hourly cells) per chunk of lanes; the streaming path (stream.py) cuts the same chunks
TARGET_CELLS = 200_000


def window_label(ns: int) -> str:
    """``1h``, ``1d``, ``3d`` ... for a window length in ns."""
    if ns % DAY_NS == 0:
        return f"{ns // DAY_NS}d"
    return f"{ns // HOUR_NS}h"


def filled_modules(modules: ModuleTable) -> ModuleTable:
    """``modules`` with every NaN threshold filled: per-part catalog first, then the defaults.

    The catalog is ``fabricscope.optics.catalog.fill_thresholds`` when it exists; values the
    source gave are never replaced.
    """
    filled = modules
    try:  # the catalog is written apart; without it the defaults below apply
        catalog: object = importlib.import_module("fabricscope.optics.catalog")
    except ImportError:
        catalog = None
    fill: Callable[[ModuleTable], ModuleTable] | None = getattr(catalog, "fill_thresholds", None)
    if fill is not None:
        filled = fill(modules)
    n = len(filled)
    th = dict(empty_thresholds(n))
    for col, v in filled.thresholds.items():
        th[col] = np.array(v, dtype=np.float64, copy=True)
    for m, vals in DEFAULT_THRESHOLDS.items():
        for kind, default in zip(THRESHOLD_KINDS, vals, strict=True):
            a = th[f"{m}_{kind}"]
            a[np.isnan(a)] = default
    return replace(filled, thresholds=th)


@dataclass(frozen=True)
class LaneFeatures:
    """Features of every (module, lane) with data at ``at_ns``; ``values[name][k]`` for row k.

    Rows are sorted by (module, lane). ``names`` lists the feature columns (see the module
    docstring); :meth:`matrix` stacks them for a learner.
    """

    module: I32
    lane: I32
    at_ns: int
    windows: tuple[int, ...]
    values: Mapping[str, F64]
    modules: ModuleTable
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.module.shape[0])

    def __getitem__(self, name: str) -> F64:
        try:
            return self.values[name]
        except KeyError:
            raise ConfigError(f"optics features: no feature named {name!r}") from None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.values)

    @property
    def labels(self) -> tuple[str, ...]:
        """Window labels (``1h``, ``1d`` ...) in the order of :attr:`windows`."""
        return tuple(window_label(w) for w in self.windows)

    def matrix(self, names: Sequence[str] | None = None) -> tuple[tuple[str, ...], F64]:
        """(names, array of shape (rows, len(names))) of the chosen (default: all) features."""
        cols = tuple(names) if names is not None else self.names
        if not cols:
            return cols, np.zeros((len(self), 0))
        return cols, np.stack([self[c] for c in cols], axis=1)


@dataclass(frozen=True)
class ModuleFeatures:
    """Lane features aggregated per module: ``<feature>.min`` / ``.max`` / ``.mean`` per row.

    ``module[i]`` is the :class:`ModuleTable` row of row ``i``; ``lanes[i]`` its lanes with
    data. The worst lane is the min or the max, depending on the feature's sense.
    """

    module: I32
    lanes: I32
    at_ns: int
    values: Mapping[str, F64]
    modules: ModuleTable

    def __len__(self) -> int:
        return int(self.module.shape[0])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.values)

    def matrix(self, names: Sequence[str] | None = None) -> tuple[tuple[str, ...], F64]:
        """(names, array of shape (modules, len(names)))."""
        cols = tuple(names) if names is not None else self.names
        if not cols:
            return cols, np.zeros((len(self), 0))
        return cols, np.stack([self.values[c] for c in cols], axis=1)


# --------------------------------------------------------------------------- helpers
def lane_runs(history: FleetHistory) -> tuple[I64, I64]:
    """Start / end rows of each (module, lane) run (one compiled pass, no 64-bit key copy)."""
    from fabricscope.optics import kernels

    n = len(history)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    k = int(kernels.run_starts(history.module, history.lane, np.empty(1, np.int64), False))
    starts = np.empty(k, dtype=np.int64)
    kernels.run_starts(history.module, history.lane, starts, True)
    ends = np.empty(k, dtype=np.int64)
    ends[:-1] = starts[1:]
    ends[-1] = n
    return starts, ends


def _masked_median(x: F64) -> F64:
    """Median along the last axis ignoring NaN (NaN where a row has none)."""
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], np.nan)
    s = np.sort(x, axis=-1)  # NaN sorts last
    n = np.sum(~np.isnan(x), axis=-1)
    lo = np.clip((n - 1) // 2, 0, None)
    hi = np.clip(n // 2, 0, None)
    a = np.take_along_axis(s, lo[..., None], axis=-1)[..., 0]
    b = np.take_along_axis(s, np.minimum(hi, x.shape[-1] - 1)[..., None], axis=-1)[..., 0]
    out: F64 = 0.5 * (a + b)
    out[n == 0] = np.nan
    return out


def _spd_inverse(a: F64) -> F64:
    """Inverses of a stack of small symmetric positive-definite matrices (Gauss-Jordan).

    Vectorized over the stack: ``numpy.linalg.inv`` pays a LAPACK call per matrix, which
    dominates for 10^5 matrices of size 5. No pivoting is needed for SPD matrices.
    """
    n, p, _ = a.shape
    m = np.concatenate([a, np.broadcast_to(np.eye(p), (n, p, p))], axis=2)
    for k in range(p):
        m[:, k, :] /= m[:, k, k : k + 1]
        row = m[:, k : k + 1, :].copy()
        m -= m[:, :, k : k + 1] * row
        m[:, k : k + 1, :] = row
    out: F64 = m[:, :, p:]
    return out


def _trend(y: F64, tday: F64, phase: F64, extra: F64 | None) -> tuple[F64, F64]:
    """Partial least-squares slope (per day) of each row of ``y`` on time, and its t statistic.

    Regressors: intercept, time, sin / cos of the time of day, and ``extra`` (the module
    temperature, standardized per row) when given; the nuisance columns get a small ridge so
    a collinear diurnal cycle does not make the system singular. The normal equations are
    built with matrix products over the shared columns (no per-row design matrix); rows with
    fewer than p + 2 cells give NaN.
    """
    nl, w = y.shape
    m = np.isfinite(y)
    if extra is not None:
        m &= np.isfinite(extra)
    cols = np.stack([np.ones(w), tday - tday.mean(), np.sin(phase), np.cos(phase)], axis=1)
    q = cols.shape[1]
    p = q + (extra is not None)
    mf = m.astype(np.float64)
    yz = np.where(m, y, 0.0)
    xtx = np.zeros((nl, p, p))
    pairs = (cols[:, :, None] * cols[:, None, :]).reshape(w, q * q)
    # in blocks of 4 columns: a wider skinny product makes OpenBLAS switch to threads, which
    # costs 100x on a loaded 2-core machine
    xtx[:, :q, :q] = np.concatenate([mf @ pairs[:, j : j + 4] for j in range(0, q * q, 4)],
                                    axis=1).reshape(nl, q, q)
    xty = np.zeros((nl, p))
    xty[:, :q] = yz @ cols
    n = mf.sum(axis=1)
    if extra is not None:
        e = np.where(m, extra, 0.0)
        cnt = np.maximum(n, 1)[:, None]
        mu = e.sum(axis=1, keepdims=True) / cnt
        sd = np.sqrt(np.where(m, (e - mu) ** 2, 0.0).sum(axis=1, keepdims=True) / cnt)
        ez = np.where(m, (e - mu) / np.maximum(sd, 0.1), 0.0)
        xe = ez @ cols
        xtx[:, q, :q] = xe
        xtx[:, :q, q] = xe
        xtx[:, q, q] = (ez * ez).sum(axis=1)
        xty[:, q] = (ez * yz).sum(axis=1)
    lam = 1e-3 * np.maximum(n, 1)
    for k in range(2, p):
        xtx[:, k, k] += lam
    ok = n >= p + 2
    xtx[~ok] = np.eye(p)
    inv = _spd_inverse(xtx)
    beta = np.einsum("lij,lj->li", inv, xty)
    # The penalized residual sum of squares, sum (y - X b)^2 + sum_k lam b_k^2 (equal to
    # y'y - b'X'y at the ridge solution), from the residuals themselves: the difference
    # form cancels catastrophically when the fit is good (a laser bias of 6 mA that moves by
    # microamps), and its rounding then reaches 1e-9 of the t statistic.
    fit = beta[:, :q] @ cols.T
    if extra is not None:
        fit += ez * beta[:, q : q + 1]
    res = np.where(m, y - fit, 0.0)
    rss = (res * res).sum(axis=1) + lam * (beta[:, 2:] ** 2).sum(axis=1)
    s2 = rss / np.maximum(n - p, 1)
    se = np.sqrt(np.maximum(s2 * inv[:, 1, 1], 1e-30))
    slope = np.where(ok, beta[:, 1], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(ok, slope / se, np.nan)
    return slope, t


@dataclass
class LaneGrid:
    """Hourly cells of one chunk of lanes: (lanes, bins) arrays per metric."""

    mean: dict[str, F64] = field(default_factory=dict)
    count: dict[str, F64] = field(default_factory=dict)
    sumsq: dict[str, F64] = field(default_factory=dict)
    inc: dict[str, F64] = field(default_factory=dict)
    last: dict[str, F64] = field(default_factory=dict)


def first_after(ts: I64, lo: I64, hi: I64, t: int) -> I64:
    """Per lane, the first row in ``[lo, hi)`` with ``ts > t`` (``hi`` if none): bisection
    vectorized over the lanes (each lane's rows are sorted by time)."""
    lo = lo.copy()
    hi = hi.copy()
    while True:
        act = lo < hi
        if not act.any():
            return lo
        mid = (lo + hi) // 2
        right = np.zeros(lo.shape[0], dtype=bool)
        right[act] = ts[mid[act]] <= t
        lo = np.where(act & right, mid + 1, lo)
        hi = np.where(act & ~right, mid, hi)


@dataclass(frozen=True)
class GridPiece:
    """Rows of whole lanes, sorted by (lane, ts): ``starts`` / ``g0`` / ``g1`` (each lane's
    first row and its rows in the grid, ``g0[k]:g1[k]``) count from the piece's first row.
    A lane chunk may come in several pieces (the streaming reader's read chunks), lanes
    numbered on across them."""

    ts: I64
    metrics: Mapping[str, npt.NDArray[np.floating]]
    starts: I64
    g0: I64
    g1: I64


def grid_chunk(history: FleetHistory, r0: int, r1: int, starts: I64, g0: I64, g1: I64,
               at_ns: int, nb: int, wmax: int, bb: int) -> LaneGrid:
    """Hourly cells of rows r0:r1 (whole lanes starting at ``starts``; rows ``g0:g1`` of each
    lane lie in the grid): :func:`grid_pieces` of that one piece."""
    piece = GridPiece(ts=history.ts[r0:r1], metrics={m: v[r0:r1] for m, v in
                                                     history.metrics.items()},
                      starts=starts - r0, g0=g0 - r0, g1=g1 - r0)
    return grid_pieces([piece], at_ns, nb, wmax, bb)


def grid_pieces(pieces: Sequence[GridPiece], at_ns: int, nb: int, wmax: int,
                bb: int) -> LaneGrid:
    """Hourly cells (lanes x ``nb`` hours ending at ``at_ns``) of a lane chunk, one compiled
    pass per metric (:mod:`fabricscope.optics.kernels`) over the kept cells only: the first
    ``bb`` hours of each lane in the grid and the last ``wmax``. Equal bit for bit to the
    numpy segment sums of :func:`grid_chunk_numpy` (same roundings, same summation order,
    and, as there, a counter with a missing sample in a kept cell takes the masked variant
    for the whole chunk).
    """
    from fabricscope.optics import kernels

    nl = sum(int(p.starts.shape[0]) for p in pieces)
    pieces = [p for p in pieces if p.ts.shape[0]]
    g = LaneGrid()
    if not any(bool((p.g1 > p.g0).any()) for p in pieces):
        return g
    offs = np.cumsum([0] + [int(p.starts.shape[0]) for p in pieces])
    for name in pieces[0].metrics:
        cols = [p.metrics[name] for p in pieces]
        if all(np.isnan(x[0]) and np.isnan(x).all() for x in cols):  # an absent optional column
            continue
        c = np.zeros((nl, nb))
        if name in ("crc_errors", "fec_uncorrectable"):
            sm = np.zeros((nl, nb))
            nan_seen = False
            for p, x, lane0 in zip(pieces, cols, offs.tolist(), strict=False):
                nan_seen |= bool(kernels.counter_sums(p.ts, x, p.starts, p.g0, p.g1, lane0,
                                                      at_ns, nb, wmax, bb, sm, c))
            if nan_seen:  # missing samples: increases over the present ones
                sm = np.zeros((nl, nb))
                c = np.zeros((nl, nb))
                for p, x, lane0 in zip(pieces, cols, offs.tolist(), strict=False):
                    kernels.counter_sums_masked(p.ts, x, p.starts, p.g0, p.g1, lane0, at_ns,
                                                nb, wmax, bb, sm, c)
            g.inc[name] = sm
            g.count[name] = c
            continue
        sq = np.zeros((nl, nb))
        mu = np.full((nl, nb), np.nan)
        for p, x, lane0 in zip(pieces, cols, offs.tolist(), strict=False):
            kernels.cell_sums(p.ts, x, x.dtype.type(0), p.g0, p.g1, lane0, at_ns, nb, wmax, bb,
                              name in NOISE_FLOOR, mu, c, sq)
        g.mean[name] = mu
        g.count[name] = c
        g.sumsq[name] = sq
        lv = np.full(nl, np.nan)
        for p, x, lane0 in zip(pieces, cols, offs.tolist(), strict=False):
            hv = p.g1 > p.g0
            lv[lane0 + np.flatnonzero(hv)] = x[p.g1[hv] - 1]
        g.last[name] = lv
    return g


def grid_chunk_numpy(history: FleetHistory, r0: int, r1: int, starts: I64, g0: I64, g1: I64,
                     at_ns: int, nb: int, wmax: int, bb: int, *,
                     only: str | None = None) -> LaneGrid:
    """The numpy reference of :func:`grid_pieces` (``only``: that metric alone): hourly cells
    of rows r0:r1 (whole lanes starting at ``starts``; rows ``g0:g1`` of each lane in the grid).

    The sorted rows make every (lane, hour) cell one contiguous segment, so sums are
    ``reduceat`` over views of the columns (no gather). Only the cells used later get their
    own segment: the baseline (the first ``bb`` hours of each lane in the grid) and the last
    ``wmax`` hours; the hours between collapse into one discarded segment per lane, which
    ``reduceat`` sums at memory speed. A NaN makes a cell's sum NaN; only then is that metric
    summed again with a mask.
    """
    nl = starts.shape[0]
    n = r1 - r0
    hb = (at_ns - history.ts[r0:r1]) // HOUR_NS  # hours before at_ns, per row
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(hb[1:], hb[:-1], out=change[1:])
    for pos in (starts - r0, g0 - r0, g1 - r0):
        change[pos[pos < n]] = True
    seg = np.flatnonzero(change)
    lane = np.searchsorted(starts - r0, seg, side="right") - 1
    sbin = nb - 1 - hb[seg]
    inside = (seg >= g0[lane] - r0) & (seg < g1[lane] - r0)
    fb = np.full(nl, nb, dtype=np.int64)
    has = g1 > g0
    fb[has] = nb - 1 - (at_ns - history.ts[g0[has]]) // HOUR_NS
    real = inside & ((sbin < fb[lane] + bb) | (sbin >= nb - wmax))
    keep = real.copy()
    keep[1:] |= real[:-1]  # a real cell must end where the next segment starts
    keep[0] = True
    seg, lane, sbin, real = seg[keep], lane[keep], sbin[keep], real[keep]
    cellr = lane[real] * nb + sbin[real]
    seglen = np.diff(np.concatenate([seg, [n]])).astype(np.float64)[real]
    g = LaneGrid()
    size = nl * nb
    lane_first = starts - r0
    if cellr.size == 0:
        return g

    def put(vals: F64) -> F64:
        out = np.zeros(size)
        out[cellr] = vals
        return out.reshape(nl, nb)

    for name, col in history.metrics.items():
        if only is not None and name != only:
            continue
        x = col[r0:r1]
        if np.isnan(x[0]) and np.isnan(x).all():  # an absent optional column
            continue
        if name in ("crc_errors", "fec_uncorrectable"):
            d = np.empty(n, dtype=np.float32)
            d[0] = 0
            np.subtract(x[1:], x[:-1], out=d[1:])
            inc = np.where(d >= 0, d, x)  # a drop restarts the counter from 0
            inc[lane_first] = 0
            sums = np.add.reduceat(inc, seg, dtype=np.float64)[real]
            if np.isnan(sums).any():
                nan = np.isnan(x)
                if nan.all():
                    continue
                xs = x.astype(np.float64)
                fi = np.flatnonzero(~nan)
                dd = np.diff(xs[fi])
                inc64 = np.zeros(n)
                inc64[fi[1:]] = np.where(dd >= 0, dd, xs[fi][1:])
                inc64[lane_first] = 0.0
                # the first finite sample of a lane has no predecessor in it
                first_fin = fi[np.concatenate([[True], np.searchsorted(lane_first, fi[1:], "right")
                                               != np.searchsorted(lane_first, fi[:-1], "right")])]
                inc64[first_fin] = 0.0
                sums = np.add.reduceat(inc64, seg)[real]
                cnt = np.add.reduceat((~nan).astype(np.float64), seg)[real]
            else:
                cnt = seglen
            g.inc[name] = put(sums)
            g.count[name] = put(cnt)
            continue
        sm = np.add.reduceat(x, seg, dtype=np.float64)[real]
        if np.isnan(sm).any():
            nan = np.isnan(x)
            if nan.all():
                continue
            xz = np.where(nan, np.float32(0), x)
            sm = np.add.reduceat(xz, seg, dtype=np.float64)[real]
            cnt = np.add.reduceat((~nan).astype(np.float64), seg)[real]
        else:
            xz = x
            cnt = seglen
        sq = np.add.reduceat(xz * xz, seg, dtype=np.float64)[real] if name in NOISE_FLOOR else \
            np.zeros(cnt.shape[0])
        c = put(cnt)
        with np.errstate(invalid="ignore", divide="ignore"):
            g.mean[name] = np.where(c > 0, put(sm) / c, np.nan)
        g.count[name] = c
        g.sumsq[name] = put(sq)
        lv = np.full(nl, np.nan)
        lv[has] = x[g1[has] - 1 - r0]
        g.last[name] = lv
    return g


def _last_finite(a: F64) -> F64:
    """The last finite value of each row (NaN if none)."""
    fin = np.isfinite(a)
    pos = a.shape[1] - 1 - np.argmax(fin[:, ::-1], axis=1)
    out: F64 = a[np.arange(a.shape[0]), pos]
    out[~fin.any(axis=1)] = np.nan
    return out


def chunk_features(g: LaneGrid, nl: int, nb: int, at_ns: int, windows: tuple[int, ...],
                    baseline_bins: int) -> dict[str, F64]:
    """Per-lane features of one chunk from its hourly cells."""
    out: dict[str, F64] = {}
    nan = np.full(nl, np.nan)
    labels = [window_label(w) for w in windows]
    wbins = [max(1, w // HOUR_NS) for w in windows]
    wmax = max(wbins)
    bins = np.arange(nb)
    t_ns = at_ns - (nb - 1 - bins) * HOUR_NS - HOUR_NS // 2  # cell centres
    tday = (t_ns - at_ns) / DAY_NS
    phase = 2 * math.pi * ((t_ns % DAY_NS) / DAY_NS)
    means = dict(g.mean)
    if "pre_fec_ber" in means:
        means["log_ber"] = np.log10(np.maximum(means["pre_fec_ber"], BER_FLOOR))
    # baseline cells: the first baseline_bins hours of each lane in the grid
    anyc = np.zeros((nl, nb), dtype=bool)
    for name in METRICS:
        if name in g.count:
            anyc |= g.count[name] > 0
    has = anyc.any(axis=1)
    first = np.where(has, np.argmax(anyc, axis=1), nb)
    bw = min(baseline_bins, nb)
    base_idx = np.minimum(first[:, None], nb - bw) + np.arange(bw)[None, :]  # (lanes, bw)
    base_ok = base_idx < first[:, None] + baseline_bins

    def base_cells(a: F64) -> F64:
        return np.where(base_ok, np.take_along_axis(a, base_idx, axis=1), np.nan)
    temp = means.get("temperature_c")
    for name in (*METRICS, "log_ber"):
        mu = means.get(name)
        if mu is None:
            for lab in labels:
                out[f"{name}.level.{lab}"] = nan.copy()
                out[f"{name}.slope.{lab}"] = nan.copy()
                out[f"{name}.slope_t.{lab}"] = nan.copy()
            out[f"{name}.baseline"] = nan.copy()
            if name != "log_ber":
                out[f"{name}.last"] = nan.copy()
                out[f"{name}.noise"] = nan.copy()
            continue
        if name != "log_ber":
            last = g.last[name]
            out[f"{name}.last"] = np.where(np.isnan(last), _last_finite(mu), last)
            c = g.count[name][:, -wmax:]
            s = np.nan_to_num(mu[:, -wmax:]) * c
            q = g.sumsq[name][:, -wmax:]
            dof = np.clip(c - 1, 0, None).sum(axis=1)
            ss = np.clip(q - np.where(c > 0, s * s / np.maximum(c, 1), 0.0), 0, None).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                noise = np.where(dof > 0, np.sqrt(ss / np.maximum(dof, 1)), np.nan)
            miss = np.flatnonzero(np.isnan(noise))
            if miss.size:  # one sample per hour: the spread of hourly differences instead
                dm = np.diff(mu[miss, -wmax:], axis=1)
                noise[miss] = 1.4826 * _masked_median(
                    np.abs(dm - _masked_median(dm)[:, None])) / math.sqrt(2)
            out[f"{name}.noise"] = np.fmax(noise, NOISE_FLOOR[name])
        out[f"{name}.baseline"] = _masked_median(base_cells(mu))
        for lab, w in zip(labels, wbins, strict=True):
            seg = mu[:, -w:]
            out[f"{name}.level.{lab}"] = _masked_median(seg)
            if w >= 3:
                extra = temp[:, -w:] if (name in _TEMP_REGRESSED and temp is not None) else None
                sl, tt = _trend(seg, tday[-w:], phase[-w:], extra)
            else:
                sl, tt = nan.copy(), nan.copy()
            out[f"{name}.slope.{lab}"] = sl
            out[f"{name}.slope_t.{lab}"] = tt
    # temperature-compensated bias drift: bias = a + c * temp over the baseline cells
    bias = means.get("tx_bias_ma")
    if bias is not None and temp is not None:
        bt, bi = base_cells(temp), base_cells(bias)
        m = np.isfinite(bt) & np.isfinite(bi)
        n = np.maximum(m.sum(axis=1), 1)
        tb = np.where(m, bt, 0).sum(axis=1) / n
        bb = np.where(m, bi, 0).sum(axis=1) / n
        cov = np.where(m, (bt - tb[:, None]) * (bi - bb[:, None]), 0).sum(axis=1) / n
        var = np.where(m, (bt - tb[:, None]) ** 2, 0).sum(axis=1) / n
        coef = cov / (var + 0.25)  # shrink towards 0 when the baseline saw no temperature swing
        resid = bias - (bb[:, None] + coef[:, None] * (temp - tb[:, None]))
        base_bias = out["tx_bias_ma.baseline"]
        for lab, w in zip(labels, wbins, strict=True):
            d = _masked_median(resid[:, -w:])
            out[f"bias.drift_ma.{lab}"] = d
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f"bias.drift_rel.{lab}"] = d / np.abs(base_bias)
        comp = base_bias + out[f"bias.drift_ma.{labels[min(1, len(labels) - 1)]}"]
    else:
        for lab in labels:
            out[f"bias.drift_ma.{lab}"] = nan.copy()
            out[f"bias.drift_rel.{lab}"] = nan.copy()
        comp = nan.copy()
    lab_d = labels[min(1, len(labels) - 1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        eff_now = 10 * np.log10(comp)
        eff_base = 10 * np.log10(out["tx_bias_ma.baseline"])
        out["tx.efficiency_change_db"] = (out[f"tx_power_dbm.level.{lab_d}"] - eff_now) - (
            out["tx_power_dbm.baseline"] - eff_base)
    # counters: errors per hour with counter samples
    for col, short in _COUNTERS:
        inc = g.inc.get(col)
        for lab, w in zip(labels, wbins, strict=True):
            if inc is None:
                out[f"{short}.rate.{lab}"] = nan.copy()
                continue
            hours = (g.count[col][:, -w:] > 0).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f"{short}.rate.{lab}"] = np.where(hours > 0, inc[:, -w:].sum(axis=1) / hours,
                                                      np.nan)
    for lab in labels:
        out[f"ber.log_level.{lab}"] = out.pop(f"log_ber.level.{lab}")
        out[f"ber.slope.{lab}"] = out.pop(f"log_ber.slope.{lab}")
        out[f"ber.slope_t.{lab}"] = out.pop(f"log_ber.slope_t.{lab}")
    out["ber.baseline"] = out.pop("log_ber.baseline")
    return out


# --------------------------------------------------------------------------- main
def check_feature_args(windows: Sequence[int], lookback_ns: int, baseline_ns: int) -> tuple[int, ...]:
    """The trend windows as ints, after checking them and the baseline (ConfigError naming the
    bad value): shared by :func:`lane_features` and the streaming path."""
    wins = tuple(int(w) for w in windows)
    if not wins:
        raise ConfigError("optics features: windows: need at least one window")
    for w in wins:
        if w < HOUR_NS or w % HOUR_NS or w > lookback_ns:
            raise ConfigError(f"optics features: windows: {w} ns: must be whole hours, "
                              f"1 h .. lookback ({lookback_ns // HOUR_NS} h)")
    if baseline_ns < HOUR_NS:
        raise ConfigError(f"optics features: baseline_ns: must be >= 1 h, got {baseline_ns}")
    return wins


def lane_features(
    history: FleetHistory,
    *,
    at_ns: int,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    peers: Mapping[str, str] | None = None,
    lookback_ns: int = 28 * DAY_NS,
    baseline_ns: int = 3 * DAY_NS,
    modules: ModuleTable | None = None,
) -> LaneFeatures:
    """Features of every (module, lane) with a sample in ``(at_ns - lookback_ns, at_ns]``.

    Parameters
    ----------
    history:
        The history table (:class:`FleetHistory`, sorted by module, lane, ts).
    at_ns:
        Evaluation time; samples after it are ignored (so a learner can be fed the past only).
    windows:
        Window lengths in ns, whole hours, each at most ``lookback_ns``.
    peers:
        ``device:port`` -> ``device:port`` at the other end of the cable (the inventory's
        peer_port), for the per-direction link loss; without it the ``link.*`` features are NaN.
    lookback_ns, baseline_ns:
        Length of the hourly grid, and of the baseline at the start of each lane's data in it.
    modules:
        The module table with thresholds filled (default: :func:`filled_modules` of the
        history's).

    Cost: O(rows) for the hourly cells (a few passes of ``numpy.add.reduceat``), then
    O(lanes x hours) for the rest, in chunks of about 400,000 cells.
    """
    if isinstance(at_ns, bool) or not isinstance(at_ns, int | np.integer):
        raise ConfigError(f"optics features: at_ns: must be an integer (ns), got {at_ns!r}")
    at = int(at_ns)
    wins = check_feature_args(windows, lookback_ns, baseline_ns)
    mods = modules if modules is not None else filled_modules(history.modules)
    starts, ends = lane_runs(history)
    nruns = starts.shape[0]
    run_module = history.module[starts].astype(np.int64) if nruns else np.zeros(0, np.int64)
    run_lane = history.lane[starts].astype(np.int64) if nruns else np.zeros(0, np.int64)
    t_first = int(history.ts.min()) if len(history) else at
    span = max(HOUR_NS, min(lookback_ns, at - t_first + HOUR_NS))
    nb = int(-(-span // HOUR_NS))
    nb = max(nb, max(wins) // HOUR_NS)
    per_chunk = max(8, TARGET_CELLS // nb)
    g0 = first_after(history.ts, starts, ends, at - nb * HOUR_NS)
    g1 = first_after(history.ts, g0, ends, at)
    have = g1 > g0
    wmax = max(wins) // HOUR_NS
    bb = max(1, baseline_ns // HOUR_NS)
    parts: list[dict[str, F64]] = []
    for k0 in range(0, nruns, per_chunk):
        k1 = min(nruns, k0 + per_chunk)
        if not have[k0:k1].any():
            parts.append({})
            continue
        g = grid_chunk(history, int(starts[k0]), int(ends[k1 - 1]), starts[k0:k1], g0[k0:k1],
                        g1[k0:k1], at, nb, wmax, bb)
        parts.append(chunk_features(g, k1 - k0, nb, at, wins, bb))
    filled = [p for p in parts if p]
    if filled:
        keys = list(filled[0])
        sizes = [min(nruns, k0 + per_chunk) - k0 for k0 in range(0, nruns, per_chunk)]
        vals = {k: np.concatenate([p[k] if p else np.full(sz, np.nan)
                                   for p, sz in zip(parts, sizes, strict=True)]) for k in keys}
    else:  # nothing in the grid: the same columns, empty
        vals = {k: np.zeros(0) for k in chunk_features(LaneGrid(), 0, nb, at, wins, bb)}
        have = np.zeros(0, dtype=bool)
    vals = {k: v[have] for k, v in vals.items()}
    if have.any():
        last_ts = history.ts[np.maximum(g1 - 1, 0)][have]
        first_ts = history.ts[np.minimum(g0, len(history) - 1)][have]
        vals["data.span_hours"] = (last_ts - first_ts) / HOUR_NS
        vals["data.last_age_hours"] = (at - last_ts) / HOUR_NS
    else:
        vals["data.span_hours"] = np.zeros(0)
        vals["data.last_age_hours"] = np.zeros(0)
    mod = run_module[have]
    lane = run_lane[have]
    warnings: list[str] = []
    vals.update(cross_lane(vals, mod, lane, mods, wins, peers, warnings))
    return LaneFeatures(module=mod.astype(np.int32), lane=lane.astype(np.int32), at_ns=at,
                        windows=wins, values=vals, modules=mods, warnings=tuple(warnings))


def cross_lane(vals: Mapping[str, F64], mod: I64, lane: I64, mods: ModuleTable,
                wins: tuple[int, ...], peers: Mapping[str, str] | None,
                warnings: list[str]) -> dict[str, F64]:
    """Features that compare a lane with other lanes: thresholds, peers, module, population."""
    out: dict[str, F64] = {}
    n = mod.shape[0]
    labels = [window_label(w) for w in wins]
    lab_now = labels[0]
    lab_d = next((lab for lab, w in zip(labels, wins, strict=True) if w >= DAY_NS), labels[-1])
    lab_3d = next((lab for lab, w in zip(labels, wins, strict=True) if w >= 3 * DAY_NS),
                  labels[-1])
    # margins to the module's own thresholds
    for m in METRICS:
        now = vals.get(f"{m}.level.{lab_now}", np.full(n, np.nan))
        now = np.where(np.isnan(now), vals.get(f"{m}.last", np.full(n, np.nan)), now)
        noise = vals.get(f"{m}.noise", np.full(n, np.nan))
        slope = vals.get(f"{m}.slope.{lab_3d}", np.full(n, np.nan))
        st = vals.get(f"{m}.slope_t.{lab_3d}", np.full(n, np.nan))
        for kind in THRESHOLD_KINDS:
            th = np.asarray(mods.thresholds[f"{m}_{kind}"], dtype=np.float64)[mod] if n else \
                np.zeros(0)
            marg = (th - now) if kind.startswith("high") else (now - th)
            out[f"{m}.margin.{kind}"] = marg
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f"{m}.margin_sigma.{kind}"] = marg / noise
        with np.errstate(invalid="ignore", divide="ignore"):
            lo = out[f"{m}.margin.low_warn"]
            hi = out[f"{m}.margin.high_warn"]
            out[f"{m}.eta_days.low_warn"] = np.where((st <= -3) & (lo > 0), lo / -slope, np.nan)
            out[f"{m}.eta_days.high_warn"] = np.where((st >= 3) & (hi > 0), hi / slope, np.nan)
    # lane of (module, lane) -> row
    nmod = len(mods)
    maxl = int(lane.max()) + 1 if n else 1
    row = np.full((max(nmod, 1), maxl), -1, dtype=np.int64)
    row[mod, lane] = np.arange(n)
    # lane deviation from the module's median lane, now and at baseline
    for m in ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm"):
        for src, dst in ((f"{m}.level.{lab_d}", f"{m}.lane_dev"), (f"{m}.baseline", "_b")):
            dense = np.full(row.shape, np.nan)
            dense[mod, lane] = vals[src]
            with np.errstate(all="ignore"):
                med = _masked_median(dense)
            out[dst] = vals[src] - med[mod]
        out[f"{m}.lane_dev_change"] = out[f"{m}.lane_dev"] - out.pop("_b")
    # population z scores per part number
    part_codes: dict[str, int] = {}
    pcode = np.array([part_codes.setdefault(p, len(part_codes)) for p in mods.part_number],
                     dtype=np.int64)
    lane_part = pcode[mod] if n else np.zeros(0, np.int64)
    for m, floor in _POP_FLOOR.items():
        x = vals[f"{m}.level.{lab_d}"]
        z = np.full(n, np.nan)
        for c in range(len(part_codes)):
            sel = lane_part == c
            xs = x[sel]
            ok = np.isfinite(xs)
            if ok.sum() < _MIN_POP:
                continue
            centre = float(np.median(xs[ok]))
            mad = 1.4826 * float(np.median(np.abs(xs[ok] - centre)))
            z[sel] = (xs - centre) / max(mad, floor)
        out[f"{m}.pop_z"] = z
    # same-switch co-degradation: modules of one device whose temperature rose
    rise = vals[f"temperature_c.level.{lab_d}"] - vals["temperature_c.baseline"]
    out["temperature_c.rise"] = rise
    mod_rise = np.full(max(nmod, 1), np.nan)
    np.fmax.at(mod_rise, mod, rise)
    dev_codes: dict[str, int] = {}
    dcode = np.array([dev_codes.setdefault(d, len(dev_codes)) for d in mods.device], dtype=np.int64)
    has = np.zeros(max(nmod, 1), dtype=bool)
    has[mod] = True
    nd = max(len(dev_codes), 1)
    if nmod:
        warming = np.bincount(dcode[has], (mod_rise[has] >= _WARMING_C).astype(np.float64),
                              minlength=nd).astype(np.float64)
        with_data = np.bincount(dcode[has], minlength=nd).astype(np.float64)
        out["device.warming"] = warming[dcode[mod]]
        out["device.modules"] = with_data[dcode[mod]]
    else:
        out["device.warming"] = np.zeros(0)
        out["device.modules"] = np.zeros(0)
    # per-direction link loss
    for k in ("loss_out_db", "loss_in_db", "loss_out_change_db", "loss_in_change_db",
              "peer_tx_change_db", "peer_rx_change_db"):
        out[f"link.{k}"] = np.full(n, np.nan)
    if peers and n:
        index = {mods.key(i): i for i in range(nmod)}
        peer_mod = np.full(nmod, -1, dtype=np.int64)
        missing: list[str] = []
        for a, b in peers.items():
            ia = index.get(a)
            ib = index.get(b)
            if ia is None:
                continue
            if ib is None:
                missing.append(f"{a} -> {b}")
                continue
            peer_mod[ia] = ib
        if missing:
            warnings.append(f"optics features: peers: {len(missing)} peer port(s) have no optics "
                            f"history (first: {missing[0]}); their link loss is unknown")
        pm = peer_mod[mod]
        ok = pm >= 0
        pr = np.full(n, -1, dtype=np.int64)
        in_range = ok & (lane < row.shape[1])
        pr[in_range] = row[pm[in_range], lane[in_range]]
        ok = pr >= 0
        tx_now, tx_b = vals[f"tx_power_dbm.level.{lab_d}"], vals["tx_power_dbm.baseline"]
        rx_now, rx_b = vals[f"rx_power_dbm.level.{lab_d}"], vals["rx_power_dbm.baseline"]
        p = pr[ok]
        out["link.loss_out_db"][ok] = tx_now[ok] - rx_now[p]
        out["link.loss_in_db"][ok] = tx_now[p] - rx_now[ok]
        out["link.loss_out_change_db"][ok] = out["link.loss_out_db"][ok] - (tx_b[ok] - rx_b[p])
        out["link.loss_in_change_db"][ok] = out["link.loss_in_db"][ok] - (tx_b[p] - rx_b[ok])
        out["link.peer_tx_change_db"][ok] = tx_now[p] - tx_b[p]
        out["link.peer_rx_change_db"][ok] = rx_now[p] - rx_b[p]
    # FEC margin in decades to the KP4 limit, from the current level
    now_ber = vals.get(f"ber.log_level.{lab_now}", np.full(n, np.nan))
    now_ber = np.where(np.isnan(now_ber), vals.get(f"ber.log_level.{lab_d}", now_ber), now_ber)
    out["ber.fec_margin_dec"] = math.log10(KP4_BER_LIMIT) - now_ber
    return out


def module_features(features: LaneFeatures) -> ModuleFeatures:
    """Aggregate lane features per module: ``.min``, ``.max`` and ``.mean`` over its lanes.

    The worst lane is ``.min`` for a margin or a falling power and ``.max`` for a drift, a
    rate or a BER; ``<m>.lane_dev`` max - min is the lane imbalance (``<m>.imbalance``).
    """
    mod = features.module
    n = len(features)
    if n == 0:
        return ModuleFeatures(module=np.zeros(0, np.int32), lanes=np.zeros(0, np.int32),
                              at_ns=features.at_ns, values={}, modules=features.modules)
    cut = np.concatenate([[0], np.flatnonzero(np.diff(mod)) + 1])
    umod = mod[cut]
    counts = np.diff(np.concatenate([cut, [n]]))
    out: dict[str, F64] = {}
    for name, v in features.values.items():
        fin = np.isfinite(v)
        vz = np.where(fin, v, 0.0)
        c = np.add.reduceat(fin.astype(np.float64), cut)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"{name}.mean"] = np.where(c > 0, np.add.reduceat(vz, cut) / c, np.nan)
        lo = np.fmin.reduceat(np.where(fin, v, np.nan), cut)
        hi = np.fmax.reduceat(np.where(fin, v, np.nan), cut)
        out[f"{name}.min"] = lo
        out[f"{name}.max"] = hi
    for m in ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm"):
        out[f"{m}.imbalance"] = out[f"{m}.lane_dev.max"] - out[f"{m}.lane_dev.min"]
    return ModuleFeatures(module=umod.astype(np.int32), lanes=counts.astype(np.int32),
                          at_ns=features.at_ns, values=out, modules=features.modules)


# ------------------------------------------------------------------ cached feature series
def _grid_full(history: FleetHistory, r0: int, r1: int, lane_first: I64, j0: int,
               nbc: int) -> LaneGrid:
    """Hourly cells of rows ``r0:r1`` (whole lanes) over the whole history, absolute hours.

    Cell ``j`` holds the samples with ``ts`` in ``(j h, (j + 1) h]`` (minus ``j0``): the
    cells of :func:`~fabricscope.optics.features.lane_features` at any whole-hour ``at_ns``,
    so one pass over the rows serves every evaluation time. Same sums, counts, sums of squares
    and counter increments (a drop restarts a counter from 0) as the features' own grid.
    """
    nl = lane_first.shape[0]
    n = r1 - r0
    cell = (history.ts[r0:r1] - 1) // HOUR_NS - j0
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(cell[1:], cell[:-1], out=change[1:])
    change[lane_first] = True
    seg = np.flatnonzero(change)
    lane = np.searchsorted(lane_first, seg, side="right") - 1
    cellr = lane * nbc + cell[seg]
    seglen = np.diff(np.concatenate([seg, [n]])).astype(np.float64)
    g = LaneGrid()

    def put(vals: F64) -> F64:
        out = np.zeros(nl * nbc)
        out[cellr] = vals
        return out.reshape(nl, nbc)

    for name, col in history.metrics.items():
        x = col[r0:r1]
        if n == 0 or (np.isnan(x[0]) and np.isnan(x).all()):
            continue
        if name in ("crc_errors", "fec_uncorrectable"):
            nan = np.isnan(x)
            xs = x.astype(np.float64)
            fi = np.flatnonzero(~nan)
            inc = np.zeros(n)
            dd = np.diff(xs[fi])
            inc[fi[1:]] = np.where(dd >= 0, dd, xs[fi][1:])
            inc[lane_first] = 0.0
            if fi.size:
                lf = np.searchsorted(lane_first, fi, "right")
                first_fin = fi[np.concatenate([[True], lf[1:] != lf[:-1]])]
                inc[first_fin] = 0.0
            g.inc[name] = put(np.add.reduceat(inc, seg))
            g.count[name] = put(np.add.reduceat((~nan).astype(np.float64), seg))
            continue
        sm = np.add.reduceat(x, seg, dtype=np.float64)
        if np.isnan(sm).any():
            nan = np.isnan(x)
            xz = np.where(nan, np.float32(0), x)
            sm = np.add.reduceat(xz, seg, dtype=np.float64)
            cnt = np.add.reduceat((~nan).astype(np.float64), seg)
        else:
            xz = x
            cnt = seglen
        sq = np.add.reduceat(xz * xz, seg, dtype=np.float64) if name in NOISE_FLOOR else \
            np.zeros(cnt.shape[0])
        c = put(cnt)
        with np.errstate(invalid="ignore", divide="ignore"):
            g.mean[name] = np.where(c > 0, put(sm) / c, np.nan)
        g.count[name] = c
        g.sumsq[name] = put(sq)
    return g


def _slice_grid(g: LaneGrid, lo: int, hi: int, nbc: int, keep: BoolA) -> LaneGrid:
    """Columns ``lo:hi`` of a full grid, padded with empty cells outside ``0:nbc``, and
    emptied where ``keep`` is false (the cells the features' own grid leaves out: between each
    lane's baseline and the last window, so that ``.last`` falls back exactly alike)."""
    pad_l, pad_r = max(0, -lo), max(0, hi - nbc)
    a, b = max(lo, 0), min(hi, nbc)

    def cut(x: F64, fill: float) -> F64:
        s = x[:, a:b] if b > a else x[:, :0]
        if pad_l or pad_r:
            s = np.pad(s, ((0, 0), (pad_l, pad_r)), constant_values=fill)
        return np.where(keep, s, fill)

    return LaneGrid(mean={k: cut(v, np.nan) for k, v in g.mean.items()},
                 count={k: cut(v, 0.0) for k, v in g.count.items()},
                 sumsq={k: cut(v, 0.0) for k, v in g.sumsq.items()},
                 inc={k: cut(v, 0.0) for k, v in g.inc.items()})


def feature_series(
    history: FleetHistory,
    times: Sequence[int],
    *,
    peers: Mapping[str, str] | None = None,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    lookback_ns: int = 28 * DAY_NS,
    baseline_ns: int = 3 * DAY_NS,
) -> Iterator[LaneFeatures]:
    """:func:`lane_features` at each of ``times``, sharing one pass.

    The hourly cells are built once over the whole history (chunks of lanes) and each
    evaluation time takes its slice, so ``k`` evaluation times cost one pass over the rows plus
    ``k`` passes over the (lanes x hours) cells, instead of ``k`` passes over the rows. Times
    must be whole hours (``t % 1 h == 0``) for the shared grid; other times fall back to
    ``lane_features`` one by one. The result equals ``lane_features(history, at_ns=t, ...)``
    (a test compares them).
    """
    ts_list = [int(t) for t in times]
    wins = tuple(int(w) for w in windows)
    if not ts_list:
        return
    if any(t % HOUR_NS for t in ts_list) or len(history) == 0:
        for t in ts_list:
            yield lane_features(history, at_ns=t, windows=wins, peers=peers,
                                lookback_ns=lookback_ns, baseline_ns=baseline_ns)
        return
    # the first call validates the arguments exactly like lane_features does
    mods = filled_modules(history.modules)
    starts, ends = lane_runs(history)
    nruns = starts.shape[0]
    run_module = history.module[starts].astype(np.int64)
    run_lane = history.lane[starts].astype(np.int64)
    j0 = int((int(history.ts.min()) - 1) // HOUR_NS)
    nbc = int((int(history.ts.max()) - 1) // HOUR_NS) - j0 + 1
    t_first = int(history.ts.min())
    wmax = max(wins) // HOUR_NS
    bb = max(1, baseline_ns // HOUR_NS)
    per_chunk = max(8, 200_000 // max(nbc, 1))
    plan = []
    for t in ts_list:
        span = max(HOUR_NS, min(lookback_ns, t - t_first + HOUR_NS))
        nb = max(int(-(-span // HOUR_NS)), wmax)
        g0 = first_after(history.ts, starts, ends, t - nb * HOUR_NS)
        g1 = first_after(history.ts, g0, ends, t)
        plan.append((t, nb, g0, g1, g1 > g0))
    parts: list[list[dict[str, F64]]] = [[] for _ in ts_list]
    chunks = [(k0, min(nruns, k0 + per_chunk)) for k0 in range(0, nruns, per_chunk)]
    for k0, k1 in chunks:
        r0, r1 = int(starts[k0]), int(ends[k1 - 1])
        g = _grid_full(history, r0, r1, starts[k0:k1] - r0, j0, nbc)
        for i, (t, nb, _g0, g1, have) in enumerate(plan):
            if not have[k0:k1].any():
                parts[i].append({})
                continue
            jt = t // HOUR_NS - 1 - j0
            h = have[k0:k1]
            fb = np.full(k1 - k0, nb, dtype=np.int64)
            fb[h] = nb - 1 - (t - history.ts[_g0[k0:k1][h]]) // HOUR_NS
            bins = np.arange(nb)[None, :]
            keep = (bins < fb[:, None] + bb) | (bins >= nb - wmax)
            gs = _slice_grid(g, jt - nb + 1, jt + 1, nbc, keep)
            for name in g.mean:
                lv = np.full(k1 - k0, np.nan)
                lv[h] = history.metrics[name][g1[k0:k1][h] - 1]
                gs.last[name] = lv
            parts[i].append(chunk_features(gs, k1 - k0, nb, t, wins, bb))
    for i, (t, _nb, g0, g1, have) in enumerate(plan):
        filled = [p for p in parts[i] if p]
        if filled:
            keys = list(filled[0])
            vals = {k: np.concatenate([p[k] if p else np.full(b - a, np.nan)
                                       for p, (a, b) in zip(parts[i], chunks, strict=True)])
                    for k in keys}
            vals = {k: v[have] for k, v in vals.items()}
        else:
            yield lane_features(history, at_ns=t, windows=wins, peers=peers,
                                lookback_ns=lookback_ns, baseline_ns=baseline_ns)
            continue
        last_ts = history.ts[np.maximum(g1 - 1, 0)][have]
        first_ts = history.ts[np.minimum(g0, len(history) - 1)][have]
        vals["data.span_hours"] = (last_ts - first_ts) / HOUR_NS
        vals["data.last_age_hours"] = (t - last_ts) / HOUR_NS
        mod, lane = run_module[have], run_lane[have]
        warnings: list[str] = []
        vals.update(cross_lane(vals, mod, lane, mods, wins, peers, warnings))
        yield LaneFeatures(module=mod.astype(np.int32), lane=lane.astype(np.int32), at_ns=t,
                           windows=wins, values=vals, modules=mods, warnings=tuple(warnings))
