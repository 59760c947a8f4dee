"""The main job end to end: `fabricscope demo --quick` runs every part and finds what it injected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_quick_runs_every_part_and_localizes(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-c", "from fabricscope.cli import main; main()",
         "demo", "--quick", "--seed", "7", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    parts = summary["parts"]
    assert set(parts) == {"loop", "sim", "telemetry", "probe", "straggler"}
    # the closed loop: every injected fault diagnosed with its root cause, no false positive
    assert parts["loop"]["found"] == parts["loop"]["injected"] >= 1, parts["loop"]
    assert parts["loop"]["false_positives"] == 0, parts["loop"]
    # Each part checks itself against the ground truth it injected.
    assert parts["telemetry"]["detected"] == len(parts["telemetry"]["faults"])
    assert parts["telemetry"]["false_findings"] == 0
    assert parts["probe"]["localized"] is True
    assert parts["straggler"]["ok"] is True
    assert parts["straggler"]["found"] == parts["straggler"]["injected"]["subject"]
    assert parts["sim"]["table"], "the what-if table is empty"
    for name in ("fct_cdf", "link_util"):
        assert Path(parts["sim"]["files"][name]).is_file()
