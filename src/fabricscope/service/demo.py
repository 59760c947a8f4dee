"""The main job: run every capability's part of the closed loop on an embedded default twin.

Parts run in order (the closed loop: every instrument on the twin joined into diagnosed
incidents; then each instrument on its own: simulator what-if, telemetry over gNMI, mesh
probing, straggler localization); each is a module ``fabricscope.service.demo_<part>`` with a ``run(...)``
function that prints its own summary and returns a JSON-able dict. The demo writes
``summary.json`` (and each part's plots) under the output folder.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from fabricscope.model.errors import ConfigError

PARTS: tuple[tuple[str, str], ...] = (
    ("loop", "Closed loop: faults on the twin -> instruments -> incidents -> root cause + action"),
    ("sim", "What-if: load balancing on a rail-optimized cluster (flow-level simulator)"),
    ("telemetry", "Streaming telemetry: the twin over real gNMI into the collector"),
    ("probe", "Mesh probing: localize an injected gray link"),
    ("straggler", "Training job: localize an injected slow NIC from per-rank traces"),
)


class _Part(Protocol):
    def __call__(
        self, *, seed: int, outdir: Path, echo: Callable[[str], None], quick: bool = False
    ) -> dict[str, object]: ...


def _load(part: str) -> _Part:
    run: _Part = importlib.import_module(f"fabricscope.service.demo_{part}").run
    return run


def run_demo(
    *,
    outdir: Path,
    seed: int = 7,
    parts: Sequence[str] | None = None,
    quick: bool = False,
    echo: Callable[[str], None] = print,
    progress: Callable[[str], AbstractContextManager[object]] | None = None,
) -> dict[str, Any]:
    """Run the selected demo parts (all by default) and write ``outdir/summary.json``.

    ``progress(title)`` gives a context manager held while a part runs (the CLI shows a
    spinner); each part's wall time is printed after it.
    """
    known = [p for p, _ in PARTS]
    chosen = list(parts) if parts else known
    for p in chosen:
        if p not in known:
            raise ConfigError(f"demo --part: unknown part {p!r}; choose from {', '.join(known)}")
    outdir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"seed": seed, "quick": quick, "parts": {}}
    for p, title in PARTS:
        if p not in chosen:
            continue
        echo("")
        echo(f"== {title} ==")
        fn = _load(p)
        t0 = time.perf_counter()
        part_dir = outdir / p
        part_dir.mkdir(parents=True, exist_ok=True)
        with progress(title) if progress is not None else nullcontext():
            result = fn(seed=seed, outdir=part_dir, echo=echo, quick=quick)
        result = dict(result)
        result["seconds"] = round(time.perf_counter() - t0, 2)
        echo(f"({p} part: {result['seconds']:.1f} s)")
        summary["parts"][p] = result
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    echo("")
    echo(f"Wrote {outdir / 'summary.json'} (and plots under {outdir}/<part>/).")
    return summary
