"""What a workload hands the flow engine: flows with dependencies, and collective metadata.

A :class:`FlowSpec` starts at ``max(start_ns, completion of every dep) + gap_ns``; chained
collective steps (ring all-reduce's 2(n-1) steps, pipeline send/recv) are expressed with
``deps``. Bandwidth definitions follow nccl-tests (doc/PERFORMANCE.md): ``algbw = S / t`` and
``busbw = algbw * factor``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fabricscope.model.errors import WorkloadError

Collective = Literal[
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv", "none"
]


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """One transfer between two NICs.

    id:        unique within its workload, used by ``deps``
    src, dst:  NIC ids (``host0042/nic3``)
    size_bytes: bytes to move
    start_ns:  earliest start
    deps:      ids of flows that must complete first
    gap_ns:    delay after the last dep completes (compute, kernel launch)
    tag:       label for grouping results (``ring-ar/step3``, ``dp-allreduce``)
    src_port:  UDP source port of the 5-tuple (ECMP entropy); None derives one from ``id``
    """

    id: int
    src: str
    dst: str
    size_bytes: float
    start_ns: int = 0
    deps: tuple[int, ...] = ()
    gap_ns: int = 0
    tag: str = ""
    src_port: int | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A set of flows plus what they mean (for algbw / busbw)."""

    name: str
    flows: tuple[FlowSpec, ...]
    collective: Collective = "none"
    n_ranks: int = 0
    size_bytes: float = 0.0  # S of nccl-tests: the per-rank buffer size of the collective
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.flows:
            raise WorkloadError(f"workload {self.name!r}: no flows (empty workload)")




def busbw_factor(collective: Collective, n_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor for ``n_ranks`` ranks."""
    n = n_ranks
    if n < 1:
        raise WorkloadError(f"busbw: n_ranks must be >= 1, got {n}")
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t."""
    return size_bytes / seconds if seconds > 0 else float("inf")


def busbw(collective: Collective, n_ranks: int, size_bytes: float, seconds: float) -> float:
    """Bus bandwidth in bytes/s: algbw x the collective's factor."""
    return algbw(size_bytes, seconds) * busbw_factor(collective, n_ranks)
