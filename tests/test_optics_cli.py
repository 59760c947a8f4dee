"""`fabricscope optics`: twin -> grade / plot / predict / train on files, and its mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "optics"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fleet") / "fleet"
    p = _cli("optics", "twin", str(d), "--modules", "200", "--days", "12", "--seed", "4",
             cwd=d.parent)
    assert p.returncode == 0, p.stderr
    return d


def test_twin_writes_the_four_files_and_refuses_to_mix_folders(fleet: Path) -> None:
    for name in ("history.parquet", "labels.csv", "truth.json", "links.csv"):
        assert (fleet / name).stat().st_size > 0
    other = fleet.parent / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    p = _cli("optics", "twin", str(other), "--modules", "50", "--days", "3", cwd=fleet.parent)
    assert p.returncode == 2 and "not empty" in p.stderr


def test_grade_json_names_every_module_with_grade_reasons_and_action(fleet: Path) -> None:
    p = _cli("optics", "grade", str(fleet / "history.parquet"), "--links",
             str(fleet / "links.csv"), "--json", cwd=fleet.parent)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    mods = doc["modules"]
    assert len(mods) == 200
    for m in mods:
        assert {"device", "port", "serial", "grade", "reasons", "action"} <= set(m)
        assert m["grade"] in ("good", "moderate", "needs-attention", "bad", "no-data")
    assert sum(doc["summary"]["grades"].values()) == 200
    # The generator's failed modules end the window dead or dark: most grade bad.
    truth = json.loads((fleet / "truth.json").read_text())
    failed = {(t["device"], t["port"]) for t in _truth_modules(truth) if t.get("failure_ts_ns")}
    bad = {(m["device"], m["port"]) for m in mods if m["grade"] in ("bad", "needs-attention")}
    assert failed and len(failed & bad) / len(failed) >= 0.5


def _truth_modules(truth: object) -> list[dict]:  # type: ignore[type-arg]
    if isinstance(truth, dict) and "modules" in truth:
        return list(truth["modules"])
    assert isinstance(truth, list)
    return truth


def test_grade_real_ethtool_and_sonic_samples(tmp_path: Path) -> None:
    files = sorted(str(p) for p in DATA.iterdir() if p.suffix in (".txt", ".json"))
    p = _cli("optics", "grade", *files, "--json", "--ts", "2025-01-01T00:00:00Z", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    ports = {(m["device"], m["port"]) for m in doc["modules"]}
    assert ("sas2-5s50", "swp14") in ports and ("host-i40e", "eth28") in ports
    assert "warning:" in p.stderr  # the broken / N/A values are reported, not fatal


def test_plot_writes_a_png_and_names_a_missing_module(fleet: Path) -> None:
    out = fleet.parent / "m.png"
    p = _cli("optics", "plot", str(fleet / "history.parquet"), "--module", "leaf-000:Ethernet0",
             "-o", str(out), cwd=fleet.parent)
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 20_000
    p = _cli("optics", "plot", str(fleet / "history.parquet"), "--module", "nope:x",
             "-o", str(out), cwd=fleet.parent)
    assert p.returncode == 2 and "nope:x" in p.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["grade", "{d}/missing.parquet"], "missing.parquet"),
    (["grade", "{d}"], "is a folder"),
    (["grade", "{d}/bad.csv"], "bad.csv"),
    (["grade", "{d}/bad.csv", "--at", "yesterday"], "--at"),
    (["predict", "{d}/bad.csv", "--horizon", "seven"], "--horizon"),
    (["twin", "{d}/t", "--modules", "0"], "modules"),
])
def test_mistakes_are_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "bad.csv").write_text("ts,device\n1,x\n")
    p = _cli("optics", *[a.format(d=tmp_path) for a in args], cwd=tmp_path)
    assert p.returncode == 2, (args, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert any(needle in line for line in p.stderr.splitlines()), p.stderr


def test_train_on_the_twin_files_then_predict_with_that_model(tmp_path: Path) -> None:
    fleet = tmp_path / "f"
    p = _cli("optics", "twin", str(fleet), "--modules", "300", "--days", "14", "--seed", "3",
             cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    model = tmp_path / "model.json"
    p = _cli("optics", "train", str(fleet / "history.parquet"), "--labels",
             str(fleet / "labels.csv"), "--links", str(fleet / "links.csv"), "-o", str(model),
             cwd=fleet.parent)
    assert p.returncode == 0, p.stderr
    assert model.stat().st_size > 1000
    p = _cli("optics", "predict", str(fleet / "history.parquet"), "--model", str(model),
             "--links", str(fleet / "links.csv"), "--json", cwd=fleet.parent)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    mods = doc["modules"]
    assert len(mods) == 300
    for m in mods:
        assert 0.0 <= m["risk"] <= 1.0 and isinstance(m["predicted_failure"], bool)
        assert {"device", "port", "serial", "grade", "eta_days", "reasons", "action"} <= set(m)
    p = _cli("optics", "predict", str(fleet / "history.parquet"), "--model", str(model),
             "--horizon", "3d", cwd=fleet.parent)
    assert p.returncode == 2 and "7 days" in p.stderr
