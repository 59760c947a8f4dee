"""Reader of NCCL Inspector output: newline-delimited JSON with ``coll_perf`` records.

Format (NVIDIA/nccl ``ext-profiler/inspector``, output format v4.0, README and
``exporter/example/README.md``): one JSON object per line, each the latest completed collective
of one communicator in a dump interval::

    {"header": {"id": "0x9e7a..", "rank": 31, "n_ranks": 32, "nnodes": 4},
     "metadata": {"inspector_output_format_version": "v4.0", "dump_timestamp_us": ..,
                  "hostname": "..", "pid": ..},
     "coll_perf": {"coll": "ReduceScatter", "coll_sn": 129, "coll_msg_size_bytes": 65536,
                   "coll_exec_time_us": 110, "coll_timing_source": "kernel_gpu",
                   "coll_algobw_gbs": 19.06, "coll_busbw_gbs": 18.47}}

Later versions add ``coll_algo`` / ``coll_proto``; ``p2p_perf`` records (send / recv) are
skipped. Records are snapshots, not every call, so the rows of a run are medians per size.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from fabricscope.collective.model import CollectiveRun, Placement, SizeRow
from fabricscope.collective.nccl_tests import collective_from_name
from fabricscope.model.errors import TraceFormatError

__all__ = ["InspectorRecord", "parse_inspector", "read_inspector", "runs_from_inspector"]


@dataclass(frozen=True)
class InspectorRecord:
    """One ``coll_perf`` record."""

    comm_id: str
    rank: int | None
    n_ranks: int | None
    nnodes: int | None
    hostname: str
    pid: int | None
    ts_us: int | None
    coll: str
    sn: int | None
    size_bytes: int
    exec_time_us: float
    algbw_gbs: float
    busbw_gbs: float
    timing_source: str = ""
    algo: str = ""
    proto: str = ""
    line: int = 0


def _num(d: dict[str, object], key: str, where: str, *, required: bool = True) -> float | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceFormatError(f"{where}: {key}: expected a number, got {v!r}")
    return float(v)


def parse_inspector(text: str, *, source: str = "<text>") -> tuple[list[InspectorRecord], list[str]]:
    """Every ``coll_perf`` record of the text, and warnings (bad lines are skipped and named).

    Raises :class:`TraceFormatError` when no line is an Inspector record.
    """
    recs: list[InspectorRecord] = []
    warnings: list[str] = []
    seen_json = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s.startswith("{"):
            continue
        where = f"{source}: line {lineno}"
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as exc:
            warnings.append(f"{where}: not JSON ({exc.msg}); skipped")
            continue
        if not isinstance(obj, dict):
            continue
        seen_json = True
        perf = obj.get("coll_perf")
        if not isinstance(perf, dict):
            continue
        header = obj.get("header") if isinstance(obj.get("header"), dict) else {}
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(header, dict) and isinstance(meta, dict)
        try:
            size = _num(perf, "coll_msg_size_bytes", where)
            t = _num(perf, "coll_exec_time_us", where)
            alg = _num(perf, "coll_algobw_gbs", where, required=False)
            bus = _num(perf, "coll_busbw_gbs", where)
        except TraceFormatError as exc:
            warnings.append(f"{exc}; skipped")
            continue
        assert size is not None and t is not None and bus is not None

        def _opt_int(d: dict[str, object], k: str) -> int | None:
            v = d.get(k)
            return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        recs.append(InspectorRecord(
            comm_id=str(header.get("id", "")), rank=_opt_int(header, "rank"),
            n_ranks=_opt_int(header, "n_ranks"), nnodes=_opt_int(header, "nnodes"),
            hostname=str(meta.get("hostname", "")), pid=_opt_int(meta, "pid"),
            ts_us=_opt_int(meta, "dump_timestamp_us"), coll=str(perf.get("coll", "")),
            sn=_opt_int(perf, "coll_sn"), size_bytes=int(size), exec_time_us=t,
            algbw_gbs=alg if alg is not None else (size / t / 1e3 if t > 0 else 0.0),
            busbw_gbs=bus, timing_source=str(perf.get("coll_timing_source", "")),
            algo=str(perf.get("coll_algo", "")), proto=str(perf.get("coll_proto", "")),
            line=lineno))
    if not recs:
        what = "JSON lines but no coll_perf record" if seen_json else "no JSON lines"
        raise TraceFormatError(f"{source}: not NCCL Inspector output ({what})")
    return recs, warnings


def runs_from_inspector(records: list[InspectorRecord], *, source: str,
                        warnings: list[str] | None = None) -> list[CollectiveRun]:
    """One run per (collective, communicator): per size the median time / algbw / busbw of the
    records (reported as out-of-place: Inspector does not say the placement)."""
    groups: dict[tuple[str, str], list[InspectorRecord]] = defaultdict(list)
    for r in records:
        groups[(r.coll, r.comm_id)].append(r)
    runs: list[CollectiveRun] = []
    for (coll, comm), recs in sorted(groups.items()):
        by_size: dict[int, list[InspectorRecord]] = defaultdict(list)
        for r in recs:
            by_size[r.size_bytes].append(r)
        rows = []
        for size in sorted(by_size):
            rs = by_size[size]
            rows.append(SizeRow(
                size_bytes=size, count=0, dtype="", redop="", root=None,
                out_of_place=Placement(
                    time_us=statistics.median(r.exec_time_us for r in rs),
                    algbw_gbs=statistics.median(r.algbw_gbs for r in rs),
                    busbw_gbs=statistics.median(r.busbw_gbs for r in rs), wrong=None,
                    busbw_half_unit=0.0),
                in_place=None, line=rs[0].line, samples=len(rs)))
        hosts = tuple(dict.fromkeys(r.hostname for r in recs if r.hostname))
        n_ranks = next((r.n_ranks for r in recs if r.n_ranks is not None), None)
        busbw = [row.out_of_place.busbw_gbs for row in rows if row.out_of_place]
        name = collective_from_name(coll) or "unknown"
        runs.append(CollectiveRun(
            source=f"{source}#{coll}:{comm}" if len(groups) > 1 else source,
            collective=name, ranks=n_ranks, rows=tuple(rows), hosts=hosts,
            avg_busbw_recomputed=sum(busbw) / len(busbw) if busbw else None,
            warnings=tuple(warnings or ()), fmt="nccl-inspector",
            header={"nnodes": str(next((r.nnodes for r in recs if r.nnodes), ""))}))
    return runs


def read_inspector(path: str | Path) -> list[CollectiveRun]:
    """Read one Inspector JSONL file into runs (see :func:`runs_from_inspector`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read ({exc.strerror})") from None
    recs, warnings = parse_inspector(text, source=str(p))
    return runs_from_inspector(recs, source=str(p), warnings=warnings)
