"""Change detection (robust baseline + CUSUM) on seeded series; the watch command for real."""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fabricscope.collective.watch import detect_changes, robust_baseline, siegmund_arl
from fabricscope.model.errors import ConfigError
from fabricscope.store.collective import CollectiveWatchStore, WatchSample

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "collective"
TRIALS = 300


def _binomial_upper(p: float, n: int) -> float:
    """Mean + 3 standard deviations of a Binomial(n, p) count."""
    return n * p + 3 * math.sqrt(n * p * (1 - p))


def test_false_alarms_on_a_stationary_series() -> None:
    """Design target: at most 8 % of 100-point stationary series hold an alarm (the doc
    reports ~5 % measured); the count over TRIALS seeded series must stay within 3 sigma of
    that binomial bound."""
    rng = random.Random(7)
    alarms = 0
    for _ in range(TRIALS):
        xs = [100 + rng.gauss(0, 1) for _ in range(100)]
        alarms += bool(detect_changes(xs, rel_floor=0.0))
    assert alarms <= _binomial_upper(0.08, TRIALS), alarms


def test_detection_delay_on_a_3_sigma_step() -> None:
    """Mean delay for a 3-sigma drop: Siegmund's approximation for a known baseline, plus a
    25 % allowance for the estimated baseline (measured +7 %), plus 3 standard errors."""
    rng = random.Random(11)
    delays: list[int] = []
    missed = 0
    for _ in range(TRIALS):
        xs = [100 + rng.gauss(0, 1) for _ in range(30)] + [97 + rng.gauss(0, 1) for _ in range(30)]
        down = [c for c in detect_changes(xs, rel_floor=0.0, direction="down") if c.index >= 30]
        if down:
            delays.append(down[0].index - 30 + 1)
        else:
            missed += 1
    theory = siegmund_arl(3.0 - 0.5, 10.0)
    se = statistics.stdev(delays) / math.sqrt(len(delays))
    assert statistics.mean(delays) <= 1.25 * theory + 3 * se
    # a miss needs an earlier false alarm whose restart swallowed the step
    assert missed <= _binomial_upper(0.08, TRIALS)


def test_onset_direction_and_recovery() -> None:
    rng = random.Random(3)
    xs = ([10 + rng.gauss(0, 0.1) for _ in range(20)] + [8 + rng.gauss(0, 0.1) for _ in range(30)]
          + [10 + rng.gauss(0, 0.1) for _ in range(30)])
    shifts = [c for c in detect_changes(xs) if c.kind == "cusum"]
    assert [c.direction for c in shifts] == ["down", "up"]
    # Page's onset (the last point the sum was 0) lies at or before the true change; a
    # 20-sigma step fires within a few points
    assert shifts[0].onset <= 20 <= shifts[0].index <= 23
    assert shifts[0].relative == pytest.approx(-0.2, abs=0.03)
    assert shifts[0].index < shifts[1].onset <= 50 <= shifts[1].index <= 53
    # the same series watched for drops only
    assert [c.direction for c in detect_changes(xs, direction="down") if c.kind == "cusum"] == ["down"]


def test_single_outlier() -> None:
    xs = [5.0] * 15 + [2.0] + [5.0] * 15
    cs = detect_changes(xs, direction="down")
    assert cs and cs[0].index == 15 and cs[0].kind in {"outlier", "cusum"}


def test_robust_baseline() -> None:
    med, sigma = robust_baseline([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0 and sigma == pytest.approx(1.4826)
    # identical values: the floor keeps sigma above zero
    med, sigma = robust_baseline([2.0] * 5)
    assert med == 2.0 and sigma == pytest.approx(0.02)
    with pytest.raises(ValueError):
        robust_baseline([])
    with pytest.raises(ValueError):
        detect_changes([1.0] * 10, direction="sideways")
    assert detect_changes([1.0, 2.0, 3.0]) == []


def test_store_roundtrip() -> None:
    with CollectiveWatchStore(":memory:") as st:
        st.add(WatchSample(2, "cmd", "all_reduce", 8, True, 1.5, 10.0, 20.0, 0.5, 3))
        st.add(WatchSample(1, "cmd", "all_reduce", None, False, None, None, None, None, 0, "boom"))
        st.add(WatchSample(3, "other", "unknown", None, True, 1.0, 1.0, 1.0, None, 1))
        rows = st.samples(command="cmd")
    assert [r.ts_ns for r in rows] == [1, 2] and rows[0].error == "boom" and rows[1].ranks == 8


def _app() -> typer.Typer:
    from fabricscope.cli.collective import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        pass

    return app


def test_watch_runs_a_real_command_and_flags_the_degraded_runs(tmp_path: Path) -> None:
    """Replays real runs of one machine: three DEFAULT runs, then two with
    NCCL_SOCKET_NTHREADS=4 (avg busbw 1.58 -> 1.48 -> 1.43 GB/s)."""
    marker = tmp_path / "checked"
    cmd = [sys.executable, str(ROOT / "examples" / "collective" / "print_run.py"), str(DATA / "ncclebpf_socket-thread-validation.md.txt"),
           str(tmp_path / "state"), "0", "1", "2", "3", "4"]
    res = CliRunner().invoke(_app(), [
        "collective", "watch", "--every", "0s", "--count", "5", "--warmup", "3",
        "--store", str(tmp_path / "w.duckdb"), "--db", str(tmp_path / "diag.duckdb"),
        "--on-anomaly", f"touch {marker}", "--", *cmd])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "anomaly: avg_busbw_gbs down" in res.output
    assert marker.exists()
    with CollectiveWatchStore(tmp_path / "w.duckdb") as st:
        rows = st.samples()
    assert [r.avg_busbw_gbs for r in rows] == [1.57614, 1.58183, 1.58058, 1.4791, 1.42682]
    assert all(r.ok and r.collective == "all_reduce" and r.ranks == 2 and r.sizes == 8 for r in rows)
    assert rows[0].max_time_us == 58479.5
    from fabricscope.store.findings import DiagnosisStore

    store = DiagnosisStore(tmp_path / "diag.duckdb")
    try:
        found = [o.finding for o in store.findings()]
    finally:
        store.close()
    # one finding per anomalous run, naming every metric that changed in it
    assert all(f.kind == "collective-regression" for f in found)
    assert sorted(int(f.details["run"]) for f in found) == [4, 5]  # none before the degraded runs
    assert any("avg_busbw_gbs" in str(f.details["metrics"]) for f in found)


def test_watch_records_a_failed_run(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c",
           f"print(open({str(DATA / 'nccl_issue473_allreduce_init_failure.txt')!r}).read())"]
    res = CliRunner().invoke(_app(), ["collective", "watch", "--every", "0s", "--count", "1",
                                      "--store", str(tmp_path / "w.duckdb"), "--", *cmd])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "anomaly: run 1 failed" in res.output
    with CollectiveWatchStore(tmp_path / "w.duckdb") as st:
        (row,) = st.samples()
    assert not row.ok and "unhandled system error" in row.error


def test_watch_bad_options(tmp_path: Path) -> None:
    for argv in (["--every", "soon", "--", "true"], ["--count", "0", "--", "true"], [],
                 ["--warmup", "2", "--", "true"]):
        res = CliRunner().invoke(_app(), ["collective", "watch", "--store", str(tmp_path / "w.duckdb"), *argv])
        assert isinstance(res.exception, ConfigError), (argv, res.output)


def test_watch_runs_the_link_checks_on_an_anomaly(tmp_path: Path) -> None:
    """On the degraded runs the RoCE checks of saved outputs (a port down, MTU 1024) become
    evidence of the regression finding and findings of their own; none before the anomaly."""
    from fabricscope.store.findings import DiagnosisStore

    roce = ROOT / "tests" / "data" / "roce" / "broken"
    cmd = [sys.executable, str(ROOT / "examples" / "collective" / "print_run.py"),
           str(DATA / "ncclebpf_socket-thread-validation.md.txt"), str(tmp_path / "state"), "0", "1", "2", "3", "4"]
    for link_checks in ("--link-checks", "--no-link-checks"):
        db = tmp_path / f"diag{link_checks}.duckdb"
        (tmp_path / "state").unlink(missing_ok=True)
        res = CliRunner().invoke(_app(), [
            "collective", "watch", "--every", "0s", "--count", "5", "--warmup", "3", "--subject", "job/llama",
            "--store", str(tmp_path / f"w{link_checks}.duckdb"), "--db", str(db), link_checks,
            "--roce-from", str(roce), "--", *cmd])
        assert res.exit_code == 0, (res.output, res.exception)
        store = DiagnosisStore(db)
        try:
            obs = list(store.findings())
        finally:
            store.close()
        reg = [o.finding for o in obs if o.finding.kind == "collective-regression"]
        host = [o.finding for o in obs if o.source == "host"]
        assert reg and all(f.subject == "job/llama" for f in reg)
        if link_checks == "--link-checks":
            assert "link checks" in res.output and "fail mlx5_12 port-state" in res.output
            assert all(any(e.startswith("link checks (") for e in f.evidence) for f in reg)
            assert {"roce-port-down", "roce-mtu"} <= {f.kind for f in host}
        else:
            assert "link checks" not in res.output and not host
            assert not any("link checks" in e for f in reg for e in f.evidence)
