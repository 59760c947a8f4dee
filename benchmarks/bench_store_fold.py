"""Cost of querying while collecting: rolling a DuckDB partition, folding it into the main
file, and opening the store read-only. Prints a table and writes benchmarks/results/store_fold.json.

    python benchmarks/bench_store_fold.py                 # 100k, 1M and 3M rows per partition
    python benchmarks/bench_store_fold.py --rows 1000000

A partition is what the collector writes in one roll-interval (rows = event rate x interval;
100k events/s x 60 s = 6M). The fold runs inside the collector's writer, so its time is how
long the writer stops taking batches from the bounded buffer once per roll.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from fabricscope.model.records import TelemetryEvent
from fabricscope.store.rolling import RollingTelemetryStore
from fabricscope.store.telemetry import open_readonly


def one(rows: int, batch: int = 50_000) -> dict[str, float]:
    d = Path(tempfile.mkdtemp())
    clock = [0.0]
    st = RollingTelemetryStore(d / "t.duckdb", roll_interval_s=1e9, clock=lambda: clock[0])
    tags = [{"interface_name": f"eth{i}"} for i in range(64)]
    t_write = 0.0
    for b0 in range(0, rows, batch):
        evs = [TelemetryEvent("/interfaces/interface/state/counters/in-octets", b0 + i, f"leaf-{i % 97:03d}",
                              tags[i % 64], float(i)) for i in range(min(batch, rows - b0))]
        t0 = time.perf_counter()
        st.write_events(evs)
        t_write += time.perf_counter() - t0
    t0 = time.perf_counter()
    st.roll()  # close + rename + fold
    t_roll = time.perf_counter() - t0
    t0 = time.perf_counter()
    con = open_readonly(d / "t.duckdb")
    row = con.execute("SELECT count(*) FROM telemetry").fetchone()
    con.close()
    t_open = time.perf_counter() - t0
    assert row is not None and row[0] == rows
    st.close()
    return {"rows": rows, "insert_s": t_write, "insert_rows_per_s": rows / t_write, "roll_and_fold_s": t_roll,
            "fold_rows_per_s": rows / t_roll, "open_readonly_count_s": t_open}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, action="append", help="rows per partition (repeatable)")
    args = ap.parse_args()
    results = [one(n) for n in (args.rows or [100_000, 1_000_000, 3_000_000])]
    print(f"{'rows':>10} {'insert rows/s':>14} {'roll+fold s':>12} {'fold rows/s':>12} {'open+count s':>13}")
    for r in results:
        print(f"{r['rows']:>10,} {r['insert_rows_per_s']:>14,.0f} {r['roll_and_fold_s']:>12.2f} "
              f"{r['fold_rows_per_s']:>12,.0f} {r['open_readonly_count_s']:>13.3f}")
    out = Path(__file__).parent / "results" / "store_fold.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()}, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
