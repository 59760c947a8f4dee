"""Per-lane history of one module: rx / tx power, bias, temperature, with its thresholds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fabricscope.model.errors import ConfigError
from fabricscope.optics.history import FleetHistory

_PANELS = (
    ("rx_power_dbm", "rx power (dBm)"),
    ("tx_power_dbm", "tx power (dBm)"),
    ("tx_bias_ma", "laser bias (mA)"),
    ("temperature_c", "temperature (°C)"),
)


def plot_module(history: FleetHistory, module: str, path: str | Path, *,
                failure_ns: int | None = None, title: str | None = None) -> Path:
    """Write a PNG of every lane of ``module`` (``device:port``) over time.

    Warning thresholds are dashed, alarm thresholds dotted (from the module's own table);
    ``failure_ns`` marks a known failure time.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mt = history.modules
    idx = {mt.key(i): i for i in range(len(mt))}
    if module not in idx:
        near = sorted(k for k in idx if module.split(":")[-1] in k)[:5]
        hint = f"; similar: {', '.join(near)}" if near else ""
        raise ConfigError(f"--module {module}: not in the input ({len(mt)} modules){hint}")
    m = idx[module]
    rows = np.flatnonzero(history.module == m)
    t0 = int(history.ts[rows].min()) if rows.size else 0
    days = (history.ts[rows] - t0) / 86400e9
    lanes = history.lane[rows]
    fig, axes = plt.subplots(len(_PANELS), 1, figsize=(10, 9), sharex=True)
    for ax, (metric, label) in zip(axes, _PANELS, strict=True):
        vals = np.asarray(history.metrics[metric], dtype=float)[rows]
        for ln in np.unique(lanes):
            sel = lanes == ln
            ax.plot(days[sel], vals[sel], lw=0.8, label=f"lane {int(ln)}")
        for kind, style in (("high_warn", "--"), ("low_warn", "--"), ("high_alarm", ":"),
                            ("low_alarm", ":")):
            th = mt.thresholds.get(f"{metric}_{kind}")
            if th is not None and np.isfinite(th[m]):
                ax.axhline(float(th[m]), color="#c44", ls=style, lw=0.8)
        if failure_ns is not None:
            ax.axvline((failure_ns - t0) / 86400e9, color="k", lw=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=8, loc="lower left")
    axes[-1].set_xlabel("days since the first sample")
    ident = f"{mt.vendor[m]} {mt.part_number[m]} s/n {mt.serial[m]}".strip()
    fig.suptitle(title or f"{module}: {ident} (dashed: warning, dotted: alarm)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
