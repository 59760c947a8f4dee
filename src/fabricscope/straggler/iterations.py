"""Irregular-iteration detection: robust baseline (median / MAD) and change points."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
MAD_TO_SIGMA = 1.4826  # MAD of a normal sample x 1.4826 = its standard deviation


@dataclass(frozen=True, slots=True)
class IterationStats:
    """Per-iteration durations and what stands out in them.

    ``irregular``: iterations slower than ``median + max(k * sigma, rel * median)`` where
    sigma is the MAD-based scale (robust to the outliers it looks for);
    ``change_points``: the step ids (as the trace numbers them) where the mean level shifts
    (binary segmentation); ``change_point_index``: the same as 0-based positions.
    """

    iterations: tuple[int, ...]
    duration_ns: tuple[int, ...]
    median_ns: float
    sigma_ns: float
    irregular: tuple[int, ...]
    change_points: tuple[int, ...]
    change_point_index: tuple[int, ...] = ()


def noise_scale(x: F64) -> float:
    """Iteration-to-iteration noise: MAD scale of successive differences / sqrt(2).

    Robust to a level shift (a fault starting mid-trace moves the level, not the
    differences), unlike the MAD of the values themselves.
    """
    if x.size < 3:
        return robust_scale(x)
    d = np.diff(x)
    return MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / float(np.sqrt(2.0))


def robust_scale(x: F64) -> float:
    """MAD-based standard deviation of ``x`` (0 for an empty sample)."""
    if x.size == 0:
        return 0.0
    med = float(np.median(x))
    return MAD_TO_SIGMA * float(np.median(np.abs(x - med)))


def change_points(x: F64, *, min_size: int = 3, threshold: float = 6.0, max_points: int = 4) -> list[int]:
    """Positions where the mean of ``x`` shifts, by binary segmentation on a t-like statistic.

    A split at k is kept when |mean(left) - mean(right)| exceeds ``threshold`` robust standard
    errors (pooled MAD scale, floored at 0.5 % of the median so a perfectly flat series never
    splits on rounding); segments shorter than ``min_size`` are not split. Returns sorted
    positions (the index of the first element of each new segment).
    """
    out: list[int] = []
    med_all = float(np.median(x)) if x.size else 0.0
    floor = 0.005 * abs(med_all)

    def split(lo: int, hi: int) -> None:
        if len(out) >= max_points or hi - lo < 2 * min_size:
            return
        seg = x[lo:hi]
        n = seg.size
        csum = np.cumsum(seg)
        k = np.arange(min_size, n - min_size + 1)
        left = csum[k - 1] / k
        right = (csum[-1] - csum[k - 1]) / (n - k)
        best = int(np.argmax(np.abs(left - right)))
        kk = int(k[best])
        resid = np.concatenate([seg[:kk] - np.median(seg[:kk]), seg[kk:] - np.median(seg[kk:])])
        sigma = max(robust_scale(resid), floor, 1e-12)
        se = sigma * np.sqrt(1.0 / kk + 1.0 / (n - kk))
        if abs(left[best] - right[best]) / se < threshold:
            return
        out.append(lo + kk)
        split(lo, lo + kk)
        split(lo + kk, hi)

    split(0, x.size)
    return sorted(out)


def iteration_stats(
    iterations: npt.NDArray[np.int64], duration_ns: F64, *, k: float = 5.0, rel: float = 0.05
) -> IterationStats:
    """Baseline and irregular iterations of a job's per-iteration durations."""
    order = np.argsort(iterations)
    its, dur = iterations[order], duration_ns[order]
    med = float(np.median(dur)) if dur.size else 0.0
    sigma = robust_scale(dur)
    limit = med + max(k * sigma, rel * med)
    irregular = tuple(int(i) for i, d in zip(its.tolist(), dur.tolist(), strict=True) if d > limit)
    pos = tuple(int(c) for c in change_points(dur))
    cps = tuple(int(its[c]) for c in pos)
    return IterationStats(tuple(int(i) for i in its.tolist()),
                          tuple(int(d) for d in dur.tolist()), med, sigma, irregular, cps, pos)
