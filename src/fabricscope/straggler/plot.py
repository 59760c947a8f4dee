"""Timeline plot of a report: iteration times, the ideal, and what each culprit explains."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fabricscope.straggler.analysis import Report


def plot_report(report: Report, path: str | Path, *, title: str | None = None) -> Path:
    """Write a PNG/SVG: per-iteration duration, stacked with the time each finding explains."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = np.array(report.iterations.iterations)
    # Seconds for long iterations (real LLM steps take tens of seconds), else ms.
    unit, scale = ("s", 1e9) if max(report.iterations.duration_ns, default=0) > 10e9 else ("ms", 1e6)
    dur = np.array(report.iterations.duration_ns, dtype=float) / scale
    x = np.arange(its.size)
    fig, ax = plt.subplots(figsize=(10, 4.6))
    bottom = np.zeros(its.size)
    total_explained = np.zeros(its.size)
    for series in report.explained_ns.values():
        total_explained += np.array(series) / scale
    base = np.maximum(dur - total_explained, 0)
    ax.bar(x, base, color="#9ab", label="not explained")
    bottom = base.copy()
    colors = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    for k, (name, series) in enumerate(report.explained_ns.items()):
        s = np.array(series) / scale
        ax.bar(x, s, bottom=bottom, color=colors[k % len(colors)], label=f"explained by {name}")
        bottom += s
    ax.axhline(report.ideal_ns / scale, color="k", ls="--", lw=1,
               label=f"estimated ideal ({report.slowdown:.2f}x slowdown)")
    for k, cp in enumerate(report.iterations.change_points):
        pos = int(np.searchsorted(its, cp))
        ax.axvline(pos - 0.5, color="#555", ls=":", lw=1,
                   label="change point" if k == 0 else None)
    # At most ~16 labels, fewer when step numbers are long (they must not run together).
    width = max((len(str(i)) for i in its.tolist()), default=1)
    step = max(1, -(-its.size // (16 if width <= 3 else 10)))
    ax.set_xticks(x[::step])
    ax.set_xticklabels([str(i) for i in its[::step]])
    ax.set_xlabel("iteration (training step)")
    ax.set_ylabel(f"iteration time ({unit})")
    ax.set_title(title or f"{report.job}: where the iteration time goes")
    # Below the axes: inside it would hide the first bars (they reach the top).
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3,
              frameon=False)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
