"""Time-series reads from a telemetry store, downsampled in the database (the console's API).

One series is (target, name, tag filter): ``name`` is the schema path without keys
(``interfaces/interface/state/counters/in-octets``), the tags pick the instance
(``interface_name=eth3``). The window ``[start_ns, end_ns]`` is cut into ``points`` equal
buckets and each bucket aggregated by DuckDB (``mean``/``max``/``min``/``last``, or ``rate``:
the per-second increase of a counter, a counter reset counted as no increase), so a day of 1 s
samples (86,400 rows) comes back as a few hundred points without moving the rows to Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import duckdb

from fabricscope.model.errors import ConfigError

AGGREGATES: tuple[str, ...] = ("mean", "max", "min", "last", "rate")
_SQL_AGG = {"mean": "avg(v)", "max": "max(v)", "min": "min(v)", "last": "arg_max(v, ts_ns)",
            "rate": "avg(r)"}


def series_names(con: duckdb.DuckDBPyConnection, limit: int = 1000) -> list[dict[str, Any]]:
    """Every series name with how many targets report it."""
    rows = con.execute("SELECT name, count(DISTINCT target) FROM telemetry "
                       "WHERE value_num IS NOT NULL GROUP BY name ORDER BY name LIMIT ?",
                       [limit]).fetchall()
    return [{"name": n, "targets": int(c)} for n, c in rows]


def query_series(con: duckdb.DuckDBPyConnection, *, target: str, name: str,
                 tags: Mapping[str, str] | None = None, start_ns: int, end_ns: int,
                 points: int = 600, agg: str = "mean") -> dict[str, Any]:
    """The series downsampled to at most ``points`` buckets over ``[start_ns, end_ns]``."""
    if agg not in AGGREGATES:
        raise ConfigError(f"agg: expected one of {', '.join(AGGREGATES)}, got {agg!r}")
    if not 1 <= points <= 10_000:
        raise ConfigError(f"points: expected 1..10000, got {points!r}")
    if end_ns <= start_ns:
        raise ConfigError(f"end_ns: must be after start_ns ({start_ns}), got {end_ns}")
    step = max(1, -(-(end_ns - start_ns) // points))
    where = ["target = ?", "name = ?", "ts_ns BETWEEN ? AND ?", "value_num IS NOT NULL"]
    args: list[Any] = [target, name, start_ns, end_ns]
    for k, v in sorted((tags or {}).items()):
        if not k.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"tag: {k!r} is not a tag name")
        # the fragment as the store writes it (json.dumps) prunes most rows cheaply; the
        # JSON extract then makes the match exact
        where.append(f"contains(tags, ?) AND json_extract_string(tags, '$.{k}') = ?")
        args.extend([json.dumps({k: v})[1:-1], v])
    rate = ("(value_num - lag(value_num) OVER w) * 1e9 / nullif(ts_ns - lag(ts_ns) OVER w, 0)"
            if agg == "rate" else "NULL")
    sql = (f"WITH s AS (SELECT ts_ns, value_num AS v, {rate} AS r, tags FROM telemetry "
           f"WHERE {' AND '.join(where)} "
           + ("WINDOW w AS (PARTITION BY tags ORDER BY ts_ns)" if agg == "rate" else "")
           + ") SELECT (ts_ns - ?) // ? AS b, "
           + ("avg(CASE WHEN r >= 0 THEN r END)" if agg == "rate" else _SQL_AGG[agg])
           + ", count(*), count(DISTINCT tags) FROM s GROUP BY b ORDER BY b")
    rows = con.execute(sql, [*args, start_ns, step]).fetchall()
    return {
        "target": target, "name": name, "tags": dict(tags or {}),
        "instances": max((int(r[3]) for r in rows), default=0),
        "agg": agg, "start_ns": start_ns, "end_ns": end_ns, "step_ns": step,
        "raw_points": int(sum(int(r[2]) for r in rows)),
        "points": [[start_ns + int(b) * step + step // 2, None if v is None else float(v)]
                   for b, v, _, _ in rows],
    }


def is_counter(name: str) -> bool:
    """Cumulative counter (shown as a per-second rate) or gauge: OpenConfig puts counters
    under ``/counters/``; the queue leaves that count packets are cumulative too."""
    return "/counters/" in name or name.endswith(("-pkts", "-frames", "-errors", "-discards",
                                                  "-transitions", "-octets"))


def port_series(con: duckdb.DuckDBPyConnection, *, target: str, interface: str,
                start_ns: int, end_ns: int, points: int = 120, limit: int = 8
                ) -> list[dict[str, Any]]:
    """Every numeric series of one port over the window, downsampled like
    :func:`query_series` (counters as rates, gauges as maxima), those that moved first; at
    most ``limit``. The evidence drill-down of a telemetry finding."""
    if end_ns <= start_ns:
        raise ConfigError(f"end_ns: must be after start_ns ({start_ns}), got {end_ns}")
    step = max(1, -(-(end_ns - start_ns) // points))
    frag = json.dumps({"interface_name": interface})[1:-1]
    rows = con.execute(
        "WITH s AS (SELECT name, tags, ts_ns, value_num AS v, "
        "(value_num - lag(value_num) OVER w) * 1e9 / nullif(ts_ns - lag(ts_ns) OVER w, 0) AS r "
        "FROM telemetry WHERE target = ? AND ts_ns BETWEEN ? AND ? AND value_num IS NOT NULL "
        "AND contains(tags, ?) AND json_extract_string(tags, '$.interface_name') = ? "
        "WINDOW w AS (PARTITION BY name, tags ORDER BY ts_ns)) "
        "SELECT name, (ts_ns - ?) // ? AS b, avg(CASE WHEN r >= 0 THEN r END), max(v) "
        "FROM s GROUP BY name, b ORDER BY name, b",
        [target, start_ns, end_ns, frag, interface, start_ns, step]).fetchall()
    by: dict[str, list[list[Any]]] = {}
    for name, b, rate, peak in rows:
        v = rate if is_counter(name) else peak
        by.setdefault(name, []).append([start_ns + int(b) * step + step // 2,
                                        None if v is None else float(v)])
    out = []
    for name, pts in by.items():
        vals = [p[1] for p in pts if p[1] is not None]
        # a counter moved when it increased at all; a gauge when it changed
        moved = (any(v > 0 for v in vals) if is_counter(name)
                 else bool(vals) and max(vals) > min(vals))
        out.append({"name": name, "kind": "rate" if is_counter(name) else "max",
                    "unit": "/s" if is_counter(name) else "", "points": pts,
                    "moved": moved})
    out.sort(key=lambda d: (not d["moved"], d["name"]))
    return out[:limit]
