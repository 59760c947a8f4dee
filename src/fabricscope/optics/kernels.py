"""Compiled one-pass loops of the optics history: the hourly cells and the row checks.

Each kernel reproduces, value for value, what the numpy code it replaces computed (the same
float32 / float64 roundings and the same summation order: ``numpy.add.reduceat`` adds a
segment's values one after the other, starting from its first one), so the features stay
equal bit for bit (docs/design/optics-stream.md). Compiled with numba (``cache=True`` on
disk, ``nogil=True`` so that lane chunks run in threads); without numba the same functions
run as plain Python (slowly), which keeps the results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

__all__ = [
    "cell_sums", "compact", "counter_sums", "counter_sums_masked", "duplicate_mask", "keep_rows",
    "resets_and_lanes", "row_checks", "run_starts",
]

HOUR_NS = 3_600_000_000_000

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(fn: _F) -> _F:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; plain Python still works
        return fn
    return cast(_F, numba.njit(cache=True, nogil=True)(fn))


@_jit
def _first_later(ts: Any, lo: int, hi: int, t: int) -> int:
    """First row in ``[lo, hi)`` with ``ts > t`` (``hi`` if none); ``ts`` sorted there."""
    while lo < hi:
        mid = (lo + hi) // 2
        if ts[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def cell_sums(ts: Any, x: Any, zero: Any, g0: Any, g1: Any, lane0: int, at: int, nb: int,
              wmax: int, bb: int, want_sq: bool, mu: Any, c: Any, q: Any) -> None:
    """Means (sum / count where the count is positive), non-NaN counts and (``want_sq``)
    sums of squares of metric ``x`` over the kept hourly cells of lanes whose grid rows are
    ``g0[k]:g1[k]``, written to row ``lane0 + k`` of the (lanes, ``nb``) arrays ``mu`` / ``c``
    / ``q`` (untouched elsewhere). Kept cells: the first
    ``bb`` hours of each lane in the grid and the last ``wmax`` hours; the rows between are
    skipped (bisection on the sorted ``ts``). A NaN adds ``zero`` (0 of ``x``'s dtype, in
    which the squares are taken) and is not counted, as numpy's masked sums do."""
    for k in range(g0.shape[0]):
        a = g0[k]
        b = g1[k]
        if a >= b:
            continue
        row = lane0 + k
        fb = nb - 1 - (at - ts[a]) // HOUR_NS
        i = a
        cur = -1
        hi_ts = ts[a]
        acc = 0.0
        acq = 0.0
        cnt = 0.0
        while i < b:
            t = ts[i]
            v = x[i]
            ok = v == v
            vz = v if ok else zero
            if cur < 0 or t > hi_ts:
                if cur >= 0:
                    if cnt > 0:
                        mu[row, cur] = acc / cnt
                    c[row, cur] = cnt
                    if want_sq:
                        q[row, cur] = acq
                hb = (at - t) // HOUR_NS
                sb = nb - 1 - hb
                hi_ts = at - hb * HOUR_NS
                if sb >= fb + bb and sb < nb - wmax:
                    # between the baseline and the windows: jump to the windows' first row
                    cur = -1
                    i = _first_later(ts, i, b, at - wmax * HOUR_NS)
                    continue
                cur = sb
                acc = np.float64(vz)
                cnt = 1.0 if ok else 0.0
                if want_sq:
                    acq = np.float64(vz * vz)
            else:
                acc += np.float64(vz)
                if ok:
                    cnt += 1.0
                if want_sq:
                    acq += np.float64(vz * vz)
            i += 1
        if cur >= 0:
            if cnt > 0:
                mu[row, cur] = acc / cnt
            c[row, cur] = cnt
            if want_sq:
                q[row, cur] = acq


@_jit
def counter_sums(ts: Any, x: Any, starts: Any, g0: Any, g1: Any, lane0: int, at: int, nb: int,
                 wmax: int, bb: int, s: Any, c: Any) -> bool:
    """Increases of cumulative counter ``x`` summed over the kept hourly cells (as
    :func:`cell_sums`) and the rows counted: a row's increase is ``float32(x[i] - x[i-1])``,
    or ``x[i]`` where that is negative or NaN (a reset restarts from 0), 0 at a lane's first
    row ``starts[k]``. True when some kept cell's sum is NaN (then the caller takes the
    masked variant for the whole chunk, :func:`counter_sums_masked`, as the numpy code did)."""
    nan_seen = False
    for k in range(g0.shape[0]):
        a = g0[k]
        b = g1[k]
        if a >= b:
            continue
        row = lane0 + k
        first = starts[k]
        fb = nb - 1 - (at - ts[a]) // HOUR_NS
        i = a
        cur = -1
        hi_ts = 0
        acc = 0.0
        cnt = 0.0
        while i < b:
            t = ts[i]
            if cur < 0 or t > hi_ts:
                if cur >= 0:
                    s[row, cur] = acc
                    c[row, cur] = cnt
                    if acc != acc:
                        nan_seen = True
                hb = (at - t) // HOUR_NS
                sb = nb - 1 - hb
                hi_ts = at - hb * HOUR_NS
                if sb >= fb + bb and sb < nb - wmax:
                    cur = -1
                    i = _first_later(ts, i, b, at - wmax * HOUR_NS)
                    continue
                cur = sb
                cnt = 0.0
                started = False
            else:
                started = True
            if i == first:
                inc = 0.0
            else:
                d = np.float32(x[i] - x[i - 1])
                inc = np.float64(d) if d >= 0 else np.float64(x[i])
            if started:
                acc += inc
            else:
                acc = inc
            cnt += 1.0
            i += 1
        if cur >= 0:
            s[row, cur] = acc
            c[row, cur] = cnt
            if acc != acc:
                nan_seen = True
    return nan_seen


@_jit
def _last_finite_before(x: Any, i: int, lo: int) -> int:
    """The last row in ``[lo, i)`` where ``x`` is not NaN, or -1."""
    j = i - 1
    while j >= lo:
        if x[j] == x[j]:
            return j
        j -= 1
    return -1


@_jit
def counter_sums_masked(ts: Any, x: Any, starts: Any, g0: Any, g1: Any, lane0: int, at: int,
                        nb: int, wmax: int, bb: int, s: Any, c: Any) -> None:
    """:func:`counter_sums` where samples are missing: a present sample's increase is taken
    from the lane's previous present one, in float64 (0 for a lane's first present sample, 0
    for a missing one), and only present samples are counted (numpy's masked path)."""
    for k in range(g0.shape[0]):
        a = g0[k]
        b = g1[k]
        if a >= b:
            continue
        row = lane0 + k
        first = starts[k]
        fb = nb - 1 - (at - ts[a]) // HOUR_NS
        i = a
        cur = -1
        hi_ts = 0
        acc = 0.0
        cnt = 0.0
        pf = _last_finite_before(x, a, first)
        while i < b:
            t = ts[i]
            if cur < 0 or t > hi_ts:
                if cur >= 0:
                    s[row, cur] = acc
                    c[row, cur] = cnt
                hb = (at - t) // HOUR_NS
                sb = nb - 1 - hb
                hi_ts = at - hb * HOUR_NS
                if sb >= fb + bb and sb < nb - wmax:
                    cur = -1
                    i = _first_later(ts, i, b, at - wmax * HOUR_NS)
                    pf = _last_finite_before(x, i, first)
                    continue
                cur = sb
                cnt = 0.0
                started = False
            else:
                started = True
            v = np.float64(x[i])
            if v == v:
                if pf < 0:
                    inc = 0.0
                else:
                    dd = v - np.float64(x[pf])
                    inc = dd if dd >= 0 else v
                pf = i
                cnt += 1.0
            else:
                inc = 0.0
            if started:
                acc += inc
            else:
                acc = inc
            i += 1
        if cur >= 0:
            s[row, cur] = acc
            c[row, cur] = cnt


@_jit
def compact(src: Any, keep: Any, dst: Any, off: int) -> None:
    """``dst[off:]`` = the rows of ``src`` where ``keep`` (in order)."""
    j = off
    for i in range(src.shape[0]):
        if keep[i]:
            dst[j] = src[i]
            j += 1


@_jit
def run_starts(module: Any, lane: Any, out: Any, write: bool) -> int:
    """The number of rows where a (module, lane) run starts, and (``write``) those rows
    written to ``out``: called once to count, once to fill an array of that size."""
    k = 0
    for i in range(module.shape[0]):
        if i == 0 or module[i] != module[i - 1] or lane[i] != lane[i - 1]:
            if write:
                out[k] = i
            k += 1
    return k


@_jit
def row_checks(ts: Any, module: Any, lane: Any, prev_module: int, prev_lane: int,
               prev_ts: int) -> tuple[int, bool, int, int]:
    """One pass over rows in file order, continuing a previous row (``prev_module`` -1 for
    none): (first row whose module id is below the previous row's, or -1; whether the
    (module, lane) keys never decrease; steps back in time within a lane; samples that repeat
    the previous row's (module, lane, ts))."""
    bad = -1
    ordered = True
    back = 0
    dup = 0
    pm = prev_module
    pk = np.int64(prev_module) * 64 + prev_lane
    pt = prev_ts
    for i in range(ts.shape[0]):
        m = module[i]
        key = np.int64(m) * 64 + lane[i]
        t = ts[i]
        if pm >= 0:
            if m < pm and bad < 0:
                bad = i
            if key < pk:
                ordered = False
            elif key == pk:
                if t < pt:
                    back += 1
                elif t == pt:
                    dup += 1
        pm = m
        pk = key
        pt = t
    return bad, ordered, back, dup


@_jit
def duplicate_mask(ts: Any, module: Any, lane: Any, prev_module: int, prev_lane: int,
                   prev_ts: int, keep: Any) -> None:
    """``keep[i]`` False where row ``i`` repeats the previous row's (module, lane, ts)."""
    pk = np.int64(prev_module) * 64 + prev_lane if prev_module >= 0 else np.int64(-1)
    pt = prev_ts
    for i in range(ts.shape[0]):
        key = np.int64(module[i]) * 64 + lane[i]
        t = ts[i]
        keep[i] = not (key == pk and t == pt)
        pk = key
        pt = t


@_jit
def resets_and_lanes(module: Any, lane: Any, fec: Any, crc: Any, lanes: Any) -> tuple[int, int]:
    """(counter resets of ``fec`` and ``crc``: a value below the previous one of the same
    lane, NaN never counted), with ``lanes[m]`` raised to the highest lane + 1 seen."""
    rf = 0
    rc = 0
    for i in range(module.shape[0]):
        m = module[i]
        ln = lane[i]
        if ln + 1 > lanes[m]:
            lanes[m] = ln + 1
        if i > 0 and module[i - 1] == m and lane[i - 1] == ln:
            if fec[i] - fec[i - 1] < 0:
                rf += 1
            if crc[i] - crc[i - 1] < 0:
                rc += 1
    return rf, rc


def keep_rows(ts: npt.NDArray[np.int64], module: npt.NDArray[np.int32],
              lane: npt.NDArray[np.int32], prev: tuple[int, int, int]) -> npt.NDArray[np.bool_]:
    """The rows that do not repeat their predecessor's sample (see :func:`duplicate_mask`)."""
    keep = np.empty(ts.shape[0], dtype=np.bool_)
    duplicate_mask(ts, module, lane, prev[0], prev[1], prev[2], keep)
    return keep
