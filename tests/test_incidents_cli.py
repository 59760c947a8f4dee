"""``fabricscope incidents list|show|export`` over stores built from hand-made records."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cli_inprocess import run_main
from fabricscope.diagnosis.serialize import incident_from_json, observed_from_json
from fabricscope.store.findings import DiagnosisStore
from test_incidents_store import WALL, S, sample_findings, sample_incidents

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    p = tmp_path / "incidents.duckdb"
    with DiagnosisStore(p) as s:
        s.add_findings(sample_findings())
        s.upsert_incidents(sample_incidents())
    return p


def _rows(out: str) -> dict[str, str]:
    return {ln.split()[0]: ln for ln in out.splitlines()[1:]}


def test_list_human(db: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(db))
    assert code == 0, err
    head = out.splitlines()[0].split()
    assert head[:3] == ["ID", "STATUS", "SEVERITY"] and head[-1] == "FINDINGS"
    assert list(_rows(out)) == ["inc-0002", "inc-0001"]  # newest first (wall clock > sim)
    r1 = _rows(out)["inc-0001"].split()
    # root cause, probability, opened (simulated clock: s), ttrc = 14 s - 9 s, 3 findings
    assert r1[1:] == ["open", "critical", "spine-01:eth4", "dirty-connector", "0.82", "12.500",
                      "s", "5.0", "s", "3"]
    r2 = _rows(out)["inc-0002"]
    assert "2023-11-14T22:13:20.000Z" in r2 and "(not yet)" in r2  # wall clock as ISO UTC


def test_list_status_and_json(db: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(db),
                            "--status", "closed")
    assert code == 0 and list(_rows(out)) == ["inc-0002"]
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(db),
                            "--status", "open", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [i["id"] for i in doc["incidents"]] == ["inc-0001"]
    row = doc["incidents"][0]
    assert row["root_cause"] == {"resource": "spine-01:eth4", "fault": "dirty-connector",
                                 "probability": 0.82}
    assert row["time_to_root_cause_s"] == pytest.approx(5.0) and row["findings"] == 3
    code, _, err = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(db),
                            "--status", "done")
    assert code == 2 and "--status 'done'" in err


def test_empty_store(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "empty.duckdb"
    DiagnosisStore(p).close()
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(p))
    assert code == 0 and out.startswith("no incidents")
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(p), "--json")
    assert code == 0 and json.loads(out)["incidents"] == []
    for ident in ("inc-0001", "latest"):
        code, _, err = run_main(capsys, monkeypatch, "incidents", "show", ident, "--db", str(p))
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(p) in err


def test_show_human(db: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _ = sample_findings()
    code, out, err = run_main(capsys, monkeypatch, "incidents", "show", "inc-0001", "--db",
                              str(db))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "incident inc-0001  open  critical"
    assert "packet loss and CRC errors on spine-01:eth4" in lines[1]
    assert any(ln.split() == ["first", "symptom", "9.000", "s"] for ln in lines)
    assert any(ln.split() == ["root", "cause", "14.000", "s", "(+5.000", "s)"] for ln in lines)
    assert any(ln.split() == ["closed", "-"] for ln in lines)
    i1 = lines.index(next(ln for ln in lines if ln.startswith("  1. ")))
    i2 = lines.index(next(ln for ln in lines if ln.startswith("  2. ")))
    assert "dirty-connector" in lines[i1] and "0.820" in lines[i1] and "[optics]" in lines[i1]
    assert "optic-aging" in lines[i2] and "0.150" in lines[i2]
    first = "\n".join(lines[i1:i2])
    assert f"{a.id} probe-loss on leaf-03:eth12->spine-01:eth4 (probe)" in first
    assert f"{b.id} crc-increase on spine-01:eth4 (telemetry)" in first
    assert "supports      rx-power-per-lane (optics): 1 of 4 lanes low" in first
    assert "excludes      tx-power-peer (gnmi)" in first
    assert "action: clean the connector on spine-01:eth4" in first
    assert "blast radius: links 1, gpus 16, jobs 1" in out
    assert "findings (3)" in out and "window 9.000 s .. 13.000 s" in out
    assert "cost out leaf-03:eth12|spine-01:eth4" in out.split("actions taken", 1)[1]


def test_show_prefix_latest_and_errors(db: Path, capsys: Capture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "show", "inc-0002", "--db", str(db))
    assert code == 0
    assert ["closed", "2023-11-14T22:14:50.000Z", "(+100.000", "s)"] in [
        ln.split() for ln in out.splitlines()]
    code, out2, _ = run_main(capsys, monkeypatch, "incidents", "show", "latest", "--db", str(db))
    assert code == 0 and out2 == out  # inc-0002 is the newest
    code, _, err = run_main(capsys, monkeypatch, "incidents", "show", "inc-000", "--db", str(db))
    assert code == 2 and "ambiguous" in err and "inc-0001" in err and "inc-0002" in err
    code, _, err = run_main(capsys, monkeypatch, "incidents", "show", "inc-9", "--db", str(db))
    assert code == 2 and "no incident 'inc-9'" in err and len(err.strip().splitlines()) == 1


def test_show_json_is_an_export_record(db: Path, capsys: Capture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_main(capsys, monkeypatch, "incidents", "show", "inc-0001", "--db", str(db),
                            "--json")
    assert code == 0
    rec = json.loads(out)
    assert incident_from_json(rec["incident"]) == sample_incidents()[0]
    assert [observed_from_json(f) for f in rec["findings"]] == sample_findings()


@pytest.mark.parametrize(("name", "fmt"), [("out.json", None), ("out.jsonl", None),
                                           ("out.txt", "jsonl")])
def test_export(db: Path, tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch,
                name: str, fmt: str | None) -> None:
    out_file = tmp_path / name
    args = ["incidents", "export", "--db", str(db), "--out", str(out_file)]
    code, out, err = run_main(capsys, monkeypatch, *args, *(["--format", fmt] if fmt else []))
    assert code == 0, err
    assert "2 incident(s), 3 finding(s)" in out
    text = out_file.read_text()
    if name == "out.json":
        doc = json.loads(text)
        assert doc["format"] == "fabricscope-incidents" and doc["version"] == 1
        records = doc["incidents"]
    else:
        records = [json.loads(ln) for ln in text.splitlines()]
    # oldest first, each incident exactly as stored, its findings inlined
    assert [incident_from_json(r["incident"]) for r in records] == sample_incidents()
    assert [observed_from_json(f) for f in records[0]["findings"]] == sample_findings()
    assert records[1]["findings"] == []
    assert not (tmp_path / f"{name}.tmp").exists()


def test_export_bad_arguments(db: Path, tmp_path: Path, capsys: Capture,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_main(capsys, monkeypatch, "incidents", "export", "--db", str(db),
                            "--out", str(tmp_path / "x.json"), "--format", "csv")
    assert code == 2 and "--format 'csv'" in err
    missing = tmp_path / "no" / "x.json"
    code, _, err = run_main(capsys, monkeypatch, "incidents", "export", "--db", str(db),
                            "--out", str(missing))
    assert code == 2 and "--out" in err and "does not exist" in err


def test_bad_db_files(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_text("hello\n" * 200)
    for p in (junk, tmp_path):  # not a DuckDB file; a folder
        code, _, err = run_main(capsys, monkeypatch, "incidents", "list", "--db", str(p))
        assert code == 2 and str(p) in err and len(err.strip().splitlines()) == 1
        assert "Traceback" not in err


def test_help_examples_run(tmp_path: Path, capsys: Capture,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example of `incidents ... --help` runs on a store at incidents.duckdb (the docs
    test runs them again after a prelude that makes the store with `supervise`)."""
    from fabricscope.cli import get_command

    monkeypatch.chdir(tmp_path)
    with DiagnosisStore("incidents.duckdb") as s:
        s.add_findings(sample_findings())
        s.upsert_incidents(sample_incidents())
    grp = get_command().commands["incidents"]
    helps = [grp.help, *(c.help for c in grp.commands.values())]
    examples = [ln.strip() for h in helps for ln in h.split("Examples:", 1)[1].splitlines()
                if ln.strip().startswith("fabricscope incidents ")]
    assert len(examples) >= 6
    for ex in examples:
        code, out, err = run_main(capsys, monkeypatch, *shlex.split(ex)[1:])
        assert code == 0, f"{ex}: {err}"
        assert out.strip(), ex


def test_missing_db_through_the_entry_point(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "fabricscope"
    missing = tmp_path / "none.duckdb"
    p = subprocess.run([str(exe), "incidents", "list", "--db", str(missing)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: incidents list: --db {missing}: no such file (a diagnosis store is written by "
        "`fabricscope supervise --db FILE`)"]
    assert p.stdout == "" and not missing.exists()


def test_times_in_both_clocks() -> None:
    from fabricscope.cli.incidents import fmt_time

    assert fmt_time(None) == "-"
    assert fmt_time(12 * S + S // 2) == "12.500 s"
    assert fmt_time(WALL + 250_000_000) == "2023-11-14T22:13:20.250Z"
