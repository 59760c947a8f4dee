"""``fabricscope topo build`` / ``topo show`` through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fabricscope.fabric.io import read_fabric


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_build_then_show(tmp_path: Path) -> None:
    out = tmp_path / "rail.yaml"
    r = _run("topo", "build", "rail-optimized", "servers=8", "gpus_per_server=4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "32 GPUs" in r.stdout
    assert read_fabric(out).gpu_count == 32
    r = _run("topo", "show", str(out), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["gpus"], s["rails"], s["kind"]) == (32, 4, "rail-optimized")
    r = _run("topo", "show", str(out))
    assert r.returncode == 0 and "bisection" in r.stdout and "oversubscription leaf" in r.stdout


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
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
        r = _run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and r.stderr.startswith("error: ")
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_params_listing_and_help() -> None:
    r = _run("topo", "build", "dual-tor", "--params")
    assert r.returncode == 0 and "servers_per_leaf" in r.stdout
    r = _run("topo", "build", "--help")
    assert r.returncode == 0 and "Examples" in r.stdout
