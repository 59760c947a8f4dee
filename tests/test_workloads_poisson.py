"""Poisson workloads from flow-size CDFs (sim/workload/poisson.py) and their spec form.

Statistical checks are seeded; every tolerance is derived from the sample size (DKW bound for
the empirical CDF, Poisson / CLT bounds for counts and means) at a false-alarm rate ~1e-6.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.workload import estimate_flows, workload_from_spec
from fabricscope.sim.workload.poisson import (
    CDF_NAMES,
    load_cdf,
    parse_cdf_text,
    poisson_workload,
)

Z = 5.0  # ~6e-7 two-sided normal tail


@pytest.fixture(scope="module")
def fabric():  # type: ignore[no-untyped-def]
    return leaf_spine_fabric(leaves=4, hosts_per_leaf=8, spines=4)


def test_shipped_cdfs_are_the_hpcc_repository_points() -> None:
    ws = load_cdf("websearch")
    assert ws.sizes[0] == 0 and ws.sizes[-1] == 30_000_000 and ws.cum[-1] == 1.0
    assert ws.quantile(0.15) == pytest.approx(10_000) and ws.quantile(0.6) == pytest.approx(200_000)
    fb = load_cdf("FB-Hadoop")  # case and dash tolerant
    assert fb.sizes[-1] == 10_000_000 and fb.quantile(0.5) == pytest.approx(700)
    assert "alibaba-edu/High-Precision-Congestion-Control" in ws.source
    assert set(CDF_NAMES) == {"websearch", "fb_hadoop"}
    # Mean of the piecewise-linear CDF, the trapezoid rule written out for three points.
    c = parse_cdf_text("0 0\n100 50\n300 100\n", name="t")
    assert c.mean_bytes == pytest.approx(0.5 * (0 + 100) * 0.5 + 0.5 * (100 + 300) * 0.5)


@pytest.mark.parametrize("name", CDF_NAMES)
def test_sampled_sizes_follow_the_cdf(name: str) -> None:
    cdf = load_cdf(name)
    n = 200_000
    x = cdf.sample(np.random.default_rng(7), n)
    # DKW: P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2); eps for 1e-6. Sizes are floored to
    # whole bytes, so compare at the points (integers) where flooring changes nothing.
    eps = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    for s, c in zip(cdf.sizes[1:-1], cdf.cum[1:-1], strict=True):
        assert abs(float(np.mean(x <= s)) - c) <= eps + 1.0 / n, (s, c)
    # Mean within Z standard errors (the sample std estimates sigma).
    assert abs(x.mean() - cdf.mean_bytes) <= Z * x.std() / math.sqrt(n) + 1.0
    assert x.min() >= 1


def test_poisson_arrivals_rate_destinations_and_order(fabric) -> None:  # type: ignore[no-untyped-def]
    cdf = load_cdf("fb_hadoop")  # small mean: many flows in a short window
    load, dur = 0.4, 2e6
    wl = poisson_workload(fabric, cdf, load=load, duration_ns=dur, seed=3)
    n_nics = len(fabric.nics)
    expected = n_nics * load * 100e9 * dur * 1e-9 / (8 * cdf.mean_bytes)
    n = len(wl.flows)
    assert abs(n - expected) <= Z * math.sqrt(expected)  # sum of Poisson counts
    starts = np.array([f.start_ns for f in wl.flows])
    assert np.all(np.diff(starts) >= 0) and starts[0] >= 0 and starts[-1] <= dur
    assert [f.id for f in wl.flows] == list(range(n))
    assert all(f.src != f.dst for f in wl.flows)
    # Uniform destinations over the other NICs: chi-square with n_nics - 1 dof against a
    # bound far in its tail (mean k, sd sqrt(2k)).
    counts = np.array([sum(f.dst == nic.id for f in wl.flows) for nic in fabric.nics], dtype=float)
    exp = n / n_nics
    chi2 = float(((counts - exp) ** 2 / exp).sum())
    k = n_nics - 1
    assert chi2 <= k + Z * math.sqrt(2 * k) + 10
    # Inter-arrival gaps of one host are exponential with the mean of the target rate.
    src0 = fabric.nics[0].id
    t0 = np.array([f.start_ns for f in wl.flows if f.src == src0], dtype=float)
    gaps = np.diff(t0)
    mean_gap = 8 * cdf.mean_bytes / (100e9 * load) * 1e9
    assert abs(gaps.mean() - mean_gap) <= Z * mean_gap / math.sqrt(gaps.shape[0]) + 1.0
    assert wl.meta["pattern"] == "poisson" and wl.meta["load"] == load


def test_seed_determinism(fabric) -> None:  # type: ignore[no-untyped-def]
    cdf = load_cdf("websearch")
    a = poisson_workload(fabric, cdf, load=0.5, duration_ns=1e6, seed=1)
    b = poisson_workload(fabric, cdf, load=0.5, duration_ns=1e6, seed=1)
    c = poisson_workload(fabric, cdf, load=0.5, duration_ns=1e6, seed=2)
    assert a.flows == b.flows
    assert a.flows != c.flows


def test_spec_form_and_estimate(fabric) -> None:  # type: ignore[no-untyped-def]
    spec = {"kind": "poisson", "cdf": "websearch", "load": "50%", "duration": "2ms"}
    wl = workload_from_spec(fabric, spec, seed=0)
    est = estimate_flows(fabric, spec)
    assert est is not None and abs(len(wl.flows) - est) <= Z * math.sqrt(est) + 1
    assert wl.meta["cdf"] == "websearch" and wl.meta["load"] == 0.5
    same = workload_from_spec(fabric, {"kind": "poisson", "load": 0.5, "duration": "2ms"}, seed=0)
    assert same.flows == wl.flows  # websearch is the default cdf


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"load": 0, "duration": "1ms"}, "workload.load"),
        ({"load": 1.5, "duration": "1ms"}, "workload.load"),
        ({"load": "half", "duration": "1ms"}, "'half'"),
        ({"load": 0.5}, "workload.duration: missing"),
        ({"load": 0.5, "duration": "0ms"}, "workload.duration: must be > 0"),
        ({"load": 0.5, "duration": "1ms", "cdf": "nope"}, "unknown distribution 'nope'"),
        ({"load": 0.5, "duration": "1ms", "rate": 3}, "workload.rate: unknown key"),
    ],
)
def test_spec_errors_name_the_field(fabric, extra, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as exc:
        workload_from_spec(fabric, {"kind": "poisson", **extra}, source="<flags>")
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_cdf_files(tmp_path: Path, fabric) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "mine.txt"
    good.write_text("# size percent\n0 0\n1000 50\n5000 100\n")
    wl = workload_from_spec(fabric, {"kind": "poisson", "cdf": str(good), "load": 0.1, "duration": "100us"})
    assert all(1 <= f.size_bytes <= 5000 for f in wl.flows) and wl.meta["cdf"] == "mine"
    for text, needle in (("0 0\n1000 50\n", "end at 100"), ("0 0\n10 x\n", "line 2"),
                         ("0 0\n1000 60\n500 100\n", "strictly increasing"), ("5 0\n", "at least 2")):
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            load_cdf(str(bad))


def test_direct_call_errors(fabric) -> None:  # type: ignore[no-untyped-def]
    cdf = load_cdf("websearch")
    with pytest.raises(ConfigError, match="load"):
        poisson_workload(fabric, cdf, load=-0.1, duration_ns=1e6)
    with pytest.raises(ConfigError, match="duration"):
        poisson_workload(fabric, cdf, load=0.5, duration_ns=0)
    with pytest.raises(WorkloadError, match="not a NIC"):
        poisson_workload(fabric, cdf, load=0.5, duration_ns=1e6, nics=["nope", "nope2"])
    # A window too short for any arrival is an error, not an empty run.
    with pytest.raises(WorkloadError, match="longer duration"):
        poisson_workload(fabric, cdf, load=0.01, duration_ns=1.0, seed=0)
