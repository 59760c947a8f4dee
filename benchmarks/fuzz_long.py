"""The long fuzz run: every property test that uses ``tests/fuzzing.py`` for minutes, not 10k examples.

Finds the fuzz targets (the Hypothesis tests whose settings come from ``fuzz_settings()``),
then runs each for ``--minutes`` in batches of fresh seeds, counting the examples it really
tried, and prints a table (target, examples, minutes, crashes); writes
``benchmarks/results/fuzz_long.json``. A crash is any failure of the property (an exception
the target must not raise); the first one is printed with its reproducing seed.

    python benchmarks/fuzz_long.py --minutes 10           # every target, 10 min each
    python benchmarks/fuzz_long.py --minutes 1 --only wire # targets whose name contains 'wire'
    python benchmarks/fuzz_long.py --list
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SENTINEL = 10_007  # an example count nobody writes by hand: marks fuzz_settings() targets
BATCH = 2_000


def discover() -> list[tuple[str, Callable[..., Any]]]:
    """``(module::name, test)`` for every test built with ``fuzz_settings()``."""
    os.environ["FABRICSCOPE_FUZZ_EXAMPLES"] = str(SENTINEL)
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "src"))
    found: list[tuple[str, Callable[..., Any]]] = []
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        if "fuzz_settings" not in f.read_text():
            continue
        mod = importlib.import_module(f.stem)
        for name in dir(mod):
            obj = getattr(mod, name)
            hyp = getattr(obj, "hypothesis", None)
            st = getattr(obj, "_hypothesis_internal_use_settings", None)
            if name.startswith("test_") and hyp is not None and st is not None and st.max_examples == SENTINEL:
                found.append((f"{f.stem}::{name}", obj))
    return found


def run_target(test: Callable[..., Any], minutes: float) -> dict[str, Any]:
    from hypothesis import settings

    count = 0
    inner = test.hypothesis.inner_test  # type: ignore[attr-defined]

    def counting(*a: Any, **kw: Any) -> Any:
        nonlocal count
        count += 1
        return inner(*a, **kw)

    test.hypothesis.inner_test = counting  # type: ignore[attr-defined]
    base = test._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    t0 = time.monotonic()
    crashes: list[str] = []
    batch = 0
    try:
        while time.monotonic() - t0 < minutes * 60:
            batch += 1
            # Hypothesis reads these attributes at call time: a fresh seed and count per batch.
            test._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
                base, max_examples=BATCH, derandomize=False)
            test._hypothesis_internal_use_seed = batch  # type: ignore[attr-defined]
            try:
                test()
            except Exception as exc:  # the property failed: a crash to report
                crashes.append(f"seed {batch}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
                break
    finally:
        test.hypothesis.inner_test = inner  # type: ignore[attr-defined]
        test._hypothesis_internal_use_settings = base  # type: ignore[attr-defined]
    return {"examples": count, "minutes": round((time.monotonic() - t0) / 60, 2),
            "batches": batch, "crashes": len(crashes), "first_crash": crashes[:1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="minutes per target (default 10)")
    ap.add_argument("--only", default="", help="run targets whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_long.json"))
    args = ap.parse_args()
    targets = [(n, t) for n, t in discover() if args.only in n]
    if args.list or not targets:
        for n, _ in targets:
            print(n)
        if not targets:
            sys.exit("no fuzz targets found")
        return
    rows: dict[str, Any] = {}
    print(f"{'target':60s} {'examples':>10s} {'min':>6s} {'crashes':>7s}", flush=True)
    for name, test in targets:
        r = run_target(test, args.minutes)
        rows[name] = r
        print(f"{name:60s} {r['examples']:>10,d} {r['minutes']:>6.2f} {r['crashes']:>7d}", flush=True)
    out = Path(args.out)
    prev = json.loads(out.read_text()) if out.exists() else {}
    prev.update(rows)
    out.write_text(json.dumps(prev, indent=2) + "\n")
    print(f"wrote {out}")
    if any(r["crashes"] for r in rows.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
