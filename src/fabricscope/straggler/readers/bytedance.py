"""Reader for the per-worker / per-step / per-op Parquet table of ByteDance's straggler study.

Format of ByteDance-Seed/StragglerAnalysis (OSDI'25, "Understanding Stragglers in Large Model
Training Using What-if Analysis"): one row per operation with ``dp_rank, stage, rank, step,
optype, start_ts (s), duration (s), seq_id, mc, mb_id, gmc``. The table has no communicator
membership, so groups are rebuilt from Megatron's layout: pipeline send/recv pair a rank with
the same ``dp_rank`` one stage up/down (the k-th send matches the peer's k-th recv), the
gradient reduce-scatter / parameter all-gather span a stage's data-parallel ranks, and the
embedding all-reduce pairs the first and last stage of a ``dp_rank``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.common import (
    MAX_DURATION_NS,
    MAX_I32,
    MAX_RANK,
    MAX_TIME_NS,
    ReadResult,
    WarningLog,
    clip,
    duplicate_columns,
    show,
)
from fabricscope.straggler.table import TableBuilder

_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
_DP_COLLECTIVES = ("grads-reduce-scatter", "params-all-gather")
# Integer columns and their ranges; a row outside them is skipped and named.
_INT_RANGES = {"dp_rank": (0, MAX_RANK), "stage": (0, MAX_RANK), "rank": (0, MAX_RANK),
               "step": (0, MAX_I32), "mb_id": (-1, MAX_I32)}


def _numbers(tb: Any, name: str, source: str) -> npt.NDArray[np.float64]:
    """Column ``name`` as float64 (nulls as NaN); a non-numeric column is a TraceFormatError."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = tb.column(name)
    kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise TraceFormatError(f"{source}: column {name} holds {col.type}, expected numbers")
    try:
        arr = pc.fill_null(col.cast(pa.float64(), safe=False), float("nan"))
        return np.asarray(arr.to_numpy(), dtype=np.float64)
    except (pa.ArrowException, ValueError) as exc:
        raise TraceFormatError(f"{source}: column {name}: cannot read as numbers "
                               f"({clip(str(exc), 80)})") from exc


def _columns(tb: Any, source: str, log: WarningLog) -> dict[str, Any]:
    """The validated columns; rows with a null, NaN or out-of-range value are dropped (named)."""
    import pyarrow as pa

    n = tb.num_rows
    bad = np.zeros(n, dtype=bool)
    reasons: list[tuple[npt.NDArray[np.bool_], str]] = []
    out: dict[str, Any] = {}
    for name, (lo, hi) in _INT_RANGES.items():
        if name not in tb.column_names:
            out[name] = np.full(n, -1, dtype=np.int64)
            continue
        v = _numbers(tb, name, source)
        if name == "mb_id":
            v = np.where(np.isnan(v), -1.0, v)  # optional: null means unknown
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(v) & (v == np.floor(v)) & (v >= lo) & (v <= hi)
        reasons.append((~ok, f"{name} not an integer in [{lo}, {hi}]"))
        bad |= ~ok
        out[name] = np.where(ok, v, 0).astype(np.int64)
    start = _numbers(tb, "start_ts", source)
    dur = _numbers(tb, "duration", source)
    with np.errstate(invalid="ignore"):
        ok_t = (np.isfinite(start) & np.isfinite(dur) & (np.abs(start) <= MAX_TIME_NS / 1e9)
                & (dur >= 0) & (dur <= MAX_DURATION_NS / 1e9))
    reasons.append((~ok_t, "bad start_ts/duration"))
    bad |= ~ok_t
    out["start_ts"], out["duration"] = np.where(ok_t, start, 0.0), np.where(ok_t, dur, 0.0)
    col = tb.column("optype")
    kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise TraceFormatError(f"{source}: column optype holds {col.type}, expected strings")
    try:
        optype = col.to_pylist()
    except (pa.ArrowException, ValueError) as exc:  # UnicodeDecodeError: invalid UTF-8
        raise TraceFormatError(f"{source}: column optype: cannot read as text "
                               f"({clip(str(exc), 80)})") from exc
    null_op = np.fromiter((o is None for o in optype), dtype=bool, count=n)
    reasons.append((null_op, "optype is null"))
    bad |= null_op
    out["optype"] = optype
    for k in np.flatnonzero(bad)[:5].tolist():
        why = "; ".join(r for m, r in reasons if m[k])
        vals = ", ".join(f"{c}={show(tb.column(c)[k].as_py())}" for c in _COLUMNS
                         if c != "optype")
        log.add(f"{source}: row {k}: {why} ({vals}); skipped")
    if bad.sum() > 5:
        log.add(f"{source}: {int(bad.sum())} rows with bad values skipped in all")
    out["ok"] = ~bad
    return out


def parse_bytedance(data: bytes, *, source: str = "<parquet>", job: str | None = None) -> ReadResult:
    """Parse one ByteDance trace Parquet (bytes) into an :class:`OpTable`.

    Raises only :class:`TraceFormatError` (unreadable file, a missing or non-numeric column,
    one (dp_rank, stage) on two ranks); a row with a null / NaN / out-of-range value is
    skipped and named in the warnings.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        tb = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceFormatError(f"{source}: not a readable Parquet file "
                               f"({clip(str(exc), 100)})") from exc
    duplicate_columns(tb.column_names, source)
    missing = [c for c in _COLUMNS if c not in tb.column_names]
    if missing:
        raise TraceFormatError(f"{source}: not a ByteDance trace, missing column(s) "
                               f"{', '.join(missing)}")
    warnings: list[str] = []
    log = WarningLog(warnings, source)
    cols = _columns(tb, source, log)
    keep = cols["ok"]
    dp, stage, rank = cols["dp_rank"][keep], cols["stage"][keep], cols["rank"][keep]
    step, mb = cols["step"][keep], cols["mb_id"][keep]
    start_s, dur_s = cols["start_ts"][keep], cols["duration"][keep]
    optype = [o for o, k in zip(cols["optype"], keep.tolist(), strict=True) if k]
    n = len(optype)

    where: dict[tuple[int, int], int] = {}
    for a, s, r in zip(dp.tolist(), stage.tolist(), rank.tolist(), strict=True):
        prev = where.setdefault((a, s), r)
        if prev != r:
            raise TraceFormatError(f"{source}: dp_rank {a} stage {s} maps to ranks {prev} and {r}")
    last_stage = int(stage.max()) if n else 0
    by_stage: dict[int, list[int]] = defaultdict(list)
    for (_a, s), r in sorted(where.items()):
        by_stage[s].append(r)

    b = TableBuilder(job or Path(source).stem)
    b.files = {r: source for r in where.values()}
    order = np.lexsort((start_s, step, rank))
    counters: dict[tuple[int, int, str], int] = defaultdict(int)
    for k in order.tolist():
        op = optype[k]
        a, s, r, it = int(dp[k]), int(stage[k]), int(rank[k]), int(step[k])
        group: tuple[int, ...] = ()
        if op in _DP_COLLECTIVES:
            group = tuple(by_stage[s])
        elif op == "embedding-grads-all-reduce":
            ends = (where.get((a, 0)), where.get((a, last_stage)))
            group = tuple(x for x in ends if x is not None)
        elif op == "forward-send":
            group = (r, where.get((a, s + 1), -1))
        elif op == "forward-recv":
            group = (where.get((a, s - 1), -1), r)
        elif op == "backward-send":
            group = (r, where.get((a, s - 1), -1))
        elif op == "backward-recv":
            group = (where.get((a, s + 1), -1), r)
        if -1 in group:
            group = ()
        key = (r, it, op)
        seq = counters[key]
        counters[key] = seq + 1
        if mb[k] >= 0 and "compute" in op:
            seq = int(mb[k])
        t0 = round(start_s[k] * 1e9)
        b.add(rank=r, iteration=it, op=op, group=group, seq=seq, start=t0,
              end=t0 + round(dur_s[k] * 1e9), stage=s, mb=int(mb[k]))
    log.close()
    meta: dict[str, object] = {"workers": len(where), "pp": last_stage + 1,
                               "dp": len(by_stage.get(0, []))}
    return ReadResult(b.build(), warnings, [], meta)


def read_bytedance(path: str | Path) -> ReadResult:
    """Read a ByteDance ``trace-<T>.parquet`` file."""
    p = Path(path)
    return parse_bytedance(p.read_bytes(), source=str(p), job=p.stem.removeprefix("trace-"))
