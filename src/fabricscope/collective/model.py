"""Records of one collective benchmark run: the per-size rows and what the run says of itself."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "COLLECTIVES",
    "CollectiveRun",
    "Placement",
    "RankInfo",
    "SizeRow",
]

#: Every nccl-tests benchmark (``src/*.cu`` of NVIDIA/nccl-tests), by its canonical name.
COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall",
    "alltoallv", "sendrecv", "gather", "scatter", "hypercube",
)


@dataclass(frozen=True)
class Placement:
    """One measurement of one size: out-of-place or in-place.

    time_us:    average time per operation (nccl-tests ``time``, or ``cputime`` with ``-C``)
    algbw_gbs:  size / time, GB/s (1e9 bytes)
    busbw_gbs:  algbw x the collective's bus factor (nccl-tests doc/PERFORMANCE.md)
    wrong:      ``#wrong`` elements (newer layout) or the max error (older ``error`` column);
                None where the file prints ``N/A`` (validation off, ``-c 0``)
    wrong_kind: ``"count"`` (``#wrong``) or ``"error"`` (older relative error column)
    over_threshold: the value carries RCCL's ``*`` (error above the allowed threshold)
    busbw_half_unit: half of the last printed digit of busbw (0.005 for ``%.2f``): the
                rounding the printed figure carries
    iter_stats: per-iteration columns (``-I 1``): i_min, i_max, i_p99 (us), i_cv (%)
    """

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: float | None = None
    wrong_kind: str = "count"
    over_threshold: bool = False
    busbw_half_unit: float = 0.005
    iter_stats: dict[str, float] = field(default_factory=dict)

    @property
    def failed_check(self) -> bool:
        """True when the data check reported wrong elements (a count above 0) or ``*``."""
        return self.over_threshold or (self.wrong_kind == "count" and bool(self.wrong))


@dataclass(frozen=True)
class SizeRow:
    """One message size of a run (one line of the nccl-tests table).

    ``out_of_place`` / ``in_place`` are None where the line does not hold them (trace replay
    prints only in-place; a run killed mid-line holds only out-of-place). ``samples`` counts
    the records merged into this row (1 for nccl-tests; Inspector snapshots are merged).
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    out_of_place: Placement | None
    in_place: Placement | None
    line: int
    samples: int = 1

    def placements(self) -> list[tuple[str, Placement]]:
        """``[("out-of-place", p), ("in-place", p)]``, those present, in print order."""
        out: list[tuple[str, Placement]] = []
        if self.out_of_place is not None:
            out.append(("out-of-place", self.out_of_place))
        if self.in_place is not None:
            out.append(("in-place", self.in_place))
        return out

    def best_busbw(self) -> float:
        """The larger busbw of the placements present (0.0 when none)."""
        return max((p.busbw_gbs for _, p in self.placements()), default=0.0)


@dataclass(frozen=True)
class RankInfo:
    """One ``#  Rank  N Group G Pid P on HOST device D [BUS] NAME`` line."""

    rank: int
    host: str
    device: int
    pid: int | None = None
    group: int | None = None
    bus_id: str = ""
    gpu: str = ""


@dataclass(frozen=True)
class CollectiveRun:
    """Everything one benchmark run (one file, or one run of a file holding several) tells.

    collective:  canonical name (:data:`COLLECTIVES`) or ``"unknown"``
    ranks:       total ranks (listing, else nThread x nGpus for one process); None unknown
    rank_list:   the ``Rank`` lines, in order
    hosts:       distinct hosts of the rank listing, in order of first appearance
    header:      ``# nThread 1 nGpus 8 minBytes ...`` as key -> text
    rows:        the complete size rows, in print order
    partial_sizes: sizes whose line was cut short (no complete placement)
    avg_busbw_file: the file's own ``# Avg bus bandwidth`` (None: absent)
    avg_busbw_recomputed: mean busbw over every printed placement (how nccl-tests averages,
                 src/common.cu: ``bw += busBw; bw_count++`` per placement, then ``bw /= bw_count``)
    avg_tolerance: largest difference explained by the printed rounding
    out_of_bounds: the ``# Out of bounds values`` count (None: absent)
    truncated:   no footer, or a line cut short: the run did not finish
    errors:      failure lines (``NCCL failure``, ``Test NCCL failure``, ``Test failure``, ...)
    warnings:    reader warnings, each naming the file and line
    nccl_info_lines / nccl_warn_lines: NCCL_DEBUG lines mixed in (counted; WARN lines kept)
    source:      the file (and ``#k`` when a file holds several runs)
    fmt:         ``nccl-tests`` or ``nccl-inspector``
    """

    source: str
    collective: str
    ranks: int | None
    rows: tuple[SizeRow, ...]
    rank_list: tuple[RankInfo, ...] = ()
    hosts: tuple[str, ...] = ()
    header: dict[str, str] = field(default_factory=dict)
    partial_sizes: tuple[int, ...] = ()
    avg_busbw_file: float | None = None
    avg_busbw_recomputed: float | None = None
    avg_tolerance: float = 0.0
    out_of_bounds: int | None = None
    truncated: bool = False
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    nccl_info_lines: int = 0
    nccl_warn_lines: tuple[str, ...] = ()
    fmt: str = "nccl-tests"

    @property
    def sizes(self) -> list[int]:
        """The sizes with at least one complete placement, in print order."""
        return [r.size_bytes for r in self.rows]

    @property
    def avg_matches(self) -> bool | None:
        """Whether the file's average equals the recomputation within the printed rounding."""
        if self.avg_busbw_file is None or self.avg_busbw_recomputed is None:
            return None
        return abs(self.avg_busbw_file - self.avg_busbw_recomputed) <= self.avg_tolerance

    @property
    def avg_busbw(self) -> float | None:
        """The file's own average where printed, else the recomputation."""
        return self.avg_busbw_file if self.avg_busbw_file is not None else self.avg_busbw_recomputed

    @property
    def nodes(self) -> int | None:
        """Distinct hosts in the rank listing (None: no listing)."""
        return len(self.hosts) or None
