"""Fleet-scale optics: read + grade + predict end to end, streamed, at 1k / 3k / 10k modules.

Issue 12's target: "grade + predict 10,000 modules x 8 lanes x 21 days < 60 s". Each fleet is
written once with ``write_fleet`` (21 days, 10-minute samples, seed 1) under ``--root`` (about
4.2 GB at 10,000 modules; free space is checked first) and reused by later runs. Every
measurement runs in a child process, so its peak RSS (``getrusage``: the process and, with
worker processes, the largest child) is its own. Modes:

* ``stream``: :func:`fabricscope.optics.stream.stream_features` (read + features, ``--workers``
  processes for the features), then ``grade_fleet`` and ``predict_fleet`` on them;
* ``memory`` (up to ``--memory-max`` modules): ``read_history`` + ``lane_features`` +
  ``grade_fleet`` + ``predict_fleet``, the in-memory path, for comparison.

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


def _measure(folder: Path, mode: str, workers: int) -> dict[str, Any]:
    """One end-to-end run in this process (the child)."""
    from fabricscope.optics.features import lane_features
    from fabricscope.optics.grade import grade_fleet
    from fabricscope.optics.predict import default_model, predict_fleet
    from fabricscope.optics.readers.links import read_links
    from fabricscope.optics.readers.table import read_history
    from fabricscope.optics.stream import stream_features

    path = folder / "history.parquet"
    model = default_model()
    t0 = time.perf_counter()
    peers, _ = read_links(folder / "links.csv")
    out: dict[str, Any] = {"mode": mode, "workers": workers if mode == "stream" else 1}
    if mode == "stream":
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
    out["rows"] = int(rows)
    out["modules"] = len(h.modules)
    out["lanes"] = len(f)
    out["flagged"] = sum(1 for m in p.modules if m.predicted_failure)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    out["child_peak_rss_gb"] = round(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, 2)
    return out


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
    ap.add_argument("--delete", action="store_true", help="delete the fleets afterwards")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(_measure(Path(a.measure), a.mode, a.workers)))
        return
    root = Path(a.root)
    runs: list[dict[str, Any]] = []
    for n in [int(x) for x in a.sizes.split(",") if x.strip()]:
        folder, gen_s = _fleet(root, n)
        size_gb = (folder / "history.parquet").stat().st_size / 1e9
        modes = [("stream", a.workers)] + ([("memory", 1)] if n <= a.memory_max else [])
        for mode, w in modes:
            r = _child(folder, mode, w, a.timeout_s)
            r.update(fleet_modules=n, parquet_gb=round(size_gb, 2),
                     generate_s=None if gen_s is None else round(gen_s, 1))
            runs.append(r)
            print(json.dumps(r), file=sys.stderr)
        if a.delete:
            shutil.rmtree(folder)
    print(f"{'modules':>8} {'rows':>12} {'mode':>8} {'w':>2} {'read+feat s':>11} {'grade s':>8} "
          f"{'predict s':>9} {'total s':>8} {'rss GB':>7} {'child GB':>8}")
    for r in runs:
        if "error" in r:
            print(f"{r['fleet_modules']:>8} {'':>12} {r['mode']:>8}  {r['error']}")
            continue
        rf = r.get("read_features_s", (r.get("read_s") or 0) + (r.get("features_s") or 0))
        print(f"{r['fleet_modules']:>8} {r['rows']:>12,} {r['mode']:>8} {r['workers']:>2} "
              f"{rf:>11.1f} {r['grade_s']:>8.1f} {r['predict_s']:>9.1f} {r['total_s']:>8.1f} "
              f"{r['peak_rss_gb']:>7.2f} {r['child_peak_rss_gb']:>8.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {"target": "grade + predict 10,000 modules x 8 lanes x 21 days < 60 s",
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(),
                       "load_average_at_end": list(os.getloadavg())},
           "fleet": {"days": 21, "sample_s": 600, "seed": 1}, "runs": runs}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
