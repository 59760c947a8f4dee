"""Seed spread in the scenario table and comparisons; the table at 80 columns; big workloads
are estimated and refused before they are built; steady-state runs draw no plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fabricscope.fabric.catalog import build_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.sim_report import format_comparisons, format_table, write_report
from fabricscope.sim.scenario import paired_difference, prepare, run_scenario, scenario_from_flags
from fabricscope.sim.workload import estimate_flows, workload_from_spec

_TOPO = "leaf-spine:leaves=4,hosts_per_leaf=4,spines=2"


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    sc = scenario_from_flags(topo=_TOPO, workload="permutation:size=1MB", lb="ecmp,spray",
                             seeds=[0, 1, 2], degrade=["leaf-000~spine-00=25%"])
    return run_scenario(sc, record_utilization=False)


def test_table_reports_the_sample_std_over_seeds(result) -> None:  # type: ignore[no-untyped-def]
    for row in result.table():
        label = str(row["scheme"])
        p99 = list(result.seed_values(label).values())
        assert len(p99) == 3
        assert row["fct_p99_us"] == pytest.approx(np.mean(p99), abs=1e-3)
        assert row["fct_p99_us_sd"] == pytest.approx(np.std(p99, ddof=1), abs=1e-3)
    text = format_table(result)
    assert "mean ±sd over 3 seeds" in text.splitlines()[0]
    assert "±" in text


def test_comparisons_say_when_a_difference_is_within_the_spread(result) -> None:  # type: ignore[no-untyped-def]
    lines = format_comparisons(result)
    assert any(ln.startswith("p99 FCT spray vs ecmp:") for ln in lines)
    assert any("ecmp (faults) vs ecmp" in ln for ln in lines)
    assert all("95% CI" in ln for ln in lines)
    # The verdict follows the t interval of the paired differences.
    d = paired_difference("a", "b", "k", [10.0, 11.0, 12.0], [10.5, 10.0, 13.0])
    assert d.verdict == "within seed spread" and d.ci95 is not None and abs(d.mean) <= d.ci95
    d = paired_difference("a", "b", "k", [10.0, 11.0, 12.0], [20.0, 21.5, 21.0])
    assert d.verdict == "higher" and "b higher" in d.text()
    one = paired_difference("a", "b", "k", [10.0], [5.0])
    assert one.verdict == "one seed" and "no spread" in one.text()


def test_one_seed_says_there_is_no_spread() -> None:
    sc = scenario_from_flags(topo=_TOPO, workload="permutation:size=1MB", lb="ecmp,spray")
    res = run_scenario(sc, record_utilization=False)
    assert "one seed, no spread" in format_table(res).splitlines()[0]
    assert "fct_p99_us_sd" not in res.table()[0]
    assert all("one seed" in ln for ln in format_comparisons(res))


def test_table_folds_at_80_columns_and_keeps_the_subject(result) -> None:  # type: ignore[no-untyped-def]
    wide = format_table(result)
    assert max(len(ln) for ln in wide.splitlines()) > 80  # the test needs a wide table
    folded = format_table(result, width=80)
    lines = folded.splitlines()
    assert max(len(ln) for ln in lines[1:]) <= 80
    blocks = [b for b in "\n".join(lines[1:]).split("\n\n") if b.strip()]
    assert len(blocks) >= 2
    for b in blocks:  # every block starts with the whole subject column
        rows = b.splitlines()
        assert rows[0].startswith("scheme")
        assert [r.split("  ")[0].strip() for r in rows[2:]] == [str(r["scheme"]) for r in result.table()]
    # Every cell of the wide table is somewhere in the folded one.
    for cell in wide.splitlines()[3].split("  "):
        if cell.strip():
            assert cell.strip() in folded


def test_big_workload_is_estimated_and_refused_before_it_is_built() -> None:
    fab = build_fabric("rail-optimized", {"servers": 8}, source="t")
    for spec in ({"kind": "allreduce", "size": "1MiB"}, {"kind": "allreduce", "size": "1MiB", "placement": "random"},
                 {"kind": "allgather", "size": "1MiB", "steady_state": True},
                 {"kind": "allreduce", "size": "1MiB", "algorithm": "tree"}, {"kind": "alltoall", "size": "1MiB"},
                 {"kind": "reducescatter", "size": "1MiB", "rail_aligned": False}, {"kind": "permutation", "size": "1MB"},
                 {"kind": "nic-all-to-all", "size": "1MB"}):
        assert estimate_flows(fab, spec) == len(workload_from_spec(fab, spec).flows), spec
    sc = scenario_from_flags(topo="rail-optimized:servers=256", workload="allreduce:size=256MiB")
    with pytest.raises(ConfigError, match=r"about 8,384,512 flows per seed.*steady_state=true.*--force"):
        prepare(sc)
    steps: list[str] = []
    with pytest.raises(ConfigError, match="limit 10"):
        prepare(scenario_from_flags(topo="rail-optimized:servers=4", workload="allreduce:size=1MiB"), max_flows=10)
    prep = prepare(scenario_from_flags(topo="rail-optimized:servers=4", workload="allreduce:size=1MiB"),
                   max_flows=None, progress=steps.append)
    assert len(prep.workloads[0].flows) == 1984
    assert any("~1,984 flows" in s for s in steps)


def test_steady_state_run_draws_no_plots(tmp_path: Path) -> None:
    sc = scenario_from_flags(topo="rail-optimized:servers=4", workload="allreduce:size=8MiB,steady_state=true")
    res = run_scenario(sc)
    files = write_report(res, tmp_path)
    assert set(files) == {"json"}
    assert not (tmp_path / "fct_cdf.png").exists() and not (tmp_path / "link_util.png").exists()
    row = res.table()[0]
    assert math.isfinite(float(str(row["ring_ms"])))
