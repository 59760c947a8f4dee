"""Search the ECN marking thresholds (kmin, kmax, pmax) that minimize FCT slowdown on the twin.

A seeded coordinate search over log-spaced grids (one parameter at a time, the others held,
repeated until a round improves nothing), started from the common vendor template: SONiC's
default lossless WRED/ECN profile ``AZURE_LOSSLESS`` (sonic-net/sonic-buildimage,
``files/build_templates/qos_config.j2``: green min 1048576 B, max 2097152 B, drop
probability 5 %). Every candidate is scored by running the workloads through the fluid
transport engine (:func:`fabricscope.sim.transport.simulate_transport`) and reading the FCT
slowdown (:mod:`fabricscope.sim.slowdown`); the winner is then re-run on **held-out**
workloads (other seeds) beside the template, so the reported gain is not the search's own
optimism. ``sensitivity`` is each parameter's sweep around the winner. The issue's framing:
automatic ECN/PFC parameters as the AI-ops direction; the method is plain black-box search
(no model of the objective), which is what a few dozen cheap twin runs afford.
Design: docs/design/sim-workloads-poisson.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.flows import Workload
from fabricscope.sim.slowdown import bucket_slowdowns, fct_slowdown, flow_line_rates
from fabricscope.sim.transport import EcnConfig, TransportConfig, simulate_transport

Objective = Literal["short_p99", "p99", "short_p95", "mean"]
OBJECTIVES: tuple[Objective, ...] = ("short_p99", "p99", "short_p95", "mean")

#: SONiC's default lossless ECN profile (AZURE_LOSSLESS in qos_config.j2): the baseline.
VENDOR_TEMPLATE = EcnConfig(kmin_bytes=1_048_576.0, kmax_bytes=2_097_152.0, pmax=0.05)

KMIN_GRID: tuple[float, ...] = (5e3, 20e3, 50e3, 100e3, 200e3, 500e3, 1_048_576.0)
KMAX_GRID: tuple[float, ...] = (50e3, 100e3, 200e3, 400e3, 800e3, 1.6e6, 2_097_152.0, 4e6)
PMAX_GRID: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class Trial:
    """One scored ECN setting (score: the objective, lower is better)."""

    ecn: EcnConfig
    score: float
    short_p99: float
    p99: float
    mean: float
    unfinished: int

    def to_dict(self) -> dict[str, object]:
        return {"kmin_bytes": self.ecn.kmin_bytes, "kmax_bytes": self.ecn.kmax_bytes, "pmax": self.ecn.pmax,
                "score": round(self.score, 4), "short_p99": round(self.short_p99, 4), "p99": round(self.p99, 4),
                "mean": round(self.mean, 4), "unfinished": self.unfinished}


@dataclass(frozen=True)
class TuneResult:
    """The search: its best setting, the template, every trial, per-axis sensitivity, and
    both settings re-scored on the held-out workloads (``None`` when none were given)."""

    objective: Objective
    best: Trial
    baseline: Trial
    trials: tuple[Trial, ...]
    sensitivity: dict[str, tuple[tuple[float, float], ...]]
    holdout_best: Trial | None = None
    holdout_baseline: Trial | None = None
    rounds: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gain(self) -> float:
        """Relative objective reduction of the best over the template on the searched workloads."""
        return 1.0 - self.best.score / self.baseline.score if self.baseline.score > 0 else 0.0

    @property
    def holdout_gain(self) -> float | None:
        """The same on the held-out workloads (the figure to trust)."""
        if self.holdout_best is None or self.holdout_baseline is None or self.holdout_baseline.score <= 0:
            return None
        return 1.0 - self.holdout_best.score / self.holdout_baseline.score

    def sensitivity_span(self) -> dict[str, float]:
        """Per parameter, (worst - best) / best score along its sweep around the winner."""
        out: dict[str, float] = {}
        for k, pts in self.sensitivity.items():
            s = [v for _, v in pts if np.isfinite(v)]
            out[k] = (max(s) - min(s)) / min(s) if s and min(s) > 0 else float("nan")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "objective": self.objective, "rounds": self.rounds, "evaluations": len(self.trials),
            "best": self.best.to_dict(), "baseline": self.baseline.to_dict(),
            "baseline_source": "SONiC AZURE_LOSSLESS (sonic-buildimage files/build_templates/qos_config.j2)",
            "gain": round(self.gain, 4),
            "holdout_best": self.holdout_best.to_dict() if self.holdout_best else None,
            "holdout_baseline": self.holdout_baseline.to_dict() if self.holdout_baseline else None,
            "holdout_gain": None if self.holdout_gain is None else round(self.holdout_gain, 4),
            "sensitivity": {k: [[x, round(v, 4)] for x, v in pts] for k, pts in self.sensitivity.items()},
            "sensitivity_span": {k: round(v, 4) for k, v in self.sensitivity_span().items()},
            "trials": [t.to_dict() for t in self.trials], "notes": list(self.notes),
        }


def score_ecn(
    fabric: Fabric,
    workloads: Sequence[Workload],
    config: TransportConfig,
    ecn: EcnConfig,
    *,
    objective: Objective = "short_p99",
    lb: str = "ecmp",
    seeds: Sequence[int] | None = None,
) -> Trial:
    """Run every workload with ``ecn`` and score the pooled slowdowns (unfinished flows count
    as slowdown ``inf`` in ``mean``/percentiles only through their absence: they are reported
    in ``unfinished`` and a setting with any is scored ``inf``, so it never wins)."""
    cfg = replace(config, ecn=ecn)
    sizes: list[np.ndarray] = []
    slows: list[np.ndarray] = []
    unfinished = 0
    for k, wl in enumerate(workloads):
        seed = seeds[k] if seeds is not None else k
        res = simulate_transport(fabric, wl, config=cfg, lb=lb, seed=seed)
        sizes.append(res.sim.size_bytes)
        slows.append(fct_slowdown(res.sim, flow_line_rates(fabric, res.sim)))
        unfinished += res.unfinished
    t = bucket_slowdowns(np.concatenate(sizes), np.concatenate(slows))
    value = {"short_p99": t.short.p99, "p99": t.overall.p99, "short_p95": t.short.p95, "mean": t.overall.mean}[objective]
    score = float("inf") if unfinished or not np.isfinite(value) else float(value)
    return Trial(ecn, score, t.short.p99, t.overall.p99, t.overall.mean, unfinished)


def coordinate_search(
    evaluate: Callable[[EcnConfig], Trial],
    *,
    start: EcnConfig = VENDOR_TEMPLATE,
    kmin_grid: Sequence[float] = KMIN_GRID,
    kmax_grid: Sequence[float] = KMAX_GRID,
    pmax_grid: Sequence[float] = PMAX_GRID,
    max_rounds: int = 3,
    seed: int = 0,
) -> tuple[Trial, Trial, list[Trial], dict[str, tuple[tuple[float, float], ...]], int]:
    """Coordinate descent over the grids from ``start`` (its values are added to the grids).

    The axis order of each round is a seeded shuffle (``seed``), so a run is reproducible
    and the order is not a hidden choice; settings with kmin > kmax are skipped. Returns
    (best, start trial, every trial in evaluation order, the last sweep of each axis around
    the best, rounds run).
    """
    grids = {
        "kmin": sorted({*map(float, kmin_grid), start.kmin_bytes}),
        "kmax": sorted({*map(float, kmax_grid), start.kmax_bytes}),
        "pmax": sorted({*map(float, pmax_grid), start.pmax}),
    }
    cache: dict[tuple[float, float, float], Trial] = {}
    order: list[Trial] = []

    def ev(kmin: float, kmax: float, pmax: float) -> Trial:
        key = (kmin, kmax, pmax)
        if key not in cache:
            cache[key] = evaluate(EcnConfig(kmin, kmax, pmax))
            order.append(cache[key])
        return cache[key]

    cur = (start.kmin_bytes, start.kmax_bytes, start.pmax)
    base = ev(*cur)
    best = base
    rng = np.random.default_rng(seed)
    sweeps: dict[str, tuple[tuple[float, float], ...]] = {}
    rounds = 0
    for _ in range(max_rounds):
        rounds += 1
        improved = False
        for axis in rng.permutation(["kmin", "kmax", "pmax"]).tolist():
            i = ("kmin", "kmax", "pmax").index(axis)
            pts: list[tuple[float, float]] = []
            for v in grids[axis]:
                cand = list(cur)
                cand[i] = v
                if cand[0] > cand[1]:
                    continue
                t = ev(cand[0], cand[1], cand[2])
                pts.append((v, t.score))
                if t.score < best.score - 1e-12:
                    best, improved = t, True
            cur = (best.ecn.kmin_bytes, best.ecn.kmax_bytes, best.ecn.pmax)
            sweeps[axis] = tuple(pts)
        if not improved:
            break
    # The sensitivity is read around the final winner: re-sweep any axis whose last sweep
    # was taken at another point (cached settings cost nothing).
    for i, axis in enumerate(("kmin", "kmax", "pmax")):
        pts = []
        for v in grids[axis]:
            cand = list(cur)
            cand[i] = v
            if cand[0] <= cand[1]:
                pts.append((v, ev(cand[0], cand[1], cand[2]).score))
        sweeps[axis] = tuple(pts)
    return best, base, order, sweeps, rounds


def tune_ecn(
    fabric: Fabric,
    workloads: Sequence[Workload],
    config: TransportConfig,
    *,
    holdout: Sequence[Workload] = (),
    objective: Objective = "short_p99",
    lb: str = "ecmp",
    seeds: Sequence[int] | None = None,
    holdout_seeds: Sequence[int] | None = None,
    baseline: EcnConfig = VENDOR_TEMPLATE,
    kmin_grid: Sequence[float] = KMIN_GRID,
    kmax_grid: Sequence[float] = KMAX_GRID,
    pmax_grid: Sequence[float] = PMAX_GRID,
    max_rounds: int = 3,
    seed: int = 0,
) -> TuneResult:
    """Search (kmin, kmax, pmax) for ``workloads`` on ``fabric`` under ``config`` (its CC must
    react to ECN marks: DCQCN, not HPCC, whose window follows INT only), then score the best
    and the template on ``holdout``. ``seeds`` / ``holdout_seeds``: the routing seed of each
    workload (default its position)."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"tune: objective: unknown {objective!r} (choose one of {', '.join(OBJECTIVES)})")
    if config.cc in ("hpcc", "none"):
        raise ConfigError(f"tune: cc {config.cc!r} does not react to ECN marks; tune with a CC that "
                          "does (dcqcn)")
    if not workloads:
        raise ConfigError("tune: needs at least one workload to search on")
    baseline.validate(where="tune.baseline")

    def ev(e: EcnConfig) -> Trial:
        return score_ecn(fabric, workloads, config, e, objective=objective, lb=lb, seeds=seeds)

    best, base, trials, sweeps, rounds = coordinate_search(
        ev, start=baseline, kmin_grid=kmin_grid, kmax_grid=kmax_grid, pmax_grid=pmax_grid,
        max_rounds=max_rounds, seed=seed)
    hb = hbase = None
    if holdout:
        hb = score_ecn(fabric, holdout, config, best.ecn, objective=objective, lb=lb, seeds=holdout_seeds)
        hbase = (hb if best.ecn == base.ecn else
                 score_ecn(fabric, holdout, config, base.ecn, objective=objective, lb=lb, seeds=holdout_seeds))
    notes = [] if holdout else ["no held-out workloads: the gain is measured on the searched ones (optimistic)"]
    for axis, grid, v in (("kmin", kmin_grid, best.ecn.kmin_bytes), ("kmax", kmax_grid, best.ecn.kmax_bytes),
                          ("pmax", pmax_grid, best.ecn.pmax)):
        g = sorted({*map(float, grid), {"kmin": base.ecn.kmin_bytes, "kmax": base.ecn.kmax_bytes,
                                        "pmax": base.ecn.pmax}[axis]})
        at_domain_edge = axis == "pmax" and v == 1.0  # a probability cannot go beyond 1
        if len(g) > 1 and v in (g[0], g[-1]) and not at_domain_edge:
            notes.append(f"best {axis} {v:g} is at the edge of its grid ({g[0]:g} .. {g[-1]:g}): "
                         "the optimum may lie beyond it")
    return TuneResult(objective, best, base, tuple(trials), sweeps, hb, hbase, rounds, tuple(notes))
