"""Any mix of optics inputs into one :class:`FleetHistory` (what ``fabricscope optics`` reads).

By file: ``.parquet`` / ``.csv`` are history tables (:func:`read_history`); a ``.json`` whose
text names ``TRANSCEIVER_`` tables is a SONiC STATE_DB dump (:func:`read_sonic_state_db`);
every other file is ``ethtool -m`` output, text or ``--json`` (:func:`read_ethtool_files`).
The parts are merged: a module (device, port) seen in several inputs is one module, its
identity and thresholds from the first input that has it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from fabricscope.model.errors import ConfigError
from fabricscope.optics.history import (
    ALL_METRICS,
    THRESHOLD_COLUMNS,
    FleetHistory,
    ModuleTable,
    metric_dtype,
    sort_rows,
)
from fabricscope.optics.readers.ethtool import read_ethtool_files
from fabricscope.optics.readers.sonic import read_sonic_state_db
from fabricscope.optics.readers.table import read_history

__all__ = ["input_kind", "merge_histories", "read_inputs"]


def input_kind(path: str | os.PathLike[str]) -> str:
    """``history``, ``sonic`` or ``ethtool`` for one input file (see the module docstring)."""
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    if ext in (".parquet", ".pq", ".csv"):
        return "history"
    if ext == ".json":
        try:
            with open(p, encoding="utf-8", errors="replace") as fh:
                head = fh.read(1 << 16)
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
        if "TRANSCEIVER_" in head:
            return "sonic"
    return "ethtool"


def read_inputs(paths: Iterable[str | os.PathLike[str]], *, ts_ns: int) -> FleetHistory:
    """Read every input, each with its reader, and merge them into one history.

    ``ts_ns`` is the sample time of snapshot inputs that carry none (ethtool outputs without
    a ``ts=`` header, SONiC dumps: their file time is used when ``ts_ns`` is 0).
    """
    files = [os.fspath(p) for p in paths]
    if not files:
        raise ConfigError("optics: no input files given")
    for f in files:
        if not os.path.exists(f):
            raise ConfigError(f"{f}: no such file")
        if os.path.isdir(f):
            raise ConfigError(f"{f}: is a folder; give the files in it (e.g. {f}/*.txt)")
    parts: list[FleetHistory] = []
    ethtool: list[str] = []
    for f in files:
        kind = input_kind(f)
        if kind == "history":
            parts.append(read_history(f))
        elif kind == "sonic":
            parts.append(read_sonic_state_db(f, ts_ns=ts_ns or None))
        else:
            ethtool.append(f)
    if ethtool:
        parts.append(read_ethtool_files(ethtool, ts_ns=ts_ns))
    return merge_histories(parts)


def merge_histories(parts: Sequence[FleetHistory]) -> FleetHistory:
    """One history from several: modules matched by (device, port), rows concatenated."""
    if len(parts) == 1:
        return parts[0]
    index: dict[tuple[str, str], int] = {}
    order: list[tuple[int, int]] = []  # (part, module in part) of each merged module
    remap: list[np.ndarray] = []
    for pi, h in enumerate(parts):
        mt = h.modules
        m = np.empty(len(mt), dtype=np.int32)
        for i in range(len(mt)):
            key = (mt.device[i], mt.port[i])
            if key not in index:
                index[key] = len(order)
                order.append((pi, i))
            m[i] = index[key]
        remap.append(m)

    def col(name: str) -> tuple[str, ...]:
        return tuple(getattr(parts[p].modules, name)[i] for p, i in order)

    lanes = np.zeros(len(order), dtype=np.int32)
    for pi, h in enumerate(parts):
        if len(h.modules):
            np.maximum.at(lanes, remap[pi], h.modules.lanes)
    thresholds = {
        c: np.array([float(parts[p].modules.thresholds.get(c, np.full(len(parts[p].modules),
                                                                       np.nan))[i])
                     for p, i in order], dtype=np.float64)
        for c in THRESHOLD_COLUMNS
    }
    modules = ModuleTable(
        device=col("device"), port=col("port"), vendor=col("vendor"),
        part_number=col("part_number"), serial=col("serial"), media=col("media"),
        lanes=lanes, thresholds=thresholds,
    )
    ts = np.concatenate([h.ts for h in parts]).astype(np.int64)
    mod = np.concatenate([remap[pi][h.module] for pi, h in enumerate(parts)]).astype(np.int32)
    lane = np.concatenate([h.lane for h in parts]).astype(np.int32)
    metrics = {k: np.concatenate([np.asarray(h.metrics[k], dtype=metric_dtype(k)) for h in parts])
               for k in ALL_METRICS}
    ts, mod, lane, mets = sort_rows(ts, mod, lane, metrics)
    warnings = tuple(w for h in parts for w in h.warnings)
    return FleetHistory(ts=ts, module=mod, lane=lane, metrics=mets, modules=modules,
                        warnings=warnings)
