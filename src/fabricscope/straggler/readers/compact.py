"""The compact fabricscope op-timing format (JSON lines or Parquet of ``OpTiming``): parse/write.

One JSON object per line (docs/straggler.md)::

    {"format": "fabricscope-optiming", "version": 1, "job": "gpt-7b"}        # optional header
    {"rank": 3, "iteration": 12, "op": "allreduce", "group": [0,1,2,3], "seq": 0,
     "t_start_ns": 1700000000000, "t_end_ns": 1700000420000, "bytes": 268435456,
     "stage": 0, "mb": -1}

``stage`` and ``mb`` (micro-batch) are optional. ``job`` may appear per line. A framework hook
emits a line per operator at its end: no tracing library, one ``json.dumps`` per op.
Parquet uses the same column names (``group`` a list of ints).
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.common import (
    MAX_COUNT,
    MAX_DURATION_NS,
    MAX_I32,
    MAX_RANK,
    MAX_TIME_NS,
    ReadResult,
    WarningLog,
    as_int,
    as_ranks,
    clip,
    duplicate_columns,
    show,
)
from fabricscope.straggler.table import OpTable, TableBuilder

FORMAT = "fabricscope-optiming"
VERSION = 1
_REQUIRED = ("rank", "iteration", "op", "seq", "t_start_ns", "t_end_ns")


def _text(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} {show(value)} is not a string")
    return value


def _row(b: TableBuilder, obj: dict[str, Any]) -> int:
    """Add one operator; ``ValueError`` naming the field when a value is missing or wrong."""
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    start = as_int(obj["t_start_ns"], "t_start_ns", -MAX_TIME_NS, MAX_TIME_NS)
    end = as_int(obj["t_end_ns"], "t_end_ns", -MAX_TIME_NS, MAX_TIME_NS + MAX_DURATION_NS)
    if end < start:
        raise ValueError(f"t_end_ns {end} < t_start_ns {start}")
    if end - start > MAX_DURATION_NS:
        raise ValueError(f"t_end_ns - t_start_ns = {end - start} ns is not a plausible duration")
    raw_group = obj.get("group")
    group = () if raw_group is None else as_ranks(raw_group, "group")
    rank = as_int(obj["rank"], "rank", 0, MAX_RANK)
    nbytes, stage, mb = obj.get("bytes"), obj.get("stage"), obj.get("mb")
    b.add(
        rank=rank, iteration=as_int(obj["iteration"], "iteration", 0, MAX_I32),
        op=_text(obj, "op"), group=group, seq=as_int(obj["seq"], "seq", 0, MAX_COUNT),
        start=start, end=end, nbytes=0 if nbytes is None else as_int(nbytes, "bytes", 0, MAX_COUNT),
        stage=-1 if stage is None else as_int(stage, "stage", -1, MAX_RANK),
        mb=-1 if mb is None else as_int(mb, "mb", -1, MAX_I32),
    )
    return rank


def _header(obj: dict[str, Any], where: str, b: TableBuilder, meta: dict[str, object],
            log: WarningLog) -> None:
    version = obj.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        log.add(f"{where}: format version {show(version)} is not an integer; reading as "
                f"version {VERSION}")
    elif version > VERSION:
        log.add(f"{where}: format version {version} is newer than {VERSION}; reading what is "
                f"known")
    if "job" in obj:
        b.job = _text(obj, "job")
    for k, v in obj.items():
        if k in ("format", "version", "job"):
            continue
        if k == "world_size":
            # read_paths sizes its missing-rank check from this: only a plausible count.
            try:
                v = as_int(v, "world_size", 0, MAX_RANK + 1)
            except ValueError as exc:
                log.add(f"{where}: header {exc}; ignored")
                continue
        meta[k] = v


def parse_compact_lines(lines: Iterable[str | bytes], *, source: str = "<lines>") -> ReadResult:
    """Parse compact JSON lines; a malformed line becomes a warning naming ``source:line``.

    Never raises on bad content: every line is either an operator or a warning (the first
    ``MAX_WARNINGS`` verbatim, then a count).
    """
    b = TableBuilder("job")
    warnings: list[str] = []
    log = WarningLog(warnings, source)
    meta: dict[str, object] = {}
    for lineno, raw in enumerate(lines, 1):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            if obj.get("format") == FORMAT:
                _header(obj, f"{source}:{lineno}", b, meta, log)
                continue
            if "job" in obj and b.job == "job":
                b.job = _text(obj, "job")
            rank = _row(b, obj)
            b.files.setdefault(rank, source)
        except (ValueError, TypeError, RecursionError) as exc:
            log.add(f"{source}:{lineno}: skipped line ({clip(str(exc), 100)})")
    log.close()
    return ReadResult(b.build(), warnings, [], meta)


def format_compact_lines(table: OpTable, *, header: dict[str, object] | None = None) -> str:
    """The compact JSON-lines text of ``table`` (header first)."""
    out = io.StringIO()
    head: dict[str, object] = {"format": FORMAT, "version": VERSION, "job": table.job}
    head.update(header or {})
    out.write(json.dumps(head) + "\n")
    names, groups = table.op_names, table.groups
    for r, i, o, g, s, a, e, n, st, mb in zip(
        table.rank.tolist(), table.iteration.tolist(), table.op.tolist(), table.group.tolist(),
        table.seq.tolist(), table.start.tolist(), table.end.tolist(), table.nbytes.tolist(),
        table.stage.tolist(), table.mb.tolist(), strict=True,
    ):
        row: dict[str, object] = {"rank": r, "iteration": i, "op": names[o],
                                  "group": list(groups[g]), "seq": s, "t_start_ns": a,
                                  "t_end_ns": e, "bytes": n}
        if st >= 0:
            row["stage"] = st
        if mb >= 0:
            row["mb"] = mb
        out.write(json.dumps(row, separators=(",", ":")) + "\n")
    return out.getvalue()


def parse_compact_parquet(data: bytes, *, source: str = "<parquet>") -> ReadResult:
    """Parse the Parquet flavour of the compact format (same columns as the JSON lines)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        tb = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        duplicate_columns(tb.column_names, source)
        cols = set(tb.column_names)
        missing = [k for k in _REQUIRED if k not in cols]
        if missing:
            raise TraceFormatError(f"{source}: Parquet lacks column(s) {', '.join(missing)}")
        d = tb.to_pydict()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceFormatError(f"{source}: not a readable Parquet file "
                               f"({clip(str(exc), 100)})") from exc
    job = (tb.schema.metadata or {}).get(b"job", b"job").decode("utf-8", "replace")
    b = TableBuilder(job)
    warnings: list[str] = []
    log = WarningLog(warnings, source)
    for i in range(tb.num_rows):
        obj = {k: d[k][i] for k in d}
        try:
            rank = _row(b, obj)
            b.files.setdefault(rank, source)
        except (ValueError, TypeError) as exc:
            log.add(f"{source}: row {i}: skipped ({clip(str(exc), 100)})")
    log.close()
    return ReadResult(b.build(), warnings)


def compact_parquet_bytes(table: OpTable) -> bytes:
    """The compact Parquet bytes of ``table``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tb = pa.table({
        "rank": table.rank, "iteration": table.iteration,
        "op": pa.array([table.op_names[o] for o in table.op.tolist()]).dictionary_encode(),
        "group": pa.array([list(table.groups[g]) for g in table.group.tolist()],
                          type=pa.list_(pa.int32())),
        "seq": table.seq, "t_start_ns": table.start, "t_end_ns": table.end,
        "bytes": table.nbytes, "stage": table.stage, "mb": table.mb,
    }).replace_schema_metadata({"job": table.job, "format": FORMAT})
    sink = pa.BufferOutputStream()
    pq.write_table(tb, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def parse_compact_bytes(data: bytes, *, source: str) -> ReadResult:
    """Parse a compact trace's bytes: Parquet, gzip'd or plain JSON lines (by ``source``'s name)."""
    if source.endswith(".parquet"):
        return parse_compact_parquet(data, source=source)
    if source.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{source}: corrupt gzip ({exc})") from exc
    return parse_compact_lines(data.splitlines(), source=source)


def read_compact(path: str | Path) -> ReadResult:
    """Read a compact trace file (``.jsonl``, ``.jsonl.gz`` or ``.parquet``)."""
    p = Path(path)
    return parse_compact_bytes(p.read_bytes(), source=str(p))


def write_compact(table: OpTable, path: str | Path, *, header: dict[str, object] | None = None) -> None:
    """Write ``table`` as compact JSON lines (``.jsonl``/``.jsonl.gz``) or Parquet."""
    p = Path(path)
    if p.suffix == ".parquet":
        p.write_bytes(compact_parquet_bytes(table))
        return
    text = format_compact_lines(table, header=header).encode()
    p.write_bytes(gzip.compress(text, mtime=0) if p.suffix == ".gz" else text)
