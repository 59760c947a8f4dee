"""Report a scenario run: a comparison table, a JSON file and two plots a person can read.

Plots (matplotlib, Agg backend, no display needed):

``fct_cdf.png``     FCT CDF per scheme (and per faulted case), log-x, with p50/p99 marks.
``link_util.png``   link-utilization heat map per scheme: links (rows, grouped by tier,
                    hottest first inside a tier) x time, so a hot spine or a dead uplink
                    shows as a bright or dark stripe.
``slowdown.png``    transport runs (``--cc dcqcn|hpcc``) only: FCT slowdown (p50 / p99) by
                    flow-size bucket per scheme, HPCC-paper style (:mod:`fabricscope.sim.slowdown`).
``queues.png``      watched transport runs only: egress queue occupancy over time at the
                    hottest switch ports, with the ECN and PFC XOFF thresholds.
``pauses.png``      watched transport runs only: first pause per link by hop distance from
                    the congestion, and paused time per hop
                    (:mod:`fabricscope.service.sim_plots_transport`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fabricscope.sim.scenario import ScenarioResult
from fabricscope.sim.slowdown import (
    SlowdownTable,
    bucket_slowdowns,
    fct_slowdown,
    flow_line_rates,
    format_size,
    format_slowdown_table,
)

if TYPE_CHECKING:
    from fabricscope.service.sim_plots_transport import WatchedRun

_COLUMNS = (
    ("scheme", "scheme", "{}"),
    ("fct_mean_us", "mean", "{:.1f}"),
    ("fct_p50_us", "p50", "{:.1f}"),
    ("fct_p99_us", "p99", "{:.1f}"),
    ("fct_max_us", "max", "{:.1f}"),
    ("completion_us", "last byte", "{:.1f}"),
    ("ring_ms", "ring ms", "{:.2f}"),
    ("busbw_GBps", "busbw GB/s", "{:.2f}"),
    ("unroutable", "unrouted", "{}"),
    ("wall_s", "wall s", "{:.2f}"),
)
_TIER_ORDER = ("nic-leaf", "leaf-spine", "spine-core", "core-spine", "spine-leaf", "leaf-nic")


def format_table(result: ScenarioResult, *, width: int | None = None) -> str:
    """The comparison table as aligned text (one row per scheme / case, seeds averaged).

    With several seeds a cell reads ``mean ±sd`` (sample std over the seeds). ``width``
    (a terminal's columns) folds the table into blocks that each fit, every block starting
    with the scheme column so that a row's subject is never cut; ``None`` (piped output)
    keeps one wide table.
    """
    rows = result.table()
    cols = [c for c in _COLUMNS if any(c[0] in r for r in rows)]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        line = []
        for key, _, fmt in cols:
            v = r.get(key, "")
            if isinstance(v, float) and math.isnan(v):
                line.append("-")
            elif v == "":
                line.append("")
            else:
                sd = r.get(f"{key}_sd")
                text = fmt.format(v)
                if isinstance(sd, float) and math.isfinite(sd):
                    text += " ±" + fmt.format(sd)
                line.append(text)
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    n_seeds = len(result.scenario.seeds)
    how = f"mean ±sd over {n_seeds} seeds" if n_seeds > 1 else "one seed, no spread"
    out = [f"FCT mean, p50, p99, max and last byte arrival, in us ({how})"]
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for j in range(1, len(cols)):
        if width is not None and blocks[-1] and used + 2 + widths[j] > width:
            blocks.append([])
            used = widths[0]
        blocks[-1].append(j)
        used += 2 + widths[j]
    for k, block in enumerate(blocks):
        if k:
            out.append("")
        idx = [0, *block]
        for i, c in enumerate(cells):
            out.append("  ".join(c[j].ljust(widths[j]) if j == 0 else c[j].rjust(widths[j]) for j in idx).rstrip())
            if i == 0:
                out.append("  ".join("-" * widths[j] for j in idx))
    return "\n".join(out)


def format_comparisons(result: ScenarioResult, key: str = "fct_p99_us") -> list[str]:
    """One line per comparison a reader draws from the table (p99 FCT by default): the
    difference, its 95 % interval over the seeds, and whether it is more than seed spread."""
    name = {"fct_p99_us": "p99 FCT", "fct_mean_us": "mean FCT", "completion_us": "last byte"}.get(key, key)
    return [f"{name} {d.text()}" for d in result.comparisons(key)]


def write_json(result: ScenarioResult, path: Path, *, extra: dict[str, object] | None = None) -> Path:
    """``result.to_dict()`` as JSON, with ``extra`` top-level keys added (e.g. ``slowdown``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    if extra:
        data.update(extra)
    path.write_text(json.dumps(_jsonable(data), indent=2) + "\n", encoding="utf-8")
    return path


def is_transport(result: ScenarioResult) -> bool:
    """Whether the runs came from the fluid transport engine (their meta names a ``cc``)."""
    return any("cc" in r.result.meta for r in result.runs)


def slowdown_tables(result: ScenarioResult, *, step_percent: float = 10.0) -> dict[str, SlowdownTable]:
    """Per row label (scheme / case), the FCT slowdown by flow-size bucket, seeds pooled."""
    out: dict[str, SlowdownTable] = {}
    for label in result.labels():
        runs = [r.result for r in result.runs if r.label == label]
        sizes = np.concatenate([x.size_bytes for x in runs])
        slow = np.concatenate([fct_slowdown(x, flow_line_rates(result.fabric, x)) for x in runs])
        out[label] = bucket_slowdowns(sizes, slow, step_percent=step_percent)
    return out


def format_slowdowns(result: ScenarioResult) -> list[str]:
    """The slowdown tables ``fabricscope sim`` prints for a transport run, one per row label."""
    n = len(result.scenario.seeds)
    pooled = f", {n} seeds pooled" if n > 1 else ""
    return [
        format_slowdown_table(t, title=f"FCT slowdown by flow size, {label} (FCT / FCT alone on an empty path{pooled})")
        for label, t in slowdown_tables(result).items()
    ]


def plot_slowdown(result: ScenarioResult, path: Path, *, tables: dict[str, SlowdownTable] | None = None) -> Path:
    """p50 (dashed) and p99 (solid) slowdown against each bucket's largest flow size, per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tabs = tables if tables is not None else slowdown_tables(result)
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (label, t) in enumerate(tabs.items()):
        if not t.buckets:
            ax.plot([], [], linestyle="none", label=f"{label}: no flow completed")
            continue
        x = np.arange(len(t.buckets))
        color = f"C{k % 10}"
        ax.plot(x, [b.p99 for b in t.buckets], "-o", color=color, label=f"{label} p99 (short flows {t.short.p99:.2f})")
        ax.plot(x, [b.p50 for b in t.buckets], "--", color=color, alpha=0.7, label=f"{label} p50")
    first = next((t for t in tabs.values() if t.buckets), None)
    if first is not None:
        ax.set_xticks(np.arange(len(first.buckets)))
        ax.set_xticklabels([format_size(b.hi_bytes) for b in first.buckets], rotation=30, fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("flow size (bucket upper bound; equal numbers of flows per bucket)")
    ax.set_ylabel("FCT slowdown (FCT / FCT alone), log scale")
    ax.grid(True, which="both", alpha=0.3)
    cc = next((str(r.result.meta.get("cc")) for r in result.runs if "cc" in r.result.meta), "")
    ax.set_title(f"{result.scenario.name}: slowdown by size on {result.fabric.name} "
                 f"({result.scenario.workload.get('kind')}, cc {cc})")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    return x


def plot_fct_cdf(result: ScenarioResult, path: Path) -> Path:
    """FCT CDF per scheme (all seeds pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label in result.labels():
        runs = [r for r in result.runs if r.label == label]
        f = np.concatenate([r.result.fct_us() for r in runs])
        # Fractions of ALL flows: unroutable / blocked ones never complete, so the curve
        # stops below 1 instead of hiding them.
        total = sum(int(r.result.flow_ids.shape[0]) for r in runs)
        lost = total - f.shape[0]
        note = f", {lost} never completed (unroutable)" if lost else ""
        if f.shape[0] == 0:
            ax.plot([], [], linestyle="none", label=f"{label}: no flow completed{note}")
            continue
        x = np.sort(f)
        y = np.arange(1, x.shape[0] + 1) / max(total, 1)
        style = "--" if "(" in label else "-"
        ax.step(x, y, where="post", linestyle=style,
                label=f"{label}: p50 {np.percentile(f, 50):.0f} us, p99 {np.percentile(f, 99):.0f} us{note}")
    ax.set_xscale("log")
    ax.set_xlabel("flow completion time (us, log scale)")
    ax.set_ylabel("fraction of flows completed")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    sc = result.scenario
    ax.set_title(f"{sc.name}: FCT CDF on {result.fabric.name} ({sc.workload.get('kind')})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_link_heatmap(result: ScenarioResult, path: Path, *, bins: int = 40, per_tier: int = 48) -> Path:
    """Per scheme (first seed), utilization of the busiest links of every tier over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    firsts = [r for r in result.runs if r.seed == result.scenario.seeds[0] and r.result.utilization is not None]
    firsts = firsts[:6]
    if not firsts:
        firsts = []
    n = max(len(firsts), 1)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 1.5, 4.2 * nrows), squeeze=False,
                             layout="constrained")
    flat_axes = axes.ravel().tolist()
    for ax in flat_axes[len(firsts):]:
        ax.axis("off")
    # Directed edges of the faulted cables: always shown in the faulted runs' panels (a dead
    # link carries nothing, so "busiest first" alone would hide it).
    faulted: dict[str, str] = {}  # directed edge id -> "down" / "degraded"
    for f in result.faults:
        what = "down" if f.kind == "link-down" else "degraded"
        if "|" in f.subject:
            a, b = f.subject.split("|", 1)
            faulted.update({f"{a}->{b}": what, f"{b}->{a}": what})
        else:
            faulted[f.subject] = what
    im = None
    for panel, (ax, run) in enumerate(zip(flat_axes, firsts, strict=False)):
        res = run.result
        util = res.utilization
        assert util is not None
        mean = util.mean_utilization()
        tiers = np.array(res.edge_tier)
        rows: list[int] = []
        row_counts: list[int] = []
        ticks: list[tuple[float, str]] = []
        for tier in _TIER_ORDER:
            sel = np.flatnonzero(tiers == tier)
            if sel.shape[0] == 0:
                continue
            # The busiest links of the tier, plus any link that carried nothing (a failed one).
            top = sel[np.argsort(-mean[sel], kind="stable")][:per_tier]
            if faulted and "(" in run.label:
                hit = [int(e) for e in sel if res.edge_ids[int(e)] in faulted and int(e) not in set(top.tolist())]
                if hit:
                    top = np.concatenate([top[: max(per_tier - len(hit), 0)], np.array(hit, dtype=top.dtype)])
            shown = f"top {len(top)} of {sel.shape[0]}" if len(top) < sel.shape[0] else f"{sel.shape[0]}"
            ticks.append((len(rows) + len(top) / 2, f"{tier}\n({shown} links)"))
            rows.extend(int(e) for e in top)
            row_counts.append(len(top))
        t0, mat = util.timeline(rows, bins=bins)
        t_end = float(util.t1[-1]) if util.n_intervals else 1.0
        im = ax.imshow(mat, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest",
                       extent=(float(t0[0]) / 1e3 if t0.shape[0] else 0.0, t_end / 1e3, len(rows), 0))
        bounds = np.cumsum(row_counts)
        for acc in bounds:
            ax.axhline(float(acc), color="white", linewidth=0.6)
        for r_i, e in enumerate(rows):
            if res.edge_ids[e] in faulted and "(" in run.label:
                ax.axhline(r_i + 0.5, color="cyan", linewidth=1.0, linestyle="--")
                ax.text(0.99, r_i + 0.5, f"link {faulted[res.edge_ids[e]]}", transform=ax.get_yaxis_transform(),
                        ha="right", va="bottom", color="cyan", fontsize=8)
        ax.set_yticks([p for p, _ in ticks])
        ax.set_yticklabels([s for _, s in ticks], fontsize=7)
        if panel % ncols:  # tier labels once per row of panels: they would overlap the neighbour
            ax.tick_params(labelleft=False)
        ax.set_xlabel("time (us)")
        ax.set_title(run.label, fontsize=10)
        if res.unroutable and not res.done.any():  # a partitioned run: say so, not just black
            ax.text(0.5, 0.5, f"nothing delivered:\n{len(res.unroutable)} flow(s) unroutable (partitioned)",
                    transform=ax.transAxes, ha="center", va="center", color="white", fontsize=10)
    if im is not None:
        fig.colorbar(im, ax=flat_axes, label="link utilization", shrink=0.8)
    fig.suptitle(f"{result.scenario.name}: busiest links per tier over time (seed {result.scenario.seeds[0]})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(result: ScenarioResult, outdir: Path, *, plots: bool = True,
                 watched: Sequence[WatchedRun] | None = None) -> dict[str, Path]:
    """Write ``sim.json`` (+ ``fct_cdf.png`` and ``link_util.png``, except for a ring
    steady-state workload) under ``outdir``. Transport runs add ``slowdown`` (per row label,
    :class:`~fabricscope.sim.slowdown.SlowdownTable`) to ``sim.json`` and ``slowdown.png``;
    with ``watched`` (:func:`~fabricscope.service.sim_plots_transport.run_transport_watched`)
    also ``pauses`` / ``hottest_queues`` to ``sim.json`` and ``queues.png`` / ``pauses.png``."""
    outdir.mkdir(parents=True, exist_ok=True)
    tables = slowdown_tables(result) if is_transport(result) else None
    extra: dict[str, object] | None = (
        {"slowdown": {label: t.to_dict() for label, t in tables.items()}} if tables is not None else None
    )
    if watched is not None:
        from fabricscope.service.sim_plots_transport import watch_json

        extra = {**(extra or {}), **watch_json(watched)}
    files = {"json": write_json(result, outdir / "sim.json", extra=extra)}
    if result.scenario.workload.get("steady_state") is True:
        # One ring step at t = 0: its FCTs and link timeline are an artefact of the model, not
        # the collective's (the answer is ring ms / busbw in the table), so no plots.
        return files
    if plots:
        files["fct_cdf"] = plot_fct_cdf(result, outdir / "fct_cdf.png")
        if any(r.result.utilization is not None for r in result.runs):
            files["link_util"] = plot_link_heatmap(result, outdir / "link_util.png")
        if tables is not None:
            files["slowdown"] = plot_slowdown(result, outdir / "slowdown.png", tables=tables)
        if watched is not None:
            from fabricscope.service.sim_plots_transport import plot_pauses, plot_queues

            files["queues"] = plot_queues(result, watched, outdir / "queues.png")
            files["pauses"] = plot_pauses(result, watched, outdir / "pauses.png")
    return files
