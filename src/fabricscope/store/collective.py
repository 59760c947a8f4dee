"""DuckDB storage of ``collective watch`` samples: one row per benchmark run.

Table ``collective_watch``::

    ts_ns            BIGINT   when the run finished (Unix epoch ns)
    command          VARCHAR  the benchmark command line
    collective       VARCHAR  all_reduce, all_gather, ... (unknown when not named)
    ranks            INTEGER  NULL when unknown
    ok               BOOLEAN  the run printed a table and no failure line
    avg_busbw_gbs    DOUBLE   the file's "# Avg bus bandwidth" (else the mean of busbw printed)
    avg_time_us      DOUBLE   mean time over every size and placement
    max_time_us      DOUBLE   max latency: the largest time over sizes and placements
    time_std_us      DOUBLE   latency std: pooled within-size std of the placements' times
    sizes            INTEGER  sizes printed
    error            VARCHAR  the first failure line ('' when none)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from fabricscope.store.db import open_db

__all__ = ["SCHEMA", "CollectiveWatchStore", "WatchSample"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS collective_watch (
    ts_ns BIGINT NOT NULL, command VARCHAR NOT NULL, collective VARCHAR NOT NULL,
    ranks INTEGER, ok BOOLEAN NOT NULL, avg_busbw_gbs DOUBLE, avg_time_us DOUBLE,
    max_time_us DOUBLE, time_std_us DOUBLE, sizes INTEGER NOT NULL, error VARCHAR NOT NULL
);
"""

_COLS = ("ts_ns", "command", "collective", "ranks", "ok", "avg_busbw_gbs", "avg_time_us",
         "max_time_us", "time_std_us", "sizes", "error")


@dataclass(frozen=True)
class WatchSample:
    """One row of ``collective_watch`` (see the module docstring for the columns)."""

    ts_ns: int
    command: str
    collective: str
    ranks: int | None
    ok: bool
    avg_busbw_gbs: float | None
    avg_time_us: float | None
    max_time_us: float | None
    time_std_us: float | None
    sizes: int
    error: str = ""


class CollectiveWatchStore:
    """The ``collective_watch`` table in a DuckDB file (``":memory:"`` for tests)."""

    def __init__(self, path: str | Path, *, wait_s: float = 5.0) -> None:
        self.path = str(path)
        self._con = open_db(path, SCHEMA, wait_s=wait_s)

    def add(self, sample: WatchSample) -> None:
        """Append one sample."""
        self._con.execute(
            f"INSERT INTO collective_watch ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})",
            [getattr(sample, c) for c in _COLS])

    def samples(self, *, command: str | None = None) -> list[WatchSample]:
        """Every sample (of ``command`` when given), oldest first."""
        sql = f"SELECT {', '.join(_COLS)} FROM collective_watch"
        args: list[object] = []
        if command is not None:
            sql += " WHERE command = ?"
            args.append(command)
        rows = self._con.execute(sql + " ORDER BY ts_ns", args).fetchall()
        return [WatchSample(*r) for r in rows]

    def close(self) -> None:
        """Close the connection."""
        self._con.close()

    def __enter__(self) -> CollectiveWatchStore:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
