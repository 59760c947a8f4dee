"""``fabricscope straggler`` commands and the demo part."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fabricscope.cli import app
from fabricscope.service import demo_straggler

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_help_teaches() -> None:
    out = runner.invoke(app, ["straggler", "analyze", "--help"])
    assert out.exit_code == 0
    assert "Examples" in out.output and "--inventory" in out.output


def test_analyze_json_on_gloo_fixture(tmp_path: Path) -> None:
    plot = tmp_path / "t.png"
    out = runner.invoke(app, ["straggler", "analyze", str(ROOT / "tests/fixtures/gloo/throttle-rank1"),
                              "--json", "--plot", str(plot)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["subject"] == "rank 1 network"
    assert plot.stat().st_size > 1000


def test_twin_then_analyze_with_inventory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "8"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())
    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory",
                              str(run / "inventory.json")])
    assert out.exit_code == 0, out.output
    assert truth["expected"][0]["subject"] in out.output


def test_bad_path_is_one_error_line() -> None:
    from fabricscope.model.errors import TraceFormatError

    out = runner.invoke(app, ["straggler", "analyze", "/nonexistent/x"])
    assert isinstance(out.exception, TraceFormatError)
    assert "no such file" in str(out.exception)


def test_demo_part_quick(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = demo_straggler.run(seed=0, outdir=tmp_path, echo=lines.append, quick=True)
    assert summary["ok"] is True
    assert summary["found"] == summary["injected"]["subject"]  # type: ignore[index]
    assert any("injected" in x for x in lines) and any("found" in x for x in lines)
    json.dumps(summary)


def test_bad_files_in_a_folder_are_reported_and_the_rest_analyzed(tmp_path: Path) -> None:
    import gzip
    import warnings

    from fabricscope.straggler.pipeline import analyze_paths

    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "8"])
    assert out.exit_code == 0, out.output
    k = run / "kineto"
    raw = gzip.decompress((k / "rank3.json.gz").read_bytes())
    (k / "rank3.json.gz").write_bytes(gzip.compress(raw[: len(raw) // 3]))
    (k / "junk.parquet").write_bytes(b"PAR1 not parquet")
    (k / "rank9.json.gz").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's all-NaN RuntimeWarning must not leak to stderr
        _res, report = analyze_paths([k], inventory=run / "inventory.json")
    text = "\n".join(report.warnings)
    assert "rank3.json.gz" in text and "cut or corrupt at byte" in text
    assert "junk.parquet" in text and "missing rank(s) 9" in text
    assert "clock offset" not in text  # the cut file keeps its clock base
    truth = json.loads((run / "truth.json").read_text())
    assert report.findings and report.findings[0].subject == truth["expected"][0]["subject"]


def test_missing_rank_does_not_frame_its_peers_nic(tmp_path: Path) -> None:
    # Flow-engine twin (NCCL-like rail channels: a DP ring crossing a server uses all of its
    # NICs, so the slow NIC also slows a ring its rank is not in). Without rank 10 (or 12)
    # nothing clears its pipeline peer's NIC elsewhere; that NIC must not be named.
    from fabricscope.straggler.pipeline import analyze_paths

    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-nic", "--seed", "0"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())["expected"][0]["subject"]
    for missing in (10, 12):
        k = tmp_path / f"k{missing}"
        k.mkdir()
        for f in (run / "kineto").iterdir():
            if f.name != f"rank{missing}.json.gz":
                (k / f.name).write_bytes(f.read_bytes())
        _, rep = analyze_paths([k], inventory=run / "inventory.json",
                               placement=None)
        assert [f.subject for f in rep.device_findings()] == [truth], missing


def test_placement_option_takes_truth_json_and_rejects_binary(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "6"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())
    inv = str(run / "inventory.json")
    # the help's own example: --placement run/truth.json
    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory", inv,
                              "--placement", str(run / "truth.json"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["findings"][0]["subject"] == truth["expected"][0]["subject"]
    from fabricscope.model.errors import ConfigError

    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory", inv,
                              "--placement", str(run / "kineto" / "rank0.json.gz")])
    assert isinstance(out.exception, ConfigError) and "rank0.json.gz" in str(out.exception)
