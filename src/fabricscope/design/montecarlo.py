"""Monte Carlo over failure sequences: a checkpointed job's wall time and a design's year.

Two simulations of the processes whose means ``reliability`` gives in closed form, so a
caller can show the distribution beside the mean and a test can check one against the other:

- :func:`simulate_checkpointed_job` is a discrete-event simulation of Daly's (2006) process
  (exponential failures of mean ``M``; segments of ``tau`` work plus a ``delta`` checkpoint,
  each lost on a failure; a restart ``R`` after each failure, itself lost and redone on a
  failure). It is vectorized by drawing, per run, the number of failed attempts of all
  segments at once (a sum of geometric counts is negative binomial) and the time each
  failed attempt lost from the exponential truncated to the attempt's length.
- :func:`monte_carlo` draws every component class's failures over a horizon as a Poisson
  process (``count x per_hour`` per class, not per unit: a 32k-GPU design has ~200k links),
  each with an exponential repair time, thins them into job interruptions, and replays the
  job's checkpointing on the drawn interruption times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.design.model import BlastRow, FailureRate
from fabricscope.design.reliability import (
    DEFAULT_FAILOVER_S,
    DEFAULT_SURVIVE_S,
    _check_gpus,
    _check_param,
    _failover_time,
    _rate_of,
    availability,
    expected_wall_time,
    goodput,
    interrupt_probability,
    interruptions,
)
from fabricscope.model.errors import ConfigError

__all__ = ["DesResult", "Distribution", "McResult", "monte_carlo", "simulate_checkpointed_job"]

#: Normal quantile of a two-sided 95 % confidence interval.
Z95 = 1.959963984540054
#: Most truncated-exponential draws held in memory at once.
_CHUNK = 2_000_000

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class DesResult:
    """Wall time and goodput of a checkpointed job over ``runs`` simulated runs.

    ``wall_ci_s`` is the 95 % confidence interval of the mean wall time (normal, from the
    runs' standard deviation); ``goodput = work / mean wall`` (the quantity Daly's formula
    gives) with ``goodput_ci`` mapped from it. ``closed_form_*`` is Daly's formula beside it.
    """

    runs: int
    mean_wall_s: float
    std_wall_s: float
    wall_ci_s: tuple[float, float]
    goodput: float
    goodput_ci: tuple[float, float]
    mean_failures: float
    closed_form_wall_s: float
    closed_form_goodput: float


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean, its standard error, 5th / 50th / 95th percentiles, and the closed-form mean."""

    mean: float
    se: float
    p5: float
    p50: float
    p95: float
    closed_form: float


@dataclass(frozen=True, slots=True)
class McResult:
    """Per-run figures of a design over ``horizon_h`` hours, summarized over ``runs``.

    ``interruptions``: job interruptions in the horizon (``interruptions_per_day`` the same
    per day); ``gpu_hours_cut``: GPU-hours without a fabric path (GPU failures excluded);
    ``degraded_gpu_hours``: bandwidth-weighted GPU-hours lost on degraded GPUs;
    ``availability``: fabric availability (``1 - cut / (total x horizon)``); ``goodput``: the
    job's useful work / horizon. ``goodput_edge`` bounds how far the goodput's mean may sit
    from the closed form because the horizon is finite (``(tau + delta + R) / horizon``: the
    job starts without a restart and its last, unfinished segment counts).
    """

    runs: int
    horizon_h: float
    interruptions: Distribution
    interruptions_per_day: Distribution
    interruptions_by_component: Mapping[str, float]
    gpu_hours_cut: Distribution
    degraded_gpu_hours: Distribution
    availability: Distribution
    goodput: Distribution
    goodput_edge: float


def _sum_truncexp(
    counts: IntArray, length_s: float, mtbf_s: float, rng: np.random.Generator
) -> FloatArray:
    """Per run, the sum of ``counts[i]`` exponentials (mean ``mtbf_s``) truncated to ``length_s``.

    Inverse CDF of the truncated exponential: ``t = -M ln(1 - u (1 - e^{-L/M}))``.
    """
    out = np.zeros(counts.size)
    if length_s <= 0 or not counts.any():
        return out
    mass = -math.expm1(-length_s / mtbf_s)
    ends = np.cumsum(counts)
    start = 0
    while start < counts.size:
        # The runs from ``start`` whose draws fit in one chunk (at least one run).
        base = ends[start - 1] if start else 0
        stop = int(np.searchsorted(ends, base + _CHUNK, side="right"))
        stop = max(stop, start + 1)
        part = counts[start:stop]
        u = rng.random(int(part.sum()))
        lost = -mtbf_s * np.log1p(-u * mass)
        idx = np.repeat(np.arange(part.size), part)
        out[start:stop] = np.bincount(idx, weights=lost, minlength=part.size)
        start = stop
    return out


def _negative_binomial(
    successes: IntArray | int, p: float, runs: int, rng: np.random.Generator
) -> IntArray:
    """Failures before ``successes`` successes of probability ``p`` (0 where successes is 0)."""
    n = np.broadcast_to(np.asarray(successes, dtype=np.int64), (runs,))
    out = np.zeros(runs, dtype=np.int64)
    if p >= 1.0:
        return out
    if p <= 0.0:
        raise ConfigError("a segment or restart can never complete: (tau + delta) / M overflows")
    live = n > 0
    if live.any():
        out[live] = rng.negative_binomial(n[live], p)
    return out


def _attempts_time(
    segments: int, length_s: float, restart_s: float, mtbf_s: float,
    runs: int, rng: np.random.Generator,
) -> tuple[FloatArray, IntArray]:
    """Wall time per run to get ``segments`` segments of ``length_s`` through, and failures."""
    if segments == 0:
        return np.zeros(runs), np.zeros(runs, dtype=np.int64)
    time = np.full(runs, float(segments * length_s))
    if math.isinf(mtbf_s):
        return time, np.zeros(runs, dtype=np.int64)
    failures = _negative_binomial(segments, math.exp(-length_s / mtbf_s), runs, rng)
    time += _sum_truncexp(failures, length_s, mtbf_s, rng)
    # Each failure needs one restart that completes; failed restart attempts come first.
    failed_restarts = _negative_binomial(failures, math.exp(-restart_s / mtbf_s), runs, rng)
    time += failures * restart_s + _sum_truncexp(failed_restarts, restart_s, mtbf_s, rng)
    return time, failures + failed_restarts


def simulate_checkpointed_job(
    *,
    work_s: float,
    tau_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    runs: int,
    rng: np.random.Generator,
) -> DesResult:
    """Discrete-event simulation of a checkpointed job under exponential failures.

    The job has ``work_s`` of work in segments of ``tau_s`` (the last one shorter when
    ``work_s / tau_s`` is not an integer), each followed by a ``checkpoint_s`` write. A
    failure (rate ``1 / mtbf_s``) anywhere in a segment loses it; then a restart of
    ``restart_s``, itself restarted when a failure hits it, and the segment again. This is
    the process of Daly (2006), whose closed form :func:`reliability.expected_wall_time` the
    result carries beside the simulated mean. 10,000 runs of a 30-day job take well under a
    second (the cost grows with the number of failures drawn).
    """
    _check_param("work_s", work_s, positive=True)
    _check_param("tau_s", tau_s, positive=True)
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("restart_s", restart_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    if runs < 2:
        raise ConfigError(f"runs = {runs!r}: must be >= 2 for a confidence interval")
    full = math.floor(work_s / tau_s * (1 + 1e-12))
    rest = max(work_s - full * tau_s, 0.0)
    if rest <= 1e-9 * tau_s:
        rest = 0.0
    wall, failures = _attempts_time(full, tau_s + checkpoint_s, restart_s, mtbf_s, runs, rng)
    if rest:
        more, fails = _attempts_time(1, rest + checkpoint_s, restart_s, mtbf_s, runs, rng)
        wall, failures = wall + more, failures + fails
    mean = float(wall.mean())
    std = float(wall.std(ddof=1))
    half = Z95 * std / math.sqrt(runs)
    lo, hi = mean - half, mean + half
    closed = expected_wall_time(work_s, tau_s, checkpoint_s, restart_s, mtbf_s)
    return DesResult(
        runs=runs,
        mean_wall_s=mean,
        std_wall_s=std,
        wall_ci_s=(lo, hi),
        goodput=work_s / mean,
        goodput_ci=(work_s / hi, work_s / lo if lo > 0 else math.inf),
        mean_failures=float(failures.mean()),
        closed_form_wall_s=closed,
        closed_form_goodput=work_s / closed if closed > 0 else 1.0,
    )


def _distribution(values: FloatArray, closed_form: float) -> Distribution:
    p5, p50, p95 = np.percentile(values, [5.0, 50.0, 95.0])
    se = float(values.std(ddof=1)) / math.sqrt(values.size) if values.size > 1 else math.nan
    return Distribution(float(values.mean()), se, float(p5), float(p50), float(p95), closed_form)


def _job_work(
    counts: IntArray, horizon_s: float, tau_s: float, checkpoint_s: float, restart_s: float,
    rng: np.random.Generator,
) -> FloatArray:
    """Useful work per run given ``counts[i]`` interruptions at uniform times in the horizon.

    Between two interruptions the job first restarts (``R``; the first interval starts from
    a running job), then commits ``tau`` per full ``tau + delta`` segment; what it did since
    the last checkpoint is lost. The last interval ends at the horizon, not by a failure, so
    its unfinished segment's work counts.
    """
    runs = counts.size
    seg = tau_s + checkpoint_s
    run_of = np.repeat(np.arange(runs), counts)
    times = rng.uniform(0.0, horizon_s, size=run_of.size)
    order = np.argsort(run_of + times / (horizon_s * (1 + 1e-9)), kind="stable")
    times = times[order]
    first = np.zeros(run_of.size, dtype=bool)
    starts = np.cumsum(counts) - counts
    first[starts[counts > 0]] = True
    prev = np.empty_like(times)
    if times.size:
        prev[1:] = times[:-1]
        prev[first] = 0.0
    up = np.maximum(times - prev - np.where(first, 0.0, restart_s), 0.0)
    work: FloatArray = np.bincount(
        run_of, weights=np.floor(up / seg) * tau_s, minlength=runs
    ).astype(np.float64)
    last = np.zeros(runs)
    has = counts > 0
    last[has] = times[starts[has] + counts[has] - 1]
    up_end = np.maximum(horizon_s - last - np.where(has, restart_s, 0.0), 0.0)
    work += np.floor(up_end / seg) * tau_s + np.minimum(np.mod(up_end, seg), tau_s)
    return work


def monte_carlo(
    rows: Sequence[BlastRow],
    rates: Mapping[str, FailureRate],
    *,
    total_gpus: int,
    job_gpus: int,
    horizon_h: float,
    runs: int,
    rng: np.random.Generator,
    tau_s: float,
    checkpoint_s: float,
    restart_s: float,
    failover_s: Mapping[str, float] = DEFAULT_FAILOVER_S,
    survive_s: float = DEFAULT_SURVIVE_S,
) -> McResult:
    """Monte Carlo of a design's failures over ``horizon_h`` hours, ``runs`` times.

    Per run and class: ``N ~ Poisson(count x per_hour x horizon)`` failures, their summed
    repair time ``~ Gamma(N, mttr_h)`` (a sum of exponentials), of which
    ``Binomial(N, p)`` stop the job (``p`` from :func:`reliability.interrupt_probability`);
    the job's goodput comes from replaying its checkpoints on uniformly drawn interruption
    times, not from the mean formula. Like the closed form, it is first order: overlapping
    failures of the same GPUs are counted twice. Each figure carries its closed-form mean
    (``reliability.interruptions`` / ``availability`` / ``goodput``).
    """
    _check_gpus(job_gpus, total_gpus)
    _check_param("horizon_h", horizon_h, positive=True)
    _check_param("tau_s", tau_s, positive=True)
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("restart_s", restart_s)
    if runs < 2:
        raise ConfigError(f"runs = {runs!r}: must be >= 2 for a standard error")
    horizon_s = horizon_h * 3600.0
    n_int: IntArray = np.zeros(runs, dtype=np.int64)
    cut_h = np.zeros(runs)
    degraded_h = np.zeros(runs)
    by: dict[str, float] = {}
    for row in rows:
        rate = _rate_of(rates, row.component)
        failures = rng.poisson(row.count * rate.per_hour * horizon_h, size=runs)
        p = interrupt_probability(row, job_gpus=job_gpus, total_gpus=total_gpus,
                                  failover_s=failover_s, survive_s=survive_s)
        hits = rng.binomial(failures, p)
        n_int += hits
        by[row.component] = by.get(row.component, 0.0) + float(hits.mean()) * 24.0 / horizon_h
        if row.component == "gpu":
            continue
        repair_h = rng.gamma(np.maximum(failures, 1), rate.mttr_h) * (failures > 0)
        cut_h += row.gpus_cut * repair_h
        if row.gpus_degraded:
            fail_h = _failover_time(failover_s, row.failover) / 3600.0
            degraded_h += row.gpus_degraded * (failures * fail_h + row.bandwidth_lost * repair_h)
    work = _job_work(n_int, horizon_s, tau_s, checkpoint_s, restart_s, rng)

    closed_int = interruptions(rows, rates, job_gpus=job_gpus, total_gpus=total_gpus,
                               failover_s=failover_s, survive_s=survive_s)
    closed_av = availability(rows, rates, total_gpus=total_gpus, checkpoint_s=checkpoint_s,
                             restart_s=restart_s, failover_s=failover_s, survive_s=survive_s)
    gpu_h = total_gpus * horizon_h
    days = horizon_h / 24.0
    n = n_int.astype(np.float64)
    return McResult(
        runs=runs,
        horizon_h=horizon_h,
        interruptions=_distribution(n, closed_int.per_day * days),
        interruptions_per_day=_distribution(n / days, closed_int.per_day),
        interruptions_by_component=by,
        gpu_hours_cut=_distribution(cut_h, (1.0 - closed_av.fabric) * gpu_h),
        degraded_gpu_hours=_distribution(degraded_h, closed_av.degraded * gpu_h),
        availability=_distribution(1.0 - cut_h / gpu_h, closed_av.fabric),
        goodput=_distribution(
            work / horizon_s, goodput(tau_s, checkpoint_s, restart_s, closed_int.mtbf_s)
        ),
        goodput_edge=(tau_s + checkpoint_s + restart_s) / horizon_s,
    )
