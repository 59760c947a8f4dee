"""``fabricscope sim`` / ``topo`` flags that used to be ignored or crash are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_inprocess import run_main

_SMALL = ("--topo", "leaf-spine:leaves=2,hosts_per_leaf=2,spines=2", "--workload", "permutation:size=1MB")


_main = run_main


def _one_error_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--seed", "-1"), "a seed must be a non-negative integer, got -1"),
        (("--seed", "3", "--seed", "3"), "seed 3 is given twice"),
        (("--lb", "stripe"), "stripe needs NICs with several uplinks"),
        (("--out", "/etc/passwd"), "--out /etc/passwd: is an existing file"),
        (("--no-plot",), "--no-plot: only applies with --out"),
    ],
)
def test_sim_bad_flags(
    extra: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = _main(capsys, monkeypatch, "sim", *_SMALL, *extra)
    _one_error_line(code, err, needle)


def test_sim_out_file_and_unwritable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "results"
    f.write_text("keep me\n")
    code, _, err = _main(capsys, monkeypatch, "sim", *_SMALL, "--out", str(f))
    _one_error_line(code, err, "is an existing file, not a folder")
    assert f.read_text() == "keep me\n"  # nothing lost
    code, _, err = _main(capsys, monkeypatch, "sim", *_SMALL, "--out", str(f / "sub"))
    _one_error_line(code, err, "cannot create the folder")


def test_stripe_runs_on_a_multi_homed_fabric(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _main(capsys, monkeypatch, "sim", "--topo", "dual-tor:servers=4",
                           "--workload", "permutation:size=1MB", "--lb", "stripe")
    assert code == 0, err
    assert "stripe" in out
