"""`probe twin` and `probe analyze` on the command line: the twin with faults from flags, and
mismatched, empty or malformed inputs answered by one line and exit 2."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from fabricscope.cli import main
from fabricscope.fabric import leaf_spine_fabric
from fabricscope.fabric.io import write_fabric

CLI = [sys.executable, "-c", "from fabricscope.cli import main; main()"]
TOPO = "leaf-spine:leaves=4,hosts_per_leaf=2,spines=2"
FAULT = "gray:spine-01:eth3->leaf-002:eth4,loss=0.05"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The console entry point in this process (``main()``, so errors take the user's path:
    one line, exit 2); the help example below runs it as a real subprocess."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["fabricscope", *args]
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        rc = int(exc.code or 0)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def twin_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("twin")
    db = tmp / "out.duckdb"
    r = run("probe", "twin", "--topo", TOPO, "--fault", FAULT, "--duration", "20",
            "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    # Without --traced the analysis has candidate paths only: the two spines tie.
    assert found[0]["subject"].split(" | ") == ["spine-00:eth3->leaf-002:eth3",
                                                "spine-01:eth3->leaf-002:eth4"]
    assert found[0]["details"]["candidates"] == 2
    inv = tmp / "lab.json"
    write_fabric(leaf_spine_fabric(leaves=4, hosts_per_leaf=2, spines=2), inv)
    return db, inv


def test_twin_help_example_runs_as_written(tmp_path: Path) -> None:
    r = run("probe", "twin", "--help")
    assert r.returncode == 0
    line = next(x for x in r.stdout.splitlines() if "probe twin --topo leaf-spine" in x)
    argv = shlex.split(line.strip())[2:]  # drop "fabricscope probe"
    argv = [str(tmp_path / "out.duckdb") if a == "out.duckdb" else a for a in argv]
    argv[argv.index("--duration") + 1] = "5"  # same command, shorter run
    r = subprocess.run([*CLI, "probe", *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "spine-01:eth3->leaf-002:eth4" in r.stdout and "cannot be told apart" in r.stdout
    assert (tmp_path / "out.duckdb").is_file()


def test_twin_traced_names_the_link(tmp_path: Path) -> None:
    r = run("probe", "twin", "--topo", TOPO, "--fault", FAULT, "--duration", "20", "--traced",
            "--json", "--top", "1")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert [(f["kind"], f["subject"]) for f in found] == [("gray-link", "spine-01:eth3->leaf-002:eth4")]


def test_analyze_reads_the_twin_db(twin_db: tuple[Path, Path]) -> None:
    db, inv = twin_db
    r = run("probe", "analyze", "-i", str(inv), "--db", str(db), "--json", "--no-steady")
    assert r.returncode == 0, r.stderr
    assert "spine-01:eth3->leaf-002:eth4" in json.loads(r.stdout)[0]["subject"]


def test_analyze_with_another_inventory_is_an_error(twin_db: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = twin_db
    other = tmp_path / "other.json"
    write_fabric(leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2), other)
    one_error_line(run("probe", "analyze", "-i", str(other), "--db", str(db)),
                   "do not match inventory", "wrong --inventory?")


def test_db_without_probes_table_is_an_error(twin_db: tuple[Path, Path], tmp_path: Path) -> None:
    _, inv = twin_db
    tel = tmp_path / "telemetry.duckdb"
    con = duckdb.connect(str(tel))
    con.execute("CREATE TABLE samples (ts BIGINT, value DOUBLE)")
    con.close()
    one_error_line(run("probe", "analyze", "-i", str(inv), "--db", str(tel)),
                   "no table 'probes'", "samples")


def test_empty_jsonl_is_an_error(twin_db: tuple[Path, Path], tmp_path: Path) -> None:
    _, inv = twin_db
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_error_line(run("probe", "analyze", "-i", str(inv), "--jsonl", str(empty)),
                   "no probe samples", str(empty))


@pytest.mark.parametrize("args, needle", [
    (["analyze", "--top", "-3"], "--top must be a count >= 1, got -3"),
    (["analyze", "--top", "0"], "--top must be a count >= 1, got 0"),
    (["analyze", "--last", "-5"], "--last must be seconds >= 0"),
    (["twin", "--top", "-1"], "--top must be a count >= 1"),
    (["twin", "--duration", "0"], "--duration must be seconds"),
    (["twin", "--rate", "-2"], "--rate must be probes/s"),
    (["twin", "--fault", "gray:spine-09:eth3->leaf-002:eth4,loss=0.05"], "no link 'spine-09:eth3->leaf-002:eth4'"),
    (["twin", "--fault", "micro-burst leaf-000:eth3"], "not visible to probes"),
    (["twin", "--fault", "gray:spine-01:eth3->leaf-002:eth4,loss=5"], "loss must be in [0, 1]"),
])
def test_bad_counts_and_faults_are_one_line(twin_db: tuple[Path, Path], args: list[str], needle: str) -> None:
    db, inv = twin_db
    extra = ["-i", str(inv), "--db", str(db)] if args[0] == "analyze" else ["--topo", TOPO]
    one_error_line(run("probe", *args, *extra), needle)
