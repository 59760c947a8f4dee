"""DuckDB storage for telemetry events and findings (schema in docs/telemetry.md).

Batches go in through Apache Arrow (one columnar insert per batch, not one statement per
row), which is what keeps the store off the critical path at >100k events/s.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.store.db import open_db

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

_TS = attrgetter("ts_ns")
_TARGET = attrgetter("target")
_NAME = attrgetter("name")
_TAGS = attrgetter("tags")
_VALUE = attrgetter("value")

_EV_SCHEMA = pa.schema([
    ("ts_ns", pa.int64()), ("target", pa.string()), ("name", pa.string()), ("tags", pa.string()),
    ("value_num", pa.float64()), ("value_str", pa.string()),
])


class EventTable:
    """Builds Arrow tables in the ``telemetry`` schema from events (also used by collector shards)."""

    def __init__(self) -> None:
        self._tags_json: dict[int, tuple[Mapping[str, str], str]] = {}

    def __call__(self, events: Sequence[TelemetryEvent]) -> pa.Table:
        return self.events_table(events)

    def _tags_column(self, tag_maps: list[Mapping[str, str]]) -> pa.Array:
        # Tag dicts are shared per leaf by the flattener: encode each distinct one once
        # (by identity, holding a reference so an id cannot be reused) and build a
        # dictionary-encoded column, so the per-event cost is one dict lookup.
        memo = self._tags_json
        ids = list(map(id, tag_maps))
        by_id = dict(zip(ids, tag_maps, strict=True))  # distinct leaves, first-seen order (C loop)
        pos: dict[int, int] = {}
        labels: list[str] = []
        for i, t in by_id.items():
            hit = memo.get(i)
            if hit is None or hit[0] is not t:
                hit = (t, json.dumps(dict(t), sort_keys=True))
                if len(memo) > 2_000_000:
                    memo.clear()
                memo[i] = hit
            pos[i] = len(labels)
            labels.append(hit[1])
        idx = pa.array(list(map(pos.__getitem__, ids)), pa.int32())
        return pa.DictionaryArray.from_arrays(idx, pa.array(labels, pa.string())).cast(pa.string())

    def events_table(self, events: Sequence[TelemetryEvent]) -> pa.Table:
        """The Arrow table of ``events`` in the ``telemetry`` schema."""
        values = list(map(_VALUE, events))
        kinds = set(map(type, values))
        if kinds <= {int, float}:  # the common case: all numeric
            num = pa.array(values, pa.float64())
            txt = pa.nulls(len(values), pa.string())
        else:
            num = pa.array([None if isinstance(v, bool | str) else float(v) for v in values], pa.float64())
            txt = pa.array([str(v) if isinstance(v, bool | str) else None for v in values], pa.string())
        return pa.Table.from_arrays([
            pa.array(list(map(_TS, events)), pa.int64()),
            pa.array(list(map(_TARGET, events)), pa.string()),
            pa.array(list(map(_NAME, events)), pa.string()),
            self._tags_column(list(map(_TAGS, events))),
            num,
            txt,
        ], schema=_EV_SCHEMA)


def insert_table(con: duckdb.DuckDBPyConnection, path: str, table: pa.Table) -> None:
    """Insert an Arrow table in the ``telemetry`` schema (one columnar insert)."""
    if table.schema != _EV_SCHEMA:
        raise TransportError(f"duckdb {path}: batch schema {table.schema} is not the telemetry schema")
    try:
        con.register("_batch", table)
        con.execute("INSERT INTO telemetry SELECT * FROM _batch")
        con.unregister("_batch")
    except duckdb.Error as exc:
        raise TransportError(f"duckdb {path}: insert failed: {exc}") from exc


def insert_findings(con: duckdb.DuckDBPyConnection, path: str, findings: Sequence[Finding]) -> None:
    try:
        con.executemany(
            "INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(f.kind, f.subject, f.score, f.window[0], f.window[1], json.dumps(list(f.evidence)),
              f.action, json.dumps(dict(f.details))) for f in findings],
        )
    except duckdb.Error as exc:
        raise TransportError(f"duckdb {path}: insert failed: {exc}") from exc


def insert_batch(con: duckdb.DuckDBPyConnection, path: str, table: pa.Table | None,
                 findings: Sequence[Finding]) -> None:
    """Insert one batch's events and findings in ONE transaction: all or nothing.

    A sink that fails mid-batch is retried with the whole batch; two separate inserts would
    store the events twice when only the findings insert had failed.
    """
    try:
        con.execute("BEGIN TRANSACTION")
    except duckdb.Error as exc:
        raise TransportError(f"duckdb {path}: cannot begin a transaction: {exc}") from exc
    try:
        if table is not None and table.num_rows:
            insert_table(con, path, table)
        if findings:
            insert_findings(con, path, findings)
        con.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        if isinstance(exc, duckdb.Error):
            raise TransportError(f"duckdb {path}: commit failed: {exc}") from exc
        raise


FINDINGS_SQL = "SELECT kind, subject, score, start_ns, end_ns, evidence, action, details FROM findings"


def finding_of(row: tuple[Any, ...]) -> Finding:
    k, s, sc, a, b, ev, act, det = row
    return Finding(k, s, sc, (a, b), tuple(json.loads(ev)), act, json.loads(det))


def findings_of(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """Every finding of a store connection (a TelemetryStore's or :func:`open_readonly`'s)."""
    return [finding_of(r) for r in con.execute(FINDINGS_SQL + " ORDER BY start_ns").fetchall()]


def open_readonly(path: str | Path, *, wait_s: float = 10.0) -> duckdb.DuckDBPyConnection:
    """Read a store while a collector writes it: views ``telemetry`` and ``findings``.

    See :func:`fabricscope.store.rolling.open_readonly` (main file + closed partitions,
    all attached read-only).
    """
    from fabricscope.store.rolling import open_readonly as _open

    return _open(path, wait_s=wait_s)


class TelemetryStore:
    """One DuckDB file (``":memory:"`` for tests) with the telemetry and findings tables.

    It holds the file exclusively (DuckDB: one process per file). A collector that must be
    queried while it runs writes a :class:`~fabricscope.store.rolling.RollingTelemetryStore`
    instead, and readers use :func:`open_readonly`.
    """

    def __init__(self, path: str | Path = ":memory:", *, wait_s: float = 0.0) -> None:
        self.path = str(path)
        self.con = open_db(self.path, SCHEMA, wait_s=wait_s)
        self.events_table = EventTable()
        self.rows = 0

    def write_events(self, events: Sequence[TelemetryEvent]) -> None:
        if events:
            self.write_table(self.events_table(events))

    def write_table(self, table: pa.Table) -> None:
        """Insert an Arrow table in the ``telemetry`` schema (one columnar insert)."""
        insert_table(self.con, self.path, table)
        self.rows += table.num_rows

    def write_findings(self, findings: Sequence[Finding]) -> None:
        if findings:
            insert_findings(self.con, self.path, findings)

    def write_batch(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        """Events and findings of one batch, all or nothing (see :func:`insert_batch`)."""
        table = self.events_table(events) if events else None
        insert_batch(self.con, self.path, table, findings)
        self.rows += table.num_rows if table is not None else 0

    def count(self, table: str = "telemetry") -> int:
        if table not in ("telemetry", "findings"):
            raise ValueError(table)
        rows = self.con.execute(f"SELECT count(*) FROM {table}").fetchall()  # all: no open result
        return int(rows[0][0]) if rows else 0

    def findings(self) -> list[Finding]:
        return findings_of(self.con)

    def close(self) -> None:
        self.con.close()
