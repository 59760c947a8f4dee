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

import numpy as np

from fabricscope.model.errors import TraceFormatError
from fabricscope.straggler.readers.common import ReadResult
from fabricscope.straggler.table import TableBuilder

_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
_DP_COLLECTIVES = ("grads-reduce-scatter", "params-all-gather")


def parse_bytedance(data: bytes, *, source: str = "<parquet>", job: str | None = None) -> ReadResult:
    """Parse one ByteDance trace Parquet (bytes) into an :class:`OpTable`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        tb = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceFormatError(f"{source}: not a readable Parquet file ({exc})") from exc
    missing = [c for c in _COLUMNS if c not in tb.column_names]
    if missing:
        raise TraceFormatError(f"{source}: not a ByteDance trace, missing column(s) "
                               f"{', '.join(missing)}")
    d = tb.to_pydict()
    n = tb.num_rows
    warnings: list[str] = []
    dp = np.asarray(d["dp_rank"], dtype=np.int64)
    stage = np.asarray(d["stage"], dtype=np.int64)
    rank = np.asarray(d["rank"], dtype=np.int64)
    step = np.asarray(d["step"], dtype=np.int64)
    start_s = np.asarray(d["start_ts"], dtype=np.float64)
    dur_s = np.asarray(d["duration"], dtype=np.float64)
    mb = np.asarray(d.get("mb_id", [-1] * n), dtype=np.int64)
    optype = [str(o) for o in d["optype"]]

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
    bad = 0
    for k in order.tolist():
        op = optype[k]
        a, s, r, it = int(dp[k]), int(stage[k]), int(rank[k]), int(step[k])
        if not (np.isfinite(start_s[k]) and np.isfinite(dur_s[k])) or dur_s[k] < 0:
            bad += 1
            if bad <= 5:
                warnings.append(f"{source}: row {k}: bad start_ts/duration "
                                f"({start_s[k]}, {dur_s[k]}); skipped")
            continue
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
    if bad > 5:
        warnings.append(f"{source}: {bad} rows with bad times skipped in all")
    meta: dict[str, object] = {"workers": len(where), "pp": last_stage + 1,
                               "dp": len(by_stage.get(0, []))}
    return ReadResult(b.build(), warnings, [], meta)


def read_bytedance(path: str | Path) -> ReadResult:
    """Read a ByteDance ``trace-<T>.parquet`` file."""
    p = Path(path)
    return parse_bytedance(p.read_bytes(), source=str(p), job=p.stem.removeprefix("trace-"))
