"""``fabricscope gnmi query``: SQL over a collector's DuckDB store, also while it collects."""

from __future__ import annotations

from pathlib import Path

import typer

_QUERY_HELP = """Run SQL over the telemetry store of a duckdb sink, also while 'gnmi collect' is writing it.

The store is opened read-only through its closed partitions (the collector rolls one every
roll-interval, 60 s by default) and its main file, behind two views: telemetry and findings
(schema in docs/telemetry.md). Without SQL, prints a summary. Data reaches readers at the
next roll; a store written with roll-interval 0 is locked until that collector stops.

For example, with a collector writing telemetry.duckdb:

  fabricscope gnmi query telemetry.duckdb

  fabricscope gnmi query telemetry.duckdb "SELECT target, count(*) AS n FROM telemetry GROUP BY target" --format csv
"""

_SUMMARY = """
SELECT 'telemetry' AS "table", count(*) AS "rows", count(DISTINCT target) AS devices,
       min(ts_ns) AS first_ts_ns, max(ts_ns) AS last_ts_ns FROM telemetry
UNION ALL
SELECT 'findings', count(*), count(DISTINCT subject), min(start_ns), max(end_ns) FROM findings
"""


def register(gnmi: typer.Typer) -> None:
    """Add ``query`` to the ``gnmi`` command group."""

    @gnmi.command("query", help=_QUERY_HELP.replace("[", "\\["))
    def query_cmd(
        db: Path = typer.Argument(..., help="Path of the duckdb sink (its 'path' in the collector config)."),
        sql: str | None = typer.Argument(None, help="SQL over the views telemetry and findings (default: a summary)."),
        fmt: str = typer.Option("table", "--format", help="table | csv | jsonl"),
        limit: int = typer.Option(1000, "--limit", min=1, help="Print at most this many rows."),
        wait: float = typer.Option(10.0, "--wait", min=0.0, help="Seconds to wait while a fold holds the main file."),
    ) -> None:
        import csv
        import json
        import math
        import sys

        import duckdb

        from fabricscope.model.errors import ConfigError
        from fabricscope.store.telemetry import open_readonly

        if not math.isfinite(wait):
            raise ConfigError(f"--wait: expected a finite number of seconds, got {wait}")
        if fmt not in ("table", "csv", "jsonl"):
            raise ConfigError(f"--format: expected table|csv|jsonl, got {fmt!r}")
        con = open_readonly(db, wait_s=wait)
        try:
            try:
                cur = con.execute(sql or _SUMMARY)
                cols = [d[0] for d in cur.description or []]
                rows = cur.fetchmany(limit)
                more = bool(cur.fetchone())
            except duckdb.Error as exc:
                raise ConfigError(f"SQL: {' '.join(str(exc).split())}") from None
        finally:
            con.close()
        if fmt == "csv":
            w = csv.writer(sys.stdout)
            w.writerow(cols)
            w.writerows(rows)
        elif fmt == "jsonl":
            for r in rows:
                row = {c: (None if isinstance(v, float) and not math.isfinite(v) else v)
                       for c, v in zip(cols, r, strict=True)}  # strict JSON: null, not NaN
                typer.echo(json.dumps(row, default=str, allow_nan=False))
        else:
            from rich.console import Console
            from rich.table import Table

            tbl = Table(*cols)
            for r in rows:
                tbl.add_row(*("" if v is None else str(v) for v in r))
            Console(highlight=False).print(tbl)
        if more:
            typer.echo(f"(first {limit} rows; --limit to see more)", err=True)
