"""``fabricscope straggler`` commands and the demo part."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fabricscope.cli import app
from fabricscope.service import demo_straggler

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_help_teaches() -> None:
    out = runner.invoke(app, ["straggler", "analyze", "--help"])
    assert out.exit_code == 0
    assert "Examples" in out.output and "--inventory" in out.output


def test_analyze_json_on_gloo_fixture(tmp_path: Path) -> None:
    plot = tmp_path / "t.png"
    out = runner.invoke(app, ["straggler", "analyze", str(ROOT / "tests/fixtures/gloo/throttle-rank1"),
                              "--json", "--plot", str(plot)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["subject"] == "rank 1 network"
    assert plot.stat().st_size > 1000


def test_twin_then_analyze_with_inventory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "8"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())
    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory",
                              str(run / "inventory.json")])
    assert out.exit_code == 0, out.output
    assert truth["expected"][0]["subject"] in out.output


def test_bad_path_is_one_error_line() -> None:
    from fabricscope.model.errors import TraceFormatError

    out = runner.invoke(app, ["straggler", "analyze", "/nonexistent/x"])
    assert isinstance(out.exception, TraceFormatError)
    assert "no such file" in str(out.exception)


def test_demo_part_quick(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = demo_straggler.run(seed=0, outdir=tmp_path, echo=lines.append, quick=True)
    assert summary["ok"] is True
    assert summary["found"] == summary["injected"]["subject"]  # type: ignore[index]
    assert any("injected" in x for x in lines) and any("found" in x for x in lines)
    json.dumps(summary)


def test_bad_files_in_a_folder_are_reported_and_the_rest_analyzed(tmp_path: Path) -> None:
    import gzip
    import warnings

    from fabricscope.straggler.pipeline import analyze_paths

    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "8"])
    assert out.exit_code == 0, out.output
    k = run / "kineto"
    raw = gzip.decompress((k / "rank3.json.gz").read_bytes())
    (k / "rank3.json.gz").write_bytes(gzip.compress(raw[: len(raw) // 3]))
    (k / "junk.parquet").write_bytes(b"PAR1 not parquet")
    (k / "rank9.json.gz").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's all-NaN RuntimeWarning must not leak to stderr
        _res, report = analyze_paths([k], inventory=run / "inventory.json")
    text = "\n".join(report.warnings)
    assert "rank3.json.gz" in text and "cut or corrupt at byte" in text
    assert "junk.parquet" in text and "missing rank(s) 9" in text
    assert "clock offset" not in text  # the cut file keeps its clock base
    truth = json.loads((run / "truth.json").read_text())
    assert report.findings and report.findings[0].subject == truth["expected"][0]["subject"]


def test_missing_rank_does_not_frame_its_peers_nic(tmp_path: Path) -> None:
    # Flow-engine twin (NCCL-like rail channels: a DP ring crossing a server uses all of its
    # NICs, so the slow NIC also slows a ring its rank is not in). Without rank 10 (or 12)
    # nothing clears its pipeline peer's NIC elsewhere; that NIC must not be named.
    from fabricscope.straggler.pipeline import analyze_paths

    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-nic", "--seed", "0"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())["expected"][0]["subject"]
    for missing in (10, 12):
        k = tmp_path / f"k{missing}"
        k.mkdir()
        for f in (run / "kineto").iterdir():
            if f.name != f"rank{missing}.json.gz":
                (k / f.name).write_bytes(f.read_bytes())
        _, rep = analyze_paths([k], inventory=run / "inventory.json",
                               placement=None)
        assert [f.subject for f in rep.device_findings()] == [truth], missing


def test_placement_option_takes_truth_json_and_rejects_binary(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = runner.invoke(app, ["straggler", "twin", str(run), "--fault", "slow-gpu",
                              "--comm", "alpha-beta", "--iterations", "6"])
    assert out.exit_code == 0, out.output
    truth = json.loads((run / "truth.json").read_text())
    inv = str(run / "inventory.json")
    # the help's own example: --placement run/truth.json
    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory", inv,
                              "--placement", str(run / "truth.json"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["findings"][0]["subject"] == truth["expected"][0]["subject"]
    from fabricscope.model.errors import ConfigError

    out = runner.invoke(app, ["straggler", "analyze", str(run / "kineto"), "--inventory", inv,
                              "--placement", str(run / "kineto" / "rank0.json.gz")])
    assert isinstance(out.exception, ConfigError) and "rank0.json.gz" in str(out.exception)


# --------------------------------------------------------------------------- mistakes (issue 9)

def _fabricscope(*args: str, cwd: Path, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    """The real entry point in a subprocess, as a user runs it (stdout/stderr are pipes)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FABRICSCOPE_")}
    full.pop("COLUMNS", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()",
                           *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=full)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small twin run (8 ranks) and a copy of its kineto/ with one rank's ts = Infinity."""
    d = tmp_path_factory.mktemp("straggler-cli")
    r = _fabricscope("straggler", "twin", str(d / "run"), "--fault", "slow-gpu", "--comm",
                     "alpha-beta", "--iterations", "6", "--dp", "2", cwd=d)
    assert r.returncode == 0, r.stderr
    inf = d / "inf"
    inf.mkdir()
    for f in (d / "run" / "kineto").iterdir():
        (inf / f.name).write_bytes(f.read_bytes())
    doc = json.loads(gzip.decompress((inf / "rank5.json.gz").read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    events[len(events) // 2]["ts"] = float("inf")  # json.dumps writes Infinity
    (inf / "rank5.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    (d / "afile").write_text("x")
    (d / "dir.png").mkdir()
    return d


# (id, argv with {d} for the work folder, substrings the one error line must contain)
MISTAKES: list[tuple[str, list[str], list[str]]] = [
    ("plot-missing-folder", ["analyze", "{d}/run/kineto", "--plot", "/nonexistent/x.png"],
     ["--plot", "/nonexistent"]),
    ("plot-wrong-type", ["analyze", "{d}/run/kineto", "--plot", "{d}/x.txt"],
     ["--plot", "x.txt", ".png"]),
    ("plot-is-a-folder", ["analyze", "{d}/run/kineto", "--plot", "{d}/dir.png"],
     ["--plot", "dir.png", "folder"]),
    ("placement-without-inventory", ["analyze", "{d}/run/kineto", "--placement",
                                     "{d}/run/truth.json"], ["--placement", "--inventory"]),
    ("inventory-missing", ["analyze", "{d}/run/kineto", "--inventory", "{d}/nope.json"],
     ["--inventory", "nope.json"]),
    ("top-negative", ["analyze", "{d}/run/kineto", "--top", "-3"], ["--top", "-3"]),
    ("top-zero", ["analyze", "{d}/run/kineto", "--top", "0"], ["--top", "0"]),
    ("trace-path-missing", ["analyze", "{d}/nothing-here"], ["nothing-here"]),
    ("twin-dp-zero", ["twin", "{d}/t0", "--dp", "0"], ["--dp", "0"]),
    ("twin-tp-zero", ["twin", "{d}/t0", "--tp", "0"], ["--tp"]),
    ("twin-pp-negative", ["twin", "{d}/t0", "--pp", "-1"], ["--pp", "-1"]),
    ("twin-iterations-zero", ["twin", "{d}/t0", "--iterations", "0"], ["--iterations"]),
    ("twin-too-large", ["twin", "{d}/t0", "--dp", "100000"], ["--dp", "100000"]),
    ("twin-seed-negative", ["twin", "{d}/t0", "--seed", "-1"], ["--seed", "-1"]),
    ("twin-fault-unknown", ["twin", "{d}/t0", "--fault", "slow-cpu"], ["--fault", "slow-cpu"]),
    ("twin-comm-unknown", ["twin", "{d}/t0", "--comm", "magic"], ["--comm", "magic"]),
    ("twin-into-a-file", ["twin", "{d}/afile"], ["afile", "not a folder"]),
    ("twin-into-proc", ["twin", "/proc/x"], ["/proc/x"]),
    ("twin-into-another-run", ["twin", "{d}/run", "--dp", "1"], ["{d}/run", "--force"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "needles"), [(c[1], c[2]) for c in MISTAKES],
                         ids=[c[0] for c in MISTAKES])
def test_straggler_mistake_is_one_line_exit_2(run_dir: Path, argv: list[str],
                                              needles: list[str]) -> None:
    r = _fabricscope("straggler", *[a.replace("{d}", str(run_dir)) for a in argv], cwd=run_dir)
    assert r.returncode == 2, f"exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-1500:]}"
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n.replace("{d}", str(run_dir)) in lines[0], (n, lines[0])
    assert not (run_dir / "t0").exists()  # rejected before the folder was touched


@pytest.mark.slow
def test_folder_with_an_infinite_timestamp_is_analyzed_naming_that_file(run_dir: Path) -> None:
    r = _fabricscope("straggler", "analyze", str(run_dir / "inf"), "--json", cwd=run_dir)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    unused = doc["unused_inputs"]
    assert len(unused) == 1 and "rank5.json.gz" in unused[0], unused
    assert "ts inf is not a finite number" in unused[0]
    assert any("missing rank(s) 5" in w for w in doc["warnings"]), doc["warnings"]


def test_twin_force_removes_the_larger_runs_stale_rank_files(tmp_path: Path) -> None:
    from fabricscope.model.errors import ConfigError
    from fabricscope.straggler.readers import read_paths

    run = tmp_path / "run"
    base = ["straggler", "twin", str(run), "--comm", "alpha-beta", "--iterations", "4"]
    out = runner.invoke(app, [*base, "--dp", "4", "--pp", "4"])  # 32 ranks
    assert out.exit_code == 0, out.output
    assert len(list((run / "kineto").iterdir())) == 32
    out = runner.invoke(app, [*base, "--dp", "2"])  # 8 ranks, no --force
    assert isinstance(out.exception, ConfigError) and "--force" in str(out.exception)
    assert len(list((run / "kineto").iterdir())) == 32  # nothing touched
    out = runner.invoke(app, [*base, "--dp", "2", "--force"])
    assert out.exit_code == 0, out.output
    assert "removed 24 rank file(s)" in out.output
    assert sorted(p.name for p in (run / "kineto").iterdir()) == sorted(
        f"rank{r}.json.gz" for r in range(8))
    res = read_paths([run / "kineto"])
    assert set(res.table.rank.tolist()) == set(range(8)) and res.unused == []
    # A kineto/ holding files the twin never writes is not ours to delete.
    (run / "kineto" / "notes.txt").write_text("mine")
    out = runner.invoke(app, [*base, "--dp", "1", "--force"])
    assert isinstance(out.exception, ConfigError) and "notes.txt" in str(out.exception)
    assert (run / "kineto" / "rank7.json.gz").exists()


# --------------------------------------------------------------------------- 80 columns

def _gloo_report() -> object:
    from fabricscope.straggler.pipeline import analyze_paths

    _, report = analyze_paths([ROOT / "tests/fixtures/gloo/throttle-rank1"])
    return report


def test_one_finding_fits_an_80_column_screen() -> None:
    import io

    from rich.console import Console

    from fabricscope.cli.straggler import _print_findings

    report = _gloo_report()
    findings = report.findings  # type: ignore[attr-defined]
    assert findings
    buf = io.StringIO()
    _print_findings(Console(file=buf, width=80, force_terminal=False), findings[:1])
    lines = buf.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    assert len(lines) <= 24, "\n".join(lines)  # one screen
    assert findings[0].subject in lines[1]


def test_piped_output_is_not_wrapped_at_80() -> None:
    r = _fabricscope("straggler", "analyze", str(ROOT / "tests/fixtures/gloo/throttle-rank1"),
                     cwd=ROOT)
    assert r.returncode == 0, r.stderr
    report = _gloo_report()
    lines = r.stdout.splitlines()
    for ev in report.findings[0].evidence:  # type: ignore[attr-defined]
        assert any(ev in line for line in lines), (ev, r.stdout)
    assert any(len(line.rstrip()) > 80 for line in lines)  # long lines stay whole


def test_top_applies_to_json_when_given() -> None:
    fixture = str(ROOT / "tests/fixtures/gloo/throttle-rank1")
    every = runner.invoke(app, ["straggler", "analyze", fixture, "--json"])
    two = runner.invoke(app, ["straggler", "analyze", fixture, "--json", "--top", "2"])
    assert every.exit_code == 0 and two.exit_code == 0, every.output + two.output
    n_all = len(json.loads(every.stdout)["candidates"])
    assert n_all > 2 and len(json.loads(two.stdout)["candidates"]) == 2


def test_twin_folder_with_our_names_on_the_wrong_kind_of_entry_is_refused(tmp_path: Path) -> None:
    from fabricscope.cli._run_folder import prepare_twin_folder
    from fabricscope.model.errors import ConfigError

    a = tmp_path / "a"
    (a / "truth.json").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"truth\.json is not a file"):
        prepare_twin_folder(a, force=True)
    b = tmp_path / "b"
    (b / "kineto" / "rank3.json.gz").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds 'rank3\.json\.gz'"):
        prepare_twin_folder(b, force=True)
    c = tmp_path / "c"
    c.mkdir()
    (c / "notes.txt").write_text("unrelated")  # non-empty, but no run: fine
    prepare_twin_folder(c, force=False)
    assert sorted(p.name for p in c.iterdir()) == ["notes.txt"]
