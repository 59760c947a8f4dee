"""ECN auto-tuning on the twin (sim/transport_tune.py)."""

from __future__ import annotations

import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.transport import EcnConfig, PfcConfig, TransportConfig
from fabricscope.sim.transport_tune import (
    VENDOR_TEMPLATE,
    Trial,
    coordinate_search,
    score_ecn,
    tune_ecn,
)
from fabricscope.sim.workload.poisson import load_cdf, poisson_workload


def _trial(e: EcnConfig, score: float) -> Trial:
    return Trial(e, score, score, score, score, 0)


def test_coordinate_search_finds_the_minimum_of_a_separable_bowl() -> None:
    # score = distance (in grid steps) from a known optimum: coordinate descent must reach it.
    kmin = (1e3, 1e4, 1e5, 1e6)
    kmax = (1e4, 1e5, 1e6, 1e7)
    pmax = (0.01, 0.1, 1.0)
    target = (1e4, 1e6, 0.1)

    def ev(e: EcnConfig) -> Trial:
        d = (abs(kmin.index(e.kmin_bytes) - kmin.index(target[0])) + abs(kmax.index(e.kmax_bytes) - kmax.index(target[1]))
             + abs(pmax.index(e.pmax) - pmax.index(target[2])))
        return _trial(e, 1.0 + d)

    start = EcnConfig(1e6, 1e7, 1.0)
    best, base, trials, sweeps, rounds = coordinate_search(ev, start=start, kmin_grid=kmin, kmax_grid=kmax,
                                                           pmax_grid=pmax, seed=3)
    assert (best.ecn.kmin_bytes, best.ecn.kmax_bytes, best.ecn.pmax) == target
    assert best.score == 1.0 and base.ecn == start and base.score > 1.0
    assert len({(t.ecn.kmin_bytes, t.ecn.kmax_bytes, t.ecn.pmax) for t in trials}) == len(trials)  # cached
    assert all(t.ecn.kmin_bytes <= t.ecn.kmax_bytes for t in trials)
    # The sweeps are taken around the winner: each axis has its minimum at the target value.
    for i, axis in enumerate(("kmin", "kmax", "pmax")):
        v, s = min(sweeps[axis], key=lambda p: p[1])
        assert v == target[i] and s == 1.0
    assert rounds >= 2  # the last round confirms nothing improves


@pytest.fixture(scope="module")
def small():  # type: ignore[no-untyped-def]
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=8, spines=2, host_gbps=100.0, uplink_gbps=400.0)
    cdf = load_cdf("websearch")
    search = [poisson_workload(fab, cdf, load=0.5, duration_ns=5e5, seed=0)]
    hold = [poisson_workload(fab, cdf, load=0.5, duration_ns=5e5, seed=7)]
    return fab, search, hold


def test_tune_on_the_twin_beats_or_matches_the_template_and_reports_holdout(small) -> None:  # type: ignore[no-untyped-def]
    fab, search, hold = small
    cfg = TransportConfig(cc="dcqcn", pfc=PfcConfig(enabled=True))
    res = tune_ecn(fab, search, cfg, holdout=hold, kmin_grid=(5e3, 100e3), kmax_grid=(200e3, 2e6),
                   pmax_grid=(0.01, 0.2), max_rounds=2, holdout_seeds=[7])
    assert res.baseline.ecn == VENDOR_TEMPLATE
    # The search starts at the template and only moves on a strict improvement.
    assert res.best.score <= res.baseline.score
    assert res.gain >= 0.0
    assert res.holdout_best is not None and res.holdout_baseline is not None
    assert res.holdout_best.ecn == res.best.ecn and res.holdout_baseline.ecn == VENDOR_TEMPLATE
    # Re-scoring a setting is deterministic (same workloads, same seeds).
    again = score_ecn(fab, search, cfg, res.best.ecn)
    assert again.score == pytest.approx(res.best.score, rel=1e-12)
    d = res.to_dict()
    assert d["evaluations"] == len(res.trials) and set(d["sensitivity"]) == {"kmin", "kmax", "pmax"}
    assert "AZURE_LOSSLESS" in str(d["baseline_source"])


def test_tune_refuses_what_it_cannot_tune(small) -> None:  # type: ignore[no-untyped-def]
    fab, search, _ = small
    with pytest.raises(ConfigError, match="does not react to ECN"):
        tune_ecn(fab, search, TransportConfig(cc="hpcc"))
    with pytest.raises(ConfigError, match="objective"):
        tune_ecn(fab, search, TransportConfig(cc="dcqcn"), objective="median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one workload"):
        tune_ecn(fab, [], TransportConfig(cc="dcqcn"))
