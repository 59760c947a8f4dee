"""``fabricscope roce check`` / ``roce parse``: every --help example runs, exit codes, --json, --db."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.cli.roce import _CHECK_HELP, _PARSE_HELP, register
from fabricscope.model.errors import ConfigError, TraceFormatError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "roce"


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _examples(help_text: str) -> list[list[str]]:
    return [shlex.split(m.group(1)) for m in re.finditer(r"^  fabricscope (.+)$", help_text, re.M)]


@pytest.mark.parametrize("args", [*_examples(_CHECK_HELP), *_examples(_PARSE_HELP)],
                         ids=lambda a: " ".join(a))
def test_help_examples_run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    assert res.output.strip()


def test_help_examples_found() -> None:
    assert len(_examples(_CHECK_HELP)) == 2 and len(_examples(_PARSE_HELP)) == 2


def test_no_tools_no_sys_exits_2_with_every_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    res = CliRunner().invoke(_app(), ["roce", "check", "--root", str(tmp_path)])
    assert res.exit_code == 2
    assert "ibstat not found on PATH" in res.output
    assert f"{tmp_path}/sys/class/infiniband absent" in res.output
    assert "nothing could be checked" in res.output
    assert not re.search(r"^(ok|FAIL|WARN) ", res.output, re.M)


def test_broken_bundle_exits_1_with_fix_lines() -> None:
    res = CliRunner().invoke(_app(), ["roce", "check", "--from", str(DATA / "broken"),
                                      "--expect-rate", "200"])
    assert res.exit_code == 1
    assert "fix: `mlnx_qos -i eth2 --pfc 0,0,0,1,0,0,0,0`" in res.output
    assert re.search(r"^FAIL\s+perftest-lat", res.output, re.M)


def test_json_output_and_findings() -> None:
    res = CliRunner().invoke(_app(), ["roce", "check", "--from", str(DATA / "gid-mismatch"), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["exit_code"] == 1 and doc["summary"]["fail"] >= 1
    kinds = {f["kind"] for f in doc["findings"]}
    assert "roce-gid-mismatch" in kinds
    r = next(x for x in doc["results"] if x["name"] == "gid-index-ends")
    assert set(r) >= {"name", "subject", "status", "expected", "seen", "fix"}


def test_db_stores_findings(tmp_path: Path) -> None:
    from fabricscope.store.findings import DiagnosisStore

    db = tmp_path / "diag.duckdb"
    res = CliRunner().invoke(_app(), ["roce", "check", "--from", str(DATA / "broken"),
                                      "--expect-rate", "200", "--db", str(db)])
    assert res.exit_code == 1
    with DiagnosisStore(db, read_only=True) as store:
        rows = store.con.execute("SELECT source, kind FROM findings").fetchall()
    assert rows and {s for s, _ in rows} == {"host"}
    assert {"roce-port-down", "roce-mtu", "roce-pfc-config", "roce-lat-high"} <= {k for _, k in rows}


def test_inventory_gives_rate_neighbour_and_subjects(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "version: 1\nname: edr\ndevices:\n"
        "- {id: SB7700, role: leaf}\n- {id: n01, role: host, gpus: 1}\n"
        "- {id: n01/nic0, role: nic, host: n01, gpu: 0}\n"
        "links:\n- {a: 'n01/nic0:p0', b: 'SB7700:eth18', capacity_gbps: 100.0}\n")
    bundle = tmp_path / "n01"
    bundle.mkdir()
    (bundle / "ibstat.txt").write_text((DATA / "ibstat-ib-edr.txt").read_text())
    (bundle / "iblinkinfo.txt").write_text((DATA / "iblinkinfo-edr.txt").read_text())
    args = ["roce", "check", "--from", str(bundle), "--inventory", str(inv), "--host", "n01",
            "--link-layer", "InfiniBand", "--json"]
    doc = json.loads(CliRunner().invoke(_app(), args).output)
    by = {r["name"]: r for r in doc["results"]}
    assert by["neighbour"]["status"] == "pass" and by["neighbour"]["subject"] == "n01/nic0"
    assert by["rate"]["status"] == "pass" and by["rate"]["expected"] == "100 Gb/s"
    assert by["nic-mapping"]["status"] == "warn"  # mapped by order: said so
    # the cable on another switch port: a neighbour finding on the NIC
    inv.write_text(inv.read_text().replace("eth18", "eth17"))
    res = CliRunner().invoke(_app(), [*args, "--nic", "mlx5_0=n01/nic0"])
    doc = json.loads(res.output)
    assert res.exit_code == 1
    assert [f["subject"] for f in doc["findings"] if f["kind"] == "roce-neighbour-mismatch"] == ["n01/nic0"]
    assert "nic-mapping" not in {r["name"] for r in doc["results"]}


@pytest.mark.parametrize(("args", "msg"), [
    (["--bw-fraction", "1.5"], "--bw-fraction"),
    (["--pfc-priority", "9"], "--pfc-priority"),
    (["--host", "n01"], "--host: needs --inventory"),
    (["--nic", "mlx5_0"], "--nic: 'mlx5_0'"),
    (["--link-layer", "fddi"], "--link-layer"),
])
def test_bad_options_are_config_errors(args: list[str], msg: str) -> None:
    res = CliRunner().invoke(_app(), ["roce", "check", "--from", str(DATA / "healthy"), *args])
    assert isinstance(res.exception, ConfigError) and msg in str(res.exception)


def test_parse_json_and_garbage() -> None:
    res = CliRunner().invoke(_app(), ["roce", "parse", str(DATA / "ibstat-roce-truncated.txt"), "--json"])
    doc = json.loads(res.output)
    assert doc["format"] == "ibstat" and doc["truncated"] is True and len(doc["ports"]) == 3
    bad = CliRunner().invoke(_app(), ["roce", "parse", str(DATA / "synthetic-garbage.txt")])
    assert isinstance(bad.exception, TraceFormatError)
    assert "synthetic-garbage.txt: line 1:" in str(bad.exception)


def _doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "roce.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    return [shlex.split(ln)[1:] for b in blocks for ln in b.splitlines() if ln.startswith("fabricscope ")]


@pytest.mark.parametrize("args", _doc_commands(), ids=lambda a: " ".join(a))
def test_docs_examples_run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output


def test_docs_examples_found() -> None:
    assert len(_doc_commands()) == 4
