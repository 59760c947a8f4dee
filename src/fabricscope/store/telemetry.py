"""DuckDB storage for telemetry events and findings (schema in docs/telemetry.md).

Batches go in through Apache Arrow (one columnar insert per batch, not one statement per
row), which is what keeps the store off the critical path at >100k events/s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent

SCHEMA = """
CREATE TABLE IF NOT EXISTS telemetry (
    ts_ns      BIGINT  NOT NULL,   -- notification timestamp (ns since epoch, or twin time)
    target     VARCHAR NOT NULL,   -- gNMI prefix.target: the device id
    name       VARCHAR NOT NULL,   -- schema path without keys
    tags       VARCHAR NOT NULL,   -- JSON object of path keys (interface_name, queue_name...)
    value_num  DOUBLE,             -- numeric values (counters, gauges)
    value_str  VARCHAR             -- strings and booleans (oper-status)
);
CREATE TABLE IF NOT EXISTS findings (
    kind         VARCHAR NOT NULL,
    subject      VARCHAR NOT NULL,
    score        DOUBLE  NOT NULL,
    start_ns     BIGINT  NOT NULL,
    end_ns       BIGINT  NOT NULL,
    evidence     VARCHAR NOT NULL,  -- JSON list of strings
    action       VARCHAR NOT NULL,
    details      VARCHAR NOT NULL   -- JSON object
);
"""

_EV_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("target", pa.string()), ("name", pa.string()), ("tags", pa.string()),
    ("value_num", pa.float64()), ("value_str", pa.string()),
])


class TelemetryStore:
    """One DuckDB file (``":memory:"`` for tests) with the telemetry and findings tables."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        try:
            self.con = duckdb.connect(self.path)
            self.con.execute(SCHEMA)
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: {exc}") from exc
        self._tags_json: dict[int, tuple[Mapping[str, str], str]] = {}
        self.rows = 0

    def _tags(self, t: Mapping[str, str]) -> str:
        # Tag dicts are shared per leaf by the flattener; memoize their JSON by identity
        # (holding a reference so the id cannot be reused).
        hit = self._tags_json.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        s = json.dumps(dict(t), sort_keys=True)
        if len(self._tags_json) > 2_000_000:
            self._tags_json.clear()
        self._tags_json[id(t)] = (t, s)
        return s

    def write_events(self, events: Sequence[TelemetryEvent]) -> None:
        if not events:
            return
        num: list[float | None] = []
        txt: list[str | None] = []
        for e in events:
            v = e.value
            if isinstance(v, bool | str):
                num.append(None)
                txt.append(str(v))
            else:
                num.append(float(v))
                txt.append(None)
        tags = self._tags
        table = pa.Table.from_arrays([
            pa.array([e.ts_ns for e in events], pa.int64()),
            pa.array([e.target for e in events], pa.string()),
            pa.array([e.name for e in events], pa.string()),
            pa.array([tags(e.tags) for e in events], pa.string()),
            pa.array(num, pa.float64()),
            pa.array(txt, pa.string()),
        ], schema=_EV_SCHEMA)
        try:
            self.con.register("_batch", table)
            self.con.execute("INSERT INTO telemetry SELECT * FROM _batch")
            self.con.unregister("_batch")
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: insert failed: {exc}") from exc
        self.rows += len(events)

    def write_findings(self, findings: Sequence[Finding]) -> None:
        if not findings:
            return
        try:
            self.con.executemany(
                "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(f.kind, f.subject, f.score, f.window[0], f.window[1], json.dumps(list(f.evidence)),
                  f.action, json.dumps(dict(f.details))) for f in findings],
            )
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: insert failed: {exc}") from exc

    def count(self, table: str = "telemetry") -> int:
        if table not in ("telemetry", "findings"):
            raise ValueError(table)
        row = self.con.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0

    def findings(self) -> list[Finding]:
        rows = self.con.execute(
            "SELECT kind, subject, score, start_ns, end_ns, evidence, action, details FROM findings ORDER BY start_ns"
        ).fetchall()
        return [Finding(k, s, sc, (a, b), tuple(json.loads(ev)), act, json.loads(det))
                for k, s, sc, a, b, ev, act, det in rows]

    def close(self) -> None:
        self.con.close()
