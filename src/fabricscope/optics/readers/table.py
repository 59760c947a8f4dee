"""Read and write the optics history table (CSV / Parquet) and the failure-labels CSV.

The table has exactly the columns of :data:`fabricscope.optics.history.COLUMNS` (issue 12), so
other tools can produce it. Parquet is read one row group at a time straight into
preallocated numpy arrays (pyarrow -> numpy, no Python object per row); per-module strings
(identity, device / port) are resolved once per distinct module and batch via dictionary
encoding. Repairs, each warned once with a count:

* extra columns: ignored; a required one missing: :class:`ConfigError` naming file and column;
* ``ts`` as ISO-8601 text (CSV): parsed to int64 ns UTC;
* clock jumps (``ts`` going backwards within a lane, in file order): rows sorted;
* duplicated samples (same module, lane, ts): the later ones dropped;
* counter resets (``fec_uncorrectable`` / ``crc_errors`` falling within a lane): kept, since
  grading handles them, but counted.
"""

from __future__ import annotations

import csv
import math
import os
import queue
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fabricscope.model.errors import ConfigError
from fabricscope.optics import kernels
from fabricscope.optics.history import (
    ALL_METRICS,
    COLUMNS,
    COUNTER_METRICS,
    IDENTITY,
    REQUIRED_COLUMNS,
    THRESHOLD_COLUMNS,
    FleetHistory,
    ModuleTable,
    metric_dtype,
)
from fabricscope.optics.readers.ethtool import parse_ts

__all__ = [
    "HistoryChunk", "HistoryChunks", "Labels", "UnorderedHistoryError", "read_history",
    "read_labels", "write_history",
]

_STR_COLS = ("device", "port", *IDENTITY)
_FLOAT_COLS = (*ALL_METRICS, *THRESHOLD_COLUMNS)
_COUNTERS = ("fec_uncorrectable", "crc_errors")


def _is_parquet(path: str) -> bool:
    return path.lower().endswith((".parquet", ".pq", ".parq"))


def _plain_runs(batch: pa.RecordBatch) -> tuple[npt.NDArray[np.int64],
                                                list[tuple[str, str]]] | None:
    """Batch-local module ids and their (device, port) where both columns are plain strings
    (read so when the file stores them plain: a dictionary built on read would hash every
    row) and the rows come in runs of modules: runs found by comparing neighbouring strings,
    one look-up per run. None otherwise (then :meth:`_Modules._coded`)."""
    cols = [batch.column(c) for c in ("device", "port")]
    if any(not (pa.types.is_string(c.type) or pa.types.is_large_string(c.type)) for c in cols):
        return None
    n = batch.num_rows
    cols = [pc.fill_null(c, "") for c in cols]
    chg = np.empty(n, dtype=bool)
    if n:
        chg[0] = True
        if n > 1:
            for i, c in enumerate(cols):
                ne = pc.not_equal(c.slice(1), c.slice(0, n - 1)).to_numpy(zero_copy_only=False)
                if i == 0:
                    chg[1:] = ne
                else:
                    chg[1:] |= ne
    run = np.flatnonzero(chg)
    if run.shape[0] > max(4096, n // 256):
        return None
    take = pa.array(run)
    keys = zip(cols[0].take(take).to_pylist(), cols[1].take(take).to_pylist(), strict=True)
    seen: dict[tuple[str, str], int] = {}
    run_local = np.array([seen.setdefault((str(d), str(p)), len(seen)) for d, p in keys],
                         dtype=np.int64)
    return np.repeat(run_local, np.diff(np.append(run, n))), list(seen)


class _Modules:
    """Global module index over batches: (device, port) -> row, identity and thresholds."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], int] = {}
        self.ident: dict[str, list[str]] = {c: [] for c in _STR_COLS}
        self.th: dict[str, list[float]] = {c: [] for c in THRESHOLD_COLUMNS}

    def add_batch(self, batch: pa.RecordBatch, names: Sequence[str]) -> npt.NDArray[np.int32]:
        runs = _plain_runs(batch)
        if runs is not None:
            local, uniq = runs
        else:
            local, uniq = self._coded(batch)
        return self._add(batch, names, local, uniq)

    @staticmethod
    def _coded(batch: pa.RecordBatch) -> tuple[npt.NDArray[np.int64], list[tuple[str, str]]]:
        """Batch-local module ids and their (device, port), from dictionary codes."""
        codes = []
        dicts = []
        for c in ("device", "port"):
            col = batch.column(c)
            if not pa.types.is_dictionary(col.type):
                col = pc.dictionary_encode(pc.fill_null(col.cast(pa.string()), ""))
            codes.append(pc.fill_null(col.indices, 0).to_numpy(zero_copy_only=False)
                         .astype(np.int64))
            dicts.append(["" if v is None else str(v) for v in col.dictionary.to_pylist()])
        n = codes[0].shape[0]
        chg = np.empty(n, dtype=bool)
        if n:
            chg[0] = True
            np.not_equal(codes[0][1:], codes[0][:-1], out=chg[1:])
            chg[1:] |= codes[1][1:] != codes[1][:-1]
        run = np.flatnonzero(chg)
        if run.shape[0] <= max(4096, n // 256):
            # rows grouped by module (the usual layout): one dict look-up per run of rows
            seen: dict[tuple[int, int], int] = {}
            run_local = np.array([seen.setdefault((int(a), int(b)), len(seen)) for a, b in
                                  zip(codes[0][run].tolist(), codes[1][run].tolist(),
                                      strict=True)], dtype=np.int64)
            local = np.repeat(run_local, np.diff(np.append(run, n)))
            uniq = [(dicts[0][a], dicts[1][b]) for a, b in seen]
        else:
            width = max(len(dicts[1]), 1)
            enc = pc.dictionary_encode(pa.array(codes[0] * width + codes[1]))
            local = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            uniq = [(dicts[0][int(c) // width], dicts[1][int(c) % width])
                    for c in enc.dictionary.to_numpy()]
        return local, uniq

    def _add(self, batch: pa.RecordBatch, names: Sequence[str], local: npt.NDArray[np.int64],
             uniq: list[tuple[str, str]]) -> npt.NDArray[np.int32]:
        """Global module ids of the rows; new modules' identity and thresholds recorded."""
        # first row of each local module: its identity and thresholds (constant per module)
        first = np.full(len(uniq), -1, dtype=np.int64)
        order = np.arange(local.shape[0] - 1, -1, -1)
        first[local[order]] = order
        take = pa.array(first)
        sub = {c: batch.column(c).take(take).to_pylist() for c in names
               if c in _STR_COLS or c in THRESHOLD_COLUMNS}
        mapping = np.empty(len(uniq), dtype=np.int32)
        for j, (d, p) in enumerate(uniq):
            gi = self.index.get((d, p))
            if gi is None:
                gi = len(self.index)
                self.index[(d, p)] = gi
                for c in _STR_COLS:
                    v = sub[c][j] if c in sub else ""
                    self.ident[c].append("" if v is None else str(v))
                for c in THRESHOLD_COLUMNS:
                    v = sub[c][j] if c in sub else None
                    self.th[c].append(math.nan if v is None else float(v))
            mapping[j] = gi
        out: npt.NDArray[np.int32] = mapping[local]
        return out

    def table(self, lanes: npt.NDArray[np.int32]) -> ModuleTable:
        return ModuleTable(
            device=tuple(self.ident["device"]), port=tuple(self.ident["port"]),
            vendor=tuple(self.ident["vendor"]), part_number=tuple(self.ident["part_number"]),
            serial=tuple(self.ident["serial"]), media=tuple(self.ident["media"]),
            lanes=lanes, thresholds={c: np.asarray(v, dtype=np.float64)
                                     for c, v in self.th.items()},
        )


def _ts_column(col: pa.Array | pa.ChunkedArray, path: str, warnings: list[str]) -> pa.Array:
    t = col.type
    if pa.types.is_integer(t):
        return col.cast(pa.int64())
    note = (f"{path}: ts: ISO-8601 / timestamp values ({t}): converted to int64 ns UTC "
            "(write int64 ns to skip this)")
    if pa.types.is_timestamp(t):
        if note not in warnings:
            warnings.append(note)
        return col.cast(pa.timestamp("ns", tz=t.tz)).cast(pa.int64())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if note not in warnings:
            warnings.append(note)
        vals = col.to_pylist()
        out = np.empty(len(vals), dtype=np.int64)
        for i, v in enumerate(vals):
            try:
                out[i] = parse_ts(str(v))
            except ValueError as exc:
                raise ConfigError(f"{path}: row {i + 2}: ts: {v!r}: not int64 ns or "
                                  "ISO-8601") from exc
        return pa.array(out)
    raise ConfigError(f"{path}: ts: column type {t}: expected int64 ns or ISO-8601 text")


def _check_columns(p: str, names: Sequence[str], warnings: list[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ConfigError(f"{p}: required column {missing[0]!r} missing (columns needed: "
                          f"{', '.join(REQUIRED_COLUMNS)})")
    extra = [c for c in names if c not in COLUMNS]
    if extra:
        warnings.append(f"{p}: columns: {', '.join(extra)}: not history columns: ignored")


def _convert_batch(
    batch: pa.RecordBatch, p: str, names: Sequence[str], mods: _Modules, warnings: list[str],
    r: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32],
           dict[str, npt.NDArray[np.floating]]]:
    """(ts, lane, module, metrics present) of one batch; ``r`` is its first row in the file."""
    ts = np.asarray(_ts_column(batch.column("ts"), p, warnings).to_numpy(zero_copy_only=False),
                    dtype=np.int64)
    lane_col = batch.column("lane")
    if lane_col.null_count:
        raise ConfigError(f"{p}: lane: {lane_col.null_count} empty values (rows "
                          f"{r + 2}..): every row needs its 0-based lane")
    lane = np.asarray(lane_col.cast(pa.int32()).to_numpy(zero_copy_only=False), dtype=np.int32)
    module = mods.add_batch(batch, names)
    metrics: dict[str, npt.NDArray[np.floating]] = {}
    for m in ALL_METRICS:
        if m in names:
            col = batch.column(m)
            want = pa.float64() if m in COUNTER_METRICS else pa.float32()
            if col.type != want:
                col = col.cast(want)
            if col.null_count:
                col = col.fill_null(math.nan)
            metrics[m] = col.to_numpy(zero_copy_only=False)
    return ts, lane, module, metrics


def read_history(path: str | os.PathLike[str], *, chunked: bool = True) -> FleetHistory:
    """The history table in ``path`` (``.parquet`` / ``.pq``, else CSV) as a :class:`FleetHistory`.

    Raises :class:`ConfigError` when the file is missing / unreadable or lacks a required
    column (``ts``, ``device``, ``port``, ``lane`` and the five core metrics); every other
    problem is a warning in ``FleetHistory.warnings``.

    A Parquet file whose modules' rows are contiguous (as ``optics twin`` and
    :func:`write_history` write them) is read in chunks of whole modules (:class:`HistoryChunks`),
    each sorted and deduplicated apart; any other, or ``chunked=False``, is read whole and
    sorted at once. Both give the same table and warnings.
    """
    p = os.fspath(path)
    if chunked and _is_parquet(p):
        try:
            return _read_parquet_chunked(p)
        except UnorderedHistoryError:
            pass  # modules not contiguous: read it whole and sort it below
    warnings: list[str] = []
    try:
        if _is_parquet(p):
            pf = pq.ParquetFile(p, read_dictionary=_dictionary_columns(p), pre_buffer=False)
            names = list(pf.schema_arrow.names)
            n = pf.metadata.num_rows
            batches: Iterator[pa.Table] = (pf.read_row_group(i, columns=[c for c in names if c in COLUMNS])
                       for i in range(pf.num_row_groups))
        else:
            opts = pacsv.ConvertOptions(
                column_types={**{c: pa.string() for c in _STR_COLS},
                              **{c: pa.float64() for c in _FLOAT_COLS}},
                strings_can_be_null=False)
            tbl = pacsv.read_csv(p, convert_options=opts)
            names = list(tbl.column_names)
            n = tbl.num_rows
            batches = iter([tbl])
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"{p}: cannot read the history table: {exc}") from exc
    _check_columns(p, names, warnings)
    ts = np.empty(n, dtype=np.int64)
    module = np.empty(n, dtype=np.int32)
    lane = np.empty(n, dtype=np.int32)
    metrics = {m: (np.empty(n, dtype=metric_dtype(m)) if m in names
                   else np.full(n, np.nan, dtype=metric_dtype(m))) for m in ALL_METRICS}
    mods = _Modules()
    r = 0
    for batch in (rb for tbl_part in batches for rb in tbl_part.to_batches()):
        k = batch.num_rows
        if k == 0:
            continue
        sl = slice(r, r + k)
        bts, blane, bmod, bmet = _convert_batch(batch, p, names, mods, warnings, r)
        ts[sl], lane[sl], module[sl] = bts, blane, bmod
        for m, v in bmet.items():
            metrics[m][sl] = v
        r += k
    bad_lane = int(np.count_nonzero((lane[:r] < 0) | (lane[:r] > 63)))
    if bad_lane:
        raise ConfigError(f"{p}: lane: {bad_lane} values outside 0..63")
    return _finish(p, ts[:r], module[:r], lane[:r], {m: v[:r] for m, v in metrics.items()},
                   mods, warnings)


@dataclass
class _Repairs:
    """Counts of what :func:`_repair` changed, summed over chunks of whole modules."""

    back: int = 0
    dup: int = 0
    resets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTERS, 0))

    def add(self, other: _Repairs) -> None:
        self.back += other.back
        self.dup += other.dup
        for c in _COUNTERS:
            self.resets[c] += other.resets[c]

    def warnings(self, p: str) -> list[str]:
        out = []
        if self.back:
            out.append(f"{p}: ts: {self.back} samples go back in time within their lane "
                       "(clock jump): rows sorted by time")
        if self.dup:
            out.append(f"{p}: (module, lane, ts): {self.dup} duplicated samples: "
                       "later copies dropped")
        for c in _COUNTERS:
            if self.resets[c]:
                out.append(f"{p}: {c}: {self.resets[c]} counter resets (value fell within a "
                           "lane): kept, grading treats them as restarts")
        return out


_Rows = tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32],
              dict[str, npt.NDArray[np.floating]]]


def _repair(ts: npt.NDArray[np.int64], module: npt.NDArray[np.int32],
            lane: npt.NDArray[np.int32], metrics: dict[str, npt.NDArray[np.floating]],
            ) -> tuple[_Rows, _Repairs]:
    """Rows sorted by (module, lane, ts) with duplicated samples dropped, and the counts.

    Every count is per lane, so the counts of chunks of whole modules add up to those of
    the whole table (the streaming reader relies on it).
    """
    rep = _Repairs()
    n = ts.shape[0]
    if n > 1:
        key = module.astype(np.int64) * 64 + lane
        dk = np.diff(key)
        contiguous = bool(np.all(dk >= 0))
        order = None if contiguous else np.argsort(key, kind="stable")
        if order is None:
            same = dk == 0
            dt = np.diff(ts)
        else:
            ks = key[order]
            same = np.diff(ks) == 0
            dt = np.diff(ts[order])
        # within each lane, in file order: a step back in time is a clock jump
        rep.back = int(np.count_nonzero(same & (dt < 0)))
        if rep.back:
            order = np.lexsort((ts, lane, module))
        if order is not None:
            ts, module, lane, key = ts[order], module[order], lane[order], key[order]
            metrics = {m: v[order] for m, v in metrics.items()}
            same = np.diff(key) == 0
            dt = np.diff(ts)
        dup = np.flatnonzero(same & (dt == 0)) + 1
        if dup.size:
            rep.dup = int(dup.size)
            keep = np.ones(n, dtype=bool)
            keep[dup] = False
            idx = np.flatnonzero(keep)
            ts, module, lane = ts[idx], module[idx], lane[idx]
            metrics = {m: v[idx] for m, v in metrics.items()}
            same = np.delete(same, dup - 1)
        for c in _COUNTERS:
            v = metrics[c]
            if np.isnan(v[0]) and np.isnan(v).all():
                continue
            with np.errstate(invalid="ignore"):
                rep.resets[c] = int(np.count_nonzero(same & (np.diff(v) < 0)))
    return (ts, module, lane, metrics), rep


def _finish(
    p: str, ts: npt.NDArray[np.int64], module: npt.NDArray[np.int32],
    lane: npt.NDArray[np.int32], metrics: dict[str, npt.NDArray[np.floating]], mods: _Modules,
    warnings: list[str],
) -> FleetHistory:
    (ts, module, lane, metrics), rep = _repair(ts, module, lane, metrics)
    warnings.extend(rep.warnings(p))
    n = ts.shape[0]
    lanes = np.zeros(len(mods.index), dtype=np.int32)
    if n:
        np.maximum.at(lanes, module, lane + 1)
    return FleetHistory(ts=ts, module=module, lane=lane, metrics=metrics,
                        modules=mods.table(lanes), warnings=tuple(warnings))


class UnorderedHistoryError(ConfigError):
    """A history table whose rows are not grouped by module: it cannot be streamed."""


@dataclass(frozen=True)
class HistoryChunk:
    """Rows of whole modules, sorted by (module, lane, ts), duplicated samples dropped.

    ``module`` indexes :attr:`HistoryChunks.modules` (complete once the iteration ends);
    ``metrics`` holds every metric of :data:`~fabricscope.optics.history.ALL_METRICS` (NaN
    where the file has none); ``rows_read`` counts the file's rows read so far.
    """

    ts: npt.NDArray[np.int64]
    module: npt.NDArray[np.int32]
    lane: npt.NDArray[np.int32]
    metrics: dict[str, npt.NDArray[np.floating]]
    rows_read: int

    def __len__(self) -> int:
        return int(self.ts.shape[0])


_DONE = object()
_T = TypeVar("_T")
_A = TypeVar("_A", bound=np.generic)


@dataclass(frozen=True)
class _Batch:
    """A converted batch and its row checks (:func:`~fabricscope.optics.kernels.row_checks`)
    against the previous batch's last row ``prev`` (module, lane, ts; module -1: none)."""

    rows: _Rows
    ordered: bool
    back: int
    dup: int
    prev: tuple[int, int, int]


def _read_ahead(it: Iterator[_T], depth: int) -> Iterator[_T]:
    """``it`` pulled by a background thread, ``depth`` batches ahead (Parquet decoding releases
    the GIL, so it overlaps the consumer's numpy work on another core)."""
    if depth <= 0:
        yield from it
        return
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(x: object) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for b in it:
                if not put(b):
                    return
        except BaseException as exc:  # handed to the consumer
            put(exc)
        put(_DONE)

    th = threading.Thread(target=work, name="history-read-ahead", daemon=True)
    th.start()
    try:
        while True:
            x = q.get()
            if x is _DONE:
                return
            if isinstance(x, BaseException):
                raise x
            yield cast(_T, x)
    finally:
        stop.set()


def _dictionary_columns(path: str) -> list[str]:
    """The string columns to read as dictionaries: those the file stores dictionary-encoded
    (in its first row group), for which the codes come without a hash per row; a column
    stored plain is read as plain strings (see :func:`_plain_runs`)."""
    md = pq.ParquetFile(path).metadata
    if md.num_row_groups == 0:
        return list(_STR_COLS)
    rg = md.row_group(0)
    out = []
    for i in range(rg.num_columns):
        col = rg.column(i)
        if col.path_in_schema in _STR_COLS and any("DICTIONARY" in e for e in col.encodings):
            out.append(col.path_in_schema)
    return out


class _Buffers:
    """Output columns used again once nothing refers to them (each view of a buffer holds a
    reference to it as its ``base``): streaming then writes into memory already mapped,
    instead of faulting fresh pages in for every batch (a large share of the CPU in a VM)."""

    def __init__(self) -> None:
        self._held: list[npt.NDArray[np.generic]] = []

    def get(self, n: int, dtype: np.dtype[_A], capacity: int) -> npt.NDArray[_A]:
        held = self._held
        for i in range(len(held)):
            a = held[i]
            # references: the list, ``a`` and getrefcount's argument; a view would add one
            if a.dtype == dtype and a.shape[0] >= n and sys.getrefcount(a) <= 3:
                return cast(npt.NDArray[_A], a[:n])
        buf = np.empty(max(n, capacity), dtype=dtype)
        held.append(buf)
        return buf[:n]


class HistoryChunks:
    """A Parquet history table read in chunks of whole modules, memory bounded by a chunk.

    Assumes each module's rows are contiguous in the file (any order of lanes and times
    inside a module), which is how ``optics twin`` (:func:`fabricscope.twin.optics_fleet.\
write_fleet`) and :func:`write_history` lay them out. A file that is not raises
    :class:`UnorderedHistoryError` naming the file, the first out-of-order row and its module;
    nothing is partitioned on disk. Batches of ``batch_rows`` rows are read (Apache Parquet
    format, via ``pyarrow.parquet.ParquetFile.iter_batches``; small batches keep Arrow's
    buffers in its allocator's reused memory) and repaired by a thread, ``read_ahead`` chunks
    ahead; a chunk is cut once it holds ``min_rows`` rows, before the module still being
    read. Each chunk is repaired like :func:`read_history` (sorted, duplicates dropped); the
    repair counts add up, so :attr:`warnings` equals ``read_history(path).warnings``, and the
    module ids, :attr:`modules` and the rows equal its, chunk by chunk. Sorted rows take a
    fast path (one compiled check per batch, repeated samples dropped while the batch is
    copied into a reused buffer: docs/design/optics-stream.md); a chunk's arrays are views of
    such a buffer, which is used again once nothing refers to it.
    """

    def __init__(self, path: str | os.PathLike[str], *, batch_rows: int = 1 << 17,
                 min_rows: int = 1 << 20, read_ahead: int = 2) -> None:
        self.path = os.fspath(path)
        self._warnings: list[str] = []
        try:
            # pre_buffer off: reading a row group's column chunks whole up front costs a
            # fresh buffer per row group (page faults: more system time than the decoding
            # saves); page by page, the reader reuses its memory
            self._pf = pq.ParquetFile(self.path, read_dictionary=_dictionary_columns(
                self.path), pre_buffer=False)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ConfigError(f"{self.path}: cannot read the history table: {exc}") from exc
        self.names = list(self._pf.schema_arrow.names)
        self.num_rows = int(self._pf.metadata.num_rows)
        _check_columns(self.path, self.names, self._warnings)
        self._batch_rows = max(1, int(batch_rows))
        self._min_rows = max(1, int(min_rows))
        self._read_ahead = int(read_ahead)
        self._mods = _Modules()
        self._repairs = _Repairs()
        self._lanes = np.zeros(0, dtype=np.int32)
        self._done = False
        self._buffers = _Buffers()

    def ts_range(self) -> tuple[int, int] | None:
        """(first, last) ``ts`` in ns, from the row groups' statistics when every one has them,
        else from one pass over the ``ts`` column; None for a table without rows."""
        if self.num_rows == 0:
            return None
        md = self._pf.metadata
        col = self.names.index("ts")
        if pa.types.is_integer(self._pf.schema_arrow.field("ts").type):
            lo: list[int] = []
            hi: list[int] = []
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                if rg.num_rows == 0:
                    continue
                st = rg.column(col).statistics
                if st is None or not st.has_min_max or st.null_count:
                    break
                lo.append(int(st.min))
                hi.append(int(st.max))
            else:
                return (min(lo), max(hi)) if lo else None
        first, last = None, None
        scratch: list[str] = []
        try:
            for b in self._pf.iter_batches(batch_size=self._batch_rows, columns=["ts"]):
                if b.num_rows == 0:
                    continue
                t = _ts_column(b.column("ts"), self.path, scratch)
                a, z = int(pc.min(t).as_py()), int(pc.max(t).as_py())
                first = a if first is None else min(first, a)
                last = z if last is None else max(last, z)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ConfigError(f"{self.path}: cannot read the history table: {exc}") from exc
        return None if first is None or last is None else (first, last)

    @property
    def modules(self) -> ModuleTable:
        """Every module seen so far (all of them after the iteration), lanes counted."""
        lanes = np.zeros(len(self._mods.index), dtype=np.int32)
        lanes[: self._lanes.shape[0]] = self._lanes
        return self._mods.table(lanes)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What was repaired (complete after the iteration): the texts of :func:`read_history`."""
        return tuple(self._warnings) + tuple(self._repairs.warnings(self.path))

    def _cut(self, parts: list[_Rows], rows_read: int, upto: int | None) -> tuple[
            HistoryChunk | None, list[_Rows]]:
        ts = np.concatenate([x[0] for x in parts]) if len(parts) > 1 else parts[0][0]
        module = np.concatenate([x[1] for x in parts]) if len(parts) > 1 else parts[0][1]
        lane = np.concatenate([x[2] for x in parts]) if len(parts) > 1 else parts[0][2]
        met = {m: (np.concatenate([x[3][m] for x in parts]) if len(parts) > 1 else parts[0][3][m])
               for m in ALL_METRICS}
        cut = ts.shape[0] if upto is None else int(np.searchsorted(module, upto, side="left"))
        rest: list[_Rows] = []
        if cut < ts.shape[0]:
            rest = [(ts[cut:], module[cut:], lane[cut:], {m: v[cut:] for m, v in met.items()})]
        if cut == 0:
            return None, rest
        (ts, module, lane, met), rep = _repair(ts[:cut], module[:cut], lane[:cut],
                                               {m: v[:cut] for m, v in met.items()})
        self._repairs.add(rep)
        top = int(module[-1]) + 1
        if top > self._lanes.shape[0]:
            self._lanes = np.concatenate(
                [self._lanes, np.zeros(top - self._lanes.shape[0], dtype=np.int32)])
        np.maximum.at(self._lanes, module, lane + 1)
        return HistoryChunk(ts=ts, module=module, lane=lane, metrics=met,
                            rows_read=rows_read), rest

    def _rows(self) -> Iterator[_Batch]:
        """Converted, checked batches (run by the read-ahead thread: decoding, the module
        index and the one-pass row checks overlap the consumer's work)."""
        p = self.path
        cols = [c for c in self.names if c in COLUMNS]
        r = 0
        prev = (-1, 0, 0)
        for batch in self._pf.iter_batches(batch_size=self._batch_rows, columns=cols):
            k = batch.num_rows
            if k == 0:
                continue
            ts, lane, module, got = _convert_batch(batch, p, self.names, self._mods,
                                                   self._warnings, r)
            del batch  # drop the identity / threshold columns now
            off = np.flatnonzero((lane < 0) | (lane > 63))
            if off.size:
                raise ConfigError(f"{p}: row {r + int(off[0])} (0-based): lane: "
                                  f"{int(lane[off[0]])}: outside 0..63")
            bad, ordered, back, dup = kernels.row_checks(ts, module, lane, *prev)
            if bad >= 0:
                i = int(module[bad])
                raise UnorderedHistoryError(
                    f"{p}: row {r + bad} (0-based): module "
                    f"{self._mods.ident['device'][i]}:{self._mods.ident['port'][i]} "
                    "reappears after another module's rows: streaming needs each "
                    "module's rows contiguous (sort the file by device, port, or read it "
                    "whole with --no-stream)")
            met = {m: got[m] if m in got else np.full(k, np.nan, dtype=metric_dtype(m))
                   for m in ALL_METRICS}
            r += k
            yield _Batch((ts, module, lane, met), bool(ordered), int(back), int(dup), prev)
            prev = (int(module[-1]), int(lane[-1]), int(ts[-1]))

    def _emit(self, rows: _Rows, rows_read: int) -> HistoryChunk:
        """A chunk of repaired rows of whole modules: counter resets and lanes counted."""
        ts, module, lane, met = rows
        top = int(module[-1]) + 1
        if top > self._lanes.shape[0]:
            self._lanes = np.concatenate(
                [self._lanes, np.zeros(top - self._lanes.shape[0], dtype=np.int32)])
        rf, rc = kernels.resets_and_lanes(module, lane, met["fec_uncorrectable"],
                                          met["crc_errors"], self._lanes)
        self._repairs.resets["fec_uncorrectable"] += int(rf)
        self._repairs.resets["crc_errors"] += int(rc)
        return HistoryChunk(ts=ts, module=module, lane=lane, metrics=met, rows_read=rows_read)

    def _chunks(self) -> Iterator[HistoryChunk | tuple[_Rows, int]]:
        """Run by the read-ahead thread. While the rows come sorted within each lane (as
        ``optics twin`` writes them), each batch is appended to a reused buffer while still
        in cache, its repeated samples dropped on the way (one copy in all), and chunks of
        whole modules come out repaired. The first batch that needs sorting switches to the
        general path: the rows not yet cut, then every batch, are handed on raw (``(rows,
        rows read)``) and repaired by ``_repair`` once a chunk is cut (dropping a repeated
        sample before sorting keeps the same rows and counts, so the two paths mix)."""
        cap = self._min_rows + 2 * self._batch_rows
        buf: _Rows | None = None
        fill = 0
        raw = False
        r = 0

        def new_buffer(size: int, head: _Rows | None, nh: int) -> _Rows:
            def one(dt: np.dtype[np.generic], col: npt.NDArray[np.generic] | None
                    ) -> npt.NDArray[np.generic]:
                out = self._buffers.get(size, dt, cap)
                if col is not None and nh:
                    out[:nh] = col[:nh]
                return out
            h = head
            return (cast(npt.NDArray[np.int64], one(np.dtype(np.int64), h and h[0])),
                    cast(npt.NDArray[np.int32], one(np.dtype(np.int32), h and h[1])),
                    cast(npt.NDArray[np.int32], one(np.dtype(np.int32), h and h[2])),
                    {m: cast(npt.NDArray[np.floating], one(np.dtype(metric_dtype(m)),
                                                           None if h is None else h[3][m]))
                     for m in ALL_METRICS})

        def view(rows: _Rows, a: int, z: int) -> _Rows:
            return (rows[0][a:z], rows[1][a:z], rows[2][a:z],
                    {m: v[a:z] for m, v in rows[3].items()})

        for b in self._rows():
            k = int(b.rows[0].shape[0])
            r += k
            if not raw and (not b.ordered or b.back):
                raw = True
                if buf is not None and fill:
                    yield view(buf, 0, fill), r - k
                buf = None
            if raw:
                yield b.rows, r
                continue
            kept = k - b.dup
            if buf is None or fill + kept > buf[0].shape[0]:
                old, nold = buf, fill
                buf = new_buffer(max(cap, nold + kept), old, nold)
            keep = kernels.keep_rows(*b.rows[:3], b.prev) if b.dup else None
            self._repairs.dup += b.dup
            dsts: list[npt.NDArray[np.generic]] = [buf[0], buf[1], buf[2], *buf[3].values()]
            srcs: list[npt.NDArray[np.generic]] = [b.rows[0], b.rows[1], b.rows[2],
                                                   *(b.rows[3][m] for m in buf[3])]
            for dst, src in zip(dsts, srcs, strict=True):
                if keep is None:
                    dst[fill:fill + kept] = src
                else:
                    kernels.compact(src, keep, dst, fill)
            fill += kept
            if fill < self._min_rows:
                continue
            mod = buf[1]
            cut = int(np.searchsorted(mod[:fill], mod[fill - 1], side="left"))
            if cut == 0:
                continue
            yield self._emit(view(buf, 0, cut), r)
            old, rest = buf, fill - cut
            buf = new_buffer(cap, view(old, cut, fill), rest)
            fill = rest
        if not raw and buf is not None and fill:
            yield self._emit(view(buf, 0, fill), r)

    def __iter__(self) -> Iterator[HistoryChunk]:
        if self._done:
            raise ConfigError(f"{self.path}: history chunks: already read (open it again)")
        self._done = True
        parts: list[_Rows] = []
        pending = 0
        try:
            for item in _read_ahead(self._chunks(), self._read_ahead):
                if isinstance(item, HistoryChunk):
                    yield item
                    continue
                rows, r = item
                parts.append(rows)
                pending += int(rows[0].shape[0])
                if pending >= self._min_rows:
                    chunk, parts = self._cut(parts, r, int(rows[1][-1]))
                    pending = sum(x[0].shape[0] for x in parts)
                    if chunk is not None:
                        yield chunk
        except (OSError, pa.ArrowInvalid) as exc:
            raise ConfigError(f"{self.path}: cannot read the history table: {exc}") from exc
        if parts:
            chunk, _ = self._cut(parts, self.num_rows, None)
            if chunk is not None:
                yield chunk


def _read_parquet_chunked(p: str) -> FleetHistory:
    """:func:`read_history` of a Parquet file whose modules are contiguous: chunks of whole
    modules repaired one by one (in cache) into preallocated columns; same result."""
    reader = HistoryChunks(p)
    n = reader.num_rows
    ts = np.empty(n, dtype=np.int64)
    module = np.empty(n, dtype=np.int32)
    lane = np.empty(n, dtype=np.int32)
    metrics = {m: np.empty(n, dtype=metric_dtype(m)) for m in ALL_METRICS}
    r = 0
    for c in reader:
        k = len(c)
        ts[r:r + k], module[r:r + k], lane[r:r + k] = c.ts, c.module, c.lane
        for m, v in c.metrics.items():
            metrics[m][r:r + k] = v
        r += k
    return FleetHistory(ts=ts[:r], module=module[:r], lane=lane[:r],
                        metrics={m: v[:r] for m, v in metrics.items()},
                        modules=reader.modules, warnings=reader.warnings)


def write_history(history: FleetHistory, path: str | os.PathLike[str], *,
                  row_group_size: int = 1 << 20) -> None:
    """Write ``history`` with exactly the table's columns: Parquet by suffix, else CSV.

    Parquet stores device / port / identity dictionary-encoded, each distinct string once
    per row group (a dictionary with repeated entries would make the Parquet writer fall back
    to plain strings, one per row, which cost readers a string decode per row).
    """
    p = os.fspath(path)
    mt = history.modules
    idx = pa.array(history.module, type=pa.int32())

    def strings(c: str) -> pa.Array:
        enc = pc.dictionary_encode(pa.array(getattr(mt, c), pa.string()))
        return pa.DictionaryArray.from_arrays(enc.indices.take(idx), enc.dictionary)

    cols: dict[str, pa.Array] = {"ts": pa.array(history.ts, type=pa.int64())}
    for c in ("device", "port"):
        cols[c] = strings(c)
    cols["lane"] = pa.array(history.lane, type=pa.int32())
    for m in ALL_METRICS:
        cols[m] = pa.array(np.asarray(history.metrics[m], dtype=metric_dtype(m)))
    for c in IDENTITY:
        cols[c] = strings(c)
    for c in THRESHOLD_COLUMNS:
        per_mod = np.asarray(mt.thresholds.get(c, np.full(len(mt), np.nan)), dtype=np.float64)
        cols[c] = pa.array(per_mod[history.module] if len(mt) else per_mod[:0])
    table = pa.table({c: cols[c] for c in COLUMNS})
    try:
        if _is_parquet(p):
            pq.write_table(table, p, row_group_size=row_group_size)
        else:
            plain = pa.table({c: (table[c].cast(pa.string()) if c in _STR_COLS else table[c])
                              for c in COLUMNS})
            pacsv.write_csv(plain, p)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot write the history table: {exc}") from exc


@dataclass(frozen=True)
class Labels:
    """Failure labels: one row per failed module (what an RMA / ticket system exports).

    ``failure_ts`` is int64 ns UTC; ``cause`` is ``""`` when not given.
    """

    device: tuple[str, ...]
    port: tuple[str, ...]
    serial: tuple[str, ...]
    failure_ts: npt.NDArray[np.int64]
    cause: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.device)


_TIME_COLS = ("failure_time", "failure_ts", "failure_ts_ns", "ts", "time")


def read_labels(path: str | os.PathLike[str]) -> Labels:
    """Failure labels from a CSV with ``device``, ``port``, ``serial``, a failure time column
    (``failure_time`` / ``failure_ts`` / ``failure_ts_ns`` / ``ts``: int ns or ISO-8601) and optional ``cause``.

    A row without a time, or without both (device, port) and serial, is warned
    (``FILE:LINE: field: value: skipped``) and skipped. A missing header column raises
    :class:`ConfigError`.
    """
    p = os.fspath(path)
    warnings: list[str] = []
    dev: list[str] = []
    prt: list[str] = []
    ser: list[str] = []
    ts: list[int] = []
    cause: list[str] = []
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            rd = csv.DictReader(fh)
            header = [h.strip() for h in (rd.fieldnames or [])]
            rd.fieldnames = header
            tcol = next((c for c in _TIME_COLS if c in header), None)
            for need in ("device", "port", "serial"):
                if need not in header:
                    raise ConfigError(f"{p}:1: labels: column {need!r} missing "
                                      "(need device, port, serial, failure_time[, cause])")
            if tcol is None:
                raise ConfigError(f"{p}:1: labels: no failure time column (one of "
                                  f"{', '.join(_TIME_COLS)})")
            for row in rd:
                line = rd.line_num
                d = (row.get("device") or "").strip()
                po = (row.get("port") or "").strip()
                s = (row.get("serial") or "").strip()
                t = (row.get(tcol) or "").strip()
                if not ((d and po) or s):
                    warnings.append(f"{p}:{line}: device/port/serial: (empty): row names no "
                                    "module: skipped")
                    continue
                try:
                    tv = parse_ts(t)
                except ValueError:
                    warnings.append(f"{p}:{line}: {tcol}: {t or '(empty)'}: not int ns or "
                                    "ISO-8601: skipped")
                    continue
                dev.append(d)
                prt.append(po)
                ser.append(s)
                ts.append(tv)
                cause.append((row.get("cause") or "").strip())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the labels: {exc.strerror}") from exc
    return Labels(device=tuple(dev), port=tuple(prt), serial=tuple(ser),
                  failure_ts=np.asarray(ts, dtype=np.int64), cause=tuple(cause),
                  warnings=tuple(warnings))
