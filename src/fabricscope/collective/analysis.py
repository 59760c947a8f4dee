"""Curve analysis of a collective run: peak busbw, measured / expected per size, attribution.

Definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x factor,
the factor being 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and alltoall,
1 for broadcast, reduce and sendrecv. A busbw curve rises with size while the per-operation
latency (alpha) dominates and flattens at the bottleneck bandwidth (beta) for large sizes
(Thakur, Rabenseifner & Gropp 2005, the alpha-beta model), so a deficit at large sizes with
normal small sizes points to bandwidth, and the reverse to latency.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fabricscope.collective.model import CollectiveRun
from fabricscope.model.records import Finding

__all__ = [
    "RunAnalysis",
    "RunSummary",
    "SizeAnalysis",
    "analyze_run",
    "bus_factor",
    "expected_from_flat",
    "summarize_run",
]

def _ring(n: int) -> float:
    return (n - 1) / n


def _all_reduce(n: int) -> float:
    return 2.0 * (n - 1) / n


def _one(n: int) -> float:
    return 1.0


_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": _all_reduce, "all_gather": _ring, "reduce_scatter": _ring,
    "alltoall": _ring, "alltoallv": _ring, "broadcast": _one, "reduce": _one, "sendrecv": _one,
}


def bus_factor(collective: str, ranks: int) -> float | None:
    """busbw / algbw for ``collective`` on ``ranks`` ranks (doc/PERFORMANCE.md of nccl-tests);
    None for the tests the document gives no factor (gather, scatter, hypercube)."""
    f = _FACTORS.get(collective)
    if f is None or ranks < 1:
        return None
    return f(ranks)


#: The sizes a bandwidth figure (flat, or the simulator's) judges: at least 1/4 of the largest
#: size of the run (the top three doublings of a ``-f 2`` sweep). A real NCCL curve reaches the
#: fabric's bound only at the largest messages: on a healthy 2-node H100 run
#: (tests/data/collective/a3mega_allreduce_2node.txt) busbw is 45% of its 8 GiB figure at
#: 128 MiB and 78% at 512 MiB, from protocol and channel choices that an alpha-beta model
#: does not have; judging those sizes would call every healthy run slow.
PLATEAU_SPAN = 4


def plateau_only(expected: Mapping[int, float], sizes: list[int], *,
                 plateau_span: int = PLATEAU_SPAN) -> dict[int, float]:
    """``expected`` restricted to the run's plateau sizes (see :data:`PLATEAU_SPAN`)."""
    top = max(sizes, default=0)
    return {s: v for s, v in expected.items() if s > 0 and s * plateau_span >= top}


def expected_from_flat(sizes: list[int], busbw_gbs: float, *,
                       plateau_span: int = PLATEAU_SPAN) -> dict[int, float]:
    """A flat expected busbw (``--expected-busbw``) for the plateau sizes only (see
    :data:`PLATEAU_SPAN`). A flat figure is a bandwidth: it says nothing of the
    latency-bound small sizes."""
    return plateau_only({s: busbw_gbs for s in sizes}, sizes, plateau_span=plateau_span)


@dataclass(frozen=True)
class SizeAnalysis:
    """One size: both placements, the expectation and the ratio of the better placement."""

    size_bytes: int
    oop_time_us: float | None
    oop_algbw_gbs: float | None
    oop_busbw_gbs: float | None
    ip_time_us: float | None
    ip_algbw_gbs: float | None
    ip_busbw_gbs: float | None
    expected_busbw_gbs: float | None = None
    ratio: float | None = None


@dataclass(frozen=True)
class RunAnalysis:
    """The analysis of one run (see :func:`analyze_run`)."""

    source: str
    collective: str
    ranks: int | None
    nodes: int | None
    hosts: tuple[str, ...]
    sizes: tuple[SizeAnalysis, ...]
    peak_busbw_gbs: float
    peak_size_bytes: int
    plateau_gbs: float | None
    avg_busbw_file: float | None
    avg_busbw_recomputed: float | None
    avg_matches: bool | None
    truncated: bool
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    ratio_small: float | None = None
    ratio_large: float | None = None
    attribution: str = "no-expectation"
    findings: tuple[Finding, ...] = ()
    details: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (``collective analyze --json``)."""
        return {
            "source": self.source, "collective": self.collective, "ranks": self.ranks,
            "nodes": self.nodes, "hosts": list(self.hosts),
            "peak_busbw_gbs": self.peak_busbw_gbs, "peak_size_bytes": self.peak_size_bytes,
            "plateau_gbs": self.plateau_gbs, "avg_busbw_file": self.avg_busbw_file,
            "avg_busbw_recomputed": self.avg_busbw_recomputed, "avg_matches": self.avg_matches,
            "truncated": self.truncated, "errors": list(self.errors),
            "warnings": list(self.warnings), "ratio_small": self.ratio_small,
            "ratio_large": self.ratio_large, "attribution": self.attribution,
            "sizes": [vars(s) for s in self.sizes],
            "findings": [{"kind": f.kind, "subject": f.subject, "score": f.score,
                          "evidence": list(f.evidence), "action": f.action,
                          "details": dict(f.details)} for f in self.findings],
        }


def _nodes(run: CollectiveRun) -> int | None:
    if run.fmt == "nccl-inspector":
        try:
            return int(run.header.get("nnodes", "")) or None
        except ValueError:
            return None
    return run.nodes


def _plateau(sizes: list[SizeAnalysis]) -> float | None:
    """The busbw the curve flattens at: the median of the largest sizes whose busbw is within
    5 % of the peak, when at least two of the three largest sizes are; None otherwise."""
    best = [max(v for v in (s.oop_busbw_gbs, s.ip_busbw_gbs) if v is not None) for s in sizes]
    if len(best) < 3:
        return None
    peak = max(best)
    tail = best[-3:]
    near = [b for b in tail if b >= 0.95 * peak]
    return statistics.median(near) if len(near) >= 2 and peak > 0 else None


def analyze_run(run: CollectiveRun, *, expected: Mapping[int, float] | None = None,
                margin: float = 0.10, window: tuple[int, int] = (0, 0),
                subject: str | None = None) -> RunAnalysis:
    """Analyze one run against an expected busbw per size (a plain mapping size -> GB/s).

    Sizes are split at the run's median size into a small (latency-bound) and a large
    (bandwidth-bound) half; each half's ratio is the median over its sizes of
    measured / expected, the measured value being the better placement. A half below
    ``1 - margin`` is a deficit; the attribution is:

    * large deficit, small normal: ``bandwidth-network`` on several nodes,
      ``bandwidth-nvlink-or-pcie`` on one node, ``bandwidth`` when the node count is unknown;
    * small deficit, large normal: ``latency`` (hops, PXN, proxy);
    * both: ``ambiguous`` (a uniform deficit does not tell latency from bandwidth);
    * neither: ``ok``.

    A deficit gives one ``collective-busbw-low`` finding whose score is the worst deficit
    (1 - ratio) clipped to [0, 1]. Left out of the ratios: sizes of 0 bytes, sizes without an
    expectation, and sizes whose printed busbw is too coarse to judge (its rounding above
    ``margin / 2`` of it, e.g. 0.00 GB/s). Assumes ``expected`` was computed for the same fabric, placement,
    ranks and sizes.
    """
    rows: list[SizeAnalysis] = []
    for r in run.rows:
        oop, ip = r.out_of_place, r.in_place
        best = r.best_busbw()
        half = max((p.busbw_half_unit for _, p in r.placements() if p.busbw_gbs == best), default=0.0)
        exp = expected.get(r.size_bytes) if expected else None
        # a ratio is kept where the printed figure's rounding is within margin / 2 of it
        # (0.00 GB/s at 8 bytes says nothing of a 10 % deficit)
        readable = best > 0 and half <= best * margin / 2
        ratio = best / exp if exp and exp > 0 and r.size_bytes > 0 and readable else None
        rows.append(SizeAnalysis(
            size_bytes=r.size_bytes,
            oop_time_us=oop.time_us if oop else None, oop_algbw_gbs=oop.algbw_gbs if oop else None,
            oop_busbw_gbs=oop.busbw_gbs if oop else None,
            ip_time_us=ip.time_us if ip else None, ip_algbw_gbs=ip.algbw_gbs if ip else None,
            ip_busbw_gbs=ip.busbw_gbs if ip else None,
            expected_busbw_gbs=exp, ratio=ratio))
    if rows:
        best_vals = [max(v for v in (s.oop_busbw_gbs, s.ip_busbw_gbs) if v is not None) for s in rows]
        k = max(range(len(rows)), key=lambda i: best_vals[i])
        peak, peak_size = best_vals[k], rows[k].size_bytes
    else:
        peak, peak_size = 0.0, 0
    nodes = _nodes(run)
    rated = [s for s in rows if s.ratio is not None]
    ratio_small = ratio_large = None
    attribution = "no-expectation"
    findings: list[Finding] = []
    if rated:
        # the split is over every size of the run, so an expectation that covers only the
        # plateau (a flat figure) rates only the large half
        med = statistics.median(s.size_bytes for s in rows if s.size_bytes > 0)
        small = [s.ratio for s in rated if s.size_bytes < med and s.ratio is not None]
        large = [s.ratio for s in rated if s.size_bytes >= med and s.ratio is not None]
        ratio_small = statistics.median(small) if small else None
        ratio_large = statistics.median(large) if large else None
        low = 1.0 - margin
        small_def = ratio_small is not None and ratio_small < low
        large_def = ratio_large is not None and ratio_large < low
        if large_def and small_def:
            attribution = "ambiguous"
        elif large_def:
            if nodes is None:
                attribution = "bandwidth"
            elif nodes > 1:
                attribution = "bandwidth-network"
            else:
                attribution = "bandwidth-nvlink-or-pcie"
        elif small_def:
            attribution = "latency"
        else:
            attribution = "ok"
        if small_def or large_def:
            worst = min(s.ratio for s in rated if s.ratio is not None)
            # the worst ratios first, the larger size first among equals
            bad = sorted((s for s in rated if s.ratio is not None and s.ratio < low),
                         key=lambda s: (round(s.ratio or 0.0, 6), -s.size_bytes))
            evidence = tuple(
                f"{_fmt_size(s.size_bytes)}: busbw {max(v for v in (s.oop_busbw_gbs, s.ip_busbw_gbs) if v is not None):.2f} "
                f"GB/s vs expected {s.expected_busbw_gbs:.2f} (ratio {s.ratio:.2f})"
                for s in bad[:8])
            what = {
                "bandwidth-network": "check the NICs and the network path (link speed, errors, "
                                     "PFC pauses, ECMP): the large-message plateau is short",
                "bandwidth-nvlink-or-pcie": "check NVLink / PCIe (nvidia-smi nvlink -s, topo -m, "
                                            "PCIe link width): one node's large messages are slow",
                "bandwidth": "large messages are slow: bandwidth (network or NVLink/PCIe; node "
                             "count unknown)",
                "latency": "small messages are slow: check hops, PXN, proxy threads, "
                           "NCCL_ALGO/PROTO",
                "ambiguous": "every size is slow: latency and bandwidth cannot be told apart; "
                             "rerun with a wider size range or per-link tests",
            }[attribution]
            findings.append(Finding(
                kind="collective-busbw-low",
                subject=subject or _subject(run),
                score=max(0.0, min(1.0, 1.0 - worst)),
                window=window,
                evidence=(f"{run.source}: {run.collective} on {run.ranks or '?'} ranks, "
                          f"{nodes or '?'} node(s): {len(bad)} of {len(rated)} sizes below "
                          f"{low:.0%} of expected", *evidence),
                action=what,
                details={"attribution": attribution, "ratio_small": ratio_small or 0.0,
                         "ratio_large": ratio_large or 0.0, "margin": margin,
                         "peak_busbw_gbs": peak, "collective": run.collective}))
    return RunAnalysis(
        source=run.source, collective=run.collective, ranks=run.ranks, nodes=nodes,
        hosts=run.hosts, sizes=tuple(rows), peak_busbw_gbs=peak, peak_size_bytes=peak_size,
        plateau_gbs=_plateau(rows), avg_busbw_file=run.avg_busbw_file,
        avg_busbw_recomputed=run.avg_busbw_recomputed, avg_matches=run.avg_matches,
        truncated=run.truncated, errors=run.errors, warnings=run.warnings,
        ratio_small=ratio_small, ratio_large=ratio_large, attribution=attribution,
        findings=tuple(findings))


def _subject(run: CollectiveRun) -> str:
    """The job's host set (``hostA+hostB``), else the file."""
    return "+".join(run.hosts) if run.hosts else run.source


def _fmt_size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class RunSummary:
    """The figures ``collective watch`` records per run.

    avg_busbw_gbs: the file's ``# Avg bus bandwidth`` (else the mean of the printed busbw)
    avg_time_us:   mean time over every size and placement printed
    max_time_us:   max latency: the largest time over sizes and placements (the same command
                   each run, so the same sizes: a rise is a slowdown of the slowest size)
    time_std_us:   latency std: the pooled within-size standard deviation of the two
                   placements' times, sqrt(mean over sizes of (t_oop - t_ip)^2 / 2) - each size
                   is measured twice, so this is the run-to-run jitter of one measurement;
                   None when no size has both placements
    sizes:         sizes printed
    """

    avg_busbw_gbs: float | None
    avg_time_us: float | None
    max_time_us: float | None
    time_std_us: float | None
    sizes: int


def summarize_run(run: CollectiveRun) -> RunSummary:
    """The watch figures of one run (see :class:`RunSummary` for the definitions)."""
    times = [p.time_us for r in run.rows for _, p in r.placements()]
    pairs = [(r.out_of_place.time_us, r.in_place.time_us) for r in run.rows
             if r.out_of_place is not None and r.in_place is not None]
    std = (sum((a - b) ** 2 / 2.0 for a, b in pairs) / len(pairs)) ** 0.5 if pairs else None
    return RunSummary(
        avg_busbw_gbs=run.avg_busbw, avg_time_us=sum(times) / len(times) if times else None,
        max_time_us=max(times) if times else None, time_std_us=std, sizes=len(run.rows))
