"""Closed-form collective times (alpha-beta) and the ring time from steady-state flow rates.

Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH" (IJHPCA 2005): with per-message latency ``a`` and per-byte time ``b = 8 / B`` on a
link of ``B`` bit/s, for ``p`` ranks and ``n`` bytes per rank

* ring all-reduce                   ``2(p-1) a + 2(p-1)/p n b``
* ring all-gather / reduce-scatter  ``(p-1) a + (p-1)/p n b``
* recursive halving-doubling        ``2 log2(p) a + 2(p-1)/p n b``
* pairwise all-to-all               ``(p-1) a + (p-1)/p n b``
* double binary tree, pipelined     ``2 ceil(log2 p) a + 2 n b`` (each node sends ``2n`` in
  total: half the buffer up and down two edges in the tree where it is inner, up one edge in
  the tree where it is a leaf; pipeline fill ignored)

The bandwidth terms are what nccl-tests' busbw normalizes away: busbw = ``B`` exactly when
the bandwidth term is the whole time (SIMULATION.md §3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.hashing import HashConfig
from fabricscope.fabric.inventory import Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import WorkloadError
from fabricscope.sim.flows import Collective, Workload, busbw

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "rhd", "tree"),
    "allgather": ("ring",),
    "reducescatter": ("ring",),
    "alltoall": ("pairwise",),
}


def alpha_beta_time(
    collective: str,
    n_ranks: int,
    size_bytes: float,
    *,
    bandwidth_bps: float,
    alpha_s: float = 0.0,
    algorithm: str = "ring",
) -> float:
    """Predicted seconds for ``collective`` of ``size_bytes`` per rank on links of ``bandwidth_bps``."""
    p = n_ranks
    if p < 2:
        raise WorkloadError(f"alpha-beta: ranks: need at least 2, got {p}")
    if not bandwidth_bps > 0:
        raise WorkloadError(f"alpha-beta: bandwidth: must be > 0, got {bandwidth_bps!r}")
    if algorithm not in ALGORITHMS.get(collective, ()):
        raise WorkloadError(
            f"alpha-beta: algorithm: {algorithm!r} is not modelled for {collective!r} "
            f"(known: {ALGORITHMS})"
        )
    b = 8.0 / bandwidth_bps
    n = size_bytes
    if collective == "allreduce":
        if algorithm == "ring":
            return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n * b
        if algorithm == "rhd":
            return 2 * math.log2(p) * alpha_s + 2 * (p - 1) / p * n * b
        return 2 * math.ceil(math.log2(p)) * alpha_s + 2 * n * b
    return (p - 1) * alpha_s + (p - 1) / p * n * b


def ring_time_from_rates(
    workload: Workload,
    rates_bps: Sequence[float] | npt.NDArray[np.float64],
    *,
    alpha_s: float = 0.0,
    latency_s: Sequence[float] | npt.NDArray[np.float64] | None = None,
) -> float:
    """Completion time of a ring collective from one steady-state step's flow rates.

    ``workload`` comes from :func:`~fabricscope.sim.workload.collectives.ring_steady_state`;
    ``rates_bps[i]`` is the rate (bit/s) flow ``i`` gets when all of them run together (the
    engine's max-min solution at t = 0). A pipelined ring advances one step when its slowest
    hop's chunk has arrived, so channel ``c`` takes
    ``steps * (alpha + max over its hops of (chunk * 8 / rate + latency))`` and the collective
    ends with its slowest channel (``latency_s``: per-flow one-way delay, e.g. from
    :func:`path_latency_s`; omitted, only the bandwidth term is counted). This is the alpha-beta ring formula with
    ``B`` replaced by the slowest hop's fair share; it is exact for one channel, and a
    slight over-estimate for several (a channel's idle fast hops could lend bandwidth to
    another channel's slow hop, which max-min at t = 0 does not see).
    """
    meta = workload.meta
    if not meta.get("steady_state"):
        raise WorkloadError(f"ring time: workload {workload.name!r} is not a ring steady state")
    if len(rates_bps) != len(workload.flows):
        raise WorkloadError(
            f"ring time: rates: {len(rates_bps)} rates for {len(workload.flows)} flows"
        )
    steps = _as_int(meta["steps"])
    chunk = _as_float(meta["chunk_bytes"])
    bounds = meta["channel_flows"]
    assert isinstance(bounds, list)
    rates = np.asarray(rates_bps, dtype=np.float64)
    lat = np.zeros_like(rates) if latency_s is None else np.asarray(latency_s, dtype=np.float64)
    if lat.shape != rates.shape:
        raise WorkloadError(f"ring time: latency_s: {lat.shape[0]} values for {rates.shape[0]} flows")
    if np.any(rates <= 0):
        return math.inf
    step = chunk * 8.0 / rates + lat
    worst = 0.0
    for lo, hi in bounds:
        if hi > lo:
            worst = max(worst, steps * (alpha_s + float(step[lo:hi].max())))
    return worst


def ring_busbw_from_rates(
    workload: Workload,
    rates_bps: Sequence[float] | npt.NDArray[np.float64],
    *,
    alpha_s: float = 0.0,
    latency_s: Sequence[float] | npt.NDArray[np.float64] | None = None,
) -> float:
    """nccl-tests busbw (bytes/s) of the ring whose steady state is ``workload``."""
    t = ring_time_from_rates(workload, rates_bps, alpha_s=alpha_s, latency_s=latency_s)
    coll = str(workload.meta["collective"])
    if coll not in ("allreduce", "allgather", "reducescatter"):
        raise WorkloadError(f"ring busbw: meta.collective: unknown {coll!r}")
    return busbw(_COLL[coll], workload.n_ranks, _as_float(workload.meta["size_bytes"]), t)


_COLL: dict[str, Collective] = {
    "allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reducescatter",
}


def path_latency_s(
    fabric: Fabric,
    workload: Workload,
    *,
    mtu_bytes: int = 4096,
    hash_config: HashConfig | None = None,
    routing: Routing | None = None,
) -> npt.NDArray[np.float64]:
    """One-way delay of each flow's ECMP path: propagation plus one MTU store-and-forward per
    switch (the flow engine's arrival model). In a Clos every shortest path has the same hop
    count, so this holds for sprayed flows too. Pass ``routing`` to reuse one across calls
    (building it is most of the cost on a 32k-GPU fabric)."""
    ix = fabric.index
    src = np.array([ix.node_of[f.src] for f in workload.flows], dtype=np.int64)
    dst = np.array([ix.node_of[f.dst] for f in workload.flows], dtype=np.int64)
    ports = np.array([49152 if f.src_port is None else f.src_port for f in workload.flows],
                     dtype=np.int64)
    rt = routing if routing is not None else Routing(fabric, hash_config=hash_config)
    tab = rt.route_many(src, dst, ports, strict=False)
    rows = np.repeat(np.arange(src.shape[0]), np.diff(tab.offsets))
    lat = np.bincount(rows, weights=ix.latency_ns[tab.edges].astype(np.float64),
                      minlength=src.shape[0])
    ser = np.bincount(rows, weights=8.0 * mtu_bytes / ix.capacity_bps[tab.edges] * 1e9,
                      minlength=src.shape[0])
    hops = np.diff(tab.offsets)
    first = np.where(hops > 0, ser / np.maximum(hops, 1), 0.0)
    return np.asarray((lat + ser - first) / 1e9, dtype=np.float64)


def _as_int(x: object) -> int:
    assert isinstance(x, int)
    return x


def _as_float(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)
