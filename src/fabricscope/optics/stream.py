"""Fleet-scale grading and prediction: a Parquet history streamed in chunks of whole modules.

A 10,000-module x 8-lane x 21-day history (236 M rows, 4.2 GB Parquet) needs about 14 GB once
read whole (issue 12). Every feature of :func:`~fabricscope.optics.features.lane_features` but
the cross-lane ones is a function of one lane's rows, so this path

1. reads the table with :class:`~fabricscope.optics.readers.table.HistoryChunks` (chunks of
   about a million rows of whole modules, repaired while read; each module's rows must be
   contiguous in the file, as ``optics twin`` writes them: otherwise
   :class:`~fabricscope.optics.readers.table.UnorderedHistoryError`);
2. cuts the lanes into exactly the chunks ``lane_features`` uses (``TARGET_CELLS // hours``
   lanes, numbered over the whole fleet; a lane chunk spanning two read chunks is handed on as
   two :class:`~fabricscope.optics.features.GridPiece` views, not copied) and computes each
   chunk's hourly grid (``features.grid_pieces``: one compiled pass per metric) and per-lane
   features (:func:`~fabricscope.optics.features.chunk_features`), keeping only the per-lane
   table (about 300 values x 80,000 lanes);
3. runs :func:`~fabricscope.optics.features.cross_lane` once over that table (margins to the
   filled thresholds, lane deviation, the population z scores per part number, same-switch
   warming, the peers' link loss), then :func:`~fabricscope.optics.grade.grade_fleet` and
   :func:`~fabricscope.optics.predict.predict_fleet` on the precomputed features.

Because the chunks, the operations and their order are the same, the features equal the
in-memory ones bit for bit (``tests/test_optics_stream.py`` compares every column, the
grades and the risks; docs/design/optics-stream.md). Peak memory is a few read chunks and one
lane chunk's grid: bounded by the chunk size, not by the fleet. ``at_ns`` defaults to the last
sample, found from the Parquet row-group statistics of ``ts`` (one ``ts``-only pass where a
file has none), as is the first sample, which sets the grid's length.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import ConfigError
from fabricscope.optics.features import (
    DAY_NS,
    DEFAULT_WINDOWS,
    HOUR_NS,
    TARGET_CELLS,
    GridPiece,
    LaneFeatures,
    LaneGrid,
    check_feature_args,
    chunk_features,
    cross_lane,
    filled_modules,
    first_after,
    grid_pieces,
    lane_runs,
)
from fabricscope.optics.grade import FleetGrades, GradeRules, grade_fleet
from fabricscope.optics.history import ALL_METRICS, FleetHistory, ModuleTable, metric_dtype
from fabricscope.optics.readers.table import HistoryChunk, HistoryChunks

if TYPE_CHECKING:
    from fabricscope.optics.predict import FleetPredictions, Model

__all__ = ["StreamedFeatures", "stream_features", "stream_grade", "stream_predict"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Progress = Callable[[int, int], None]



@dataclass(frozen=True)
class StreamedFeatures:
    """Lane features of a streamed history, and a row-less history that carries its module
    table and the reader's warnings (what grading and prediction read from a history)."""

    features: LaneFeatures
    history: FleetHistory
    rows: int
    seconds: float


def _empty_history(modules: ModuleTable, warnings: Sequence[str]) -> FleetHistory:
    z = np.zeros(0, dtype=np.int64)
    zi = np.zeros(0, dtype=np.int32)
    return FleetHistory(ts=z, module=zi, lane=zi.copy(),
                        metrics={m: np.zeros(0, dtype=metric_dtype(m)) for m in ALL_METRICS},
                        modules=modules, warnings=tuple(warnings))


_PLACEHOLDER = ModuleTable(device=(), port=(), vendor=(), part_number=(), serial=(), media=(),
                           lanes=np.zeros(0, dtype=np.int32))


class _Pending:
    """Read chunks whose lanes are not featurized yet, kept as views (no copy): a lane chunk
    may span several of them (:class:`~fabricscope.optics.features.GridPiece`)."""

    def __init__(self, at: int, nb: int) -> None:
        self.at = at
        self.nb = nb
        #: per chunk: (ts, module, lane, metrics, lane starts, lane ends, g0, g1)
        self.parts: list[tuple[I64, I32, I32, dict[str, npt.NDArray[np.floating]], I64, I64,
                               I64, I64]] = []

    def add(self, c: HistoryChunk) -> None:
        starts, ends = lane_runs(FleetHistory(ts=c.ts, module=c.module, lane=c.lane,
                                              metrics={}, modules=_PLACEHOLDER))
        g0 = first_after(c.ts, starts, ends, self.at - self.nb * HOUR_NS)
        g1 = first_after(c.ts, g0, ends, self.at)
        self.parts.append((c.ts, c.module, c.lane, c.metrics, starts, ends, g0, g1))

    @property
    def lanes(self) -> int:
        return sum(int(x[4].shape[0]) for x in self.parts)

    def take(self, nl: int) -> list[tuple[I64, dict[str, npt.NDArray[np.floating]], I64, I64,
                                          I64, I32, I32]]:
        """The next ``nl`` lanes as pieces (ts, metrics, starts, g0, g1 relative to the
        piece; module and lane of each lane), dropped from the pending chunks."""
        out = []
        while nl > 0:
            ts, mod, lane, met, st, en, g0, g1 = self.parts[0]
            k = min(nl, int(st.shape[0]))
            r0, r1 = int(st[0]), int(en[k - 1])
            out.append((ts[r0:r1], {m: v[r0:r1] for m, v in met.items()}, st[:k] - r0,
                        g0[:k] - r0, g1[:k] - r0, mod[st[:k]], lane[st[:k]]))
            if k == st.shape[0]:
                self.parts.pop(0)
            else:
                self.parts[0] = (ts, mod, lane, met, st[k:], en[k:], g0[k:], g1[k:])
            nl -= k
        return out


def _lane_chunk(pieces: Sequence[tuple[I64, dict[str, npt.NDArray[np.floating]], I64, I64,
                                       I64]],
                at: int, nb: int, wins: tuple[int, ...], bb: int) -> dict[str, F64]:
    """Per-lane features of one lane chunk (whole lanes, in one or more pieces; ``starts`` /
    ``g0`` / ``g1`` relative to each piece's first row), lanes without data in the grid left
    out: what ``lane_features`` computes for the same chunk. Runs in a worker thread when
    asked (the compiled grid releases the GIL)."""
    wmax = max(wins) // HOUR_NS
    gp = [GridPiece(ts=ts, metrics=met, starts=st, g0=a, g1=b) for ts, met, st, a, b in pieces]
    nl = sum(int(p.starts.shape[0]) for p in gp)
    hv = np.concatenate([p.g1 > p.g0 for p in gp])
    g = grid_pieces(gp, at, nb, wmax, bb)
    vals = {k: v[hv] for k, v in chunk_features(g, nl, nb, at, wins, bb).items()}
    last_ts = np.concatenate([p.ts[np.maximum(p.g1 - 1, 0)] for p in gp])[hv]
    first_ts = np.concatenate([p.ts[np.minimum(p.g0, p.ts.shape[0] - 1)] for p in gp])[hv]
    vals["data.span_hours"] = (last_ts - first_ts) / HOUR_NS
    vals["data.last_age_hours"] = (at - last_ts) / HOUR_NS
    return vals


def stream_features(
    path: str,
    *,
    at_ns: int | None = None,
    peers: Mapping[str, str] | None = None,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    lookback_ns: int = 28 * DAY_NS,
    baseline_ns: int = 3 * DAY_NS,
    batch_rows: int = 1 << 20,
    workers: int = 1,
    progress: Progress | None = None,
) -> StreamedFeatures:
    """:func:`~fabricscope.optics.features.lane_features` of the Parquet history at ``path``,
    read in chunks (see the module docstring); equal to ``lane_features(read_history(path),
    at_ns=at_ns, ...)``.

    ``at_ns`` defaults to the last sample. ``progress(rows_read, rows_total)`` is called after
    each chunk. ``workers`` > 1 computes the lane chunks' features in that many threads (the
    compiled hourly grid and numpy's array loops release the GIL; no pickling of the rows)
    while this one reads; the chunks and their order do not change. Raises :class:`ConfigError` for an unreadable file or one without rows, and
    :class:`~fabricscope.optics.readers.table.UnorderedHistoryError` when a module's rows are
    not contiguous.
    """
    t0 = time.perf_counter()
    if at_ns is not None and (isinstance(at_ns, bool) or not isinstance(at_ns, int | np.integer)):
        raise ConfigError(f"optics features: at_ns: must be an integer (ns), got {at_ns!r}")
    if workers < 1:
        raise ConfigError(f"optics stream: workers: must be >= 1, got {workers}")
    wins = check_feature_args(windows, lookback_ns, baseline_ns)
    reader = HistoryChunks(path, batch_rows=min(batch_rows, 1 << 17), min_rows=batch_rows)
    rng = reader.ts_range()
    if rng is None:
        raise ConfigError(f"{reader.path}: the history table holds no readings "
                          "(nothing to grade)")
    t_first, t_last = rng
    at = t_last if at_ns is None else int(at_ns)
    span = max(HOUR_NS, min(lookback_ns, at - t_first + HOUR_NS))
    nb = max(int(-(-span // HOUR_NS)), max(wins) // HOUR_NS)
    per_chunk = max(8, TARGET_CELLS // nb)
    bb = max(1, baseline_ns // HOUR_NS)
    pend = _Pending(at, nb)
    parts: list[dict[str, F64]] = []
    mods_l: list[I64] = []
    lanes_l: list[I64] = []
    rows = 0

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="optics-lanes") \
        if workers > 1 else None
    futures: deque[Future[dict[str, F64]]] = deque()

    def collect(limit: int) -> None:
        while len(futures) > limit:
            parts.append(futures.popleft().result())

    def featurize(final: bool) -> None:
        while pend.parts:
            nr = pend.lanes
            if nr < per_chunk and not final:
                return
            pieces = pend.take(min(nr, per_chunk))
            hv = np.concatenate([p[4] > p[3] for p in pieces])
            if not hv.any():
                continue
            args = ([p[:5] for p in pieces], at, nb, wins, bb)
            if pool is None:
                parts.append(_lane_chunk(*args))
            else:
                futures.append(pool.submit(_lane_chunk, *args))
                collect(2 * workers)
            mods_l.append(np.concatenate([p[5] for p in pieces])[hv].astype(np.int64))
            lanes_l.append(np.concatenate([p[6] for p in pieces])[hv].astype(np.int64))

    try:
        for chunk in reader:
            rows += len(chunk)
            pend.add(chunk)
            featurize(final=False)
            if progress is not None:
                progress(chunk.rows_read, reader.num_rows)
        featurize(final=True)
        collect(0)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    mods = filled_modules(reader.modules)
    if parts:
        vals = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        mod = np.concatenate(mods_l)
        lane = np.concatenate(lanes_l)
    else:
        vals = {k: np.zeros(0) for k in chunk_features(LaneGrid(), 0, nb, at, wins, bb)}
        vals["data.span_hours"] = np.zeros(0)
        vals["data.last_age_hours"] = np.zeros(0)
        mod = np.zeros(0, dtype=np.int64)
        lane = np.zeros(0, dtype=np.int64)
    warnings: list[str] = []
    vals.update(cross_lane(vals, mod, lane, mods, wins, peers, warnings))
    feats = LaneFeatures(module=mod.astype(np.int32), lane=lane.astype(np.int32), at_ns=at,
                         windows=wins, values=vals, modules=mods, warnings=tuple(warnings))
    hist = _empty_history(reader.modules, reader.warnings)
    return StreamedFeatures(features=feats, history=hist, rows=rows,
                            seconds=time.perf_counter() - t0)


def stream_grade(
    path: str,
    *,
    at_ns: int | None = None,
    peers: Mapping[str, str] | None = None,
    rules: GradeRules | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> FleetGrades:
    """:func:`~fabricscope.optics.grade.grade_fleet` of the Parquet history at ``path``,
    streamed (equal to ``grade_fleet(read_history(path), at_ns=..., peers=...)``)."""
    sf = stream_features(path, at_ns=at_ns, peers=peers, workers=workers, progress=progress)
    return grade_fleet(sf.history, at_ns=sf.features.at_ns, peers=peers, features=sf.features,
                       rules=rules)


def stream_predict(
    path: str,
    model: Model | None = None,
    *,
    at_ns: int | None = None,
    peers: Mapping[str, str] | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> FleetPredictions:
    """:func:`~fabricscope.optics.predict.predict_fleet` of the Parquet history at ``path``,
    streamed (equal to ``predict_fleet(read_history(path), model, at_ns=..., peers=...)``)."""
    from fabricscope.optics.predict import predict_fleet

    sf = stream_features(path, at_ns=at_ns, peers=peers, workers=workers, progress=progress)
    at = sf.features.at_ns
    gr = grade_fleet(sf.history, at_ns=at, peers=peers, features=sf.features)
    return predict_fleet(sf.history, model, at_ns=at, peers=peers, grades=gr)
