"""DCQCN rate control as the fluid model of Zhu et al. (CoNEXT'16), and its fixed point.

The reaction point of DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA
Deployments", SIGCOMM'15) keeps a current rate R_C, a target rate R_T and a congestion
estimate alpha. Zhu et al., "ECN or Delay: Lessons Learnt from Analysis of DCQCN and TIMELY"
(CoNEXT'16, equations 1-5) turn it into delay differential equations driven by the marking
probability p seen one feedback delay tau* ago (R in packets per unit time)::

    a(t)      = 1 - (1 - p)^(tau R_C)                 (a CNP arrives within tau)
    dalpha/dt = g/tau' ((1 - (1 - p)^(tau' R_C)) - alpha)
    dR_T/dt   = -(R_T - R_C)/tau a
                + R_AI R_C (1-p)^(F B) p / ((1-p)^(-B) - 1)
                + R_AI R_C (1-p)^(F T R_C) p / ((1-p)^(-T R_C) - 1)
    dR_C/dt   = -R_C alpha/(2 tau) a
                + (R_T - R_C)/2 R_C p / ((1-p)^(-B) - 1)
                + (R_T - R_C)/2 R_C p / ((1-p)^(-T R_C) - 1)

(p and R_C on the right-hand side are the delayed values; the byte-counter term uses B in
packets, the timer term T in time). Hyper increase is not in the model and not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba

from fabricscope.model.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DcqcnParams:
    """Reaction-point parameters; times in ns, sizes in bytes, rates in bits/s.

    tau_ns:       rate-decrease interval (CNP generation interval at the receiver)
    tau_alpha_ns: alpha update interval (tau')
    timer_ns:     rate-increase timer T
    byte_counter: rate-increase byte counter B
    fast_recovery: F, increase events before additive increase
    rai_bps:      additive increase step R_AI
    g:            alpha gain
    min_rate_bps: floor of the current rate
    """

    name: str
    tau_ns: float
    tau_alpha_ns: float
    timer_ns: float
    byte_counter: float
    fast_recovery: float
    rai_bps: float
    g: float
    min_rate_bps: float

    def validate(self, where: str = "dcqcn") -> None:
        for k in ("tau_ns", "tau_alpha_ns", "timer_ns", "byte_counter", "rai_bps", "g"):
            v = getattr(self, k)
            if not v > 0:
                raise ConfigError(f"{where}.{k}: must be > 0, got {v!r}")
        if not 0 < self.g <= 1:
            raise ConfigError(f"{where}.g: must be in (0, 1], got {self.g!r}")
        if self.fast_recovery < 0 or self.min_rate_bps < 0:
            raise ConfigError(f"{where}: fast_recovery and min_rate_bps must be >= 0")


PAPER = DcqcnParams(
    name="paper", tau_ns=50_000.0, tau_alpha_ns=55_000.0, timer_ns=55_000.0,
    byte_counter=10e6, fast_recovery=5.0, rai_bps=40e6, g=1.0 / 256, min_rate_bps=10e6,
)
"""The defaults of Zhu et al. (SIGCOMM'15 §5, used for the CoNEXT'16 analysis and
SIMULATION.md §4): tau = 50 us, tau' = 55 us, T = 55 us, B = 10 MB, F = 5, R_AI = 40 Mb/s,
g = 1/256."""

NIC_DEFAULT = DcqcnParams(
    name="nic-default", tau_ns=4_000.0, tau_alpha_ns=1_000.0, timer_ns=300_000.0,
    byte_counter=32_767.0, fast_recovery=1.0, rai_bps=5e6, g=5.0 / 1024, min_rate_bps=1e6,
)
"""Common NIC firmware defaults (NVIDIA ConnectX-4 and later, "DCQCN CC Parameters" page of
the NVIDIA networking documentation): rate_reduce_monitor_period / min_time_between_cnps
4 us, dce_tcp_rtt 1 us with dce_tcp_g 1019/1024 (gain 5/1024), rpg_time_reset 300 us,
rpg_byte_reset 32767 B, rpg_threshold 1, rpg_ai_rate 5 Mb/s, rpg_min_rate 1 Mb/s."""

PARAM_SETS: dict[str, DcqcnParams] = {PAPER.name: PAPER, NIC_DEFAULT.name: NIC_DEFAULT}


@numba.njit(cache=True)
def _ratio(p: float, n: float, lg: float) -> float:
    """p / ((1-p)^(-n) - 1) with ``lg = log(1 - p)``: the per-packet chance that an increase
    event fires; 1/n as p -> 0."""
    if p < 1e-12:
        return 1.0 / n
    return p / math.expm1(min(-n * lg, 700.0))


@numba.njit(cache=True)
def dcqcn_derivatives(
    rc: float, rt: float, alpha: float, p: float, rc_delayed: float, mtu: float,
    tau: float, tau_a: float, timer: float, bc_bytes: float, f: float, rai: float, g: float,
) -> tuple[float, float, float]:
    """(dR_C/dt, dR_T/dt, dalpha/dt) of the CoNEXT'16 model; rates in bytes/ns, time in ns.

    ``p`` and ``rc_delayed`` are the marking probability and current rate one feedback delay
    ago; ``mtu`` converts rates to packets (the model counts packets).
    """
    r = rc_delayed / mtu  # packets per ns
    if p < 1e-12:  # no marks: the closed form of every term at p = 0 (no transcendentals)
        inc = r / (bc_bytes / mtu) + 1.0 / timer
        return (rt - rc) / 2.0 * inc, rai * inc, -g / tau_a * alpha
    p = min(max(p, 0.0), 1.0 - 1e-12)
    lg = math.log1p(-p)
    a = -math.expm1(tau * r * lg)
    da = g / tau_a * (-math.expm1(tau_a * r * lg) - alpha)
    bpk = bc_bytes / mtu
    tr = max(timer * r, 1e-12)
    b = _ratio(p, bpk, lg)
    c = _ratio(p, tr, lg)
    drt = -(rt - rc) / tau * a + rai * r * (math.exp(f * bpk * lg) * b + math.exp(f * tr * lg) * c)
    drc = -rc * alpha / (2.0 * tau) * a + (rt - rc) / 2.0 * r * (b + c)
    return drc, drt, da


def marking_probability(q_bytes: float, kmin: float, kmax: float, pmax: float) -> float:
    """RED-like ECN marking probability of a queue of ``q_bytes`` (SIGCOMM'15 Fig. 5)."""
    if q_bytes <= kmin:
        return 0.0
    if q_bytes > kmax:
        return 1.0
    return pmax * (q_bytes - kmin) / max(kmax - kmin, 1e-12)


def dcqcn_fixed_point(
    n_flows: int,
    link_bps: float,
    *,
    params: DcqcnParams = PAPER,
    kmin_bytes: float = 5_000.0,
    kmax_bytes: float = 200_000.0,
    pmax: float = 0.01,
    packet_bytes: float = 1_000.0,
) -> tuple[float, float]:
    """(p*, q*) of ``n_flows`` DCQCN flows sharing one bottleneck (CoNEXT'16 §3.2).

    At the fixed point R_C = C/N and the derivatives vanish; eliminating R_T and alpha
    leaves one equation in p, solved by bisection on a log scale. q* follows from the RED
    curve; when p* exceeds ``pmax`` the queue sits at ``kmax`` (the step of the curve) and
    q* = kmax is returned.
    """
    if n_flows < 1 or link_bps <= 0:
        raise ConfigError(f"dcqcn_fixed_point: need n_flows >= 1 and link_bps > 0, got {n_flows}, {link_bps}")
    r = link_bps / 8.0 / packet_bytes / n_flows / 1e9  # packets per ns
    tau, tau_a, timer = params.tau_ns, params.tau_alpha_ns, params.timer_ns
    bpk = params.byte_counter / packet_bytes
    rai = params.rai_bps / 8.0 / packet_bytes / 1e9  # packets per ns

    def h(p: float) -> float:
        lg = math.log1p(-p)
        alpha = -math.expm1(tau_a * r * lg)
        a = -math.expm1(tau * r * lg)
        b = _ratio(p, bpk, lg)
        c = _ratio(p, timer * r, lg)
        inc = rai * r * (math.exp(params.fast_recovery * bpk * lg) * b
                         + math.exp(params.fast_recovery * timer * r * lg) * c)
        return alpha * a * a / (tau * tau * (b + c)) - inc

    lo, hi = 1e-12, 0.999
    if h(lo) > 0:
        return 0.0, kmin_bytes
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if h(mid) > 0:
            hi = mid
        else:
            lo = mid
    p = math.sqrt(lo * hi)
    if p > pmax:
        return p, kmax_bytes
    return p, kmin_bytes + p / pmax * (kmax_bytes - kmin_bytes)
