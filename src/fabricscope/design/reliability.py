"""Failure rates, job interruptions, checkpoint intervals, goodput and fabric availability.

The closed forms of the design what-if (issue 13); ``montecarlo`` simulates the same processes
for the distribution. Every default figure carries a ``source``: ``[P]`` a published paper,
``[V]`` a vendor figure, ``[estimate: why]`` where no public figure exists. The model, its
formulas and what it leaves out are in ``docs/design/design-availability.md``.

Checkpointing follows Young (1974), "A first order approximation to the optimum checkpoint
interval", CACM 17(9), and Daly (2006), "A higher order estimate of the optimum checkpoint
interval for restart dumps", FGCS 22(3): failures are a Poisson process of mean time between
failures ``M``; work is done in segments of ``tau`` seconds each followed by a checkpoint of
``delta`` seconds; a failure anywhere in a segment loses it and costs a restart of ``R``
seconds, during which failures can also occur.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scipy.optimize import minimize_scalar
from scipy.special import gammaln, lambertw

from fabricscope.design.model import FAILOVERS, BlastRow, FailureRate
from fabricscope.model.errors import ConfigError

__all__ = [
    "AVAILABILITY_TARGET",
    "DEFAULT_CHECKPOINT_S",
    "DEFAULT_FAILOVER_S",
    "DEFAULT_FAILURE_RATES",
    "DEFAULT_RESTART_S",
    "DEFAULT_SURVIVE_S",
    "FAILOVER_SOURCES",
    "Availability",
    "Interruptions",
    "availability",
    "daly_interval",
    "exact_interval",
    "expected_wall_time",
    "failure_table",
    "goodput",
    "hit_probability",
    "interrupt_probability",
    "interruptions",
    "link_failure_rate",
    "link_rate",
    "optimal_interval",
    "per_hour_from_afr",
    "unavailability_terms",
    "young_interval",
]

HOURS_PER_YEAR = 8760.0

#: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4 and Table 5): 419
#: unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs.
_LLAMA3_UNIT_HOURS = 16_384 * 54 * 24.0
#: Singh et al. 2021, "Surviving switch failures in cloud datacenters", SIGCOMM CCR 51(2):
#: a switch has a 2 % chance of failing within 3 months (180k Azure switches).
_SINGH_PER_HOUR = -math.log(1.0 - 0.02) / (91.25 * 24.0)


def per_hour_from_afr(afr: float) -> float:
    """Constant hazard per hour of an annualized failure rate (fraction failing in a year).

    ``afr = 1 - exp(-8760 h x per_hour)``, so ``per_hour = -ln(1 - afr) / 8760``.
    """
    if not 0.0 <= afr < 1.0:
        raise ConfigError(f"afr = {afr!r}: must be a fraction in [0, 1)")
    return -math.log1p(-afr) / HOURS_PER_YEAR


_OPTIC_PER_HOUR = per_hour_from_afr(0.005)
_CABLE_PER_HOUR = per_hour_from_afr(0.001)
_LINK_PER_HOUR = _CABLE_PER_HOUR + 2 * _OPTIC_PER_HOUR
_SWITCH_MTTR_SOURCE = (
    "[estimate: Singh et al. 2021 report half of switch failures last < 6 min; the rest need "
    "a reload or a replacement from on-site spares (~4 h): 0.5 x 0.1 h + 0.5 x 4 h ~ 2 h]"
)
_SWITCH_SOURCE = (
    "Singh et al. 2021 [P]: P(switch failure within 3 months) = 2 % -> -ln(0.98) / "
    f"(91.25 d x 24 h) = {_SINGH_PER_HOUR:.3g} /h (AFR 7.8 %), all tiers pooled; "
    f"mttr {_SWITCH_MTTR_SOURCE}"
)
_LINK_SOURCE = (
    f"cable + 2 x optic = {_CABLE_PER_HOUR:.3g} + 2 x {_OPTIC_PER_HOUR:.3g} = "
    f"{_LINK_PER_HOUR:.3g} /h (default media: fiber with a transceiver at each end; the BOM "
    "recomposes it from the real media with link_rate()); mttr [estimate: 4 h, as optic]"
)

#: Default per-unit failure rates of every component class (and of the parts of a link).
DEFAULT_FAILURE_RATES: Mapping[str, FailureRate] = {
    "gpu": FailureRate(
        "gpu", 268 / _LLAMA3_UNIT_HOURS, 24.0,
        "Llama 3 (Dubey et al. 2024, Table 5) [P]: 268 GPU interruptions (faulty GPU 148, "
        "HBM3 72, SRAM 19, GPU system processor 17, silent data corruption 6, thermal "
        f"interface / sensor 6) / (16,384 GPUs x 54 d x 24 h) = {268 / _LLAMA3_UNIT_HOURS:.3g}"
        " /h; mttr [estimate: node drained and its GPU swapped or the node replaced within a "
        "day: 24 h]",
    ),
    "nic": FailureRate(
        "nic", 7 / _LLAMA3_UNIT_HOURS, 8.0,
        "Llama 3 (Dubey et al. 2024, Table 5) [P]: 7 NIC interruptions / (16,384 NICs, one "
        f"400G NIC per GPU, x 54 d x 24 h) = {7 / _LLAMA3_UNIT_HOURS:.3g} /h; mttr "
        "[estimate: NIC swap in a drained node within a shift: 8 h]",
    ),
    "leaf": FailureRate("leaf", _SINGH_PER_HOUR, 2.0, _SWITCH_SOURCE),
    "spine": FailureRate("spine", _SINGH_PER_HOUR, 2.0, _SWITCH_SOURCE),
    "core": FailureRate("core", _SINGH_PER_HOUR, 2.0, _SWITCH_SOURCE),
    "link:host-leaf": FailureRate("link:host-leaf", _LINK_PER_HOUR, 4.0, _LINK_SOURCE),
    "link:leaf-spine": FailureRate("link:leaf-spine", _LINK_PER_HOUR, 4.0, _LINK_SOURCE),
    "link:spine-core": FailureRate("link:spine-core", _LINK_PER_HOUR, 4.0, _LINK_SOURCE),
    "optic": FailureRate(
        "optic", _OPTIC_PER_HOUR, 4.0,
        "[estimate: field AFR of 400G/800G pluggable transceivers is commonly put at "
        "0.5-2 %/yr, vendor datasheets quote MTBF ~1e6 h (AFR ~0.9 %) [V]; AFR 0.5 %/yr -> "
        f"-ln(0.995) / 8760 h = {_OPTIC_PER_HOUR:.3g} /h. Cross-check: 16,384 host links x 2 "
        "optics over Llama 3's 54 d gives ~24 interruptions, ~5.8 % of 419, in line with "
        "'about 5 % of AI-cluster faults come from optics' [V]]; mttr [estimate: swap of a "
        "pluggable by on-site staff within a shift, detection and drain included: 4 h]",
    ),
    "cable": FailureRate(
        "cable", _CABLE_PER_HOUR, 4.0,
        "[estimate: a passive copper cable or fiber run rarely fails outright once installed "
        f"(damage, a dirty or loose connector): AFR 0.1 %/yr -> {_CABLE_PER_HOUR:.3g} /h]; mttr "
        "[estimate: re-seat or replace within a shift: 4 h]",
    ),
}

#: Time (s) a failover mechanism needs before the degraded GPUs have a path again.
DEFAULT_FAILOVER_S: Mapping[str, float] = {
    "fast-reroute": 0.05,
    "dual-tor": 1.0,
    "multi-plane": 0.01,
    "none": 0.0,
}
FAILOVER_SOURCES: Mapping[str, str] = {
    "fast-reroute": "BFD (RFC 5880) detection at 3 x 10-15 ms plus local repair (IP fast "
    "reroute, RFC 5286 loop-free alternates, or ECMP next-hop removal): the < 50 ms "
    "practice [F]",
    "dual-tor": "[estimate: the host's bond / MLAG switch-over to the surviving ToR after "
    "link-down or LACP timeout, ~1 s; Alibaba HPN (Qian et al., SIGCOMM 2024) reports that "
    "dual-ToR keeps jobs running through a ToR failure [P] but no switch-over time we cite]",
    "multi-plane": "[estimate: the NIC sees its plane port go down and stops striping onto "
    "that plane locally, ~10 ms]",
    "none": "no failover: the affected GPUs are cut until the repair",
}

#: How long (s) a NCCL job survives a fabric outage: the IB/RoCE transport's local ACK
#: timeout x its retry count. NCCL environment-variable docs (NCCL_IB_TIMEOUT, default 18:
#: 4.096 us x 2^18 = 1.07 s per try; NCCL_IB_RETRY_CNT, default 7): 7 x 1.07 s = 7.5 s.
#: Counting the first try as well it is 8 x 1.07 = 8.6 s; we keep the lower figure.
DEFAULT_SURVIVE_S: float = 7 * 4.096e-6 * 2**18

#: Defaults for a job's checkpoint write ``delta`` and restart ``R`` (s), used where a
#: caller gives none. Both [estimate]: a synchronous sharded save of a 70B-400B model state to
#: a parallel file system takes tens of seconds to minutes; a restart (reschedule, NCCL
#: initialisation at 10k+ ranks, checkpoint load) ~10 minutes.
DEFAULT_CHECKPOINT_S: float = 60.0
DEFAULT_RESTART_S: float = 600.0

#: 99.99 % availability: the stated entry ticket of 10k-GPU systems [V] (OPERATIONS.md sec. 1).
AVAILABILITY_TARGET: float = 0.9999

_OVERRIDE_KEYS = ("per_hour", "afr", "mttr_h")


def failure_table(
    overrides: Mapping[str, Mapping[str, float]] | None = None, *, source: str = "design"
) -> dict[str, FailureRate]:
    """The default failure table with a design's overrides applied.

    ``overrides`` maps a component class (``DEFAULT_FAILURE_RATES`` keys) to any of
    ``per_hour``, ``afr`` (annual failing fraction, converted with
    :func:`per_hour_from_afr`; not together with ``per_hour``) and ``mttr_h``. ``source``
    names where they came from (a file name) in the overridden entries and in error messages.

    Raises ConfigError (one line naming ``source``, the field and the value) on an unknown
    component or key, a non-number, a negative or non-finite value.
    """
    table = dict(DEFAULT_FAILURE_RATES)
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{source}: failure_rates = {overrides!r}: must be a mapping")
    for component, fields in overrides.items():
        where = f"{source}: failure_rates.{component}"
        if component not in table:
            known = ", ".join(table)
            raise ConfigError(f"{where}: unknown component {component!r} (known: {known})")
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{where} = {fields!r}: must be a mapping of {_OVERRIDE_KEYS}")
        for key, value in fields.items():
            if key not in _OVERRIDE_KEYS:
                known = ", ".join(_OVERRIDE_KEYS)
                raise ConfigError(f"{where}.{key}: unknown field (known: {known})")
            _check_value(f"{where}.{key}", value)
        if "per_hour" in fields and "afr" in fields:
            raise ConfigError(f"{where}: give per_hour or afr, not both")
        old = table[component]
        per_hour = old.per_hour
        if "per_hour" in fields:
            per_hour = float(fields["per_hour"])
        elif "afr" in fields:
            afr = float(fields["afr"])
            if afr >= 1.0:
                raise ConfigError(f"{where}.afr = {afr!r}: must be a fraction in [0, 1)")
            per_hour = per_hour_from_afr(afr)
        mttr_h = float(fields["mttr_h"]) if "mttr_h" in fields else old.mttr_h
        given = ", ".join(f"{k}={fields[k]!r}" for k in fields)
        table[component] = FailureRate(
            component, per_hour, mttr_h, f"{source} override ({given}); default: {old.source}"
        )
    return table


def _check_value(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} = {value!r}: must be a number")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} = {value!r}: must be a finite number >= 0")


def _check_param(name: str, value: float, *, positive: bool = False, inf: bool = False) -> None:
    ok = (value > 0 if positive else value >= 0) and (inf or math.isfinite(value))
    if isinstance(value, bool) or math.isnan(value) or not ok:
        need = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} = {value!r}: must be a finite number {need}")


def link_rate(table: Mapping[str, FailureRate], transceivers: int) -> float:
    """Failure rate per hour of one link: its cable (or fiber) plus its transceivers.

    ``transceivers`` is 0 for a passive DAC, 2 for fiber with an optic at each end (count an
    AOC or AEC as its two ends, it fails like them); the caller knows the BOM's media.
    """
    if transceivers < 0:
        raise ConfigError(f"transceivers = {transceivers!r}: must be >= 0")
    return table["cable"].per_hour + transceivers * table["optic"].per_hour


def link_failure_rate(
    table: Mapping[str, FailureRate], component: str, transceivers: int
) -> FailureRate:
    """A ``link:*`` entry composed by :func:`link_rate`; its MTTR is the rate-weighted mean."""
    cable, optic = table["cable"], table["optic"]
    per_hour = link_rate(table, transceivers)
    optic_part = transceivers * optic.per_hour
    mttr = (
        (cable.per_hour * cable.mttr_h + optic_part * optic.mttr_h) / per_hour
        if per_hour > 0 else cable.mttr_h
    )
    return FailureRate(
        component, per_hour, mttr,
        f"cable + {transceivers} x optic = {cable.per_hour:.3g} + {transceivers} x "
        f"{optic.per_hour:.3g} /h (cable: {cable.source}; optic: {optic.source})",
    )


def hit_probability(cut: float, job_gpus: int, total_gpus: int) -> float:
    """Probability that ``cut`` failed GPUs include one of a job's ``job_gpus``.

    Hypergeometric, the job's GPUs a uniformly random subset of ``total_gpus``:
    ``1 - C(total - job, cut) / C(total, cut)``, with C extended to a fractional (mean)
    ``cut`` through the gamma function. It is close to ``1 - (1 - job/total)^cut`` when
    ``cut`` is small against ``total``. A job packed onto whole leaves is hit less often by
    failures aligned with its placement (about ``job/total`` per failure); this is the
    scattered-placement figure.
    """
    if cut <= 0 or job_gpus <= 0:
        return 0.0
    free = total_gpus - job_gpus
    if free <= 0 or cut > free:
        return 1.0
    log_miss = gammaln(free + 1) + gammaln(total_gpus - cut + 1)
    log_miss -= gammaln(free - cut + 1) + gammaln(total_gpus + 1)
    return float(-math.expm1(log_miss))


@dataclass(frozen=True, slots=True)
class Interruptions:
    """Expected interruptions of one job: ``per_day`` in total and ``by_component``.

    ``mtbf_s`` is the job's mean time between interruptions (inf when none) and
    ``probability`` the chance that one failure of each component class stops the job.
    """

    per_day: float
    by_component: Mapping[str, float]
    probability: Mapping[str, float]
    mtbf_s: float
    job_gpus: int
    total_gpus: int


def _rate_of(rates: Mapping[str, FailureRate], component: str) -> FailureRate:
    try:
        return rates[component]
    except KeyError:
        raise ConfigError(f"failure rates: no entry for component {component!r}") from None


def _failover_time(failover_s: Mapping[str, float], mechanism: str) -> float:
    try:
        return float(failover_s[mechanism])
    except KeyError:
        known = ", ".join(FAILOVERS)
        raise ConfigError(f"failover_s: no time for {mechanism!r} (known: {known})") from None


def interrupt_probability(
    row: BlastRow, *, job_gpus: int, total_gpus: int,
    failover_s: Mapping[str, float], survive_s: float,
) -> float:
    """Chance that one failure of ``row.component`` stops a job of ``job_gpus`` GPUs.

    The job stops when the failure cuts one of its GPUs, or when it degrades one and the
    failover takes longer than the job survives an outage (``survive_s``): then the degraded
    GPUs count as cut.
    """
    cut = row.gpus_cut
    if row.gpus_degraded > 0 and _failover_time(failover_s, row.failover) > survive_s:
        cut += row.gpus_degraded
    return hit_probability(cut, job_gpus, total_gpus)


def _check_gpus(job_gpus: int, total_gpus: int) -> None:
    if total_gpus <= 0:
        raise ConfigError(f"total_gpus = {total_gpus!r}: must be > 0")
    if not 0 < job_gpus <= total_gpus:
        raise ConfigError(f"job_gpus = {job_gpus!r}: must be in 1..total_gpus ({total_gpus})")


def interruptions(
    rows: Sequence[BlastRow],
    rates: Mapping[str, FailureRate],
    *,
    job_gpus: int,
    total_gpus: int,
    failover_s: Mapping[str, float] = DEFAULT_FAILOVER_S,
    survive_s: float = DEFAULT_SURVIVE_S,
) -> Interruptions:
    """Expected interruptions per day of a job using ``job_gpus`` of ``total_gpus`` GPUs.

    Each row's failures arrive as a Poisson process of rate ``count x per_hour``; a failure
    stops the job with :func:`interrupt_probability` (hypergeometric hit of its cut GPUs, plus
    the degraded ones when failover is slower than ``survive_s``). The thinned processes add
    up to one Poisson process of the job's interruptions, of mean ``mtbf_s = 86400 / per_day``.
    """
    _check_gpus(job_gpus, total_gpus)
    by: dict[str, float] = {}
    prob: dict[str, float] = {}
    for row in rows:
        rate = _rate_of(rates, row.component)
        p = interrupt_probability(
            row, job_gpus=job_gpus, total_gpus=total_gpus,
            failover_s=failover_s, survive_s=survive_s,
        )
        prob[row.component] = p
        by[row.component] = by.get(row.component, 0.0) + row.count * rate.per_hour * 24.0 * p
    per_day = sum(by.values())
    mtbf = 86400.0 / per_day if per_day > 0 else math.inf
    return Interruptions(per_day, by, prob, mtbf, job_gpus, total_gpus)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum checkpoint interval ``sqrt(2 delta M)`` (s)."""
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006, eq. 37) higher-order optimum compute time between checkpoints (s).

    ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta`` for
    ``delta < 2M``, and ``M`` when ``delta >= 2M``.
    """
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def exact_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The exact minimizer of Daly's wall time: ``M (1 + W0(-exp(-1 - delta / M)))``.

    Setting d/dtau of ``(exp((tau + delta) / M) - 1) / tau`` to zero gives
    ``(1 - tau/M) exp((tau + delta) / M) = 1``, solved by the principal branch of Lambert's W.
    It does not depend on the restart time.
    """
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    if math.isinf(mtbf_s):
        return math.inf
    w = lambertw(-math.exp(-1.0 - checkpoint_s / mtbf_s), 0).real
    return float(mtbf_s * (1.0 + w))


def _segment_wall(length_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time to finish ``length_s`` of uninterrupted time: ``M e^{R/M}(e^{L/M}-1)``."""
    if math.isinf(mtbf_s):
        return length_s
    exponent = (length_s + restart_s) / mtbf_s
    if exponent > 700.0:
        return math.inf
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(length_s / mtbf_s)


def expected_wall_time(
    work_s: float, tau_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float
) -> float:
    """Daly's (2006, eq. 13) expected wall time of ``work_s`` of work (s).

    ``T_w = M e^{R/M} (e^{(tau + delta)/M} - 1) T_s / tau``: ``T_s / tau`` segments of ``tau``
    work plus a ``delta`` checkpoint, each retried until it runs through without a failure,
    each failure followed by a restart ``R`` that is itself retried. Exact for this process
    when ``T_s / tau`` is an integer; ``inf`` when it overflows.
    """
    _check_param("work_s", work_s)
    _check_param("tau_s", tau_s, positive=True)
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("restart_s", restart_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    return _segment_wall(tau_s + checkpoint_s, restart_s, mtbf_s) * work_s / tau_s


def goodput(tau_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time that is useful work, ``T_s / T_w`` of :func:`expected_wall_time`.

    The work ``T_s`` cancels: ``tau / (M e^{R/M} (e^{(tau + delta)/M} - 1))``.
    """
    wall = expected_wall_time(tau_s, tau_s, checkpoint_s, restart_s, mtbf_s)
    return tau_s / wall if wall > 0 else 1.0


def optimal_interval(checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval minimizing Daly's wall time, found numerically (bounded Brent search).

    Used to show how close :func:`young_interval` and :func:`daly_interval` are to the true
    optimum (``exact_interval`` has it in closed form). The restart time scales the wall time
    by ``e^{R/M}`` and does not move the optimum; it is taken for the objective's sake.
    """
    _check_param("checkpoint_s", checkpoint_s)
    _check_param("restart_s", restart_s)
    _check_param("mtbf_s", mtbf_s, positive=True, inf=True)
    if math.isinf(mtbf_s):
        return math.inf
    d = checkpoint_s / mtbf_s
    # In units of M: minimize (e^{x + d} - 1) / x; the optimum lies in (0, 1).

    def objective(x: float) -> float:
        return math.expm1(x + d) / x

    res = minimize_scalar(objective, bounds=(1e-12, 1.0), method="bounded",
                          options={"xatol": 1e-12})
    return float(res.x) * mtbf_s


@dataclass(frozen=True, slots=True)
class Availability:
    """Fabric availability of a design and the job-level figure of a whole-cluster job.

    ``fabric``: fraction of GPU-time with a fabric path (GPU failures excluded);
    ``degraded``: fraction of GPU bandwidth-time lost on GPUs that kept a path;
    ``nines``: ``-log10(1 - fabric)``; ``meets_target``: ``fabric >= target``;
    ``by_component``: each class's share of the unavailability. ``job``: goodput at the Daly
    interval of a job on every GPU, over every interruption cause (GPU failures included):
    the fraction of wall time that becomes training progress.
    """

    fabric: float
    degraded: float
    nines: float
    meets_target: bool
    target: float
    by_component: Mapping[str, float]
    job: float
    job_interval_s: float
    job_mtbf_s: float
    checkpoint_s: float
    restart_s: float
    notes: tuple[str, ...] = field(default=())


def unavailability_terms(
    rows: Sequence[BlastRow], rates: Mapping[str, FailureRate], *,
    total_gpus: int, failover_s: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float]]:
    """Per class: (GPU-hours cut, bandwidth-GPU-hours lost) per hour of operation.

    Cut: ``count x per_hour x mttr_h x gpus_cut``. Degraded: ``count x per_hour x gpus_degraded
    x (failover_h + bandwidth_lost x mttr_h)``: all of the bandwidth during the failover,
    ``bandwidth_lost`` of it until the repair. GPU failures are not the fabric's and are left out.
    """
    cut: dict[str, float] = {}
    degraded: dict[str, float] = {}
    for row in rows:
        if row.component == "gpu":
            continue
        rate = _rate_of(rates, row.component)
        failures = row.count * rate.per_hour
        fail_h = _failover_time(failover_s, row.failover) / 3600.0 if row.gpus_degraded else 0.0
        cut[row.component] = cut.get(row.component, 0.0) + failures * rate.mttr_h * row.gpus_cut
        lost = row.gpus_degraded * (fail_h + row.bandwidth_lost * rate.mttr_h)
        degraded[row.component] = degraded.get(row.component, 0.0) + failures * lost
    return cut, degraded


def availability(
    rows: Sequence[BlastRow],
    rates: Mapping[str, FailureRate],
    *,
    total_gpus: int,
    checkpoint_s: float = DEFAULT_CHECKPOINT_S,
    restart_s: float = DEFAULT_RESTART_S,
    failover_s: Mapping[str, float] = DEFAULT_FAILOVER_S,
    survive_s: float = DEFAULT_SURVIVE_S,
    target: float = AVAILABILITY_TARGET,
) -> Availability:
    """GPU-weighted fabric availability and the job-level availability of a design.

    ``fabric = 1 - sum(count x per_hour x mttr_h x gpus_cut) / total_gpus`` over the non-GPU
    classes: the steady-state fraction of GPU-time with a fabric path (renewal-reward: each
    class is down ``per_hour x mttr_h`` of the time per unit), first order: overlapping
    failures are counted twice, which makes it slightly pessimistic. ``degraded`` adds
    ``gpus_degraded x (failover + bandwidth_lost x mttr)`` the same way. The job figure is
    :func:`goodput` at :func:`daly_interval` for a job on all GPUs.
    """
    _check_gpus(total_gpus, total_gpus)
    cut, degraded = unavailability_terms(rows, rates, total_gpus=total_gpus,
                                         failover_s=failover_s)
    unavail = sum(cut.values()) / total_gpus
    fabric = 1.0 - unavail
    nines = -math.log10(unavail) if unavail > 0 else math.inf
    job = interruptions(rows, rates, job_gpus=total_gpus, total_gpus=total_gpus,
                        failover_s=failover_s, survive_s=survive_s)
    tau = daly_interval(checkpoint_s, job.mtbf_s)
    job_goodput = 1.0 if math.isinf(tau) else goodput(tau, checkpoint_s, restart_s, job.mtbf_s)
    notes: list[str] = []
    if fabric < 0:
        notes.append("unavailability > 1: the first-order sum is out of its range (rates too high)")
    return Availability(
        fabric=fabric,
        degraded=sum(degraded.values()) / total_gpus,
        nines=nines,
        meets_target=fabric >= target,
        target=target,
        by_component={k: v / total_gpus for k, v in cut.items()},
        job=job_goodput,
        job_interval_s=tau,
        job_mtbf_s=job.mtbf_s,
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        notes=tuple(notes),
    )
