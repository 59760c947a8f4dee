"""Curve analysis: peak, measured / expected, attribution by shape, findings; the analyze CLI."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.collective import (
    CollectiveRun,
    analyze_run,
    expected_from_flat,
    read_nccl_tests,
    summarize_run,
)
from fabricscope.collective.analysis import bus_factor
from fabricscope.collective.model import Placement, SizeRow
from fabricscope.model.errors import ConfigError, TraceFormatError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "collective"


def _run_2node() -> CollectiveRun:
    (run,) = read_nccl_tests(DATA / "a3mega_allreduce_2node.txt")
    return run


def _measured(run: CollectiveRun) -> dict[int, float]:
    return {r.size_bytes: r.best_busbw() for r in run.rows}


def test_peak_and_both_placements() -> None:
    a = analyze_run(_run_2node())
    assert (a.peak_busbw_gbs, a.peak_size_bytes) == (338.82, 8589934592)
    last = a.sizes[-1]
    assert (last.oop_time_us, last.oop_busbw_gbs, last.ip_time_us, last.ip_busbw_gbs) == (
        47535.0, 338.82, 47743.0, 337.35)
    assert a.attribution == "no-expectation" and not a.findings
    assert a.nodes == 2 and a.ranks == 16
    # of the three largest sizes, 4 and 8 GiB are within 5 % of the peak (2 GiB's 318.52 is
    # not: 0.95 x 338.82 = 321.88): the plateau is their median
    assert a.plateau_gbs == pytest.approx((330.58 + 338.82) / 2)


def test_expectation_met_gives_no_finding() -> None:
    run = _run_2node()
    a = analyze_run(run, expected=_measured(run))
    assert a.attribution == "ok" and not a.findings
    assert all(s.ratio is None or s.ratio == pytest.approx(1.0) for s in a.sizes)


def test_large_message_deficit_on_two_nodes_is_network_bandwidth() -> None:
    run = _run_2node()
    med = sorted(run.sizes)[len(run.sizes) // 2]
    exp = {s: b / 0.7 if s >= med else b for s, b in _measured(run).items()}
    a = analyze_run(run, expected=exp, margin=0.10)
    assert a.attribution == "bandwidth-network"
    (f,) = a.findings
    assert f.kind == "collective-busbw-low"
    assert f.subject == "ztan-mig-235z+ztan-mig-gq73"
    assert f.score == pytest.approx(0.3, abs=1e-9)
    assert "8 GiB: busbw 338.82 GB/s" in " ".join(f.evidence)
    assert a.ratio_large == pytest.approx(0.7)


def test_same_deficit_on_one_node_is_nvlink_or_pcie() -> None:
    (run,) = read_nccl_tests(DATA / "superbench_nccl_allreduce.log")
    assert run.nodes == 1
    exp = {s: b / 0.7 for s, b in _measured(run).items() if s >= 1 << 20}
    a = analyze_run(run, expected=exp)
    assert a.attribution == "bandwidth-nvlink-or-pcie"


def test_small_message_excess_is_latency_and_uniform_is_ambiguous() -> None:
    run = _run_2node()
    med = sorted(run.sizes)[len(run.sizes) // 2]
    meas = _measured(run)
    small = analyze_run(run, expected={s: b / 0.5 if s < med else b for s, b in meas.items()})
    assert small.attribution == "latency"
    uniform = analyze_run(run, expected={s: b / 0.5 for s, b in meas.items()})
    assert uniform.attribution == "ambiguous"
    assert uniform.findings[0].details["attribution"] == "ambiguous"


def test_margin_is_the_boundary() -> None:
    run = _run_2node()
    exp = {s: b / 0.85 for s, b in _measured(run).items()}
    assert analyze_run(run, expected=exp, margin=0.10).findings      # 0.85 < 0.90
    assert not analyze_run(run, expected=exp, margin=0.20).findings  # 0.85 >= 0.80


def test_unknown_node_count_says_bandwidth_only() -> None:
    run = replace(_run_2node(), hosts=(), rank_list=())
    exp = {s: b / 0.6 if s >= 1 << 26 else b for s, b in _measured(run).items()}
    assert analyze_run(run, expected=exp).attribution == "bandwidth"


def test_rounded_zero_busbw_is_not_judged() -> None:
    run = _run_2node()
    a = analyze_run(run, expected={s: 1.0 for s in run.sizes})
    tiny = [s for s in a.sizes if s.size_bytes <= 256]
    assert tiny and all(s.ratio is None for s in tiny)  # printed 0.00 GB/s


def test_flat_expectation_covers_the_plateau_only() -> None:
    run = _run_2node()
    exp = expected_from_flat(run.sizes, 420.0)
    assert min(exp) == 8589934592 // 4 and len(exp) == 3
    a = analyze_run(run, expected=exp)
    assert a.ratio_small is None and a.attribution == "bandwidth-network"
    # the same healthy run against a figure its plateau reaches (318-339 GB/s vs 360): no finding
    assert not analyze_run(run, expected=expected_from_flat(run.sizes, 360.0)).findings


def test_summary_definitions() -> None:
    row = SizeRow(8, 2, "float", "sum", -1, Placement(10.0, 1.0, 1.0), Placement(14.0, 1.0, 1.0), 1)
    row2 = SizeRow(16, 4, "float", "sum", -1, Placement(20.0, 1.0, 3.0), None, 2)
    run = CollectiveRun(source="x", collective="all_reduce", ranks=2, rows=(row, row2),
                        avg_busbw_recomputed=5 / 3)
    s = summarize_run(run)
    assert s.avg_time_us == pytest.approx(44 / 3) and s.max_time_us == 20.0
    assert s.time_std_us == pytest.approx((16 / 2) ** 0.5)  # one pair: (10-14)^2 / 2
    assert s.avg_busbw_gbs == pytest.approx(5 / 3) and s.sizes == 2


def test_bus_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("gather", 8) is None


# ---------------------------------------------------------------- CLI


def _app() -> typer.Typer:
    from fabricscope.cli.collective import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:  # a group, so "collective" is a subcommand
        pass

    return app


@pytest.fixture()
def examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with examples/collective/ as the lead ships it (copies of tests/data)."""
    ex = tmp_path / "examples" / "collective"
    ex.mkdir(parents=True)
    shutil.copy(DATA / "superbench_nccl_allreduce.log", ex / "allreduce_8gpu.log")
    shutil.copy(DATA / "a3mega_allreduce_2node.txt", ex / "allreduce_2node.txt")
    shutil.copy(DATA / "ncclebpf_socket-thread-validation.md.txt", ex / "socket_runs.md")
    shutil.copy(ROOT / "examples" / "collective" / "print_run.py", ex / "print_run.py")
    shutil.copytree(ROOT / "tests" / "data" / "roce" / "broken", tmp_path / "tests" / "data" / "roce" / "broken")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _help_examples(text: str) -> list[list[str]]:
    cmds = re.findall(r"^\s*(fabricscope collective .+?)\s*$", text.split("Examples:")[1], flags=re.M)
    return [shlex.split(c)[1:] for c in cmds]


def test_every_help_example_runs(examples: Path) -> None:
    from fabricscope.cli import collective as cli

    for args in (["collective"], ["collective", "analyze"], ["collective", "watch"]):
        res = CliRunner().invoke(_app(), [*args, "--help"])
        assert res.exit_code == 0 and "Examples" in res.output, res.output
    cmds = [c for t in (cli._GROUP_HELP, cli._ANALYZE_HELP, cli._WATCH_HELP) for c in _help_examples(t)]
    assert len(cmds) == 8
    for argv in cmds:
        argv = [sys.executable if a == "python3" else a for a in argv]
        res = CliRunner().invoke(_app(), argv)
        assert res.exit_code == 0, (argv, res.output, res.exception)
    assert (examples / "busbw.png").stat().st_size > 1000
    assert (examples / "collective-watch.duckdb").exists()
    from fabricscope.store.findings import DiagnosisStore

    store = DiagnosisStore(examples / "diag.duckdb")
    try:
        assert {o.finding.kind for o in store.findings()} == {"collective-regression"}
    finally:
        store.close()
    store = DiagnosisStore(examples / "diag-links.duckdb")
    try:  # the example with saved link-check outputs: the regression and the broken ports
        kinds = {o.finding.kind for o in store.findings()}
        assert "collective-regression" in kinds and "roce-port-down" in kinds
    finally:
        store.close()


def test_analyze_json_and_db(examples: Path) -> None:
    res = CliRunner().invoke(_app(), ["collective", "analyze", "examples/collective/allreduce_2node.txt",
                                      "--expected-busbw", "400", "--json", "--db", "diag.duckdb"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[: res.output.rindex("}") + 1])
    (run,) = out["runs"]
    assert run["collective"] == "all_reduce" and run["ranks"] == 16 and run["nodes"] == 2
    assert run["avg_busbw_file"] == 70.742 and run["avg_matches"] is True
    assert run["findings"][0]["kind"] == "collective-busbw-low"
    from fabricscope.store.findings import DiagnosisStore

    store = DiagnosisStore(examples / "diag.duckdb")
    try:
        kinds = [o.finding.kind for o in store.findings()]
    finally:
        store.close()
    assert kinds == ["collective-busbw-low"]


def test_analyze_expected_file_and_bad_values(examples: Path) -> None:
    run = _run_2node()
    (examples / "exp.json").write_text(json.dumps({str(k): v for k, v in _measured(run).items()}))
    res = CliRunner().invoke(_app(), ["collective", "analyze", "examples/collective/allreduce_2node.txt",
                                      "--expected", "exp.json"])
    assert res.exit_code == 0 and "attribution: ok" in res.output
    (examples / "bad.json").write_text('{"8": "fast"}')
    for argv, err in [
        (["--expected", "bad.json"], ConfigError),
        (["--margin", "1.5"], ConfigError),
        (["--expected-busbw", "-1"], ConfigError),
        (["--expected-busbw", "1", "--expected", "exp.json"], ConfigError),
        (["--collective", "allreduce"], ConfigError),
        (["--plot", "x.jpg"], ConfigError),
    ]:
        res = CliRunner().invoke(_app(), ["collective", "analyze", "examples/collective/allreduce_2node.txt", *argv])
        assert isinstance(res.exception, err), (argv, res.output)
        assert "\n" not in str(res.exception)


def test_analyze_without_any_table_is_an_error(examples: Path) -> None:
    res = CliRunner().invoke(_app(), ["collective", "analyze",
                                      str(DATA / "nccl_issue473_allreduce_init_failure.txt")])
    assert isinstance(res.exception, TraceFormatError)
    assert "unhandled system error" in str(res.exception)


def test_analyze_with_the_twin(examples: Path) -> None:
    pytest.importorskip("fabricscope.twin.collective_twin")
    res = CliRunner().invoke(_app(), ["collective", "analyze", "examples/collective/allreduce_2node.txt",
                                      "--fabric", "rail-optimized:servers=2,gpus-per-server=8", "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    out = json.loads(res.output[: res.output.rindex("}") + 1])
    run = out["runs"][0]
    top = max(s["size_bytes"] for s in run["sizes"])
    # a bandwidth model judges the plateau sizes only (analysis.PLATEAU_SPAN)
    for s in run["sizes"]:
        judged = s["size_bytes"] * 4 >= top
        assert (s["expected_busbw_gbs"] is not None and s["expected_busbw_gbs"] > 0) == judged, s
    assert run["attribution"] == "ok"  # a healthy real H100 run is not called slow


def test_baseline_run_judges_a_slow_nic_and_passes_a_healthy_rerun(tmp_path: Path) -> None:
    """--baseline: a known-good run of the twin is the expectation for every size. A rerun on
    another seed (1% noise) passes; the same job with one NIC at 60% is a network deficit."""
    from fabricscope.fabric.builders import rail_optimized_fabric
    from fabricscope.twin import collective_twin as ct

    fab = rail_optimized_fabric(4, gpus_per_server=8, nic_gbps=400, radix=16)
    sizes = [2**k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB
    nodes = ["host0000", "host0001"]
    good = tmp_path / "good.txt"
    good.write_text(ct.twin_run(fab, "all_reduce_perf", nodes, sizes, seed=1))
    rerun = tmp_path / "rerun.txt"
    rerun.write_text(ct.twin_run(fab, "all_reduce_perf", nodes, sizes, seed=2))
    slow = tmp_path / "slow.txt"
    slow.write_text(ct.twin_run(fab, "all_reduce_perf", nodes, sizes, seed=3, slow={"host0001": 0.6}))
    runner = CliRunner()
    ok = runner.invoke(_app(), ["collective", "analyze", str(rerun), "--baseline", str(good), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["runs"][0]["attribution"] == "ok"
    bad = runner.invoke(_app(), ["collective", "analyze", str(slow), "--baseline", str(good), "--json"])
    assert bad.exit_code == 0, bad.output
    got = json.loads(bad.output)["runs"][0]
    assert got["attribution"] == "bandwidth-network", got["attribution"]
    assert got["ratio_large"] < 0.8
    mism = runner.invoke(_app(), ["collective", "analyze", str(DATA / "superbench_nccl_allreduce.log"),
                                  "--baseline", str(good)])
    assert isinstance(mism.exception, ConfigError) and "same collective at the same scale" in str(mism.exception)
