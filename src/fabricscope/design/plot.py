"""Plots of a design comparison (the JSON of :func:`fabricscope.design.compare.compare`).

Three figures a fabric architect reads faster than a table: cost per GPU vs scale, scaling
efficiency vs scale (simulated points solid, analytical extrapolation dashed), and goodput
vs checkpoint interval (Daly's expected-time model per design, with the Young and Daly
intervals marked).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.design.reliability import goodput

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2")


def _by_design(result: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in result["designs"]:
        out.setdefault(str(row["name"]), []).append(row)
    for rows in out.values():
        rows.sort(key=lambda r: int(r["gpus"]))
    return out


def _finish(fig: Any, ax: Any, path: Path, *, xlabel: str, ylabel: str, title: str,
            legend: Mapping[str, Any]) -> Path:
    """Label, grid, legend, save as PNG and close one figure."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(**legend)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_comparison(result: Mapping[str, Any], folder: str | Path) -> list[Path]:
    """Write ``cost_per_gpu.png``, ``scaling_efficiency.png`` and ``goodput_vs_interval.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    designs = _by_design(result)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 4.6))
    for k, (name, rows) in enumerate(designs.items()):
        xs = [int(r["gpus"]) for r in rows]
        ax.plot(xs, [float(r["bom"]["cost_per_gpu_usd"]) for r in rows], "o-",
                color=_COLORS[k % len(_COLORS)], label=name)
    ax.set_xscale("log", base=2)
    paths.append(_finish(
        fig, ax, out / "cost_per_gpu.png", xlabel="GPUs", ylabel="fabric cost per GPU (USD)",
        title="Fabric cost per GPU (switches, optics, cables, NIC ports)", legend={"fontsize": 8}))

    fig, ax = plt.subplots(figsize=(8, 4.6))
    for k, (name, rows) in enumerate(designs.items()):
        color = _COLORS[k % len(_COLORS)]
        lbs = sorted({lb for r in rows for lb in r["steps"]})
        for j, lb in enumerate(lbs):
            pts = [(int(r["gpus"]), float(r["steps"][lb]["efficiency"])) for r in rows if lb in r["steps"]]
            if pts:
                ax.plot(*zip(*pts, strict=True), ["o-", "s--", "^:"][j % 3], color=color,
                        label=f"{name} ({lb})")
    for k, (name, _rows) in enumerate(designs.items()):
        ext = [e for e in result.get("extrapolated", []) if e["name"] == name]
        if ext:
            ext.sort(key=lambda e: int(e["gpus"]))
            ax.plot([int(e["gpus"]) for e in ext], [float(e["step"]["efficiency"]) for e in ext],
                    "x:", color=_COLORS[k % len(_COLORS)], alpha=0.7,
                    label=f"{name} (analytical, no collisions)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    paths.append(_finish(
        fig, ax, out / "scaling_efficiency.png", xlabel="GPUs",
        ylabel="scaling efficiency (compute / step time)",
        title=f"Scaling efficiency of {result['job']['name']} (weak scaling)",
        legend={"fontsize": 7, "ncol": 2}))

    fig, ax = plt.subplots(figsize=(8, 4.6))
    for k, (name, rows) in enumerate(designs.items()):
        r = rows[-1]  # the largest scale
        ck = r["checkpoint"]
        m, d, rs = float(ck["mtbf_s"]), float(ck["checkpoint_s"]), float(ck["restart_s"])
        if not np.isfinite(m):
            continue
        taus = np.geomspace(max(d / 4, 1.0), max(8 * float(ck["daly_s"]), 10 * d), 200)
        color = _COLORS[k % len(_COLORS)]
        ax.plot(taus / 60, [goodput(float(t), d, rs, m) for t in taus], color=color,
                label=f"{name} @ {int(r['gpus'])} GPUs (MTBF {m / 3600:.1f} h)")
        ax.axvline(float(ck["daly_s"]) / 60, color=color, ls=":", lw=1)
    ax.set_xscale("log")
    paths.append(_finish(
        fig, ax, out / "goodput_vs_interval.png",
        xlabel="checkpoint interval (minutes); dotted: Daly's optimum",
        ylabel="goodput (useful / wall time)",
        title="Goodput vs checkpoint interval (Daly 2006 expected-time model)",
        legend={"fontsize": 8}))
    return paths
