"""A sink batch is all or nothing: a retried batch is never stored twice (review finding).

The collector retries a batch that a sink refused, whole. A DuckDB sink that had inserted the
events and then failed on the findings, or a JSON-lines sink that had written half the lines
before the disk filled, would store those rows twice on the retry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

import fabricscope.store.telemetry as store_telemetry
from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.sinks import DuckDBSink, JsonLinesSink

EVENTS = [TelemetryEvent(f"/if/{i}", 1_000 + i, "leaf-000", (("name", "eth1"),), float(i))
          for i in range(50)]
FINDINGS = [Finding("link-flap", "leaf-000:eth1", 0.9, (1, 2), ("ev",), "check", {})]


@pytest.mark.parametrize("roll_interval", [0.0, 60.0], ids=["single-file", "rolling"])
def test_duckdb_batch_retried_after_a_findings_failure_is_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roll_interval: float
) -> None:
    db = tmp_path / "t.duckdb"
    sink = DuckDBSink(str(db), roll_interval=roll_interval)
    real = store_telemetry.insert_findings
    calls = {"n": 0}

    def failing_once(con, path, findings):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise TransportError("duckdb: insert failed: disk full (injected)")
        return real(con, path, findings)

    monkeypatch.setattr(store_telemetry, "insert_findings", failing_once)
    with pytest.raises(TransportError):
        sink.write(EVENTS, FINDINGS)
    sink.write(EVENTS, FINDINGS)  # the collector's retry: the same batch
    sink.close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM telemetry").fetchone() == (len(EVENTS),)
    assert con.execute("SELECT count(*) FROM findings").fetchone() == (len(FINDINGS),)
    con.close()


def test_jsonl_batch_cut_short_by_a_write_error_is_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "t.jsonl"
    sink = JsonLinesSink(str(out))
    real_write = os.write
    state = {"failed": False}

    def half_then_enospc(fd: int, data: bytes) -> int:  # a disk that fills mid-batch
        if not state["failed"]:
            state["failed"] = True
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_enospc)
    with pytest.raises(TransportError):
        sink.write(EVENTS, FINDINGS)
    sink.write(EVENTS, FINDINGS)
    sink.close()
    lines = out.read_text().splitlines()
    assert len(lines) == len(EVENTS) + len(FINDINGS)
    assert [json.loads(ln).get("ts_ns") for ln in lines[: len(EVENTS)]] == [e.ts_ns for e in EVENTS]
