"""``fabricscope slo``: every --help example runs; JSON, --db, bad values exit 2."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.cli.slo import _ANALYZE_HELP, _GENERATE_HELP, _SERVE_HELP, register


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """fabricscope"""

    register(app)
    return app


def _examples(text: str) -> list[list[str]]:
    return [shlex.split(m)[1:] for m in re.findall(r"^  (fabricscope .+)$", text, flags=re.M)]


def test_help_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner()
    app = _app()
    for args in _examples(_GENERATE_HELP) + _examples(_ANALYZE_HELP) + _examples(_SERVE_HELP):
        res = r.invoke(app, args)
        assert res.exit_code == 0, (args, res.output, res.exception)
    assert Path("diag.duckdb").exists() and Path("slow.jsonl.truth.json").exists()


def test_analyze_json_finds_the_slow_tool(tmp_path: Path) -> None:
    r = CliRunner()
    app = _app()
    p = tmp_path / "t.jsonl"
    assert r.invoke(app, ["slo", "generate", str(p), "--traces", "2400", "--qps", "10", "--slow-hop", "tool",
                          "--slow-fraction", "0.2", "--seed", "3"]).exit_code == 0
    res = r.invoke(app, ["slo", "analyze", str(p), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["spans"] == 2400 * 8 and out["traces"] == 2400
    assert 0.7 < out["sla_attainment"] < 0.9  # ~20% slow chains, slowdowns 8-30 ms over a ~10 ms chain
    truth = json.loads(Path(f"{p}.truth.json").read_text())
    slow = {t["hop"] for t in truth if t["kind"]}
    breaches = [f for f in out["findings"] if f["kind"] == "slo-breach"]
    assert breaches and all(f["subject"] in slow for f in breaches)
    assert {"p99_ms", "sla_attainment", "token_ms"} <= set(out["windows"][0])


def test_bad_values_exit_2(tmp_path: Path) -> None:
    r = CliRunner()
    app = _app()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    assert r.invoke(app, ["slo", "analyze", str(bad)]).exit_code != 0
    p = tmp_path / "t.jsonl"
    r.invoke(app, ["slo", "generate", str(p), "--traces", "20"])
    for args in (["slo", "analyze", str(p), "--window", "fast"], ["slo", "generate", str(p), "--slow-hop", "disk"],
                 ["slo", "analyze"]):
        res = r.invoke(app, args)
        assert res.exit_code != 0
