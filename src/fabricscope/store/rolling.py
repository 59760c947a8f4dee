"""Query while collecting: the collector writes rolling DuckDB partitions that readers can open.

DuckDB allows one process per file: while a writer holds it, no other process can open it,
even read-only. So the collector never holds the file a reader wants. Layout of a store
named ``telemetry.duckdb`` (docs/design/telemetry-query-while-collecting.md)::

    telemetry.duckdb                 folded data (the writer opens it only to fold, briefly)
    telemetry.duckdb.lock            flock held by the one writer for its lifetime (pid inside)
    telemetry.duckdb.parts/
        00000007-4242.duckdb.open    the partition being written (readers skip it)
        00000006-4242.duckdb         closed partitions: immutable, readable by anyone

Every ``roll_interval_s`` the writer closes its partition (DuckDB checkpoints it: no WAL
left), renames it to ``.duckdb`` (atomic), and folds closed partitions into the main file
if no reader holds it (else later: nothing waits on a reader). A fold inserts the parts and
records their names in ``_folded_parts`` in the same transaction, then deletes the files, so
a crash at any point neither loses nor duplicates rows. :func:`open_readonly` attaches the
main file and the closed partitions not yet folded, read-only, behind ``telemetry`` and
``findings`` views: a reader sees everything up to the last roll.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import duckdb
import pyarrow as pa

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.store.db import StoreLockedError, is_lock_conflict, lock_holder, open_db

__all__ = ["RollingTelemetryStore", "closed_parts", "fold", "open_readonly"]

log = logging.getLogger(__name__)

_FOLDED = "CREATE TABLE IF NOT EXISTS _folded_parts (name VARCHAR PRIMARY KEY, rows BIGINT, folded_ns BIGINT);"
TABLES = ("telemetry", "findings")


def _schema() -> str:
    from fabricscope.store.telemetry import SCHEMA

    return SCHEMA


def parts_dir(path: str | Path) -> Path:
    return Path(f"{path}.parts")


def closed_parts(path: str | Path) -> list[Path]:
    """Closed (immutable) partitions of the store at ``path``, oldest first."""
    d = parts_dir(path)
    return sorted(d.glob("*.duckdb")) if d.is_dir() else []


def _sql_str(p: Path | str) -> str:
    return "'" + str(p).replace("'", "''") + "'"


def _check_duckdb_file(p: Path) -> None:
    """An existing main file must be a DuckDB database (its header says ``DUCK`` at byte 8)."""
    try:
        with p.open("rb") as fh:
            head = fh.read(12)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TransportError(f"duckdb {p}: cannot read: {exc.strerror}") from exc
    if head and head[8:12] != b"DUCK":
        raise TransportError(f"duckdb {p}: exists and is not a DuckDB database; give the sink another path")


class RollingTelemetryStore:
    """The writer: same ``write_table``/``write_events``/``write_findings`` as TelemetryStore.

    ``clock`` (seconds, monotonic) decides when to roll; it is a parameter so tests roll
    deterministically. ``lock_wait_s``: how long to wait for another writer of the same
    store to go before failing with a clear error.
    """

    def __init__(self, path: str | Path, *, roll_interval_s: float = 60.0, lock_wait_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from fabricscope.store.telemetry import EventTable

        self.path = Path(path)
        _check_duckdb_file(self.path)  # now, not at the first fold a minute into the run
        self.roll_interval_s = roll_interval_s
        self.clock = clock
        self.events_table = EventTable()
        self.rows = 0
        self.folds = 0
        self.fold_skipped = 0
        self.fold_errors = 0
        self.last_fold_error = ""
        self._fold_thread: threading.Thread | None = None
        self._lock_fh = self._lock(lock_wait_s)
        self._dir = parts_dir(self.path)
        try:
            self._dir.mkdir(exist_ok=True)
        except OSError as exc:
            self._unlock()
            raise TransportError(f"duckdb {self.path}: cannot create {self._dir}: {exc.strerror}") from exc
        self._recover()
        self._seq = max((int(p.name.split("-", 1)[0]) for p in self._dir.glob("*-*.duckdb*")
                         if p.name.split("-", 1)[0].isdigit()), default=0)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._part: Path | None = None
        self._part_rows = 0
        self._part_t0 = 0.0

    # ------------------------------------------------------------------ one writer per store
    def _lock(self, wait_s: float) -> IO[str]:
        lp = Path(f"{self.path}.lock")
        try:
            fh = open(lp, "a+", encoding="utf-8")  # noqa: SIM115 (held for the store's lifetime)
        except OSError as exc:
            raise TransportError(f"duckdb {self.path}: cannot create lock file {lp}: {exc.strerror}") from exc
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    pid = fh.read().strip() or "?"
                    fh.close()
                    raise TransportError(f"duckdb {self.path}: another collector (pid {pid}) is writing this store; "
                                         "stop it or give this one another path") from None
                time.sleep(0.1)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        return fh

    def _unlock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
        self._lock_fh.close()

    def _recover(self) -> None:
        """Close partitions a crashed writer left open (DuckDB replays their WAL)."""
        for p in sorted(self._dir.glob("*.duckdb.open")):
            try:
                duckdb.connect(str(p)).close()
            except duckdb.Error as exc:
                raise TransportError(f"duckdb {p}: cannot recover a partition left open: {exc}") from exc
            p.rename(p.with_name(p.name.removesuffix(".open")))

    # ------------------------------------------------------------------ writing
    def _current(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._seq += 1
            self._part = self._dir / f"{self._seq:08d}-{os.getpid()}.duckdb.open"
            self._con = open_db(self._part, _schema())
            self._part_rows = 0
            self._part_t0 = self.clock()
        return self._con

    def write_events(self, events: Sequence[TelemetryEvent]) -> None:
        if events:
            self.write_table(self.events_table(events))

    def write_table(self, table: pa.Table) -> None:
        from fabricscope.store.telemetry import insert_table

        insert_table(self._current(), str(self.path), table)
        self.rows += table.num_rows
        self._part_rows += table.num_rows
        self.maybe_roll()

    def write_findings(self, findings: Sequence[Finding]) -> None:
        from fabricscope.store.telemetry import insert_findings

        if findings:
            insert_findings(self._current(), str(self.path), findings)
            self._part_rows += len(findings)
            self.maybe_roll()

    def write_batch(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        """Events and findings of one batch in one transaction of the open partition."""
        from fabricscope.store.telemetry import insert_batch

        if not events and not findings:
            return
        table = self.events_table(events) if events else None
        insert_batch(self._current(), str(self.path), table, findings)
        n = table.num_rows if table is not None else 0
        self.rows += n
        self._part_rows += n + len(findings)
        self.maybe_roll()

    def maybe_roll(self) -> None:
        if self._con is not None and self.clock() - self._part_t0 >= self.roll_interval_s:
            self.roll()

    def roll(self, *, fold_wait_s: float = 0.0, background: bool = True) -> None:
        """Close the open partition (if any) so readers see it, then try to fold.

        The fold runs in a background thread by default: it copies a whole roll's rows
        (seconds for millions, benchmarks/bench_store_fold.py), and the writer must keep
        taking batches meanwhile. DuckDB releases the GIL while it works.
        """
        if self._con is not None and self._part is not None:
            con, part = self._con, self._part
            self._con = self._part = None
            try:
                con.close()  # checkpoints: the closed file needs no WAL
            except duckdb.Error as exc:
                raise TransportError(f"duckdb {part}: close failed: {exc}") from exc
            if self._part_rows:
                part.rename(part.with_name(part.name.removesuffix(".open")))
            else:
                part.unlink()
        if background:
            if self._fold_thread is None or not self._fold_thread.is_alive():
                self._fold_thread = threading.Thread(target=self._fold, name="duckdb-fold", daemon=True)
                self._fold_thread.start()
            # else: the running fold, or the next roll's, takes this partition
        else:
            self.wait_fold()
            self._fold(fold_wait_s)

    def _fold(self, wait_s: float = 0.0) -> None:
        try:
            if fold(self.path, wait_s=wait_s):
                self.folds += 1
            else:
                self.fold_skipped += 1
        except (TransportError, OSError, duckdb.Error) as exc:
            # the partitions stay where they are, readable; the next roll (or start) retries
            # (a background thread: an uncaught error would be a traceback nobody handles)
            self.fold_errors += 1
            self.last_fold_error = str(exc)
            log.warning("%s; partitions kept, retried at the next roll", exc)

    def wait_fold(self, timeout_s: float | None = None) -> None:
        """Wait for a background fold to finish."""
        if self._fold_thread is not None:
            self._fold_thread.join(timeout_s)

    # ------------------------------------------------------------------ reading (the writer's own view)
    def _query(self, sql: str) -> list[tuple[object, ...]]:
        self.wait_fold()
        rows: list[tuple[object, ...]] = []
        if self._con is not None:
            rows += self._con.execute(sql).fetchall()
        if self.path.exists() or closed_parts(self.path):
            con = open_readonly(self.path, wait_s=5.0)
            try:
                rows += con.execute(sql).fetchall()
            finally:
                con.close()
        return rows

    def count(self, table: str = "telemetry") -> int:
        """Rows in ``table`` so far: the open partition, closed ones and the main file."""
        if table not in TABLES:
            raise ValueError(table)
        return sum(int(r[0]) for r in self._query(f"SELECT count(*) FROM {table}"))  # type: ignore[call-overload]

    def findings(self) -> list[Finding]:
        from fabricscope.store.telemetry import FINDINGS_SQL, finding_of

        return sorted((finding_of(r) for r in self._query(FINDINGS_SQL)), key=lambda f: f.window[0])

    def close(self, *, fold_wait_s: float = 5.0) -> None:
        """Roll and fold (waiting up to ``fold_wait_s`` for readers); parts left are still readable."""
        try:
            self.roll(fold_wait_s=fold_wait_s, background=False)
        finally:
            self._unlock()


def fold(path: str | Path, *, wait_s: float = 0.0) -> bool:
    """Move closed partitions into the main file; False if a reader holds it (try later).

    Exactly once: the inserts and the ``_folded_parts`` rows commit together; files are
    deleted after the commit, and a part already recorded is deleted without inserting.
    """
    parts = closed_parts(path)
    if not parts:
        return True
    try:
        con = open_db(path, _schema() + _FOLDED, wait_s=wait_s)
    except StoreLockedError:
        return False  # a reader has it open: the parts stay readable, fold at the next roll
    try:
        done = {r[0] for r in con.execute("SELECT name FROM _folded_parts").fetchall()}
        con.execute("BEGIN TRANSACTION")
        for i, p in enumerate(parts):
            if p.name in done:
                continue
            alias = f"_p{i}"
            con.execute(f"ATTACH {_sql_str(p)} AS {alias} (READ_ONLY)")
            n = 0
            for t in TABLES:
                con.execute(f"INSERT INTO {t} SELECT * FROM {alias}.{t}")
                row = con.execute(f"SELECT count(*) FROM {alias}.{t}").fetchone()
                n += int(row[0]) if row else 0
            con.execute(f"DETACH {alias}")
            con.execute("INSERT INTO _folded_parts VALUES (?, ?, ?)", [p.name, n, time.time_ns()])
        con.execute("COMMIT")
    except duckdb.Error as exc:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise TransportError(f"duckdb {path}: folding partitions failed: {exc}") from exc
    finally:
        con.close()
    for p in parts:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return True


def open_readonly(path: str | Path, *, wait_s: float = 10.0) -> duckdb.DuckDBPyConnection:
    """A read-only view of the store at ``path``, safe while a collector writes it.

    Returns an in-memory DuckDB connection with views ``telemetry`` and ``findings`` over the
    main file and every closed partition not yet folded (all attached READ_ONLY). Close it
    when done: while it is open the collector cannot fold into the main file (it keeps
    rolling partitions; nothing is lost). The store lags the collector by at most its
    ``roll-interval``. If the main file is briefly held by a fold, or by a writer that does
    not roll, this waits up to ``wait_s`` seconds, then raises one clear
    :class:`TransportError`; so does a path with no store at all.
    """
    p = Path(path)
    deadline = time.monotonic() + wait_s
    while True:
        con = duckdb.connect(":memory:")
        try:
            _attach_all(con, p)
            return con
        except _Retry as r:
            con.close()
            if time.monotonic() >= deadline:
                raise TransportError(f"duckdb {p}: {r.why}") from None
            time.sleep(0.1)
        except BaseException:
            con.close()
            raise


class _Retry(Exception):
    def __init__(self, why: str) -> None:
        self.why = why


def _attach_all(con: duckdb.DuckDBPyConnection, p: Path) -> None:
    sources: list[str] = []
    folded: set[str] = set()
    parts = closed_parts(p)
    if p.exists():
        try:
            con.execute(f"ATTACH {_sql_str(p)} AS main_store (READ_ONLY)")
        except duckdb.Error as exc:
            if is_lock_conflict(exc):
                raise _Retry(f"in use by {lock_holder(exc)} (a collector folding partitions, or one writing "
                             "without roll-interval)") from None
            raise TransportError(f"duckdb {p}: {' '.join(str(exc).split())}") from exc
        sources.append("main_store")
        has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'main_store' "
                          "AND table_name = '_folded_parts'").fetchone()
        if has and has[0]:
            folded = {r[0] for r in con.execute("SELECT name FROM main_store._folded_parts").fetchall()}
    elif not parts and parts_dir(p).is_dir():
        raise TransportError(f"duckdb {p}: no data yet: the collector has not closed its first partition "
                             "(it does every roll-interval, 60 s by default); try again then")
    elif not parts:
        raise TransportError(f"duckdb {p}: no telemetry store here (no such file and no {parts_dir(p).name}/); "
                             "expected the path of a collector's duckdb sink")
    for i, part in enumerate(parts):
        if part.name in folded:
            continue  # folded, its file not yet deleted: counted once, in the main file
        try:
            con.execute(f"ATTACH {_sql_str(part)} AS part_{i} (READ_ONLY)")
        except duckdb.Error as exc:
            if not part.exists():
                raise _Retry("partitions changed while opening (a fold ran); retrying") from None
            raise TransportError(f"duckdb {part}: {' '.join(str(exc).split())}") from exc
        sources.append(f"part_{i}")
    for t in TABLES:
        union = " UNION ALL ".join(f"SELECT * FROM {s}.{t}" for s in sources)
        con.execute(f"CREATE TEMP VIEW {t} AS {union}")
