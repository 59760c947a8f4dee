"""``fabricscope topo build`` / ``topo show`` through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_inprocess import run_main
from fabricscope.fabric.io import read_fabric


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_build_then_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "rail.yaml"
    code, stdout, err = _main(capsys, monkeypatch, "topo", "build", "rail-optimized", "servers=8",
                              "gpus_per_server=4", "-o", str(out))
    assert code == 0, err
    assert "32 GPUs" in stdout
    assert read_fabric(out).gpu_count == 32
    code, stdout, err = _main(capsys, monkeypatch, "topo", "show", str(out), "--json")
    assert code == 0, err
    s = json.loads(stdout)
    assert (s["gpus"], s["rails"], s["kind"]) == (32, 4, "rail-optimized")
    code, stdout, _ = _main(capsys, monkeypatch, "topo", "show", str(out))
    assert code == 0 and "bisection" in stdout and "oversubscription leaf" in stdout


_main = run_main


def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = [
        (("topo", "build", "torus", "-o", str(tmp_path / "x.yaml")), "unknown topology 'torus'"),
        (("topo", "build", "rail-optimized", "sever=3", "-o", str(tmp_path / "x.yaml")),
         "sever: unknown parameter"),
        (("topo", "build", "leaf-spine", "leaves=2", "hosts_per_leaf=1", "spines=1",
          "nics_per_host=8", "radix=4", "-o", str(tmp_path / "x.yaml")), "on a 4-port leaf"),
        (("topo", "build", "fat-tree", "k=4"), "--out FILE is required"),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ndevices: [\n  {id: a\n")
    cases.append((("topo", "show", str(bad)), "bad.yaml:4:1: malformed YAML"))
    for args, needle in cases:
        code, _, err = _main(capsys, monkeypatch, *args)
        assert code == 2, (args, err)
        assert needle in err and err.startswith("error: ")
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    r = _run("topo", "build", "torus", "-o", str(tmp_path / "x.yaml"))  # the real console too
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_params_listing_and_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = _main(capsys, monkeypatch, "topo", "build", "dual-tor", "--params")
    assert code == 0 and "servers_per_leaf" in out
    code, out, _ = _main(capsys, monkeypatch, "topo", "build", "--help")
    assert code == 0 and "Examples" in out


def test_one_spec_syntax_for_topo_build_and_sim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabricscope.fabric.catalog import parse_fabric_spec

    new, old = tmp_path / "new.json", tmp_path / "old.json"
    code, out_new, err = _main(capsys, monkeypatch, "topo", "build", "rail-optimized:servers=4,gpus-per-server=2",
                               "-o", str(new))
    assert code == 0, err
    code, _, err = _main(capsys, monkeypatch, "topo", "build", "rail-optimized", "servers=4",
                               "gpus_per_server=2", "-o", str(old))
    assert code == 0, err
    assert new.read_text().replace("new.json", "") == old.read_text().replace("old.json", "")
    assert read_fabric(new).gpu_count == 8
    # Progress never lands on stdout: one result line, unwrapped even when longer than 80.
    assert len(out_new.strip().splitlines()) == 1 and out_new.startswith("wrote ")
    assert parse_fabric_spec("rail-optimized:servers=4,gpus-per-server=2") == parse_fabric_spec(
        ["rail-optimized", "servers=4", "gpus-per-server=2"]) == parse_fabric_spec("rail-optimized servers=4,gpus-per-server=2")
    # sim --topo takes the same spec, in both forms.
    for spec in ("leaf-spine:leaves=2,hosts_per_leaf=2,spines=2", "leaf-spine leaves=2 hosts_per_leaf=2 spines=2"):
        code, out, err = _main(capsys, monkeypatch, "sim", "--topo", spec, "--workload", "permutation:size=1MB")
        assert code == 0, err
        assert "leafspine-2x2-s2" in out
    # KIND alone builds (every builder has defaults).
    code, out, err = _main(capsys, monkeypatch, "topo", "build", "leaf-spine", "-o", str(tmp_path / "d.yaml"))
    assert code == 0 and "64 GPUs" in out, err
    for bad, needle in (("=3", "KIND first"), ("rail-optimized:servers", "expected KEY=VALUE, got 'servers'")):
        code, _, err = _main(capsys, monkeypatch, "topo", "build", bad, "-o", str(tmp_path / "x.yaml"))
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
