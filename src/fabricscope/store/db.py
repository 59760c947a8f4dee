"""Opening the embedded DuckDB file: one place that creates the schema and maps errors.

DuckDB lets one process write a file and, while it does, no other process open it, not even
read-only (an OS file lock). A lock conflict is therefore an expected condition, not a crash:
:func:`open_db` can wait for it to clear and otherwise says who holds the file.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb

from fabricscope.model.errors import TransportError

_PID = re.compile(r"\(PID (\d+)\)")


class StoreLockedError(TransportError):
    """The DuckDB file is held by another process (expected while a collector writes it)."""


def is_lock_conflict(exc: BaseException) -> bool:
    """True when ``exc`` is DuckDB refusing a file another process (or connection here) holds."""
    msg = str(exc).lower()
    return isinstance(exc, duckdb.Error) and (
        (isinstance(exc, duckdb.IOException) and "lock" in msg) or "file handle conflict" in msg)


def lock_holder(exc: BaseException) -> str:
    """``"process 1234"`` from DuckDB's lock message (``"another process"`` if it names none)."""
    if "file handle conflict" in str(exc).lower():
        return "another connection in this process"
    m = _PID.search(str(exc))
    return f"process {m.group(1)}" if m else "another process"


def open_db(path: str | Path, schema: str, *, read_only: bool = False, wait_s: float = 0.0,
            poll_s: float = 0.1) -> duckdb.DuckDBPyConnection:
    """Connect to ``path`` (``":memory:"`` for tests) and create ``schema`` if missing.

    A file locked by another process is retried for ``wait_s`` seconds, then reported in one
    line naming the file and the holder. Other DuckDB errors (a corrupt file, a schema clash)
    become a :class:`~fabricscope.model.errors.TransportError` naming the file.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            if not read_only:
                con.execute(schema)
            return con
        except duckdb.Error as exc:
            if is_lock_conflict(exc):
                if time.monotonic() < deadline:
                    time.sleep(poll_s)
                    continue
                raise StoreLockedError(
                    f"duckdb {path}: in use by {lock_holder(exc)} (DuckDB allows one process per file); "
                    "to read while a collector writes, give its duckdb sink a roll-interval and use "
                    "'fabricscope gnmi query' (docs/telemetry.md)") from None
            raise TransportError(f"duckdb {path}: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
