"""FCT slowdown (FCT over the ideal FCT of the flow alone) per flow-size bucket, HPCC style.

Slowdown is a flow's completion time divided by the time it would take alone on an empty
path: ``size / line rate + base RTT (+ store-and-forward of one MTU per switch)``, the
metric of Li et al., HPCC (SIGCOMM'19 §5.3) and of the HPCC repository's
``analysis/fct_analysis.py``, which sorts the flows by size, cuts them into equal-count
buckets (``step`` percent of the flows each), labels a bucket by its largest size and reports
the median, 95th and 99th percentile slowdown of each, values below 1 clipped to 1.

The empty-path latency of each flow comes from the result itself: both engines define
``fct = fluid + one-way propagation + store-and-forward + ACK return`` (sim/results.py),
so ``fct - fluid`` is exactly the latency a lone flow of that route pays; the line rate is
``min(sender uplink, receiver downlink)`` (:func:`flow_line_rates`). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.results import SimResult

FloatArray = npt.NDArray[np.float64]

#: Flows at or below this size are "short" in the HPCC comparison (the HPCC authors' results
#: page: "HPCC significantly improves the FCT for flows < 200KB", hpcc-group.github.io).
SHORT_FLOW_BYTES = 200_000.0


def flow_line_rates(fabric: Fabric, result: SimResult) -> FloatArray:
    """Per flow of ``result``, ``min(sender NIC uplink, receiver NIC downlink)`` in bits/s."""
    ix = fabric.index
    up = ~ix.is_switch[ix.src] & ix.is_switch[ix.dst]
    down = ix.is_switch[ix.src] & ~ix.is_switch[ix.dst]
    out_bps = np.bincount(ix.src[up], weights=ix.capacity_bps[up], minlength=ix.n_nodes)
    in_bps = np.bincount(ix.dst[down], weights=ix.capacity_bps[down], minlength=ix.n_nodes)
    try:
        s = np.array([ix.node_of[x] for x in result.src], dtype=np.int64)
        d = np.array([ix.node_of[x] for x in result.dst], dtype=np.int64)
    except KeyError as exc:
        raise ConfigError(f"slowdown: flow endpoint {exc.args[0]!r} is not in fabric {fabric.name!r}") from None
    return np.asarray(np.minimum(out_bps[s], in_bps[d]), dtype=np.float64)


def ideal_fct_ns(result: SimResult, line_rate_bps: FloatArray | float) -> FloatArray:
    """Per flow, its FCT alone on its empty route (NaN for flows that did not complete)."""
    rate = np.broadcast_to(np.asarray(line_rate_bps, dtype=np.float64), result.size_bytes.shape)
    if np.any(~(rate > 0)):
        raise ConfigError("slowdown: line rates must be > 0 bits/s")
    latency = result.fct_ns - result.fluid_ns
    return np.asarray(result.size_bytes * 8.0 / rate * 1e9 + latency, dtype=np.float64)


def fct_slowdown(result: SimResult, line_rate_bps: FloatArray | float) -> FloatArray:
    """Per flow, FCT / ideal FCT, clipped below at 1 (NaN for flows that did not complete).

    Flows that ran alone keep exactly 1; local flows (same NIC, FCT 0) count as 1.
    """
    ideal = ideal_fct_ns(result, line_rate_bps)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(ideal > 0, result.fct_ns / ideal, 1.0)
    s = np.where(result.done, np.maximum(s, 1.0), np.nan)
    return np.asarray(s, dtype=np.float64)


@dataclass(frozen=True)
class SlowdownBucket:
    """The flows between two sizes: ``lo_bytes < size <= hi_bytes`` (lo of the first is 0)."""

    lo_bytes: float
    hi_bytes: float
    flows: int
    p50: float
    p95: float
    p99: float
    mean: float

    def to_dict(self) -> dict[str, float | int]:
        return {"lo_bytes": self.lo_bytes, "hi_bytes": self.hi_bytes, "flows": self.flows,
                "p50": round(self.p50, 4), "p95": round(self.p95, 4), "p99": round(self.p99, 4),
                "mean": round(self.mean, 4)}


@dataclass(frozen=True)
class SlowdownTable:
    """Slowdown by size bucket, plus the short-flow and all-flow summaries.

    ``incomplete`` flows (not finished: simulated-time limit, unroutable) are left out of
    every statistic and counted here, never hidden.
    """

    buckets: tuple[SlowdownBucket, ...]
    short: SlowdownBucket
    overall: SlowdownBucket
    incomplete: int

    def to_dict(self) -> dict[str, object]:
        return {"buckets": [b.to_dict() for b in self.buckets], "short": self.short.to_dict(),
                "overall": self.overall.to_dict(), "incomplete": self.incomplete}


def _bucket(lo: float, hi: float, s: FloatArray) -> SlowdownBucket:
    if s.shape[0] == 0:
        nan = float("nan")
        return SlowdownBucket(lo, hi, 0, nan, nan, nan, nan)
    # The estimator of HPCC's fct_analysis.py: element int(n * p) of the sorted values.
    srt = np.sort(s)
    n = int(srt.shape[0])
    p50, p95, p99 = (float(srt[min(int(n * q), n - 1)]) for q in (0.50, 0.95, 0.99))
    return SlowdownBucket(lo, hi, int(s.shape[0]), p50, p95, p99, float(s.mean()))


def slowdown_by_size(
    result: SimResult,
    line_rate_bps: FloatArray | float,
    *,
    step_percent: float = 10.0,
    edges_bytes: npt.ArrayLike | None = None,
    short_bytes: float = SHORT_FLOW_BYTES,
) -> SlowdownTable:
    """Slowdown percentiles per flow-size bucket of the completed flows of ``result``
    (:func:`bucket_slowdowns` over :func:`fct_slowdown`)."""
    s = fct_slowdown(result, line_rate_bps)
    return bucket_slowdowns(result.size_bytes, s, step_percent=step_percent, edges_bytes=edges_bytes,
                            short_bytes=short_bytes)


def bucket_slowdowns(
    size_bytes: npt.ArrayLike,
    slowdown: npt.ArrayLike,
    *,
    step_percent: float = 10.0,
    edges_bytes: npt.ArrayLike | None = None,
    short_bytes: float = SHORT_FLOW_BYTES,
) -> SlowdownTable:
    """Slowdown percentiles per size bucket; NaN slowdowns are incomplete flows (counted apart).

    By default the buckets hold equal numbers of flows (``step_percent`` of them each,
    sorted by size; HPCC's ``fct_analysis.py`` uses 5), so they follow the workload's own
    size distribution; flows of one size never straddle two buckets (a bucket ends at a size
    boundary). ``edges_bytes`` gives fixed upper bounds instead (the last bucket takes the
    rest). ``short`` summarizes the flows of at most ``short_bytes``.
    """
    if not 0 < step_percent <= 100:
        raise ConfigError(f"slowdown: step_percent must be in (0, 100], got {step_percent!r}")
    size_all = np.asarray(size_bytes, dtype=np.float64)
    s_all = np.asarray(slowdown, dtype=np.float64)
    if size_all.shape != s_all.shape:
        raise ConfigError(f"slowdown: {size_all.shape[0]} sizes for {s_all.shape[0]} slowdowns")
    done = np.isfinite(s_all)
    order = np.argsort(size_all[done], kind="stable")
    size, s = size_all[done][order], s_all[done][order]
    n = int(size.shape[0])
    if edges_bytes is not None:
        his = sorted(float(x) for x in np.atleast_1d(np.asarray(edges_bytes, dtype=np.float64)))
        if n and (not his or his[-1] < size[-1]):
            his.append(float(size[-1]))
        cuts = [int(np.searchsorted(size, h, side="right")) for h in his]
    else:
        cuts = []
        k = 1
        while k * step_percent < 100 - 1e-9:
            i = int(n * k * step_percent / 100.0)
            if 0 < i < n:
                # move the cut to the end of the run of equal sizes it falls in
                i = int(np.searchsorted(size, size[i - 1], side="right"))
            cuts.append(i)
            k += 1
        cuts.append(n)
        his = [float(size[c - 1]) if c > 0 else 0.0 for c in cuts]
    buckets: list[SlowdownBucket] = []
    lo_i, lo_b = 0, 0.0
    for c, hi in zip(cuts, his, strict=True):
        if c > lo_i:
            buckets.append(_bucket(lo_b, hi, s[lo_i:c]))
            lo_i = c
        lo_b = max(lo_b, hi)
    short = _bucket(0.0, short_bytes, s[size <= short_bytes])
    overall = _bucket(0.0, float(size[-1]) if n else 0.0, s)
    return SlowdownTable(tuple(buckets), short, overall, int((~done).sum()))


def format_size(b: float) -> str:
    """``12.3KB`` style (decimal units, as the HPCC figures label their x axis)."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= f:
            return f"{b / f:.3g}{unit}"
    return f"{b:.0f}B"


def format_slowdown_table(table: SlowdownTable, *, title: str = "") -> str:
    """The table ``fabricscope sim`` prints: one row per bucket, then short and all flows."""
    head = ("size bucket", "flows", "p50", "p95", "p99")
    rows: list[tuple[str, ...]] = []
    for b in table.buckets:
        rows.append((f"{format_size(b.lo_bytes)}-{format_size(b.hi_bytes)}", str(b.flows),
                     f"{b.p50:.2f}", f"{b.p95:.2f}", f"{b.p99:.2f}"))
    for label, b in ((f"short (<= {format_size(table.short.hi_bytes)})", table.short), ("all flows", table.overall)):
        rows.append((label, str(b.flows), *("-" if b.flows == 0 else f"{v:.2f}" for v in (b.p50, b.p95, b.p99))))
    w = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    out = [title] if title else []
    out.append("  ".join(h.ljust(w[0]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head)))
    out.append("  ".join("-" * x for x in w))
    for j, r in enumerate(rows):
        if j == len(table.buckets):
            out.append("  ".join("-" * x for x in w))
        out.append("  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    if table.incomplete:
        out.append(f"({table.incomplete} flow(s) did not complete and are not counted)")
    return "\n".join(out)
