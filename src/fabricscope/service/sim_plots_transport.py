"""Queue and pause views of a transport run (``fabricscope sim --cc ... --out DIR``).

``queues.png``   egress queue occupancy (KB) over time at the hottest switch ports (highest
                 watermark) per scheme, with the ECN marking thresholds (KMIN / KMAX, when
                 the congestion control reacts to marks) and the PFC XOFF threshold drawn.
``pauses.png``   pause propagation: for every link that was paused, when its receiver sent
                 the first XOFF against the hop distance from the congested port, coloured by
                 tier, and the paused time per hop; an incast or a storm shows as a front
                 moving upstream hop by hop.

The runs are watched (:class:`~fabricscope.sim.transport.fluid.FluidTransport` with
``watch=True``): every busy switch egress queue is traced in bounded memory and each link's
first XOFF timed, so the hottest ports need not be known before the run. The hop distance
follows IEEE 802.1Qbb's causality: a link is paused when the ingress queue its bytes form
in the next switch passes XOFF, and those bytes wait in that switch's egress queues; so a
paused link is one hop further from the congestion than the nearest egress its bytes wait
in that is congested (queued, not paused) or paused itself (:func:`pause_hops`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.sim.engine import Progress, edge_tiers
from fabricscope.sim.scenario import Prepared, ScenarioResult, run_scenario
from fabricscope.sim.transport import TransportConfig, TransportResult

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

HOTTEST_PORTS = 6
MAX_LISTED_LINKS = 200  # paused links listed one by one in sim.json (the summaries count all)


@dataclass(frozen=True)
class PortTrace:
    """One switch egress queue over a watched run (bytes; each sample the maximum of the
    samples merged into it, so the watermark survives the decimation)."""

    link: str
    tier: str
    max_bytes: float
    mean_bytes: float
    xoff_bytes: float  # XOFF of the sending switch's ingress queues at an empty buffer; NaN: PFC off
    t_ns: FloatArray
    queue_bytes: FloatArray


@dataclass(frozen=True)
class PausedLink:
    """A link whose receiver sent XOFF at least once."""

    link: str
    tier: str
    hop: int  # -1: not traced back to a congested port (a cycle of paused links: deadlock)
    first_pause_ns: float
    first_pause_window_ns: float
    paused_ns: float
    pause_frames: int


@dataclass(frozen=True)
class WatchedRun:
    """What a watched transport run adds to the report: its hottest queues and its pauses."""

    label: str
    seed: int
    cc: str
    pfc: bool
    ports: tuple[PortTrace, ...]
    ecn_kmin_bytes: float | None
    ecn_kmax_bytes: float | None
    trace_every_ns: float
    trace_max_rows: int
    traced_links: int
    paused: tuple[PausedLink, ...]

    def pause_by_hop(self) -> list[dict[str, object]]:
        """Per hop distance from the congested port: links paused, their tiers, pause frames,
        paused time (sum and max) and the earliest first XOFF (the pause front)."""
        hops = sorted({p.hop for p in self.paused}, key=lambda h: (h < 0, h))
        out: list[dict[str, object]] = []
        for h in hops:
            ps = [p for p in self.paused if p.hop == h]
            tiers: dict[str, int] = {}
            for p in ps:
                tiers[p.tier] = tiers.get(p.tier, 0) + 1
            out.append({
                "hop": h, "links": len(ps), "tiers": tiers,
                "pause_frames": sum(p.pause_frames for p in ps),
                "paused_us": round(sum(p.paused_ns for p in ps) / 1e3, 3),
                "max_paused_us": round(max(p.paused_ns for p in ps) / 1e3, 3),
                "first_pause_us": round(min(p.first_pause_ns for p in ps) / 1e3, 3),
                "median_first_pause_us": round(float(np.median([p.first_pause_ns for p in ps])) / 1e3, 3),
            })
        return out

    def pause_by_tier(self) -> dict[str, dict[str, object]]:
        """Per tier (``nic-leaf``, ``spine-leaf``, ...): links paused, pause frames, paused
        time, earliest first XOFF and the hops its links sit at."""
        out: dict[str, dict[str, object]] = {}
        for tier in sorted({p.tier for p in self.paused}, key=_tier_key):
            ps = [p for p in self.paused if p.tier == tier]
            out[tier] = {
                "links": len(ps), "pause_frames": sum(p.pause_frames for p in ps),
                "paused_us": round(sum(p.paused_ns for p in ps) / 1e3, 3),
                "first_pause_us": round(min(p.first_pause_ns for p in ps) / 1e3, 3),
                "hops": sorted({p.hop for p in ps}),
            }
        return out

    def pauses_dict(self) -> dict[str, object]:
        """The ``pauses`` entry of sim.json for this run."""
        listed = sorted(self.paused, key=lambda p: (p.first_pause_ns, p.link))[:MAX_LISTED_LINKS]
        return {
            "seed": self.seed, "pfc": self.pfc, "paused_links": len(self.paused),
            "hops_paused": len({p.hop for p in self.paused if p.hop >= 0}),
            "by_hop": self.pause_by_hop(), "by_tier": self.pause_by_tier(),
            "links": [{"link": p.link, "tier": p.tier, "hop": p.hop,
                       "first_pause_us": round(p.first_pause_ns / 1e3, 3),
                       "first_pause_within_us": round(p.first_pause_window_ns / 1e3, 3),
                       "paused_us": round(p.paused_ns / 1e3, 3), "pause_frames": p.pause_frames}
                      for p in listed],
        }

    def queues_dict(self) -> dict[str, object]:
        """The ``hottest_queues`` entry of sim.json for this run (what queues.png draws)."""
        return {
            "seed": self.seed, "traced_links": self.traced_links,
            "trace_interval_us": round(self.trace_every_ns / 1e3, 3), "trace_max_rows": self.trace_max_rows,
            "ecn_kmin_KB": None if self.ecn_kmin_bytes is None else round(self.ecn_kmin_bytes / 1e3, 3),
            "ecn_kmax_KB": None if self.ecn_kmax_bytes is None else round(self.ecn_kmax_bytes / 1e3, 3),
            "ports": [{"link": p.link, "tier": p.tier, "max_queue_KB": round(p.max_bytes / 1e3, 3),
                       "mean_queue_KB": round(p.mean_bytes / 1e3, 3),
                       "xoff_KB": None if math.isnan(p.xoff_bytes) else round(p.xoff_bytes / 1e3, 3)}
                      for p in self.ports],
        }


def _tier_key(tier: str) -> tuple[int, str]:
    order = ("leaf-nic", "spine-leaf", "core-spine", "leaf-spine", "spine-core", "nic-leaf")
    return (order.index(tier) if tier in order else len(order), tier)


def pause_hops(fabric: Fabric, paused: BoolArray, queued: BoolArray, feeds: IntArray) -> IntArray:
    """Hop distance of every paused link from the congestion it backs up from (-1: not paused,
    or paused in a cycle no congested port explains).

    Hop 0 is a congested port: a switch egress that queued without being paused, or a link
    into a NIC that paused it (a stuck receiver). A paused link is one hop further than the
    nearest hop-numbered egress its bytes wait in (``feeds``: (ingress, egress) pairs of the
    routes), since PFC (IEEE 802.1Qbb) pauses it when the ingress queue they form passes XOFF.
    Breadth-first search from the congested ports, backwards along ``feeds``.
    """
    ix = fabric.index
    n = ix.n_edges
    hop = np.full(n, -1, dtype=np.int64)
    into_nic = ~ix.is_switch[ix.dst]
    root = (queued & ~paused) | (paused & into_nic)
    hop[root] = 0
    frontier = np.flatnonzero(root)
    level = 0
    while frontier.shape[0] and feeds.shape[0]:
        level += 1
        cand = np.unique(feeds[np.isin(feeds[:, 1], frontier), 0])
        cand = cand[paused[cand] & (hop[cand] < 0)]
        hop[cand] = level
        frontier = cand
    hop[~paused] = -1
    return hop


def watch_run(fabric: Fabric, res: TransportResult, *, label: str, seed: int,
              top_k: int = HOTTEST_PORTS) -> WatchedRun:
    """Reduce a watched run to its ``top_k`` hottest switch egress queues (by watermark) and
    its paused links with their hop distance (:func:`pause_hops`)."""
    w = res.watch
    if w is None:
        raise ValueError("watch_run: the run was not watched (FluidTransport(watch=True))")
    st = res.stats
    ix = fabric.index
    tiers = edge_tiers(fabric)
    traced = res.trace_edges
    ports: list[PortTrace] = []
    if traced.shape[0]:
        order = np.argsort(-st.max_queue_bytes[traced], kind="stable")[:top_k]
        for col in order.tolist():
            e = int(traced[col])
            if st.max_queue_bytes[e] <= 0:
                continue
            ports.append(PortTrace(
                link=st.edge_ids[e], tier=tiers[e], max_bytes=float(st.max_queue_bytes[e]),
                mean_bytes=float(st.mean_queue_bytes[e]), xoff_bytes=float(w.xoff_empty_bytes[int(ix.src[e])]),
                t_ns=res.queue_trace_t_ns.copy(), queue_bytes=res.queue_trace_bytes[:, col].copy(),
            ))
    paused = (st.pause_frames > 0) | (st.paused_ns > 0)
    hops = pause_hops(fabric, paused, st.max_queue_bytes > 0, w.feeds)
    plist = tuple(
        PausedLink(link=st.edge_ids[e], tier=tiers[e], hop=int(hops[e]),
                   first_pause_ns=float(w.first_pause_ns[e]) if math.isfinite(w.first_pause_ns[e]) else 0.0,
                   first_pause_window_ns=float(np.nan_to_num(w.first_pause_window_ns[e])),
                   paused_ns=float(st.paused_ns[e]), pause_frames=int(st.pause_frames[e]))
        for e in np.flatnonzero(paused).tolist()
    )
    return WatchedRun(
        label=label, seed=seed, cc=str(res.sim.meta.get("cc", "")), pfc=bool(res.sim.meta.get("pfc", False)),
        ports=tuple(ports), ecn_kmin_bytes=w.ecn_kmin_bytes, ecn_kmax_bytes=w.ecn_kmax_bytes,
        trace_every_ns=w.trace_every_ns, trace_max_rows=w.max_rows, traced_links=int(traced.shape[0]),
        paused=plist,
    )


def run_transport_watched(
    prep: Prepared,
    transport: TransportConfig,
    *,
    progress: Callable[[str], Progress] | None = None,
    top_k: int = HOTTEST_PORTS,
) -> tuple[ScenarioResult, tuple[WatchedRun, ...]]:
    """Every (case, scheme, seed) of a prepared scenario through the transport engine
    (:func:`fabricscope.sim.scenario.run_scenario` with ``transport``: same runs, same order,
    same results), each watched and reduced at once (:func:`watch_run`), so memory holds one
    run's full trace at a time."""
    watched: list[WatchedRun] = []

    def keep(label: str, seed: int, res: TransportResult) -> None:
        watched.append(watch_run(prep.fabric, res, label=label, seed=seed, top_k=top_k))

    result = run_scenario(prep, progress=progress, record_utilization=False, transport=transport,
                          on_transport=keep)
    return result, tuple(watched)


def _first_seed(result: ScenarioResult, watched: Sequence[WatchedRun]) -> list[WatchedRun]:
    seed0 = result.scenario.seeds[0]
    return [w for w in watched if w.seed == seed0][:6]


def _short(link: str) -> str:
    """``dev-a:eth1->dev-b:eth2`` as ``dev-a:eth1->dev-b``: the sending port (the queue) and the
    device it feeds (a legend line, not an id to look up)."""
    a, _, b = link.partition("->")
    return f"{a.split(':')[0]}:{a.split(':')[-1]}->{b.split(':')[0]}" if b else link


def plot_queues(result: ScenarioResult, watched: Sequence[WatchedRun], path: Path) -> Path:
    """Per scheme (first seed), the hottest switch egress queues (KB) over time, with the ECN
    KMIN / KMAX and PFC XOFF thresholds as horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _first_seed(result, watched)
    n = max(len(runs), 1)
    ncols = min(2, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.2 * ncols, 4.4 * nrows), squeeze=False, layout="constrained")
    flat = axes.ravel().tolist()
    for ax in flat[len(runs):]:
        ax.axis("off")
    for ax, w in zip(flat, runs, strict=False):
        if not w.ports:
            ax.text(0.5, 0.5, "no switch queue formed", transform=ax.transAxes, ha="center", va="center")
        for k, p in enumerate(w.ports):
            # A row is the maximum over its interval, which starts at its time: drawn as steps.
            ax.step(p.t_ns / 1e3, p.queue_bytes / 1e3, where="post", color=f"C{k % 10}", linewidth=1.2,
                    label=f"{_short(p.link)} ({p.tier}, max {p.max_bytes / 1e3:.0f} KB)")
        # The queues set the scale; a threshold far above them (a 32 MiB buffer's XOFF) is
        # named in the legend, not drawn 30x higher than everything else.
        top_kb = 1.15 * max((p.max_bytes for p in w.ports), default=1e3) / 1e3
        lines: list[tuple[str, str, list[float]]] = []
        if w.ecn_kmin_bytes is not None and w.ecn_kmax_bytes is not None:
            lines += [("ECN KMIN", "green:", [w.ecn_kmin_bytes]), ("ECN KMAX", "green--", [w.ecn_kmax_bytes])]
        xoffs = sorted({float(round(p.xoff_bytes)) for p in w.ports if math.isfinite(p.xoff_bytes)})
        if xoffs:
            lines.append(("PFC XOFF", "red-.", xoffs))
        for name, style, values in lines:
            color, ls = style.rstrip(":-."), style[len(style.rstrip(":-.")):]
            shown = [v for v in values if v / 1e3 <= top_kb]
            text = ", ".join(f"{v / 1e3:.0f}" for v in values)
            where = "" if len(shown) == len(values) else " (above the plot)"
            what = " (per ingress port, empty buffer)" if name == "PFC XOFF" else ""
            label = f"{name} {text} KB{what}{where}"
            for v in shown:
                ax.axhline(v / 1e3, color=color, linestyle=ls, linewidth=1.0, label=label)
                label = "_"
            if not shown:
                ax.plot([], [], color=color, linestyle=ls, linewidth=1.0, label=label)
        ax.set_xlabel("time (us)")
        ax.set_ylabel("egress queue (KB)")
        ax.set_ylim(0, top_kb)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{w.label}: hottest {len(w.ports)} of {w.traced_links} switch ports "
                     f"(cc {w.cc}, pfc {'on' if w.pfc else 'off'}; sample {w.trace_every_ns / 1e3:.1f} us)",
                     fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    sc = result.scenario
    fig.suptitle(f"{sc.name}: egress queue occupancy at the hottest ports on {result.fabric.name} "
                 f"({sc.workload.get('kind')}, seed {sc.seeds[0]})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pauses(result: ScenarioResult, watched: Sequence[WatchedRun], path: Path) -> Path:
    """Per scheme (first seed): left, every paused link's first XOFF time against its hop
    distance from the congested port (colour: tier), the earliest per hop joined (the pause
    front); right, the paused time summed per hop."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _first_seed(result, watched)
    n = max(len(runs), 1)
    fig, axes = plt.subplots(n, 2, figsize=(12, 3.8 * n), squeeze=False, layout="constrained",
                             gridspec_kw={"width_ratios": [2.2, 1]})
    tier_color: dict[str, str] = {}
    for k, tier in enumerate(sorted({p.tier for w in runs for p in w.paused}, key=_tier_key)):
        tier_color[tier] = f"C{k % 10}"
    for row, w in enumerate(runs):
        ax, bx = axes[row][0], axes[row][1]
        ax.set_title(f"{w.label}: first pause per link by hop from the congestion (cc {w.cc})", fontsize=9)
        bx.set_title("paused time per hop", fontsize=9)
        if not w.paused:
            why = "PFC off: nothing paused (a full buffer drops)" if not w.pfc else "no link was paused"
            for a in (ax, bx):
                a.text(0.5, 0.5, why, transform=a.transAxes, ha="center", va="center")
                a.set_xticks([])
                a.set_yticks([])
            continue
        hops = sorted({p.hop for p in w.paused})  # -1 (a paused cycle) sorts first: drawn on top
        for tier, color in tier_color.items():
            ps = [p for p in w.paused if p.tier == tier]
            if ps:
                ax.scatter([p.first_pause_ns / 1e3 for p in ps], [p.hop for p in ps], s=28, color=color,
                           alpha=0.75, label=f"{tier} ({len(ps)} links)", edgecolors="none")
        front = [min(p.first_pause_ns for p in w.paused if p.hop == h) / 1e3 for h in hops if h >= 0]
        if len(front) > 1:
            ax.plot(front, [h for h in hops if h >= 0], color="black", linewidth=0.8, alpha=0.6,
                    label="pause front (earliest per hop)")
        for a in (ax, bx):
            a.set_yticks(hops)
            a.set_yticklabels([f"hop {h}" if h >= 0 else "cycle" for h in hops])
            a.set_ylim(max(hops) + 0.6, min(hops) - 0.6)  # hop 0 (the congestion) on top
            a.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_xlabel("time of first XOFF (us, from the start of the run)")
        ax.legend(loc="best", fontsize=7)
        vals = [sum(p.paused_ns for p in w.paused if p.hop == h) / 1e3 for h in hops]
        counts = [sum(1 for p in w.paused if p.hop == h) for h in hops]
        bx.barh(hops, vals, color="grey")
        for y, c, v in zip(hops, counts, vals, strict=True):
            bx.text(v, y, f" {c} link{'s' if c != 1 else ''}", va="center", fontsize=7)
        bx.set_xlim(0, 1.3 * max(max(vals), 1e-3))
        bx.set_xlabel("paused time, summed over the hop's links (us)")
    if not runs:
        for a in axes[0]:
            a.axis("off")
    sc = result.scenario
    fig.suptitle(f"{sc.name}: PFC pause propagation on {result.fabric.name} ({sc.workload.get('kind')}, "
                 f"seed {sc.seeds[0]}; hop 0 = the congested port)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def watch_json(watched: Sequence[WatchedRun]) -> dict[str, object]:
    """The ``pauses`` and ``hottest_queues`` sections of sim.json: per row label, one entry
    per seed."""
    pauses: dict[str, list[dict[str, object]]] = {}
    queues: dict[str, list[dict[str, object]]] = {}
    for w in watched:
        pauses.setdefault(w.label, []).append(w.pauses_dict())
        queues.setdefault(w.label, []).append(w.queues_dict())
    return {"pauses": pauses, "hottest_queues": queues}
