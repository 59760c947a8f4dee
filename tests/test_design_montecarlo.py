"""The discrete-event and Monte Carlo simulations against the closed forms (issue 13).

Statistical checks are seeded; each tolerance is Z standard errors of the simulation's own
sample (Z = 3.29, a two-sided 99.9 % interval), never a loosened constant.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fabricscope.design import montecarlo as mc
from fabricscope.design import reliability as rel
from fabricscope.design.model import COMPONENTS, BlastRow, FailureRate
from fabricscope.model.errors import ConfigError

Z = 3.29
DAY = 86400.0


def _within(value: float, mean: float, se: float, extra: float = 0.0) -> bool:
    return abs(value - mean) <= Z * se + extra


@pytest.mark.parametrize(
    ("work_s", "tau_s", "delta_s", "restart_s", "mtbf_s"),
    [
        (30 * DAY, None, 300.0, 600.0, DAY),  # delta << M, at Daly's interval
        (10 * DAY, 3600.0, 3600.0, 600.0, 5400.0),  # delta comparable to M
        (5 * DAY, 1800.0, 120.0, 1800.0, 3600.0),  # a restart half as long as M
    ],
)
def test_daly_wall_time_lies_in_the_des_confidence_interval(
    work_s: float, tau_s: float | None, delta_s: float, restart_s: float, mtbf_s: float
) -> None:
    tau = tau_s if tau_s is not None else rel.daly_interval(delta_s, mtbf_s)
    if tau_s is None:  # an integer number of segments, where Daly's formula is exact
        tau = work_s / round(work_s / tau)
    runs = 10_000
    res = mc.simulate_checkpointed_job(work_s=work_s, tau_s=tau, checkpoint_s=delta_s,
                                       restart_s=restart_s, mtbf_s=mtbf_s, runs=runs,
                                       rng=np.random.default_rng(20240613))
    closed = rel.expected_wall_time(work_s, tau, delta_s, restart_s, mtbf_s)
    assert res.closed_form_wall_s == closed
    se = res.std_wall_s / math.sqrt(runs)
    assert _within(closed, res.mean_wall_s, se)
    lo, hi = res.wall_ci_s
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=1e-3)
    # The check has power: the interval is tight, and dropping Daly's restart factor
    # e^{R/M} (a plausible mistake) puts the formula far outside it.
    assert (hi - lo) / res.mean_wall_s < 0.01
    assert not _within(closed / math.exp(restart_s / mtbf_s), res.mean_wall_s, se)
    assert res.goodput_ci[0] <= res.goodput <= res.goodput_ci[1]


def test_des_handles_a_shorter_last_segment_and_no_failures() -> None:
    rng = np.random.default_rng(7)
    work, tau, delta, restart, mtbf = 10.5 * 3600, 3600.0, 60.0, 300.0, 4 * 3600.0
    res = mc.simulate_checkpointed_job(work_s=work, tau_s=tau, checkpoint_s=delta,
                                       restart_s=restart, mtbf_s=mtbf, runs=20_000, rng=rng)
    # Ten full segments plus one of half the work, each by Daly's segment formula.
    exact = (rel.expected_wall_time(10 * tau, tau, delta, restart, mtbf)
             + rel.expected_wall_time(tau / 2, tau / 2, delta, restart, mtbf))
    assert _within(exact, res.mean_wall_s, res.std_wall_s / math.sqrt(res.runs))

    calm = mc.simulate_checkpointed_job(work_s=work, tau_s=tau, checkpoint_s=delta,
                                        restart_s=restart, mtbf_s=math.inf, runs=10, rng=rng)
    assert calm.mean_wall_s == pytest.approx(work + 11 * delta)
    assert calm.std_wall_s == 0.0 and calm.mean_failures == 0.0


def test_des_mean_failures_match_the_geometric_count() -> None:
    tau, delta, restart, mtbf = 3600.0, 600.0, 900.0, 7200.0
    res = mc.simulate_checkpointed_job(work_s=100 * tau, tau_s=tau, checkpoint_s=delta,
                                       restart_s=restart, mtbf_s=mtbf, runs=5000,
                                       rng=np.random.default_rng(3))
    per_segment = math.expm1((tau + delta) / mtbf)  # failed attempts of one segment
    per_restart = math.expm1(restart / mtbf)  # failed attempts of one restart
    expected = 100 * per_segment * (1 + per_restart)
    # Failures counted per run: a compound of negative binomials; its sd is below
    # sqrt(mean x (1 + mean / n)) x (1 + per_restart), enough for a Z-sigma bound.
    sd = math.sqrt(expected * (1 + per_segment)) * (1 + per_restart)
    assert _within(res.mean_failures, expected, sd / math.sqrt(res.runs))


def test_des_is_deterministic_with_a_seed_and_checks_its_inputs() -> None:
    kwargs: dict[str, Any] = dict(work_s=20 * DAY, tau_s=3600.0, checkpoint_s=60.0,
                                  restart_s=600.0, mtbf_s=8 * 3600.0, runs=500)
    a = mc.simulate_checkpointed_job(**kwargs, rng=np.random.default_rng(1))
    b = mc.simulate_checkpointed_job(**kwargs, rng=np.random.default_rng(1))
    c = mc.simulate_checkpointed_job(**kwargs, rng=np.random.default_rng(2))
    assert a == b
    assert a.mean_wall_s != c.mean_wall_s
    with pytest.raises(ConfigError, match="runs = 1"):
        mc.simulate_checkpointed_job(**{**kwargs, "runs": 1}, rng=np.random.default_rng(1))
    with pytest.raises(ConfigError, match="tau_s = 0"):
        mc.simulate_checkpointed_job(**{**kwargs, "tau_s": 0}, rng=np.random.default_rng(1))


# --- Monte Carlo over a design ----------------------------------------------------------


def _design() -> tuple[list[BlastRow], dict[str, FailureRate]]:
    """A 256-GPU design with rates high enough for many events per run."""
    rates = {c: FailureRate(c, 2e-4, 6.0, "test") for c in COMPONENTS}
    rates["leaf"] = FailureRate("leaf", 2e-3, 3.0, "test")
    rows = [
        BlastRow("gpu", 256, 1, 0, 0, "none"),
        BlastRow("nic", 256, 1, 0, 0, "none"),
        BlastRow("leaf", 16, 16, 0, 0, "none"),
        BlastRow("spine", 8, 0, 256, 0.125, "fast-reroute"),
        BlastRow("link:host-leaf", 256, 0.5, 0.5, 0.5, "dual-tor"),
        BlastRow("link:leaf-spine", 512, 0, 16, 1 / 16, "fast-reroute"),
    ]
    return rows, rates


@pytest.mark.parametrize("job_gpus", [256, 64])
def test_monte_carlo_means_match_the_closed_forms(job_gpus: int) -> None:
    rows, rates = _design()
    res = mc.monte_carlo(rows, rates, total_gpus=256, job_gpus=job_gpus, horizon_h=24 * 90,
                         runs=2000, rng=np.random.default_rng(11), tau_s=1800.0,
                         checkpoint_s=60.0, restart_s=600.0)
    for name in ("interruptions", "interruptions_per_day", "gpu_hours_cut",
                 "degraded_gpu_hours", "availability"):
        d = getattr(res, name)
        assert d.se > 0, name
        assert _within(d.closed_form, d.mean, d.se), (name, d)
        assert d.p5 <= d.p50 <= d.p95, name
    g = res.goodput
    assert _within(g.closed_form, g.mean, g.se, extra=res.goodput_edge), g
    # Power: forgetting the restart factor e^{R/M} of Daly's goodput falls outside it.
    closed = rel.interruptions(rows, rates, job_gpus=job_gpus, total_gpus=256)
    wrong = g.closed_form * math.exp(600.0 / closed.mtbf_s)
    assert not _within(wrong, g.mean, g.se, extra=res.goodput_edge)
    assert res.interruptions_per_day.closed_form == pytest.approx(closed.per_day)
    assert sum(res.interruptions_by_component.values()) == pytest.approx(
        res.interruptions_per_day.mean)
    # Poisson interruptions: the sample variance of the counts is close to their mean
    # (the sd of s^2 / mean is about sqrt(2 / runs) for a large mean).
    counts_var = (res.interruptions.se * math.sqrt(res.runs)) ** 2
    assert counts_var / res.interruptions.mean == pytest.approx(1.0, abs=Z * math.sqrt(2 / 2000))


def test_monte_carlo_goodput_replays_checkpoints_without_failures() -> None:
    rows, _ = _design()
    rates = {c: FailureRate(c, 0.0, 1.0, "test") for c in COMPONENTS}
    tau, delta, horizon_h = 1800.0, 60.0, 10.0
    res = mc.monte_carlo(rows, rates, total_gpus=256, job_gpus=256, horizon_h=horizon_h,
                         runs=4, rng=np.random.default_rng(0), tau_s=tau,
                         checkpoint_s=delta, restart_s=600.0)
    horizon = horizon_h * 3600
    done = (horizon // (tau + delta)) * tau + min(horizon % (tau + delta), tau)
    assert res.goodput.mean == pytest.approx(done / horizon)
    assert res.availability.mean == 1.0 and res.interruptions.mean == 0.0


def test_monte_carlo_is_deterministic_with_a_seed() -> None:
    rows, rates = _design()
    kwargs: dict[str, Any] = dict(total_gpus=256, job_gpus=128, horizon_h=720.0, runs=200,
                                  tau_s=1800.0, checkpoint_s=60.0, restart_s=600.0)
    a = mc.monte_carlo(rows, rates, rng=np.random.default_rng(5), **kwargs)
    b = mc.monte_carlo(rows, rates, rng=np.random.default_rng(5), **kwargs)
    c = mc.monte_carlo(rows, rates, rng=np.random.default_rng(6), **kwargs)
    assert a == b
    assert a.goodput.mean != c.goodput.mean
    with pytest.raises(ConfigError, match="job_gpus = 512"):
        mc.monte_carlo(rows, rates, rng=np.random.default_rng(5), **{**kwargs, "job_gpus": 512})
