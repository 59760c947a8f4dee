"""Trace readers (pure parsing of bytes/objects; thin ``read_*`` wrappers open files).

``read_paths`` takes files or folders of any supported format and returns one
:class:`ReadResult`; a file that cannot be read is listed in ``unused`` with the reason and
the others still count.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.bytedance import parse_bytedance, read_bytedance
from fabricscope.straggler.readers.common import ReadResult
from fabricscope.straggler.readers.compact import (
    format_compact_lines,
    parse_compact_lines,
    parse_compact_parquet,
    read_compact,
    write_compact,
)
from fabricscope.straggler.readers.kineto import load_chrome_trace, parse_kineto, read_kineto
from fabricscope.straggler.table import OpTable, concat

__all__ = [
    "ReadResult",
    "format_compact_lines",
    "load_chrome_trace",
    "parse_bytedance",
    "parse_compact_lines",
    "parse_compact_parquet",
    "parse_kineto",
    "read_bytedance",
    "read_compact",
    "read_file",
    "read_kineto",
    "read_paths",
    "write_compact",
]

_SKIP_NAMES = ("truth", "ground-truth", "meta-", "ms-", "mw-", "readme", "license", "inventory",
               "placement")


def _kind(p: Path) -> str | None:
    name = p.name.lower()
    if any(name.startswith(s) or s in name for s in _SKIP_NAMES[:2]) or \
            any(name.startswith(s) for s in _SKIP_NAMES[2:]):
        return None
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "compact"
    if name.endswith((".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")):
        return "kineto"
    if name.endswith(".parquet"):
        return "parquet"
    return None


def read_file(path: str | Path) -> ReadResult:
    """Read one trace file, choosing the reader from its name (and Parquet columns)."""
    p = Path(path)
    kind = _kind(p)
    if kind == "compact":
        return read_compact(p)
    if kind == "kineto":
        return read_kineto(p)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            cols = pq.read_schema(p).names
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TraceFormatError(f"{p}: not a readable Parquet file ({exc})") from exc
        return read_bytedance(p) if "optype" in cols else read_compact(p)
    raise TraceFormatError(f"{p}: unknown trace format (expected .json[.gz], .jsonl[.gz] or "
                           f".parquet)")


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, plus every trace file inside the folders named (sorted)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and _kind(f)))
        elif p.exists():
            out.append(p)
        else:
            raise TraceFormatError(f"{p}: no such file or folder")
    return out


def read_paths(paths: Iterable[str | Path]) -> ReadResult:
    """Read every trace under ``paths`` into one table; unreadable files go to ``unused``.

    Also checks rank coverage: ranks named in communication groups (or below a reported
    ``world_size``) without any trace are reported as missing.
    """
    tables: list[OpTable] = []
    warnings: list[str] = []
    unused: list[str] = []
    world = 0
    meta: dict[str, object] = {}
    files = expand(paths)
    table_files: list[Path] = []
    if not files:
        raise TraceFormatError(f"no trace files found under {', '.join(map(str, paths))}")
    for f in files:
        try:
            res = read_file(f)
        except (TraceFormatError, OSError) as exc:
            msg = str(exc)
            unused.append(msg if msg.startswith(str(f)) else f"{f}: {msg}")
            continue
        if len(res.table) == 0:
            unused.append(f"{f}: no usable operators")
        tables.append(res.table)
        table_files.append(f)
        warnings.extend(res.warnings)
        unused.extend(res.unused)
        world = max(world, int(str(res.meta.get("world_size", 0) or 0)))
        for k, v in res.meta.items():
            if k not in ("rank",):
                meta.setdefault(k, v)
    if not tables:
        raise TraceFormatError("no readable trace files: " + "; ".join(unused))
    # Kineto files are one rank each; any other file is a whole job. Two whole jobs share
    # rank numbers, so mixing them would be nonsense.
    whole = [(f, t.job) for f, t in zip(table_files, tables, strict=True) if _kind(f) != "kineto"]
    if len({j for _, j in whole}) > 1:
        names = ", ".join(f"{f.name} ({j})" for f, j in whole[:6])
        raise TraceFormatError(f"several jobs given ({names}): analyze one job at a time")
    # One job written twice (the twin writes kineto/ and trace.jsonl; a hook may write both):
    # a Kineto file whose rank a whole-job file already holds is read once, not doubled.
    if whole and len(whole) < len(tables):
        held: set[int] = set()
        for f, t in zip(table_files, tables, strict=True):
            if _kind(f) != "kineto":
                held.update(t.ranks.tolist())
        keep = [i for i, (f, t) in enumerate(zip(table_files, tables, strict=True))
                if _kind(f) != "kineto" or not held.intersection(t.ranks.tolist())]
        if len(keep) < len(tables):
            src = ", ".join(str(f) for f, _ in whole[:3])
            dup = [str(table_files[i]) for i in range(len(tables)) if i not in keep]
            unused.append(f"{len(dup)} Kineto file(s) ({', '.join(dup[:2])}"
                          f"{' ...' if len(dup) > 2 else ''}) hold ranks also in {src}; "
                          f"each operator is read once, from {src}")
            tables = [tables[i] for i in keep]
            table_files = [table_files[i] for i in keep]
    job = tables[0].job if len(tables) == 1 else (files[0].parent.name or tables[0].job)
    if job in ("kineto", "traces", "."):
        job = files[0].parent.parent.name or job
    table = concat(tables, job=job)
    present = set(table.ranks.tolist())
    expected: set[int] = set(range(world)) if world else set()
    for g in table.groups:
        expected.update(g)
    missing = sorted(expected - present)
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        warnings.append(f"missing rank(s) {shown}: no trace; collectives they joined are "
                        f"judged from the other members only")
    meta["missing_ranks"] = missing
    return ReadResult(table, warnings, unused, meta)
