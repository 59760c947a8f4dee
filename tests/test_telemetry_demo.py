"""The telemetry demo part: real gNMI on loopback, every injected fault detected, nothing invented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabricscope.service.demo_telemetry import run


@pytest.mark.slow
def test_demo_quick_detects_the_injected_faults(tmp_path: Path) -> None:
    lines: list[str] = []
    out = run(seed=7, outdir=tmp_path, echo=lines.append, quick=True)
    assert out["detected"] == len(out["faults"]) == 4  # type: ignore[arg-type]
    assert out["false_findings"] == 0
    assert out["rows"] == out["updates"] and int(out["updates"]) > 1000  # type: ignore[call-overload]
    assert any("micro-burst" in ln for ln in lines)
    saved = json.loads((tmp_path / "telemetry.json").read_text())
    assert saved["detected"] == 4 and (tmp_path / "telemetry.duckdb").exists()
