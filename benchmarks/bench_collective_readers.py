"""nccl-tests reader conformance (issue 16, target "every public nccl-tests sample parses,
with avg busbw equal to the file's own line").

    python benchmarks/bench_collective_readers.py [FOLDER ...]

Reads every file of the folders (default: tests/data/collective, the real public samples
named in its README.md; tests/data/collective_slownode holds one run trimmed to its six
largest sizes under the full run's footer, which the reader rightly reports as a mismatch) with
``read_collective_file``; per file: runs found, collective, rows, the file's own
``# Avg bus bandwidth`` beside the reader's recomputation, and whether they agree within the
printed rounding. Point it at your own outputs to check them the same way. Prints a table,
writes benchmarks/results/collective_readers.json.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from fabricscope.collective import read_collective_file  # noqa: E402
from fabricscope.model.errors import FabricscopeError  # noqa: E402

_SKIP = {".md", ".py", ".json"}


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or [REPO / "tests/data/collective"]
    files = sorted(p for d in folders for p in d.iterdir()
                   if p.is_file() and (p.suffix not in _SKIP or p.name.endswith(".md.txt"))
                   and p.name != "README.md")
    rows, with_avg, agree = [], 0, 0
    t0 = time.perf_counter()
    for p in files:
        try:
            runs = read_collective_file(str(p))
        except FabricscopeError as exc:
            rows.append({"file": p.name, "error": str(exc)})
            continue
        for k, r in enumerate(runs):
            ok = None
            if r.avg_busbw_file is not None:
                with_avg += 1
                ok = bool(r.avg_matches)
                agree += ok
            rows.append({"file": p.name, "run": k, "collective": r.collective, "rows": len(r.rows),
                         "ranks": r.ranks, "avg_file": r.avg_busbw_file,
                         "avg_recomputed": r.avg_busbw_recomputed, "agrees": ok,
                         "truncated": r.truncated, "errors": len(r.errors)})
    took = time.perf_counter() - t0
    print(f"{'file':48} {'run':>3} {'collective':14} {'rows':>4} {'avg file':>10} {'recomputed':>10} agrees")
    for r in rows:
        if "error" in r:
            print(f"{r['file'][:48]:48} error: {r['error']}")
            continue
        rec = r["avg_recomputed"]
        print(f"{r['file'][:48]:48} {r['run']:>3} {r['collective']:14} {r['rows']:>4} "
              f"{r['avg_file'] if r['avg_file'] is not None else '-':>10} "
              f"{f'{rec:.4f}' if rec is not None else '-':>10} {r['agrees'] if r['agrees'] is not None else '-'}")
    print(f"\n{len(files)} files, {sum('run' in r for r in rows)} runs; {agree} of {with_avg} runs with a "
          f"numeric Avg bus bandwidth line agree with the recomputation; {took * 1e3:.0f} ms")
    out = REPO / "benchmarks/results/collective_readers.json"
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "files": len(files), "runs_with_avg": with_avg, "agree": agree,
                               "seconds": took, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
