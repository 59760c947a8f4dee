"""Opening the embedded DuckDB file: one place that creates the schema and maps errors."""

from __future__ import annotations

from pathlib import Path

import duckdb

from fabricscope.model.errors import TransportError


def open_db(path: str | Path, schema: str) -> duckdb.DuckDBPyConnection:
    """Connect to ``path`` (``":memory:"`` for tests) and create ``schema`` if missing.

    DuckDB errors (a locked or corrupt file, a schema clash) become a
    :class:`~fabricscope.model.errors.TransportError` naming the file.
    """
    try:
        con = duckdb.connect(str(path))
        con.execute(schema)
    except duckdb.Error as exc:
        raise TransportError(f"duckdb {path}: {exc}") from exc
    return con
