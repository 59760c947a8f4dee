"""Fleet-scale optics: read + grade + predict end to end, streamed, at 1k / 3k / 10k modules.

Issue 12's target: "grade + predict 10,000 modules x 8 lanes x 21 days < 60 s". Each fleet is
written once with ``write_fleet`` (21 days, 10-minute samples, seed 1) under ``--root`` (about
4.2 GB at 10,000 modules; free space is checked first) and reused by later runs. Every
measurement runs in a child process, so its peak RSS (``getrusage``) is its own; the
feature workers are threads of that process. Modes:

* ``stream``: :func:`fabricscope.optics.stream.stream_features` (read + features, ``--workers``
  processes for the features), then ``grade_fleet`` and ``predict_fleet`` on them;
* ``stream-dict``: the same on ``history_dict.parquet``, the same rows, columns and row
  groups rewritten with pyarrow's default dictionary encoding of the strings (``optics
  twin`` writes device / port / vendor / part number / media as plain strings, one per row,
  because its dictionaries repeat entries: what a file written by pandas, DuckDB or
  :func:`~fabricscope.optics.readers.table.write_history` would not do);
* ``memory`` (up to ``--memory-max`` modules): ``read_history`` + ``lane_features`` +
  ``grade_fleet`` + ``predict_fleet``, the in-memory path, for comparison.

Each run reports wall time, CPU seconds (user + system, of this process, its threads and any
worker processes, and CPU per row), page faults, peak RSS and the load average of the machine before and after
(the machine is shared: wall times move with the other jobs, CPU seconds much less).
The compiled kernels are warmed (numba's on-disk cache) by a small run first.

Prints a table and writes ``benchmarks/results/optics_scale.json``.

    python benchmarks/bench_optics_scale.py --sizes 1000,3000,10000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "optics_scale.json"
#: bytes of Parquet per row written by write_fleet (4.21 GB / 236 M rows), with headroom
_BYTES_PER_ROW = 20


def _fleet(root: Path, modules: int) -> tuple[Path, float | None]:
    """The fleet folder of ``modules`` modules, written now if absent (seconds, or None)."""
    from fabricscope.twin.optics_fleet import FleetConfig, write_fleet

    d = root / f"m{modules}"
    if (d / "truth.json").exists() and (d / "history.parquet").exists():
        return d, None
    root.mkdir(parents=True, exist_ok=True)
    need = modules * 8 * 21 * 144 * _BYTES_PER_ROW * 1.3
    free = shutil.disk_usage(root).free
    if free < need:
        raise SystemExit(f"{root}: {free / 1e9:.1f} GB free, the {modules}-module fleet needs "
                         f"about {need / 1e9:.1f} GB")
    t0 = time.perf_counter()
    write_fleet(FleetConfig(modules=modules, days=21, sample_s=600), d, seed=1)
    return d, time.perf_counter() - t0


def _recoded(folder: Path) -> Path:
    """``history_dict.parquet``: the fleet's table rewritten row group by row group with the
    strings dictionary-encoded (same rows, columns, row groups, codec and metric encodings)."""
    import pyarrow.parquet as pq

    from fabricscope.optics.history import ALL_METRICS, COLUMNS, IDENTITY, THRESHOLD_COLUMNS

    out = folder / "history_dict.parquet"
    if out.exists():
        return out
    src = pq.ParquetFile(folder / "history.parquet")
    tmp = out.with_suffix(".part")
    first = src.read_row_group(0)
    writer = pq.ParquetWriter(
        tmp, first.schema, compression="lz4",
        use_dictionary=["device", "port", *IDENTITY, *THRESHOLD_COLUMNS],
        write_statistics=["ts", "device", "port", "lane", "serial"],
        column_encoding={"ts": "DELTA_BINARY_PACKED", "lane": "DELTA_BINARY_PACKED",
                         **{m: "BYTE_STREAM_SPLIT" for m in ALL_METRICS}})
    try:
        for i in range(src.num_row_groups):
            t = first if i == 0 else src.read_row_group(i)
            writer.write_table(t.select(list(COLUMNS)), row_group_size=max(1, t.num_rows))
    finally:
        writer.close()
    tmp.replace(out)
    return out


def _measure(folder: Path, mode: str, workers: int) -> dict[str, Any]:
    """One end-to-end run in this process (the child)."""
    from fabricscope.optics.features import lane_features
    from fabricscope.optics.grade import grade_fleet
    from fabricscope.optics.predict import default_model, predict_fleet
    from fabricscope.optics.readers.links import read_links
    from fabricscope.optics.readers.table import read_history
    from fabricscope.optics.stream import stream_features

    path = folder / ("history_dict.parquet" if mode == "stream-dict" else "history.parquet")
    model = default_model()
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    peers, _ = read_links(folder / "links.csv")
    streamed = mode.startswith("stream")
    out: dict[str, Any] = {"mode": mode, "workers": workers if streamed else 1}
    if streamed:
        sf = stream_features(str(path), peers=peers, workers=workers)
        h, f, rows = sf.history, sf.features, sf.rows
        out["read_features_s"] = round(time.perf_counter() - t0, 2)
    else:
        h = read_history(path)
        rows = len(h)
        out["read_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        f = lane_features(h, at_ns=int(h.ts.max()), peers=peers)
        out["features_s"] = round(time.perf_counter() - t1, 2)
    t2 = time.perf_counter()
    g = grade_fleet(h, at_ns=f.at_ns, peers=peers, features=f)
    out["grade_s"] = round(time.perf_counter() - t2, 2)
    t3 = time.perf_counter()
    p = predict_fleet(h, model, at_ns=f.at_ns, peers=peers, grades=g)
    out["predict_s"] = round(time.perf_counter() - t3, 2)
    out["total_s"] = round(time.perf_counter() - t0, 2)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, if any
    user = ru.ru_utime - ru0.ru_utime + ch.ru_utime - ch0.ru_utime
    sys_s = ru.ru_stime - ru0.ru_stime + ch.ru_stime - ch0.ru_stime
    out["cpu_user_s"] = round(user, 2)
    out["cpu_sys_s"] = round(sys_s, 2)
    out["cpu_us_per_row"] = round((user + sys_s) / max(1, int(rows)) * 1e6, 3)
    out["minor_faults"] = int(ru.ru_minflt - ru0.ru_minflt)
    out["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    out["rows"] = int(rows)
    out["modules"] = len(h.modules)
    out["lanes"] = len(f)
    out["flagged"] = sum(1 for m in p.modules if m.predicted_failure)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    return out


def _warm(root: Path) -> None:
    """Compile (or load from numba's cache) the kernels on a small fleet, so that the
    measured runs do not include a first compilation (reported apart when it happens)."""
    d = root / "warm"
    if not (d / "history.parquet").exists():
        from fabricscope.twin.optics_fleet import FleetConfig, write_fleet

        write_fleet(FleetConfig(modules=20, days=2, sample_s=600), d, seed=1)
    t0 = time.perf_counter()
    r = _child(d, "stream", 2, 600)
    if "error" in r:
        raise SystemExit(f"warm-up run failed: {r['error']}")
    print(f"warm-up (kernels compiled or loaded): {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)


def _child(folder: Path, mode: str, workers: int, timeout_s: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--measure", str(folder), "--mode", mode,
           "--workers", str(workers)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": f"timed out after {timeout_s} s"}
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"mode": mode, "error": f"exit {r.returncode}: {tail}"}
    doc: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,3000,10000")
    ap.add_argument("--root", default="/tmp/fabricscope_optics_scale")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-max", type=int, default=3000,
                    help="largest fleet also run in memory (10k needs ~14 GB: OOM here)")
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--modes", default="stream,stream-dict,memory",
                    help="stream (the twin's file), stream-dict (strings dictionary-encoded), "
                    "memory (up to --memory-max modules)")
    ap.add_argument("--delete", action="store_true", help="delete the fleets afterwards")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(_measure(Path(a.measure), a.mode, a.workers)))
        return
    root = Path(a.root)
    runs: list[dict[str, Any]] = []
    want = [m.strip() for m in a.modes.split(",") if m.strip()]
    _warm(root)
    for n in [int(x) for x in a.sizes.split(",") if x.strip()]:
        folder, gen_s = _fleet(root, n)
        size_gb = (folder / "history.parquet").stat().st_size / 1e9
        if "stream-dict" in want:
            _recoded(folder)
        modes = [(m, a.workers) for m in ("stream", "stream-dict") if m in want]
        modes += [("memory", 1)] if "memory" in want and n <= a.memory_max else []
        for mode, w in modes:
            r = _child(folder, mode, w, a.timeout_s)
            r.update(fleet_modules=n, parquet_gb=round(size_gb, 2),
                     generate_s=None if gen_s is None else round(gen_s, 1))
            runs.append(r)
            print(json.dumps(r), file=sys.stderr)
        if a.delete:
            shutil.rmtree(folder)
    print(f"{'modules':>8} {'rows':>12} {'mode':>11} {'w':>2} {'read+feat s':>11} {'grade s':>8} "
          f"{'predict s':>9} {'total s':>8} {'CPU s':>6} {'us/row':>6} {'rss GB':>7} "
          f"{'load':>9}")
    for r in runs:
        if "error" in r:
            print(f"{r['fleet_modules']:>8} {'':>12} {r['mode']:>8}  {r['error']}")
            continue
        rf = r.get("read_features_s", (r.get("read_s") or 0) + (r.get("features_s") or 0))
        cpu = r["cpu_user_s"] + r["cpu_sys_s"]
        load = "/".join(f"{x:.1f}" for x in r["load_avg_1m"])
        print(f"{r['fleet_modules']:>8} {r['rows']:>12,} {r['mode']:>11} {r['workers']:>2} "
              f"{rf:>11.1f} {r['grade_s']:>8.1f} {r['predict_s']:>9.1f} {r['total_s']:>8.1f} "
              f"{cpu:>6.1f} {r['cpu_us_per_row']:>6.3f} {r['peak_rss_gb']:>7.2f} {load:>9}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {"target": "grade + predict 10,000 modules x 8 lanes x 21 days < 60 s",
           "command": "python benchmarks/bench_optics_scale.py " + " ".join(sys.argv[1:]),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(),
                       "load_average_at_end": list(os.getloadavg())},
           "fleet": {"days": 21, "sample_s": 600, "seed": 1}, "runs": runs}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
