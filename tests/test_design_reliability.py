"""Failure table, interruptions, Young / Daly intervals, goodput and availability (issue 13)."""

from __future__ import annotations

import math

import pytest

from fabricscope.design import reliability as rel
from fabricscope.design.model import COMPONENTS, BlastRow, FailureRate
from fabricscope.model.errors import ConfigError


def _rates(per_hour: float = 1e-3, mttr_h: float = 10.0) -> dict[str, FailureRate]:
    return {c: FailureRate(c, per_hour, mttr_h, "test") for c in COMPONENTS}


# --- the default table -------------------------------------------------------------------


def test_default_table_covers_every_component_with_a_source() -> None:
    table = rel.failure_table()
    for component in (*COMPONENTS, "optic", "cable"):
        rate = table[component]
        assert rate.component == component
        assert rate.per_hour > 0 and rate.mttr_h > 0
        assert "[P]" in rate.source or "[estimate" in rate.source, component


def test_default_rates_follow_the_arithmetic_in_their_sources() -> None:
    table = rel.DEFAULT_FAILURE_RATES
    llama_gpu_hours = 16_384 * 54 * 24
    gpu_rows = 148 + 72 + 19 + 17 + 6 + 6
    assert table["gpu"].per_hour == pytest.approx(gpu_rows / llama_gpu_hours, rel=1e-12)
    assert table["nic"].per_hour == pytest.approx(7 / llama_gpu_hours, rel=1e-12)
    # Singh et al.: a 2 % chance within 3 months, as a constant hazard.
    three_months_h = 91.25 * 24
    assert 1 - math.exp(-table["leaf"].per_hour * three_months_h) == pytest.approx(0.02)
    # Links default to fiber with an optic at each end.
    composed = rel.link_rate(table, 2)
    for link in ("link:host-leaf", "link:leaf-spine", "link:spine-core"):
        assert table[link].per_hour == pytest.approx(composed)


def test_survive_window_is_nccl_timeout_times_retries() -> None:
    per_try = 4.096e-6 * 2**18
    assert per_try == pytest.approx(1.0737, rel=1e-4)
    survive = rel.DEFAULT_SURVIVE_S
    assert survive == pytest.approx(7 * per_try)
    assert set(rel.DEFAULT_FAILOVER_S) == set(rel.FAILOVER_SOURCES)
    # Every mechanism but "none" keeps a job alive under the default survival window.
    assert all(v < rel.DEFAULT_SURVIVE_S for v in rel.DEFAULT_FAILOVER_S.values())


# --- overrides -----------------------------------------------------------------------------


def test_overrides_replace_rate_afr_and_mttr() -> None:
    table = rel.failure_table(
        {"leaf": {"afr": 0.5, "mttr_h": 1.5}, "optic": {"per_hour": 2e-6}}, source="a.yaml"
    )
    assert table["leaf"].per_hour == pytest.approx(math.log(2) / 8760)
    assert table["leaf"].mttr_h == 1.5
    assert table["optic"].per_hour == 2e-6
    assert table["optic"].mttr_h == rel.DEFAULT_FAILURE_RATES["optic"].mttr_h
    assert "a.yaml" in table["leaf"].source
    assert table["spine"] == rel.DEFAULT_FAILURE_RATES["spine"]


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"router": {"per_hour": 1e-6}}, ["failure_rates.router", "unknown component"]),
        ({"leaf": {"fit": 5}}, ["failure_rates.leaf.fit", "unknown field"]),
        ({"leaf": {"per_hour": -1e-6}}, ["failure_rates.leaf.per_hour", "-1e-06"]),
        ({"leaf": {"mttr_h": float("nan")}}, ["failure_rates.leaf.mttr_h", "nan"]),
        ({"leaf": {"mttr_h": "2h"}}, ["failure_rates.leaf.mttr_h", "'2h'"]),
        ({"leaf": {"mttr_h": True}}, ["failure_rates.leaf.mttr_h", "True"]),
        ({"leaf": {"afr": 1.0}}, ["failure_rates.leaf.afr", "1.0"]),
        ({"leaf": {"afr": 0.1, "per_hour": 1e-6}}, ["failure_rates.leaf", "not both"]),
        ({"leaf": 3}, ["failure_rates.leaf", "3"]),
    ],
)
def test_bad_override_is_one_config_error_naming_field_and_value(
    overrides: dict[str, object], needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        rel.failure_table(overrides, source="d.yaml")  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message and message.startswith("d.yaml: ")
    for needle in needles:
        assert needle in message


def test_link_rate_composes_cable_and_optics() -> None:
    table = rel.failure_table({"cable": {"per_hour": 1e-7, "mttr_h": 2},
                               "optic": {"per_hour": 4e-7, "mttr_h": 6}})
    assert rel.link_rate(table, 0) == pytest.approx(1e-7)
    assert rel.link_rate(table, 2) == pytest.approx(9e-7)
    link = rel.link_failure_rate(table, "link:leaf-spine", 2)
    assert link.per_hour == pytest.approx(9e-7)
    assert link.mttr_h == pytest.approx((1e-7 * 2 + 8e-7 * 6) / 9e-7)
    with pytest.raises(ConfigError, match="transceivers = -1"):
        rel.link_rate(table, -1)


# --- interruptions -------------------------------------------------------------------------


def test_hit_probability_is_hypergeometric() -> None:
    assert rel.hit_probability(1, 2, 4) == pytest.approx(1 / 2)
    assert rel.hit_probability(2, 2, 4) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert rel.hit_probability(3, 2, 4) == 1.0  # more cut than GPUs outside the job
    assert rel.hit_probability(0, 2, 4) == 0.0
    assert rel.hit_probability(5, 8, 8) == 1.0
    # A fractional (mean) cut sits between its integer neighbours.
    assert rel.hit_probability(1, 2, 4) < rel.hit_probability(1.5, 2, 4) < 5 / 6
    # Far from the edges it is close to 1 - (1 - f)^cut.
    assert rel.hit_probability(32, 8192, 32768) == pytest.approx(1 - 0.75**32, rel=1e-3)


def test_interruptions_on_hand_made_rows() -> None:
    rates = _rates(per_hour=1e-3)
    rows = [
        BlastRow("gpu", 64, 1, 0, 0, "none"),  # p = 32/64
        BlastRow("leaf", 2, 32, 0, 0, "none"),  # p = 1 - 1/C(64, 32)
        BlastRow("spine", 4, 0, 64, 0.25, "fast-reroute"),  # 0.05 s < survive: p = 0
        BlastRow("link:host-leaf", 16, 0, 4, 0.5, "dual-tor"),  # 1 s: interrupts only if slow
    ]
    fast = rel.interruptions(rows, rates, job_gpus=32, total_gpus=64)
    p_leaf = 1 - 1 / math.comb(64, 32)
    expected = {"gpu": 64 * 1e-3 * 24 * 0.5, "leaf": 2 * 1e-3 * 24 * p_leaf,
                "spine": 0.0, "link:host-leaf": 0.0}
    assert fast.by_component == pytest.approx(expected)
    assert fast.per_day == pytest.approx(sum(expected.values()))
    assert fast.mtbf_s == pytest.approx(86400 / fast.per_day)

    slow = rel.interruptions(rows, rates, job_gpus=32, total_gpus=64, survive_s=0.5)
    p_link = 1 - math.comb(32, 4) / math.comb(64, 4)
    assert slow.by_component["link:host-leaf"] == pytest.approx(16 * 1e-3 * 24 * p_link)
    assert slow.by_component["spine"] == 0.0  # 0.05 s still < 0.5 s


def test_interruptions_errors_name_the_value() -> None:
    rows = [BlastRow("leaf", 2, 32, 0, 0, "none")]
    with pytest.raises(ConfigError, match="job_gpus = 65"):
        rel.interruptions(rows, _rates(), job_gpus=65, total_gpus=64)
    with pytest.raises(ConfigError, match="'leaf'"):
        rel.interruptions(rows, {}, job_gpus=8, total_gpus=64)
    row = BlastRow("spine", 1, 0, 8, 0.5, "dual-tor")
    with pytest.raises(ConfigError, match="'dual-tor'"):
        rel.interruptions([row], _rates(), job_gpus=8, total_gpus=64, failover_s={"none": 0})
    assert rel.interruptions([], _rates(), job_gpus=8, total_gpus=64).mtbf_s == math.inf


# --- checkpoint intervals ------------------------------------------------------------------


def test_young_and_daly_on_hand_computed_values() -> None:
    delta, mtbf = 5 * 60.0, 24 * 3600.0
    assert rel.young_interval(delta, mtbf) == pytest.approx(120 * 60.0)  # sqrt(2 x 5 x 1440)
    # 120 x (1 + sqrt(5/2880)/3 + (5/2880)/9) - 5 = 116.6898 min
    assert rel.daly_interval(delta, mtbf) / 60 == pytest.approx(116.6898, abs=1e-4)
    assert rel.daly_interval(3 * 3600.0, 3600.0) == 3600.0  # delta >= 2M: M


@pytest.mark.parametrize(("delta", "mtbf"), [(300.0, 86400.0), (60.0, 7200.0), (3600.0, 5400.0)])
def test_exact_and_numeric_optimum_agree_and_bound_young_and_daly(delta: float,
                                                                  mtbf: float) -> None:
    exact = rel.exact_interval(delta, mtbf)
    x, d = exact / mtbf, delta / mtbf
    assert (1 - x) * math.exp(x + d) == pytest.approx(1.0, rel=1e-12)  # stationarity
    numeric = rel.optimal_interval(delta, 600.0, mtbf)
    assert numeric == pytest.approx(exact, rel=1e-6)
    young, daly = rel.young_interval(delta, mtbf), rel.daly_interval(delta, mtbf)
    # Daly's higher order estimate is closer to the optimum than Young's first order one.
    assert abs(daly - exact) < abs(young - exact)
    # ... and the goodput at the optimum is at least as good as at either estimate.
    best = rel.goodput(exact, delta, 600.0, mtbf)
    assert best >= rel.goodput(daly, delta, 600.0, mtbf) >= rel.goodput(young, delta, 600.0, mtbf)
    if d < 0.01:
        assert daly == pytest.approx(exact, rel=1e-3)


def test_expected_wall_time_by_hand() -> None:
    # One segment of 1 h with M = 1 h, no checkpoint, no restart: M (e - 1).
    assert rel.expected_wall_time(3600, 3600, 0, 0, 3600) == pytest.approx(3600 * (math.e - 1))
    # The restart factor is e^{R/M}; the work scales the wall time linearly.
    with_restart = rel.expected_wall_time(7200, 3600, 0, 1800, 3600)
    assert with_restart == pytest.approx(2 * 3600 * (math.e - 1) * math.exp(0.5))
    # Without failures: work plus one checkpoint per segment.
    assert rel.expected_wall_time(10 * 3600, 3600, 60, 600, math.inf) == 10 * 3660
    assert rel.goodput(3600, 60, 600, math.inf) == pytest.approx(3600 / 3660)
    assert rel.goodput(3600, 60, 600, 1.0) == 0.0  # overflow: never finishes
    with pytest.raises(ConfigError, match="checkpoint_s = -1"):
        rel.young_interval(-1, 3600)


# --- availability --------------------------------------------------------------------------


def test_availability_arithmetic_on_hand_made_rows() -> None:
    rates = _rates(per_hour=1e-4, mttr_h=10.0)
    rows = [
        BlastRow("gpu", 1000, 1, 0, 0, "none"),  # not the fabric's
        BlastRow("leaf", 10, 8, 0, 0, "none"),  # 10 x 1e-4 x 10 h x 8 = 0.08 GPU
        BlastRow("spine", 20, 0, 16, 0.5, "fast-reroute"),
    ]
    av = rel.availability(rows, rates, total_gpus=1000, checkpoint_s=60, restart_s=600)
    assert av.fabric == pytest.approx(1 - 0.08 / 1000)
    assert av.nines == pytest.approx(-math.log10(0.08 / 1000))
    assert av.meets_target
    degraded = 20 * 1e-4 * 16 * (0.05 / 3600 + 0.5 * 10) / 1000
    assert av.degraded == pytest.approx(degraded)
    assert av.by_component == pytest.approx({"leaf": 8e-5, "spine": 0.0})
    # The job figure: Daly goodput of a job on all GPUs (every leaf failure and GPU failure).
    per_day = (1000 * 1e-4 + 10 * 1e-4) * 24
    mtbf = 86400 / per_day
    assert av.job_mtbf_s == pytest.approx(mtbf)
    assert av.job_interval_s == pytest.approx(rel.daly_interval(60, mtbf))
    assert av.job == pytest.approx(rel.goodput(av.job_interval_s, 60, 600, mtbf))

    worse = rel.availability([*rows, BlastRow("core", 2, 100, 0, 0, "none")], rates,
                             total_gpus=1000)
    assert worse.fabric == pytest.approx(1 - (0.08 + 0.2) / 1000)
    assert not worse.meets_target
