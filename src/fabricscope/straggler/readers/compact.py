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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.common import ReadResult
from fabricscope.straggler.table import OpTable, TableBuilder

FORMAT = "fabricscope-optiming"
VERSION = 1
_REQUIRED = ("rank", "iteration", "op", "seq", "t_start_ns", "t_end_ns")


def _row(b: TableBuilder, obj: dict[str, Any]) -> None:
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    start, end = int(obj["t_start_ns"]), int(obj["t_end_ns"])
    if end < start:
        raise ValueError(f"t_end_ns {end} < t_start_ns {start}")
    group = tuple(int(g) for g in (obj.get("group") or ()))
    b.add(
        rank=int(obj["rank"]), iteration=int(obj["iteration"]), op=str(obj["op"]), group=group,
        seq=int(obj["seq"]), start=start, end=end, nbytes=int(obj.get("bytes", 0) or 0),
        stage=int(obj.get("stage", -1)), mb=int(obj.get("mb", -1)),
    )


def parse_compact_lines(lines: Iterable[str | bytes], *, source: str = "<lines>") -> ReadResult:
    """Parse compact JSON lines; a malformed line becomes a warning naming ``source:line``."""
    b = TableBuilder("job")
    warnings: list[str] = []
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
                if int(obj.get("version", VERSION)) > VERSION:
                    warnings.append(f"{source}:{lineno}: format version {obj['version']} is "
                                    f"newer than {VERSION}; reading what is known")
                b.job = str(obj.get("job", b.job))
                meta.update({k: v for k, v in obj.items() if k not in ("format", "version")})
                continue
            if "job" in obj and b.job == "job":
                b.job = str(obj["job"])
            _row(b, obj)
            b.files.setdefault(int(obj["rank"]), source)
        except (ValueError, TypeError, KeyError) as exc:
            warnings.append(f"{source}:{lineno}: skipped line ({exc})")
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
        tb = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceFormatError(f"{source}: not a readable Parquet file ({exc})") from exc
    cols = set(tb.column_names)
    missing = [k for k in _REQUIRED if k not in cols]
    if missing:
        raise TraceFormatError(f"{source}: Parquet lacks column(s) {', '.join(missing)}")
    d = tb.to_pydict()
    b = TableBuilder(str(tb.schema.metadata.get(b"job", b"job").decode()) if tb.schema.metadata
                     else "job")
    warnings: list[str] = []
    n = tb.num_rows
    for i in range(n):
        obj = {k: d[k][i] for k in d}
        try:
            _row(b, obj)
            b.files.setdefault(int(obj["rank"]), source)
        except (ValueError, TypeError) as exc:
            warnings.append(f"{source}: row {i}: skipped ({exc})")
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


def read_compact(path: str | Path) -> ReadResult:
    """Read a compact trace file (``.jsonl``, ``.jsonl.gz`` or ``.parquet``)."""
    p = Path(path)
    data = p.read_bytes()
    if p.suffix == ".parquet":
        return parse_compact_parquet(data, source=str(p))
    if p.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(f"{p}: corrupt gzip ({exc})") from exc
    return parse_compact_lines(data.splitlines(), source=str(p))


def write_compact(table: OpTable, path: str | Path, *, header: dict[str, object] | None = None) -> None:
    """Write ``table`` as compact JSON lines (``.jsonl``/``.jsonl.gz``) or Parquet."""
    p = Path(path)
    if p.suffix == ".parquet":
        p.write_bytes(compact_parquet_bytes(table))
        return
    text = format_compact_lines(table, header=header).encode()
    p.write_bytes(gzip.compress(text, mtime=0) if p.suffix == ".gz" else text)
