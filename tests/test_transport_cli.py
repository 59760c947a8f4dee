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


def test_cc_eqds_runs_receiver_credits_with_and_without_trimming(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "eqds")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("transport"))
    assert line.startswith("transport ecmp seed 0: eqds, pfc off, trimming on:"), line
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "eqds", "--no-trim")
    assert code == 0, err
    assert "trimming off" in next(ln for ln in out.splitlines() if ln.startswith("transport"))
    # --llr with no corrupting link says that it changes nothing
    code, out, err = run_main(capsys, monkeypatch, "sim", *_SMALL, "--cc", "nscc", "--llr")
    assert code == 0, err
    assert "note: --llr: no link corrupts frames" in err


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
        (("--buffer", "4MiB"), "--buffer: only applies with --cc "),
        (("--pfc",), "--pfc/--no-pfc: only applies with --cc "),
        (("--cc", "dcqcn", "--dcqcn", "fast"), "--dcqcn: unknown parameter set 'fast'"),
        (("--cc", "dcqcn", "--lb", "dlb"), "not in the transport engine yet"),
        (("--cc", "dcqcn", "--trim"), "--trim/--no-trim: only applies with --cc nscc or eqds"),
        (("--no-trim",), "--trim/--no-trim: only applies with --cc "),
        (("--cc", "eqds", "--tune-ecn"), "--tune-ecn: needs a --cc that reacts to ECN marks"),
        (("--cbfc",), "--cbfc: only applies with --cc "),
        (("--cc", "dcqcn", "--cbfc", "--pfc"), "--cbfc: credit-based flow control replaces PFC"),
        (("--corrupt", "leaf-000~spine-00=1%"), "frame corruption is modelled by the transport engine only"),
        (("--cc", "nscc", "--corrupt", "leaf-000~spine-00=2"), "faults[0].loss: expected a fraction"),
        (("--lb", "ar"), "lb ar: splits by switch queues, which only the transport engine has"),
    ],
)
def test_impossible_transport_flags_are_one_line(
    extra: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, monkeypatch, "sim", *_SMALL, *extra)
    _one_error_line(code, err, needle)


_POISSON = ("--topo", "leaf-spine:leaves=2,hosts_per_leaf=8,spines=2,uplink_gbps=400",
            "--workload", "poisson:cdf=websearch,load=0.5,duration=300us")


def test_poisson_transport_run_prints_and_writes_the_slowdown_by_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(capsys, monkeypatch, "sim", *_POISSON, "--cc", "hpcc", "--out", str(tmp_path))
    assert code == 0, err
    assert "FCT slowdown by flow size, ecmp" in out
    assert "short (<= 200KB)" in out and "all flows" in out
    data = json.loads((tmp_path / "sim.json").read_text())
    table = data["slowdown"]["ecmp"]
    flows = data["runs"][0]["flows"] if "flows" in data["runs"][0] else data["table"][0]["flows"]
    assert sum(b["flows"] for b in table["buckets"]) + table["incomplete"] == flows
    assert all(b["p50"] >= 1.0 and b["p99"] >= b["p95"] >= b["p50"] for b in table["buckets"])
    assert (tmp_path / "slowdown.png").stat().st_size > 10_000
    # The ideal engine is not a transport run: no slowdown section, no plot (unchanged report).
    code, out, err = run_main(capsys, monkeypatch, "sim", *_POISSON, "--out", str(tmp_path / "ideal"))
    assert code == 0, err
    assert "slowdown" not in json.loads((tmp_path / "ideal" / "sim.json").read_text())
    assert not (tmp_path / "ideal" / "slowdown.png").exists() and "FCT slowdown" not in out


def test_tune_ecn_reports_best_template_holdout_and_sensitivity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(capsys, monkeypatch, "sim", *_POISSON, "--cc", "dcqcn", "--tune-ecn",
                              "--holdout-seed", "5", "--out", str(tmp_path))
    assert code == 0, err
    assert "template (SONiC AZURE_LOSSLESS" in out and "best --ecn " in out
    assert "held-out seeds 5:" in out
    assert sum(ln.startswith("sensitivity ") for ln in out.splitlines()) == 3
    data = json.loads((tmp_path / "ecn_tune.json").read_text())
    assert data["holdout_seeds"] == [5] and data["search_seeds"] == [0]
    assert data["best"]["score"] <= data["baseline"]["score"]
    # The printed best setting is a valid --ecn value.
    best = next(ln for ln in out.splitlines() if ln.startswith("best --ecn ")).split()[2].rstrip(":")
    code, _, err = run_main(capsys, monkeypatch, "sim", *_POISSON, "--cc", "dcqcn", "--ecn", best)
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--cc", "hpcc", "--tune-ecn"), "--tune-ecn: needs a --cc that reacts to ECN marks"),
        (("--tune-ecn",), "--tune-ecn: needs a --cc that reacts to ECN marks"),
        (("--cc", "dcqcn", "--tune-ecn", "--ecn", "5KB,200KB,0.01"), "--ecn: not with --tune-ecn"),
        (("--cc", "dcqcn", "--tune-ecn", "--tune-objective", "median"), "--tune-objective: unknown 'median'"),
        (("--cc", "dcqcn", "--holdout-seed", "3"), "--holdout-seed: only applies with --tune-ecn"),
        (("--cc", "dcqcn", "--tune-ecn", "--seed", "3", "--holdout-seed", "3"), "--holdout-seed: [3] also searched"),
        (("--cc", "dcqcn", "--tune-ecn", "--lb", "ecmp,spray"), "--tune-ecn: give one --lb scheme"),
    ],
)
def test_tune_flag_mistakes_are_one_line(
    extra: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, monkeypatch, "sim", *_POISSON, *extra)
    _one_error_line(code, err, needle)


@pytest.mark.parametrize(
    ("workload", "needle"),
    [
        ("poisson:cdf=websearch,load=2,duration=1ms", "workload.load"),
        ("poisson:cdf=websearch,load=0.5", "workload.duration: missing"),
        ("poisson:cdf=nope,load=0.5,duration=1ms", "unknown distribution 'nope'"),
        ("poisson:load=0.5,duration=1ms,rate=2", "workload.rate: unknown key"),
    ],
)
def test_bad_poisson_specs_are_one_line(
    workload: str, needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, monkeypatch, "sim", "--topo", "leaf-spine:leaves=2,hosts_per_leaf=4,spines=2",
                            "--workload", workload, "--cc", "hpcc")
    _one_error_line(code, err, needle)


def test_lb_ar_runs_beside_spray_in_one_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(capsys, monkeypatch, "sim", "--topo", "leaf-spine:leaves=4,hosts_per_leaf=8,spines=8",
                              "--workload", "permutation:size=2MB", "--degrade", "leaf-000~spine-00=0.25",
                              "--cc", "nscc", "--lb", "spray,ar", "--out", str(tmp_path), "--no-plot")
    assert code == 0, err
    rows = {ln.split()[0] + (" f" if "(faults)" in ln else ""): ln.split() for ln in out.splitlines()
            if re.match(r"^(spray|ar)\b", ln)}
    # the leaf's own uplink direction is levelled: the mean drops; the spine's is out of its sight
    assert float(rows["ar f"][2]) < float(rows["spray f"][2])
    assert rows["ar"][1:6] == rows["spray"][1:6]  # healthy runs: the same numbers
