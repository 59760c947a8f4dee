"""The demo part localizes the injected gray link on the quick twin and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from fabricscope.service import demo_probe


def test_demo_part_quick(tmp_path: Path) -> None:
    lines: list[str] = []
    out = demo_probe.run(seed=1, outdir=tmp_path, echo=lines.append, quick=True)
    assert out["localized"] is True
    t = out["time_to_localize_s"]
    assert isinstance(t, float) and 0 < t <= 15
    saved = json.loads((tmp_path / "probe.json").read_text())
    assert saved["injected"]["subject"] == out["injected"]["subject"]  # type: ignore[index]
    assert any("localized" in x for x in lines)
