"""Querying the DuckDB store while a collector writes it: two (or three) real processes.

The writer is a subprocess running :class:`RollingTelemetryStore` (what the duckdb sink
uses); the reader is this test process (or another subprocess) using ``open_readonly``.
Every count is exact: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.store.rolling import RollingTelemetryStore, closed_parts, fold, parts_dir
from fabricscope.store.telemetry import TelemetryStore, findings_of, open_readonly

WRITER = textwrap.dedent("""
    import sys, time
    from fabricscope.model.records import Finding, TelemetryEvent
    from fabricscope.store.rolling import RollingTelemetryStore
    path, batches, per, roll = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    t0 = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # distinct timestamps across runs
    st = RollingTelemetryStore(path, roll_interval_s=roll)
    print("ready", flush=True)
    for b in range(batches):
        st.write_events([TelemetryEvent("/c/x", t0 + b * per + i, "t", {"i": str(i)}, float(b * per + i))
                         for i in range(per)])
        if b % 10 == 0:
            st.write_findings([Finding("k", f"s{b}", 0.5, (b, b + 1))])
        print(f"wrote {(b + 1) * per}", flush=True)
        time.sleep(0.03)
    st.close()
    print(f"closed folds={st.folds} skipped={st.fold_skipped}", flush=True)
""")

HOLDER = textwrap.dedent("""
    import sys, time
    from fabricscope.store.telemetry import TelemetryStore, open_readonly
    path, mode, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    con = open_readonly(path) if mode == "reader" else TelemetryStore(path).con
    print("holding", flush=True)
    time.sleep(secs)
    con.close()
""")


def _spawn(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_line(p: subprocess.Popen[str], prefix: str) -> str:
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"process ended without {prefix!r}: {p.stderr.read() if p.stderr else ''}")


def _count(path: Path) -> tuple[int, int, int]:
    con = open_readonly(path)
    try:
        row = con.execute("SELECT count(*), count(DISTINCT ts_ns) FROM telemetry").fetchone()
        nf = con.execute("SELECT count(*) FROM findings").fetchone()
    finally:
        con.close()
    assert row is not None and nf is not None
    return int(row[0]), int(row[1]), int(nf[0])


def test_a_reader_process_queries_while_the_writer_process_collects(tmp_path: Path) -> None:
    db = tmp_path / "telemetry.duckdb"
    batches, per = 60, 500
    w = _spawn(WRITER, db, batches, per, 0.25)
    _wait_line(w, "ready")
    seen: list[int] = []
    while w.poll() is None:
        try:
            n, distinct, _ = _count(db)
        except TransportError as exc:
            assert "no data yet" in str(exc) or "no telemetry store" in str(exc)  # before the first roll
            n = distinct = 0
        assert n == distinct  # a row is never seen twice (fold + part)
        seen.append(n)
        time.sleep(0.1)
    assert w.returncode == 0, w.stderr.read() if w.stderr else ""
    assert seen == sorted(seen), "a reader never sees data go away"
    assert any(0 < n < batches * per for n in seen), f"nothing visible while collecting: {seen}"
    assert _count(db) == (batches * per, batches * per, 6)
    # all folded into the main file at close: an ordinary (exclusive) open sees everything
    assert closed_parts(db) == [] and not list(parts_dir(db).glob("*.open"))
    st = TelemetryStore(db)
    assert st.count() == batches * per and len(st.findings()) == 6
    st.close()


def test_a_reader_holding_the_store_delays_folding_but_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = _spawn(WRITER, db, 10, 100, 0.05)  # a first run: makes a main file
    assert _wait_line(w, "closed")
    w.wait(30)
    # a reader (another process) holds the store while a second collector starts and runs
    r = _spawn(HOLDER, db, "reader", 3.0)
    _wait_line(r, "holding")
    w = _spawn(WRITER, db, 20, 100, 0.05, 10**6)
    _wait_line(w, "ready")  # start-up does not need the main file: no lock error, no wait
    line = _wait_line(w, "closed")
    w.wait(30)
    r.wait(30)
    assert w.returncode == 0 and r.returncode == 0
    assert "skipped=0" not in line, line  # folds were skipped while the reader held the file
    n, distinct, nf = _count(db)
    assert (n, distinct, nf) == (3000, 3000, 3)  # 1000 rows + 1 finding, then 2000 + 2


def test_two_writers_on_one_store_is_one_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = _spawn(WRITER, db, 200, 10, 1.0)
    _wait_line(w, "ready")
    try:
        with pytest.raises(TransportError, match=rf"another collector \(pid {w.pid}\) is writing this store"):
            RollingTelemetryStore(db)
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(30)


def test_an_exclusive_holder_is_a_clear_error_after_waiting(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    TelemetryStore(db).close()
    h = _spawn(HOLDER, db, "writer", 30)
    _wait_line(h, "holding")
    try:
        t0 = time.monotonic()
        with pytest.raises(TransportError) as ei:
            open_readonly(db, wait_s=0.5)
        assert time.monotonic() - t0 >= 0.5
        msg = str(ei.value)
        assert "\n" not in msg and str(db) in msg and f"process {h.pid}" in msg, msg
        with pytest.raises(TransportError, match=rf"in use by process {h.pid}.*gnmi query"):
            TelemetryStore(db)
    finally:
        h.kill()
        h.wait(30)
    with pytest.raises(TransportError, match="no telemetry store here"):
        open_readonly(tmp_path / "missing.duckdb", wait_s=0)


def test_a_killed_writer_loses_no_committed_batch(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = _spawn(WRITER, db, 10_000, 100, 3600.0)  # never rolls: everything is in the open part
    last = 0
    for _ in range(15):
        last = int(_wait_line(w, "wrote").split()[1])
    w.send_signal(signal.SIGKILL)
    w.wait(30)
    assert list(parts_dir(db).glob("*.open"))  # the crash left the partition open
    st = RollingTelemetryStore(db)  # the next start recovers and closes it
    st.close()
    n, distinct, _ = _count(db)
    assert n == distinct and n - last in (0, 100), (n, last)  # at most the batch in flight


def test_fold_is_exactly_once_even_if_the_part_file_survives(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    clock = [0.0]
    st = RollingTelemetryStore(db, roll_interval_s=10, clock=lambda: clock[0])
    st.write_events([TelemetryEvent("/c/x", i, "t", {}, 1.0) for i in range(50)])
    st.write_findings([Finding("k", "s", 0.5, (0, 1))])
    clock[0] = 11
    st.write_events([TelemetryEvent("/c/x", 100 + i, "t", {}, 1.0) for i in range(5)])  # rolls after this
    st.wait_fold()
    assert len(closed_parts(db)) == 0 and db.exists() and st.folds == 1  # rolled and folded
    # a crash between the fold's commit and the delete leaves a folded part behind: simulate it
    tmp = TelemetryStore(tmp_path / "copy.duckdb")
    tmp.write_events([TelemetryEvent("/c/x", 10**6, "t", {}, 1.0)])
    tmp.close()
    with open_readonly(db) as con:
        row = con.execute("SELECT name FROM main_store._folded_parts").fetchone()
    assert row is not None
    shutil.copy(tmp_path / "copy.duckdb", parts_dir(db) / row[0])
    assert _count(db)[0] == 55  # the stale copy is recognised as folded, not added
    assert fold(db) and not (parts_dir(db) / row[0]).exists()
    st.close()
    assert _count(db) == (55, 55, 1)
    con = TelemetryStore(db)
    assert [f.subject for f in findings_of(con.con)] == ["s"]
    con.close()


def test_the_duckdb_sink_rolls_by_default(tmp_path: Path) -> None:
    from fabricscope.telemetry.sinks import DuckDBSink

    sink = DuckDBSink(str(tmp_path / "s.duckdb"), roll_interval=0.01)
    assert isinstance(sink.store, RollingTelemetryStore)
    # the store's clock is a parameter: with the wall clock, a loaded CI core once took 10 ms
    # inside the first write, rolled there, and left the second row in a new open partition
    now = [0.0]
    sink.store.clock = lambda: now[0]
    sink.write([TelemetryEvent("/c/x", 1, "t", {}, 1.0)], [])
    now[0] = 0.02
    sink.write([TelemetryEvent("/c/x", 2, "t", {}, 2.0)], [])
    assert isinstance(sink.store, RollingTelemetryStore)
    sink.store.wait_fold()  # same process as the reader here: let the background fold finish
    assert _count(tmp_path / "s.duckdb")[0] == 2  # visible before close
    sink.close()
    assert os.path.exists(tmp_path / "s.duckdb") and _count(tmp_path / "s.duckdb")[0] == 2
    one = DuckDBSink(str(tmp_path / "x.duckdb"), roll_interval=0)
    assert isinstance(one.store, TelemetryStore)
    one.close()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from fabricscope.cli import main; main()", *args]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_gnmi_query_reads_while_gnmi_collect_writes(tmp_path: Path) -> None:
    """Three real processes: a gNMI twin, ``gnmi collect`` into DuckDB, ``gnmi query`` reading it."""
    port = _free_port()
    server = subprocess.Popen(_cli("gnmi", "serve-twin", "--address", f"127.0.0.1:{port}", "--duration", "40"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = tmp_path / "t.duckdb"
    cfg = tmp_path / "collector.yaml"
    cfg.write_text(f"""
targets: {{twin: {{address: "127.0.0.1:{port}", names: [leaf-000, spine-00]}}}}
subscriptions: {{ifs: {{paths: ["/interfaces/interface[name=*]/state/counters"], sample-interval: 200ms}}}}
sinks: [{{type: duckdb, path: "{db}", roll-interval: 1s}}]
""")
    try:
        assert server.stdout is not None and "serving" in server.stdout.readline()
        col = subprocess.Popen(_cli("gnmi", "collect", "-c", str(cfg), "--duration", "8"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        counts: list[int] = []
        while col.poll() is None:
            q = subprocess.run(_cli("gnmi", "query", str(db), "SELECT count(*) FROM telemetry", "--format", "csv"),
                               capture_output=True, text=True, timeout=60)
            if q.returncode == 0:
                counts.append(int(q.stdout.split()[1]))
            else:  # only before the first roll
                assert ("no data yet" in q.stderr or "no telemetry store" in q.stderr) and not counts, q.stderr
            time.sleep(0.3)
        out, err = col.communicate(timeout=30)
        assert col.returncode == 0, err
        assert any(n > 0 for n in counts), f"no data visible while collecting: {counts}"
        assert counts == sorted(counts)
        summary = [ln for ln in out.splitlines() if ln.startswith("received ")][-1]
        written = int(summary.split(",")[1].split()[1])
        q = subprocess.run(_cli("gnmi", "query", str(db), "SELECT count(*) FROM telemetry", "--format", "csv"),
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 0 and int(q.stdout.split()[1]) == written, (q, summary)
        assert any(0 < n < written for n in counts), f"no partial data seen mid-run: {counts}, {summary}"
    finally:
        server.terminate()
        server.wait(10)


def test_a_main_file_that_is_not_duckdb_fails_at_start(tmp_path: Path) -> None:
    db = tmp_path / "notes.txt"
    db.write_text("not a database\n" * 10)
    with pytest.raises(TransportError, match="is not a DuckDB database"):
        RollingTelemetryStore(db)
    TelemetryStore(tmp_path / "ok.duckdb").close()
    RollingTelemetryStore(tmp_path / "ok.duckdb").close()  # a real DuckDB file is accepted


def test_before_the_first_roll_the_reader_is_told_so(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    st = RollingTelemetryStore(db, roll_interval_s=3600)
    st.write_events([TelemetryEvent("/c/x", 1, "t", {}, 1.0)])
    with pytest.raises(TransportError, match="no data yet: the collector has not closed its first partition"):
        open_readonly(db, wait_s=0)
    st.close()
    assert _count(db)[0] == 1
