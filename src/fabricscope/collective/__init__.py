"""Collective health: read nccl-tests / NCCL Inspector / NCCL_DEBUG output, analyze the busbw
curve against an expectation, detect changes over repeated runs.

Never imports the simulator, the twin, DuckDB, grpc or asyncio: the expected busbw arrives as a
plain mapping (the CLI asks :mod:`fabricscope.twin.collective_twin` for it), the storage lives
in :mod:`fabricscope.store.collective`.
"""

from __future__ import annotations

from fabricscope.collective.analysis import (
    RunAnalysis,
    RunSummary,
    SizeAnalysis,
    analyze_run,
    bus_factor,
    expected_from_flat,
    summarize_run,
)
from fabricscope.collective.inspector import InspectorRecord, read_inspector, runs_from_inspector
from fabricscope.collective.model import COLLECTIVES, CollectiveRun, Placement, RankInfo, SizeRow
from fabricscope.collective.nccl_debug import NcclTopology, parse_nccl_debug
from fabricscope.collective.nccl_tests import (
    collective_from_name,
    parse_nccl_tests,
    read_nccl_tests,
)
from fabricscope.collective.watch import Change, detect_changes, robust_baseline

__all__ = [
    "COLLECTIVES",
    "Change",
    "CollectiveRun",
    "InspectorRecord",
    "NcclTopology",
    "Placement",
    "RankInfo",
    "RunAnalysis",
    "RunSummary",
    "SizeAnalysis",
    "SizeRow",
    "analyze_run",
    "bus_factor",
    "collective_from_name",
    "detect_changes",
    "expected_from_flat",
    "parse_nccl_debug",
    "parse_nccl_tests",
    "read_collective_file",
    "read_inspector",
    "read_nccl_tests",
    "robust_baseline",
    "runs_from_inspector",
    "summarize_run",
]


def read_collective_file(path: str, *, collective: str | None = None) -> list[CollectiveRun]:
    """Read nccl-tests text or NCCL Inspector JSONL, told apart by the first non-blank line
    (``{`` starts Inspector JSON)."""
    from pathlib import Path

    from fabricscope.model.errors import TraceFormatError

    p = Path(path)
    try:
        with p.open(encoding="utf-8", errors="replace") as fh:
            first = next((ln.strip() for ln in fh if ln.strip()), "")
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read ({exc.strerror})") from None
    if first.startswith("{"):
        return read_inspector(p)
    return read_nccl_tests(p, collective=collective)
