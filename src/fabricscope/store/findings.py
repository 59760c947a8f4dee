"""DuckDB storage of the diagnosis: every instrument's findings and the incidents over them.

One file (``":memory:"`` for tests) may also hold the other stores' tables (probes,
telemetry); only these two are this module's. Findings are immutable and keyed by their
stable id (:func:`fabricscope.diagnosis.model.finding_id`), so adding the same finding twice
keeps the first; an incident is rewritten as it updates (the last version written wins).

Table ``findings`` (one row per observed finding)::

    id               VARCHAR PRIMARY KEY  stable finding id ("f-1a2b3c4d5e6f")
    source           VARCHAR  instrument: telemetry, probe, straggler, optics, ...
    kind             VARCHAR  what is wrong (gray-link, crc-increase, slow-rank, ...)
    subject          VARCHAR  where: an inventory id (device, port, link, rank)
    score            DOUBLE   how sure, in [0, 1]
    window_start_ns  BIGINT   the time window the evidence covers ...
    window_end_ns    BIGINT   ... on the clock of the world that produced it
    reported_ns      BIGINT   when the diagnosis received it
    evidence         JSON     list of strings
    action           VARCHAR  what the instrument suggests doing
    details          JSON     object of numbers / strings

Table ``incidents`` (one row per incident, its latest version)::

    id                VARCHAR PRIMARY KEY
    status            VARCHAR  open | closed
    opened_ns         BIGINT   when the incident was opened
    updated_ns        BIGINT   when it last changed
    first_symptom_ns  BIGINT   earliest evidence window start
    detected_ns       BIGINT   when its first finding was reported
    root_cause_ns     BIGINT   when the current top root cause was first named (NULL: none)
    action_ns         BIGINT   when an action was proposed or taken (NULL: none)
    closed_ns         BIGINT   when its symptoms cleared (NULL while open)
    severity          VARCHAR  info | warning | critical
    title             VARCHAR
    top_resource      VARCHAR  the top-ranked root cause (NULL: none yet) ...
    top_fault         VARCHAR  ... its fault type (knowledge base) ...
    top_probability   DOUBLE   ... and probability
    body              JSON     the whole incident (diagnosis.serialize.incident_to_json)

The scalar columns are there for SQL (``SELECT top_fault, count(*) FROM incidents GROUP BY
1``); reading an incident back uses ``body`` only. Times are integer nanoseconds: wall clock
(Unix epoch) in live mode, seconds-from-0 of the simulated clock on the twin.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from fabricscope.diagnosis.model import Incident, Observed
from fabricscope.diagnosis.serialize import (
    incident_from_json,
    incident_to_json,
    observed_from_json,
)
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.store.db import StoreLockedError, lock_holder, open_db

__all__ = ["SCHEMA", "DiagnosisStore"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS findings (
    id VARCHAR PRIMARY KEY, source VARCHAR NOT NULL, kind VARCHAR NOT NULL,
    subject VARCHAR NOT NULL, score DOUBLE NOT NULL,
    window_start_ns BIGINT NOT NULL, window_end_ns BIGINT NOT NULL, reported_ns BIGINT NOT NULL,
    evidence JSON NOT NULL, action VARCHAR NOT NULL, details JSON NOT NULL
);
CREATE TABLE IF NOT EXISTS incidents (
    id VARCHAR PRIMARY KEY, status VARCHAR NOT NULL,
    opened_ns BIGINT NOT NULL, updated_ns BIGINT NOT NULL,
    first_symptom_ns BIGINT NOT NULL, detected_ns BIGINT NOT NULL,
    root_cause_ns BIGINT, action_ns BIGINT, closed_ns BIGINT,
    severity VARCHAR NOT NULL, title VARCHAR NOT NULL,
    top_resource VARCHAR, top_fault VARCHAR, top_probability DOUBLE,
    body JSON NOT NULL
);
"""
_FINDING_COLS = ("id", "source", "kind", "subject", "score", "window_start_ns", "window_end_ns",
                 "reported_ns", "evidence", "action", "details")
_INCIDENT_COLS = ("id", "status", "opened_ns", "updated_ns", "first_symptom_ns", "detected_ns",
                  "root_cause_ns", "action_ns", "closed_ns", "severity", "title", "top_resource",
                  "top_fault", "top_probability", "body")
_TABLES = {"findings": _FINDING_COLS, "incidents": _INCIDENT_COLS}
_FINDING_ARROW = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("kind", pa.string()), ("subject", pa.string()),
    ("score", pa.float64()), ("window_start_ns", pa.int64()), ("window_end_ns", pa.int64()),
    ("reported_ns", pa.int64()), ("evidence", pa.string()), ("action", pa.string()),
    ("details", pa.string()),
])
_INCIDENT_ARROW = pa.schema([
    ("id", pa.string()), ("status", pa.string()), ("opened_ns", pa.int64()),
    ("updated_ns", pa.int64()), ("first_symptom_ns", pa.int64()), ("detected_ns", pa.int64()),
    ("root_cause_ns", pa.int64()), ("action_ns", pa.int64()), ("closed_ns", pa.int64()),
    ("severity", pa.string()), ("title", pa.string()), ("top_resource", pa.string()),
    ("top_fault", pa.string()), ("top_probability", pa.float64()), ("body", pa.string()),
])
_MAX_LISTED = 10  # ambiguous prefix: matches named in the error


class DiagnosisStore:
    """The ``findings`` and ``incidents`` tables of one DuckDB file.

    ``read_only`` opens an existing file without creating anything (what ``incidents
    list/show/export`` do); the file must then already hold both tables. A file that is not
    a DuckDB database is a :class:`~fabricscope.model.errors.TransportError`, one whose
    ``findings`` / ``incidents`` tables have other columns a
    :class:`~fabricscope.model.errors.ConfigError`; both name the file.
    """

    def __init__(self, path: str | Path = ":memory:", *, read_only: bool = False,
                 wait_s: float = 0.0) -> None:
        self.path = str(path)
        try:
            self.con = open_db(self.path, SCHEMA, read_only=read_only, wait_s=wait_s)
        except StoreLockedError as exc:
            holder = lock_holder(exc.__context__) if exc.__context__ else "another process"
            raise StoreLockedError(
                f"duckdb {self.path}: in use by {holder} (DuckDB allows one process per file); "
                "read the incidents after the writer (`fabricscope supervise`) exits") from None
        try:
            self._check_schema()
        except BaseException:
            self.con.close()
            raise

    def _check_schema(self) -> None:
        rows = self.con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_catalog = current_database() AND table_schema = 'main' "
            "ORDER BY table_name, ordinal_position").fetchall()
        have: dict[str, list[str]] = {}
        for t, c in rows:
            have.setdefault(str(t), []).append(str(c))
        for table, cols in _TABLES.items():
            if table not in have:
                raise ConfigError(
                    f"duckdb {self.path}: no table {table!r} (expected a file written by "
                    f"`fabricscope supervise --db` or DiagnosisStore; it has "
                    f"{', '.join(sorted(have)) or 'no tables'})")
            if tuple(have[table]) != cols:
                raise ConfigError(
                    f"duckdb {self.path}: table {table!r} has columns ({', '.join(have[table])}), "
                    f"not the findings store's ({', '.join(cols)}); a file of another tool or "
                    "version: give another --db")

    # -- writing -------------------------------------------------------------------------

    def add_findings(self, findings: Iterable[Observed]) -> int:
        """Insert findings in one Arrow batch; one whose id is stored already (or repeated in
        the batch) is ignored. Returns the number of findings newly stored."""
        seen: set[str] = set()
        batch: list[Observed] = []
        for o in findings:
            if o.id not in seen:
                seen.add(o.id)
                batch.append(o)
        if not batch:
            return 0
        table = pa.Table.from_pydict({
            "id": [o.id for o in batch], "source": [o.source for o in batch],
            "kind": [o.finding.kind for o in batch], "subject": [o.finding.subject for o in batch],
            "score": [float(o.finding.score) for o in batch],
            "window_start_ns": [o.finding.window[0] for o in batch],
            "window_end_ns": [o.finding.window[1] for o in batch],
            "reported_ns": [o.reported_ns for o in batch],
            "evidence": [json.dumps(list(o.finding.evidence)) for o in batch],
            "action": [o.finding.action for o in batch],
            "details": [json.dumps(dict(o.finding.details)) for o in batch],
        }, schema=_FINDING_ARROW)
        cols = ", ".join(_FINDING_COLS)
        before = self._count("findings")
        self._write("findings", table, f"INSERT INTO findings SELECT {cols} FROM _batch b "
                    "WHERE NOT EXISTS (SELECT 1 FROM findings f WHERE f.id = b.id)")
        return self._count("findings") - before

    def upsert_incidents(self, incidents: Iterable[Incident]) -> int:
        """Write incidents in one batch, replacing a stored incident of the same id (the last
        version written wins, also within the batch). Returns the number of rows written."""
        latest: dict[str, Incident] = {}
        for i in incidents:
            latest.pop(i.id, None)  # keep the order of last occurrence
            latest[i.id] = i
        if not latest:
            return 0
        batch = list(latest.values())
        top = [i.root_causes[0] if i.root_causes else None for i in batch]
        table = pa.Table.from_pydict({
            "id": [i.id for i in batch], "status": [i.status for i in batch],
            "opened_ns": [i.opened_ns for i in batch], "updated_ns": [i.updated_ns for i in batch],
            "first_symptom_ns": [i.first_symptom_ns for i in batch],
            "detected_ns": [i.detected_ns for i in batch],
            "root_cause_ns": [i.root_cause_ns for i in batch],
            "action_ns": [i.action_ns for i in batch], "closed_ns": [i.closed_ns for i in batch],
            "severity": [i.severity for i in batch], "title": [i.title for i in batch],
            "top_resource": [t.resource if t else None for t in top],
            "top_fault": [t.fault if t else None for t in top],
            "top_probability": [float(t.probability) if t else None for t in top],
            "body": [json.dumps(incident_to_json(i)) for i in batch],
        }, schema=_INCIDENT_ARROW)
        cols = ", ".join(_INCIDENT_COLS)
        self._write("incidents", table,
                    "DELETE FROM incidents WHERE id IN (SELECT id FROM _batch)",
                    f"INSERT INTO incidents SELECT {cols} FROM _batch")
        return len(batch)

    def _write(self, table: str, batch: pa.Table, *statements: str) -> None:
        try:
            self.con.register("_batch", batch)
            self.con.execute("BEGIN TRANSACTION")
            try:
                for sql in statements:
                    self.con.execute(sql)
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            finally:
                self.con.unregister("_batch")
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: write to {table}: "
                                 f"{' '.join(str(exc).split())}") from exc

    # -- reading -------------------------------------------------------------------------

    def incidents(self, status: str | None = None, since_ns: int | None = None,
                  until_ns: int | None = None) -> list[Incident]:
        """Incidents, newest (latest opened) first; ``status`` "open" / "closed" (None: both);
        ``since_ns`` / ``until_ns`` keep those active in [since, until): updated at or after
        ``since_ns`` and opened before ``until_ns``."""
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            if status not in ("open", "closed"):
                raise ConfigError(f"incident status {status!r}: choose open or closed")
            where.append("status = ?")
            params.append(status)
        if since_ns is not None:
            where.append("updated_ns >= ?")
            params.append(int(since_ns))
        if until_ns is not None:
            where.append("opened_ns < ?")
            params.append(int(until_ns))
        w = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(f"SELECT body FROM incidents {w} ORDER BY opened_ns DESC, id DESC",
                           params)
        return [self._incident(r[0]) for r in rows]

    def incident(self, id: str) -> Incident | None:
        """The incident ``id``, or the one whose id starts with ``id``; None when none does.
        A prefix that several ids share is a ConfigError listing them."""
        if not id:
            raise ConfigError("incident id: empty (give an id or a unique prefix of one)")
        rows = self._query("SELECT id, body FROM incidents WHERE starts_with(id, ?) ORDER BY id "
                           f"LIMIT {_MAX_LISTED + 1}", [id])
        exact = [r for r in rows if r[0] == id]
        if exact:
            return self._incident(exact[0][1])
        if not rows:
            return None
        if len(rows) > 1:
            more = " ..." if len(rows) > _MAX_LISTED else ""
            ids = ", ".join(str(r[0]) for r in rows[:_MAX_LISTED])
            raise ConfigError(f"incident {id!r}: ambiguous prefix, matches {ids}{more}; "
                              "give more of the id")
        return self._incident(rows[0][1])

    def findings(self, ids: Sequence[str] | None = None, since_ns: int | None = None,
                 until_ns: int | None = None,
                 sources: Sequence[str] | None = None) -> list[Observed]:
        """Stored findings ordered by report time; filters combine: ``ids`` (those ids),
        ``since_ns`` / ``until_ns`` (evidence window overlapping [since, until)),
        ``sources`` (instruments)."""
        where: list[str] = []
        params: list[Any] = []
        if ids is not None:
            where.append("list_contains(?, id)")
            params.append(list(ids))
        if since_ns is not None:
            where.append("window_end_ns >= ?")
            params.append(int(since_ns))
        if until_ns is not None:
            where.append("window_start_ns < ?")
            params.append(int(until_ns))
        if sources is not None:
            where.append("list_contains(?, source)")
            params.append(list(sources))
        w = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(f"SELECT {', '.join(_FINDING_COLS)} FROM findings {w} "
                           "ORDER BY reported_ns, id", params)
        src = f"duckdb {self.path} table findings"
        out = []
        for r in rows:
            d = dict(zip(_FINDING_COLS, r, strict=True))
            d["window"] = [d.pop("window_start_ns"), d.pop("window_end_ns")]
            d["evidence"] = self._json(d["evidence"], src)
            d["details"] = self._json(d["details"], src)
            out.append(observed_from_json(d, source=src))
        return out

    def counts(self) -> tuple[int, int]:
        """(incidents, findings) stored."""
        return self._count("incidents"), self._count("findings")

    def _count(self, table: str) -> int:
        rows = self._query(f"SELECT count(*) FROM {table}", [])
        return int(rows[0][0]) if rows else 0

    def _query(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        try:
            return self.con.execute(sql, params).fetchall()
        except duckdb.Error as exc:
            raise TransportError(f"duckdb {self.path}: {' '.join(str(exc).split())}") from exc

    def _json(self, text: object, src: str) -> Any:
        try:
            return json.loads(str(text))
        except ValueError as exc:
            raise ConfigError(f"{src}: not JSON: {str(text)[:60]!r} ({exc})") from None

    def _incident(self, body: object) -> Incident:
        src = f"duckdb {self.path} table incidents"
        return incident_from_json(self._json(body, src), source=src)

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> DiagnosisStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
