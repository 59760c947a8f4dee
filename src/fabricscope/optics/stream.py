"""Fleet-scale grading and prediction: a Parquet history streamed in chunks of whole modules.

A 10,000-module x 8-lane x 21-day history (236 M rows, 4.2 GB Parquet) needs about 14 GB once
read whole (issue 12). Every feature of :func:`~fabricscope.optics.features.lane_features` but
the cross-lane ones is a function of one lane's rows, so this path

1. reads the table with :class:`~fabricscope.optics.readers.table.HistoryChunks` (batches of
   about a million rows; each module's rows must be contiguous in the file, as ``optics twin``
   writes them: otherwise :class:`~fabricscope.optics.readers.table.UnorderedHistoryError`);
2. cuts the lanes into exactly the chunks ``lane_features`` uses (``TARGET_CELLS // hours``
   lanes, numbered over the whole fleet) and computes each chunk's hourly grid and per-lane
   features (``features.grid_chunk`` + :func:`~fabricscope.optics.features.chunk_features`),
   keeping only the per-lane table (about 300 values x 80,000 lanes);
3. runs :func:`~fabricscope.optics.features.cross_lane` once over that table (margins to the
   filled thresholds, lane deviation, the population z scores per part number, same-switch
   warming, the peers' link loss), then :func:`~fabricscope.optics.grade.grade_fleet` and
   :func:`~fabricscope.optics.predict.predict_fleet` on the precomputed features.

Because the chunks, the operations and their order are the same, the features equal the
in-memory ones bit for bit (``tests/test_optics_stream.py`` compares every column, the
grades and the risks). Peak memory is a read batch, the carried-over part of a module and one
lane chunk's grid: bounded by the chunk size, not by the fleet. ``at_ns`` defaults to the last
sample, found from the Parquet row-group statistics of ``ts`` (one ``ts``-only pass where a
file has none), as is the first sample, which sets the grid's length.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
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
    LaneFeatures,
    LaneGrid,
    check_feature_args,
    chunk_features,
    cross_lane,
    filled_modules,
    first_after,
    grid_chunk,
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
    """Rows of whole lanes not yet featurized; the first one starts a lane chunk."""

    def __init__(self) -> None:
        self.ts = np.zeros(0, dtype=np.int64)
        self.module = np.zeros(0, dtype=np.int32)
        self.lane = np.zeros(0, dtype=np.int32)
        self.metrics: dict[str, npt.NDArray[np.floating]] = {
            m: np.zeros(0, dtype=metric_dtype(m)) for m in ALL_METRICS}

    def add(self, c: HistoryChunk) -> None:
        if self.ts.shape[0] == 0:
            self.ts, self.module, self.lane, self.metrics = c.ts, c.module, c.lane, c.metrics
            return
        self.ts = np.concatenate([self.ts, c.ts])
        self.module = np.concatenate([self.module, c.module])
        self.lane = np.concatenate([self.lane, c.lane])
        self.metrics = {m: np.concatenate([v, c.metrics[m]]) for m, v in self.metrics.items()}

    def history(self, modules: ModuleTable) -> FleetHistory:
        return FleetHistory(ts=self.ts, module=self.module, lane=self.lane,
                            metrics=self.metrics, modules=modules)

    def drop(self, rows: int) -> None:
        self.ts, self.module, self.lane = self.ts[rows:], self.module[rows:], self.lane[rows:]
        self.metrics = {m: v[rows:] for m, v in self.metrics.items()}


def _lane_chunk(ts: I64, metrics: dict[str, npt.NDArray[np.floating]], starts: I64, g0: I64,
                g1: I64, at: int, nb: int, wins: tuple[int, ...], bb: int) -> dict[str, F64]:
    """Per-lane features of one lane chunk (rows of whole lanes; ``starts`` / ``g0`` / ``g1``
    relative to its first row), lanes without data in the grid left out: what
    ``lane_features`` computes for the same chunk. Runs in a worker process when asked."""
    z = np.zeros(0, dtype=np.int32)
    h = FleetHistory(ts=ts, module=z, lane=z, metrics=metrics, modules=_PLACEHOLDER)
    wmax = max(wins) // HOUR_NS
    hv = g1 > g0
    g = grid_chunk(h, 0, int(ts.shape[0]), starts, g0, g1, at, nb, wmax, bb)
    vals = {k: v[hv] for k, v in chunk_features(g, starts.shape[0], nb, at, wins, bb).items()}
    last_ts = ts[np.maximum(g1 - 1, 0)][hv]
    first_ts = ts[np.minimum(g0, ts.shape[0] - 1)][hv]
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
    each chunk. ``workers`` > 1 computes the lane chunks' features in that many processes
    (``spawn``: a script that asks for them needs the ``if __name__ == "__main__":`` guard)
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
    reader = HistoryChunks(path, batch_rows=batch_rows, min_rows=batch_rows, read_ahead=1)
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
    placeholder = _PLACEHOLDER
    pend = _Pending()
    parts: list[dict[str, F64]] = []
    mods_l: list[I64] = []
    lanes_l: list[I64] = []
    rows = 0

    pool = (ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
            if workers > 1 else None)
    futures: deque[Future[dict[str, F64]]] = deque()

    def collect(limit: int) -> None:
        while len(futures) > limit:
            parts.append(futures.popleft().result())

    def featurize(final: bool) -> None:
        h = pend.history(placeholder)
        starts, ends = lane_runs(h)
        nr = starts.shape[0]
        upto = nr if final else (nr // per_chunk) * per_chunk
        if upto == 0:
            return
        g0 = first_after(h.ts, starts[:upto], ends[:upto], at - nb * HOUR_NS)
        g1 = first_after(h.ts, g0, ends[:upto], at)
        have = g1 > g0
        for k0 in range(0, upto, per_chunk):
            k1 = min(upto, k0 + per_chunk)
            hv = have[k0:k1]
            if not hv.any():
                continue
            r0, r1 = int(starts[k0]), int(ends[k1 - 1])
            args = (h.ts[r0:r1], {m: v[r0:r1] for m, v in h.metrics.items()},
                    starts[k0:k1] - r0, g0[k0:k1] - r0, g1[k0:k1] - r0, at, nb, wins, bb)
            if pool is None:
                parts.append(_lane_chunk(*args))
            else:
                futures.append(pool.submit(_lane_chunk, *args))
                collect(2 * workers)
            mods_l.append(h.module[starts[k0:k1]][hv].astype(np.int64))
            lanes_l.append(h.lane[starts[k0:k1]][hv].astype(np.int64))
        pend.drop(int(ends[upto - 1]))

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
