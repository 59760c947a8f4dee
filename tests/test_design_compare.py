"""The design comparison end to end: evaluate, port saving, and the `design` CLI (issue 13)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.design.compare import Options, evaluate, port_saving, summarize
from fabricscope.design.reliability import goodput
from fabricscope.design.scaling import JobShape
from fabricscope.design.spec import DesignSpec

RAIL = DesignSpec("rail", "rail-optimized", {"radix": 32, "spine_mode": "per-rail"})
FAT = DesignSpec("fat", "fat-tree", {"radix": 32})
DUAL = DesignSpec("dual", "dual-tor", {"radix": 64})
JOB = JobShape(params_billion=7.0, compute_s=0.5)
FAST = Options(runs=200, des_runs=400, seed=1)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    # 2,048 GPUs at radix 32: the fat tree needs three tiers (2-tier limit 32 x 16 = 512
    # NIC ports), each per-rail leaf-spine holds 256 NICs in two tiers.
    return [evaluate(s, 2048, JOB, options=FAST) for s in (RAIL, FAT)]


def test_port_saving_is_the_tier_count_at_radix_32(rows: list[dict]) -> None:
    rail, fat = rows
    assert (rail["tiers"], fat["tiers"]) == (2, 3)
    saving = port_saving(rows)
    assert len(saving) == 1
    s = saving[0]
    # Counted from the inventories: 3 vs 5 switch ports per GPU when non-blocking.
    assert s["ports_per_gpu"] == 3.0 and s["fat_tree_ports_per_gpu"] == 5.0
    assert s["saving"] == pytest.approx(0.4) and s["holds"]


def test_evaluate_joins_cost_step_time_and_reliability(rows: list[dict]) -> None:
    for r in rows:
        assert r["gpus"] == 2048
        b = r["bom"]
        assert b["cost_per_gpu_usd"] == pytest.approx(b["cost_usd"] / 2048)
        assert set(r["steps"]) == {"ecmp", "spray"}
        for st in r["steps"].values():
            assert st["simulated"] and 0 < st["efficiency"] <= 1
            assert st["step_s"] == pytest.approx(
                st["compute_s"] + st["tp_s"] + st["pp_s"] + st["exposed_sync_s"])
        ck = r["checkpoint"]
        assert ck["goodput_daly"] == pytest.approx(
            goodput(ck["daly_s"], ck["checkpoint_s"], ck["restart_s"], ck["mtbf_s"]))
        # The discrete-event simulation brackets Daly's closed form (its 95% CI, 400 runs).
        lo, hi = ck["des"]["wall_ci_s"]
        assert lo <= ck["des"]["closed_form_wall_s"] <= hi
        mc = r["montecarlo"]
        assert abs(mc["interruptions_per_day"]["mean"] - r["interruptions"]["per_day"]) <= (
            4 * mc["interruptions_per_day"]["se"] + 1e-9)
        assert 0.99 < r["availability"]["fabric"] <= 1.0
        # The link failure rate follows the medium the BOM chose (transceivers per link).
        for lr in b["links"]:
            fr = r["failure_rates"][f"link:{lr['link_class']}"]
            assert fr["per_hour"] > 0
    # The rail layout's host links run in-row (transceivers), the fat tree's in-rack (DAC):
    # per link, the rail host link fails more often, by its optics.
    rail, fat = rows
    hl = {r["name"]: next(x for x in r["bom"]["links"] if x["link_class"] == "host-leaf")
          for r in rows}
    assert hl["rail"]["transceivers"] > 0 and hl["fat"]["transceivers"] == 0
    assert (rail["failure_rates"]["link:host-leaf"]["per_hour"]
            > fat["failure_rates"]["link:host-leaf"]["per_hour"])


def test_dual_tor_survives_a_leaf_and_simulates_the_step_after_it() -> None:
    r = evaluate(DUAL, 256, JOB, options=Options(runs=0, des_runs=0))
    leaf = next(b for b in r["blast"] if b["component"] == "leaf")
    assert leaf["gpus_cut"] == 0 and leaf["gpus_degraded"] > 0 and leaf["failover"] == "dual-tor"
    assert r["interruptions"]["probability"]["leaf"] == 0.0
    deg = r["degraded"]["ecmp"]
    assert "leaf" in deg["fault"] and deg["step_s"] >= r["steps"]["ecmp"]["step_s"]
    assert r["montecarlo"] is None


def test_summarize_extrapolates_analytically_and_says_so(rows: list[dict]) -> None:
    out = summarize(rows, [RAIL, FAT], JOB, extrapolate=[1024, 131072], options=FAST)
    ext = out["extrapolated"]
    assert {e["gpus"] for e in ext} == {131072}  # 1024 is not beyond the simulated 2048
    assert all(not e["step"]["simulated"] and e["step"]["lb"] == "analytical" for e in ext)
    assert any("analytical" in n for n in out["notes"])
    json.dumps(out)  # JSON-ready


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
                          capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_cli_compare_json_and_plots(tmp_path: Path) -> None:
    d = tmp_path / "designs"
    p = _cli("design", "examples", str(d), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    files = sorted(x.name for x in d.iterdir())
    assert "rail-2tier.yaml" in files and "job-llm70b.yaml" in files
    out = tmp_path / "r.json"
    p = _cli("design", "compare", str(d / "rail-2tier.yaml"), str(d / "fattree.yaml"),
             "--gpus", "1k,2048", "--job", str(d / "job-llm70b.yaml"), "--runs", "50",
             "--plot", str(tmp_path / "plots"), "--out", str(out), "--json",
             "--extrapolate", "65536", "--workers", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert json.loads(out.read_text())["designs"] == res["designs"]
    assert sorted((r["name"], r["gpus"]) for r in res["designs"]) == [
        ("fattree", 1024), ("fattree", 2048), ("rail-2tier", 1024), ("rail-2tier", 2048)]
    assert "[4/4]" in p.stderr  # progress on stderr
    for name in ("cost_per_gpu.png", "scaling_efficiency.png", "goodput_vs_interval.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
    assert all(math.isfinite(r["bom"]["cost_per_gpu_usd"]) for r in res["designs"])


def test_cli_tables_and_mistakes(tmp_path: Path) -> None:
    p = _cli("design", "compare", "--gpus", "1024", "--runs", "0", "--no-sim", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for title in ("Bill of materials", "Step time", "Availability", "Switch ports"):
        assert title in p.stdout
    cases = [
        (["--gpus", "1001"], "whole number of 8-GPU servers"),
        (["--gpus", "1000"], "multiple of 64 GPUs"),
        (["--gpus", "x"], "--gpus"),
        (["--runs", "1"], "--runs"),
        ([str(tmp_path / "nope.yaml")], "nope.yaml"),
        (["--job", str(tmp_path / "nojob.yaml")], "nojob.yaml"),
        (["--lb", "dlb"], "dlb"),
    ]
    for args, needle in cases:
        p = _cli("design", "compare", *args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        err = p.stderr.strip().splitlines()
        assert any(needle in line for line in err), (args, p.stderr)
        assert "Traceback" not in p.stderr


def test_examples_folder_matches_the_builtin_designs() -> None:
    root = Path(__file__).resolve().parents[1]
    builtin = root / "src/fabricscope/design/examples"
    shipped = root / "examples/designs"
    names = sorted(p.name for p in builtin.glob("*.yaml"))
    assert names == sorted(p.name for p in shipped.glob("*.yaml"))
    for n in names:
        assert (shipped / n).read_text() == (builtin / n).read_text(), n
