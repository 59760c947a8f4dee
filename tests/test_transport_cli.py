"""``fabricscope sim --cc/--buffer/--ecn/--pfc``: the transport options of the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_inprocess import run_main

_SMALL = ("--topo", "leaf-spine:leaves=2,hosts_per_leaf=4,spines=2", "--workload", "incast:size=1MB,senders=6")


def _one_error_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err


def _mask_wall(text: str) -> str:
    """The report with its wall-clock column and fields blanked (they differ run to run)."""
    text = re.sub(r'"wall_s": [0-9.e-]+', '"wall_s": 0', text)
    return "\n".join(re.sub(r"\s+[0-9.]+\s*$", "", ln) for ln in text.splitlines())


def test_cc_ideal_is_the_default_engine_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c1, out1, _ = run_main(capsys, monkeypatch, "sim", *_SMALL, "--out", str(tmp_path / "a"), "--no-plot")
    c2, out2, _ = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "ideal", "--out", str(tmp_path / "b"), "--no-plot")
    assert c1 == c2 == 0
    assert _mask_wall(out1.replace("/a/", "/x/")) == _mask_wall(out2.replace("/b/", "/x/"))
    assert "transport" not in out2
    j1 = (tmp_path / "a" / "sim.json").read_text()
    j2 = (tmp_path / "b" / "sim.json").read_text()
    assert _mask_wall(j1) == _mask_wall(j2)


def test_cc_dcqcn_reports_queues_marks_pauses_and_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "dcqcn", "--buffer", "4MiB",
                              "--ecn", "5KB,200KB,0.01", "--out", str(tmp_path), "--no-plot")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("transport ecmp seed 0"))
    assert "pfc on" in line and "max queue" in line and "ECN marks" in line and "pause frames" in line
    run = json.loads((tmp_path / "sim.json").read_text())["runs"][0]
    assert run["cc"] == "dcqcn" and run["ecn_marks"] > 0 and run["max_queue_KB"] > 5
    assert run["completed"] == 6
    # Lossy: a small buffer drops instead of pausing.
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "dcqcn", "--no-pfc", "--buffer", "200KB")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("transport"))
    assert "pfc off" in line and "pause frames 0" in line and "drops 0.0 KB" not in line
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "hpcc")
    assert code == 0, err
    assert next(ln for ln in out.splitlines() if ln.startswith("transport")).startswith("transport ecmp seed 0: hpcc")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--cc", "timely"), "--cc: unknown congestion control 'timely'"),
        (("--cc", "dcqcn", "--buffer", "-1MB"), "--buffer: must be > 0"),
        (("--cc", "dcqcn", "--buffer", "1KB"), "smaller than one MTU"),
        (("--cc", "dcqcn", "--ecn", "300KB,200KB,0.01"), "must not exceed kmax"),
        (("--cc", "dcqcn", "--ecn", "5KB,200KB,0"), "pmax: must be in (0, 1]"),
        (("--cc", "dcqcn", "--ecn", "5KB,200KB,2"), "pmax: must be in (0, 1]"),
        (("--cc", "dcqcn", "--ecn", "5KB"), "expected KMIN,KMAX,PMAX"),
        (("--buffer", "4MiB"), "--buffer: only applies with --cc dcqcn or hpcc"),
        (("--pfc",), "--pfc/--no-pfc: only applies with --cc dcqcn or hpcc"),
        (("--cc", "dcqcn", "--dcqcn", "fast"), "--dcqcn: unknown parameter set 'fast'"),
        (("--cc", "dcqcn", "--lb", "dlb"), "not in the transport engine yet"),
    ],
)
def test_impossible_transport_flags_are_one_line(
    extra: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, monkeypatch, "sim", *_SMALL, *extra)
    _one_error_line(code, err, needle)
