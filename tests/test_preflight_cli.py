"""The preflight CLI: every --help example, exit codes, --json, --fix safety, --db, fleet."""

from __future__ import annotations

import glob
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.cli.preflight import _FLEET_HELP, _HELP, register
from fabricscope.model.errors import ConfigError, TraceFormatError

REPO = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "preflight"


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps "preflight" a named group
        pass

    return app


def _run(*args: str, input: str | None = None) -> tuple[int, str, BaseException | None]:
    res = CliRunner().invoke(_app(), list(args), input=input)
    exc = res.exception if not isinstance(res.exception, SystemExit) else None
    return res.exit_code, res.output, exc


def _examples(text: str) -> list[list[str]]:
    out = []
    for line in text.split("Examples:")[1].splitlines():
        line = line.strip()
        if line.startswith("fabricscope "):
            argv = []
            for a in shlex.split(line)[1:]:
                argv.extend(sorted(glob.glob(a)) if "*" in a else [a])
            out.append(argv)
    return out


@pytest.mark.parametrize("argv", _examples(_HELP) + _examples(_FLEET_HELP))
def test_help_examples_run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    before = sorted((DATA / "untuned").rglob("*"))
    code, out, exc = _run(*argv)
    assert exc is None, exc
    assert code == 0, out  # tests/test_docs_examples.py wants every example to exit 0
    assert sorted((DATA / "untuned").rglob("*")) == before
    if "--json" in argv:
        json.loads(out)


def test_exit_codes_and_json() -> None:
    assert _run("preflight", "--root", str(DATA / "tuned"))[0] == 0
    assert _run("preflight", "--root", str(DATA / "untuned"), "--exit-zero")[0] == 0
    code, out, _ = _run("preflight", "--root", str(DATA / "untuned"), "--json")
    rep = json.loads(out)
    assert code == 1 and rep["host"] == "gpu-train-12" and rep["exit_code"] == 1
    assert rep["summary"]["fail"] == sum(r["status"] == "fail" for r in rep["results"])


def test_no_data_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    code, _, _ = _run("preflight", "--root", str(tmp_path))
    assert code == 2
    code, _, exc = _run("preflight", "--root", str(tmp_path / "missing"))
    assert isinstance(exc, ConfigError)


def test_fix_needs_confirmation(tmp_path: Path) -> None:
    root = tmp_path / "h"
    shutil.copytree(DATA / "untuned", root)
    undo = tmp_path / "undo.sh"
    code, out, _ = _run("preflight", "--root", str(root), "--fix", "--undo-script", str(undo),
                        input="n\n")
    assert "nothing changed" in out and not undo.exists()
    assert (root / "proc/sys/net/ipv4/tcp_tw_reuse").read_text() == "2\n"
    assert "refuse nic.firmware" not in out  # firmware passes (report only), nothing to refuse
    assert "refuse nic.mtu" in out and "refuse nic.ring" in out
    code, out, _ = _run("preflight", "--root", str(root), "--fix", "--yes", "--undo-script",
                        str(undo))
    assert undo.exists() and "after the fix:" in out
    assert (root / "proc/sys/net/ipv4/tcp_tw_reuse").read_text() == "1\n"
    # what --fix cannot change still fails? no: every fail of this tree is reversible
    assert code == 0, out


def test_fix_flags_without_fix() -> None:
    _, _, exc = _run("preflight", "--root", str(DATA / "tuned"), "--yes")
    assert isinstance(exc, ConfigError)


def test_db_gets_findings(tmp_path: Path) -> None:
    from fabricscope.store.findings import DiagnosisStore

    db = tmp_path / "d.duckdb"
    code, _, exc = _run("preflight", "--root", str(DATA / "untuned"), "--db", str(db))
    assert exc is None and code == 1
    with DiagnosisStore(db, read_only=True) as store:
        got = store.findings()
    _, out, _ = _run("preflight", "--root", str(DATA / "untuned"), "--json")
    fails = [r for r in json.loads(out)["results"] if r["status"] == "fail"]
    assert len(got) == len(fails) > 0
    assert {o.source for o in got} == {"host"}
    assert {o.finding.details["check"] for o in got} == {r["check"] for r in fails}


def test_fleet_majority_and_outliers(tmp_path: Path) -> None:
    files = sorted(glob.glob(str(DATA / "fleet/*.json")))
    code, out, _ = _run("preflight", "fleet", *files, "--json")
    data = json.loads(out)
    assert code == 1 and data["hosts"] == 3
    fw = next(c for c in data["checks"] if c["check"] == "nic.firmware"
              and c["subject"] == "ens1f0np0")
    assert fw["majority"] == "28.39.1002" and fw["outliers"] == {"gpu-train-12": "28.36.1010"}
    assert "gpu-train-12" in data["differing_hosts"]
    assert "gpu-train-07" not in data["differing_hosts"]
    # two hosts that disagree: no majority, reported as a tie
    code, out, _ = _run("preflight", "fleet", files[0], files[2], "--json")
    fw = next(c for c in json.loads(out)["checks"] if c["check"] == "nic.firmware"
              and c["subject"] == "ens1f0np0")
    assert fw["majority"] is None and fw["outliers"] == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert isinstance(_run("preflight", "fleet", str(bad))[2], TraceFormatError)
    assert isinstance(_run("preflight", "fleet", files[0], files[0])[2], ConfigError)


def test_real_host_via_cli() -> None:
    code, out, exc = _run("preflight", "--root", "/", "--json")
    assert exc is None and code in (0, 1, 2)
    rep = json.loads(out)
    somax = next(r for r in rep["results"] if r["check"] == "sysctl.net.core.somaxconn")
    assert somax["current"] == Path("/proc/sys/net/core/somaxconn").read_text().strip()
    assert rep["elapsed_s"] < 60


def _doc_blocks(lang: str) -> list[str]:
    text = (REPO / "docs/preflight.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


@pytest.mark.parametrize("line", [ln for b in _doc_blocks("") for ln in b.splitlines()
                                  if ln.startswith("fabricscope ")])
def test_docs_examples_run(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    argv = []
    for a in shlex.split(line)[1:]:
        argv.extend(sorted(glob.glob(a)) if "*" in a else [a])
    code, out, exc = _run(*argv)
    assert exc is None and code == 0, out


def test_docs_yaml_profile_loads(tmp_path: Path) -> None:
    from fabricscope.preflight import load_profile

    (block,) = _doc_blocks("yaml")
    p = tmp_path / "p.yaml"
    p.write_text(block)
    prof = load_profile(str(p))
    assert prof.check("nic.mtu") is None
    assert prof.check("nic.speed").severity == "fail"  # type: ignore[union-attr]
    assert prof.check("sysctl.vm.swappiness") is not None
