"""What a simulation run produced: per-flow times, collective bandwidth, link utilization.

Times are nanoseconds from the start of the run. For every flow:

``start_ns``   when it became active (its start time reached and every dependency arrived)
``fluid_ns``   fluid transfer time (last byte leaves the sender's NIC)
``end_ns``     last byte at the receiver: start + fluid + one-way propagation of the path +
               store-and-forward of one MTU at every switch on the way (what a dependent
               step waits for)
``fct_ns``     flow completion time as a sender sees it (htsim's definition): end - start +
               the return propagation of the acknowledgement; so a lone flow takes
               ``size/rate + base RTT + (hops-1) x MTU/rate``.

Unroutable flows (partitioned endpoints) and flows blocked behind them are listed, never
silently dropped; their times are NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fabricscope.sim.flows import Collective, algbw, busbw

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Utilization:
    """Piecewise-constant load of the directed links: interval ``i`` is ``[t0[i], t1[i])``
    with load ``load[ptr[i]:ptr[i+1]]`` (bits/s) on edges ``edge[ptr[i]:ptr[i+1]]``."""

    t0: FloatArray
    t1: FloatArray
    ptr: IntArray
    edge: IntArray
    load: npt.NDArray[np.float32]
    capacity_bps: FloatArray

    @property
    def n_intervals(self) -> int:
        return int(self.t0.shape[0])

    def mean_utilization(self, t_from: float | None = None, t_to: float | None = None) -> FloatArray:
        """Time-averaged utilization (0..1) of every directed link over ``[t_from, t_to]``."""
        n_e = self.capacity_bps.shape[0]
        if self.n_intervals == 0:
            return np.zeros(n_e)
        lo = float(self.t0[0]) if t_from is None else t_from
        hi = float(self.t1[-1]) if t_to is None else t_to
        if hi <= lo:
            return np.zeros(n_e)
        dur = np.clip(np.minimum(self.t1, hi) - np.maximum(self.t0, lo), 0.0, None)
        w = np.repeat(dur, np.diff(self.ptr))
        acc = np.bincount(self.edge, weights=self.load.astype(np.float64) * w, minlength=n_e)
        return np.asarray(acc / (hi - lo) / self.capacity_bps, dtype=np.float64)

    def peak_utilization(self) -> FloatArray:
        n_e = self.capacity_bps.shape[0]
        out = np.zeros(n_e)
        if self.edge.shape[0]:
            np.maximum.at(out, self.edge, self.load.astype(np.float64))
        return np.asarray(out / self.capacity_bps, dtype=np.float64)

    def timeline(self, edges: Sequence[int], bins: int = 50) -> tuple[FloatArray, FloatArray]:
        """Utilization of ``edges`` on ``bins`` equal time bins: (bin starts, matrix edges x bins)."""
        if self.n_intervals == 0:
            return np.zeros(bins), np.zeros((len(edges), bins))
        lo, hi = float(self.t0[0]), float(self.t1[-1])
        grid = np.linspace(lo, hi, bins + 1)
        out = np.zeros((len(edges), bins))
        for b in range(bins):
            out[:, b] = self.mean_utilization(grid[b], grid[b + 1])[list(edges)]
        return grid[:-1], out


@dataclass(frozen=True)
class SimResult:
    """The outcome of :func:`fabricscope.sim.engine.simulate` for one load-balancing scheme."""

    scheme: str
    fabric_name: str
    workload_name: str
    flow_ids: IntArray
    src: tuple[str, ...]
    dst: tuple[str, ...]
    tags: tuple[str, ...]
    size_bytes: FloatArray
    start_ns: FloatArray
    fluid_ns: FloatArray
    end_ns: FloatArray
    fct_ns: FloatArray
    unroutable: tuple[int, ...]  # flow ids whose endpoints are partitioned
    blocked: tuple[int, ...]  # flow ids that never started (a dependency was unroutable)
    edge_ids: tuple[str, ...]  # directed link id of every edge index
    edge_tier: tuple[str, ...]  # "nic-leaf", "leaf-spine", ... per edge
    utilization: Utilization | None
    collective: Collective = "none"
    n_ranks: int = 0
    collective_bytes: float = 0.0
    events: int = 0
    solves: int = 0
    wall_s: float = 0.0
    meta: Mapping[str, object] = field(default_factory=dict)

    # ------------------------------------------------------------------ flows
    @property
    def done(self) -> npt.NDArray[np.bool_]:
        return np.isfinite(self.end_ns)

    def fct_us(self) -> FloatArray:
        """FCTs of the completed flows, microseconds."""
        return self.fct_ns[self.done] / 1e3

    def fct_stats_us(self) -> dict[str, float]:
        """mean, p50, p99, max FCT (us) over completed flows."""
        f = self.fct_us()
        if f.shape[0] == 0:
            return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
        return {
            "mean": float(f.mean()),
            "p50": float(np.percentile(f, 50)),
            "p99": float(np.percentile(f, 99)),
            "max": float(f.max()),
        }

    # ------------------------------------------------------------------ collective
    @property
    def completion_ns(self) -> float:
        """Collective / workload completion time: last arrival - first start (NaN if nothing ran)."""
        d = self.done
        if not d.any():
            return float("nan")
        return float(self.end_ns[d].max() - np.nanmin(self.start_ns))

    def tag_completion_ns(self, prefix: str) -> float:
        """Completion time of the flows whose tag starts with ``prefix``."""
        sel = np.array([t.startswith(prefix) for t in self.tags], dtype=bool) & self.done
        if not sel.any():
            return float("nan")
        return float(self.end_ns[sel].max() - self.start_ns[sel].min())

    @property
    def algbw_Bps(self) -> float:
        """nccl-tests algorithm bandwidth S/t in bytes/s (NaN without collective metadata)."""
        if self.collective_bytes <= 0 or not np.isfinite(self.completion_ns):
            return float("nan")
        return algbw(self.collective_bytes, self.completion_ns / 1e9)

    @property
    def busbw_Bps(self) -> float:
        """nccl-tests bus bandwidth in bytes/s."""
        if self.collective_bytes <= 0 or self.n_ranks < 1 or not np.isfinite(self.completion_ns):
            return float("nan")
        return busbw(self.collective, self.n_ranks, self.collective_bytes, self.completion_ns / 1e9)

    # ------------------------------------------------------------------ links
    def hottest_links(self, k: int = 10) -> list[dict[str, object]]:
        """The ``k`` directed links with the highest mean utilization over the run."""
        if self.utilization is None:
            return []
        mean = self.utilization.mean_utilization()
        peak = self.utilization.peak_utilization()
        order = np.argsort(-mean, kind="stable")[:k]
        return [
            {"link": self.edge_ids[int(e)], "tier": self.edge_tier[int(e)],
             "mean_util": round(float(mean[e]), 4), "peak_util": round(float(peak[e]), 4)}
            for e in order if mean[e] > 0
        ]

    def summary(self) -> dict[str, object]:
        """A JSON-able summary (no per-flow arrays)."""
        out: dict[str, object] = {
            "scheme": self.scheme,
            "fabric": self.fabric_name,
            "workload": self.workload_name,
            "flows": int(self.flow_ids.shape[0]),
            "completed": int(self.done.sum()),
            "unroutable": len(self.unroutable),
            "blocked": len(self.blocked),
            "fct_us": {k: round(v, 3) for k, v in self.fct_stats_us().items()},
            "completion_us": round(self.completion_ns / 1e3, 3),
            "events": self.events,
            "solves": self.solves,
            "wall_s": round(self.wall_s, 4),
        }
        if self.collective != "none" and self.collective_bytes > 0:
            out["collective"] = self.collective
            out["n_ranks"] = self.n_ranks
            out["algbw_GBps"] = round(self.algbw_Bps / 1e9, 4)
            out["busbw_GBps"] = round(self.busbw_Bps / 1e9, 4)
        out["hottest_links"] = self.hottest_links(5)
        if self.unroutable:
            out["unroutable_flows"] = [
                {"id": int(i), "src": self.src[j], "dst": self.dst[j]}
                for i in self.unroutable[:20]
                for j in [int(np.flatnonzero(self.flow_ids == i)[0])]
            ]
        out.update({k: v for k, v in self.meta.items() if isinstance(v, (int, float, str, bool))})
        return out

    def flows_table(self) -> list[dict[str, object]]:
        """Per-flow rows (id, src, dst, size, start, end, fct in us) for JSON / CSV export."""
        rows: list[dict[str, object]] = []
        for j in range(self.flow_ids.shape[0]):
            fin = bool(np.isfinite(self.end_ns[j]))
            rows.append({
                "id": int(self.flow_ids[j]), "src": self.src[j], "dst": self.dst[j],
                "tag": self.tags[j], "size_bytes": float(self.size_bytes[j]),
                "start_us": float(self.start_ns[j] / 1e3) if np.isfinite(self.start_ns[j]) else None,
                "end_us": float(self.end_ns[j] / 1e3) if fin else None,
                "fct_us": float(self.fct_ns[j] / 1e3) if fin else None,
            })
        return rows
