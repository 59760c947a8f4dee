"""The optics history table: one row per (module lane, sample time), columnar in memory.

Every reader (``ethtool -m``, SONiC STATE_DB, gNMI store, CSV / Parquet) and the synthetic
fleet generator produce this one shape, and grading / prediction consume it, so other tools
can feed fabricscope by writing the same columns (issue 12):

========================  =======  ==================================================
column                    type     meaning
========================  =======  ==================================================
``ts``                    int64    sample time, ns since the epoch (UTC)
``device``                str      switch or host name
``port``                  str      port name on that device (``Ethernet8``, ``eth1``)
``lane``                  int      0-based lane of the module
``temperature_c``         float    module case temperature
``vcc_v``                 float    supply voltage
``tx_bias_ma``            float    laser bias current of the lane
``tx_power_dbm``          float    transmit power of the lane
``rx_power_dbm``          float    receive power of the lane
``laser_temp_c``          float    optional: laser / TEC temperature
``pre_fec_ber``           float    optional: pre-FEC bit error ratio (per module or lane)
``fec_uncorrectable``     float    optional: cumulative uncorrectable FEC codewords
``crc_errors``            float    optional: cumulative CRC / FCS errors of the port
``vendor``                str      module identity
``part_number``           str
``serial``                str
``media``                 str      e.g. ``400GBASE-DR4``, ``100GBASE-SR4``
``<m>_high_alarm`` ...    float    optional thresholds for temperature_c, vcc_v,
                                   tx_bias_ma, tx_power_dbm, rx_power_dbm:
                                   ``_high_alarm``, ``_high_warn``, ``_low_warn``,
                                   ``_low_alarm``
========================  =======  ==================================================

Missing values are NaN (floats) or ``""`` (strings). In memory, :class:`FleetHistory` keeps
numeric columns as numpy arrays (metrics as float32 to halve memory at fleet scale) and the
module identity once per module (:class:`ModuleTable`), with ``module`` / ``lane`` indices per
row, so a 10,000-module fleet's identity strings are not repeated per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

METRICS: tuple[str, ...] = (
    "temperature_c", "vcc_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm",
)
OPTIONAL_METRICS: tuple[str, ...] = (
    "laser_temp_c", "pre_fec_ber", "fec_uncorrectable", "crc_errors",
)
ALL_METRICS: tuple[str, ...] = METRICS + OPTIONAL_METRICS
#: Cumulative counters: kept as float64 (float32 is exact only to 2^24, and a counter's
#: increase between two samples is a difference of large numbers).
COUNTER_METRICS: tuple[str, ...] = ("fec_uncorrectable", "crc_errors")
IDENTITY: tuple[str, ...] = ("vendor", "part_number", "serial", "media")
THRESHOLD_KINDS: tuple[str, ...] = ("high_alarm", "high_warn", "low_warn", "low_alarm")
THRESHOLD_COLUMNS: tuple[str, ...] = tuple(
    f"{m}_{k}" for m in METRICS for k in THRESHOLD_KINDS
)
#: Every column of the history table, in the documented order.
COLUMNS: tuple[str, ...] = (
    "ts", "device", "port", "lane", *ALL_METRICS, *IDENTITY, *THRESHOLD_COLUMNS,
)
REQUIRED_COLUMNS: tuple[str, ...] = ("ts", "device", "port", "lane", *METRICS)

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class ModuleTable:
    """One row per module (a transceiver in a ``device``/``port``), identity and thresholds.

    ``thresholds[col][i]`` is module ``i``'s value of threshold column ``col`` (one of
    :data:`THRESHOLD_COLUMNS`; NaN where the source gave none: the per-part catalog fills
    those in grading). ``lanes[i]`` is the number of lanes seen.
    """

    device: tuple[str, ...]
    port: tuple[str, ...]
    vendor: tuple[str, ...]
    part_number: tuple[str, ...]
    serial: tuple[str, ...]
    media: tuple[str, ...]
    lanes: I32
    thresholds: Mapping[str, npt.NDArray[np.float64]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.device)

    def key(self, i: int) -> str:
        """``device:port`` of module ``i`` (the fabric's port id form)."""
        return f"{self.device[i]}:{self.port[i]}"

    def index(self) -> dict[tuple[str, str], int]:
        """(device, port) -> module row."""
        return {(d, p): i for i, (d, p) in enumerate(zip(self.device, self.port, strict=True))}


@dataclass(frozen=True)
class FleetHistory:
    """The history table in memory, sorted by (module, lane, ts).

    ``module[r]`` and ``lane[r]`` locate row ``r``; ``metrics[name]`` holds every metric of
    :data:`ALL_METRICS` as float32 (NaN where absent), the cumulative counters of
    :data:`COUNTER_METRICS` as float64; ``ts`` is int64 ns. ``warnings`` are
    one-line notes of what a reader skipped or repaired (file and position in each).
    """

    ts: I64
    module: I32
    lane: I32
    metrics: Mapping[str, npt.NDArray[np.floating]]
    modules: ModuleTable
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    def lane_rows(self) -> tuple[I64, I64]:
        """Start / end row of each (module, lane) run: ``starts[k]:ends[k]``, sorted order."""
        key = self.module.astype(np.int64) * 64 + self.lane.astype(np.int64)
        if key.shape[0] == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z
        cut = np.flatnonzero(np.diff(key)) + 1
        starts = np.concatenate([[0], cut]).astype(np.int64)
        ends = np.concatenate([cut, [key.shape[0]]]).astype(np.int64)
        return starts, ends


def empty_thresholds(n: int) -> dict[str, npt.NDArray[np.float64]]:
    """NaN for every threshold column of ``n`` modules."""
    return {c: np.full(n, np.nan) for c in THRESHOLD_COLUMNS}


def metric_dtype(name: str) -> type[np.floating]:
    """float64 for the cumulative counters, float32 for every other metric."""
    return np.float64 if name in COUNTER_METRICS else np.float32


def sort_rows(
    ts: I64, module: I32, lane: I32, metrics: Mapping[str, npt.ArrayLike]
) -> tuple[I64, I32, I32, dict[str, npt.NDArray[np.floating]]]:
    """Rows sorted by (module, lane, ts); metrics cast to :func:`metric_dtype`."""
    order = np.lexsort((ts, lane, module))
    out = {k: np.asarray(v, dtype=metric_dtype(k))[order] for k, v in metrics.items()}
    for k in ALL_METRICS:
        out.setdefault(k, np.full(order.shape[0], np.nan, dtype=metric_dtype(k)))
    return ts[order], module[order], lane[order], out


def module_table(
    rows: Sequence[Mapping[str, object]], *, lanes: Sequence[int] | None = None
) -> ModuleTable:
    """A :class:`ModuleTable` from per-module dicts (keys: device, port, identity, thresholds)."""
    n = len(rows)
    th = empty_thresholds(n)
    for i, r in enumerate(rows):
        for c in THRESHOLD_COLUMNS:
            v = r.get(c)
            if isinstance(v, int | float) and not isinstance(v, bool):
                th[c][i] = float(v)

    def col(name: str) -> tuple[str, ...]:
        return tuple(str(r.get(name) or "") for r in rows)

    return ModuleTable(
        device=col("device"), port=col("port"), vendor=col("vendor"),
        part_number=col("part_number"), serial=col("serial"), media=col("media"),
        lanes=np.asarray(lanes if lanes is not None else [0] * n, dtype=np.int32),
        thresholds=th,
    )
