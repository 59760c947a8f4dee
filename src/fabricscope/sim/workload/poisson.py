"""Poisson open-loop traffic from a flow-size distribution (WebSearch, FB_Hadoop) at a given load.

The generator follows the HPCC repository's ``traffic_gen/traffic_gen.py`` (Li et al.,
SIGCOMM'19, alibaba-edu/High-Precision-Congestion-Control): every host starts flows as a
Poisson process whose rate makes its offered load ``load x`` its link rate (mean inter-arrival
``mean size x 8 / (link rate x load)``), each to a destination drawn uniformly among the other
hosts, with a size drawn from the empirical CDF by inverse transform, linear between the CDF
points (``custom_rand.py``). The CDF points ship as package data (``cdfs/*.json``, source URL
inside). Design notes: docs/design/sim-workloads-poisson.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.build import FlowList

FloatArray = npt.NDArray[np.float64]

#: Distributions shipped with the package (``cdf=NAME`` in a workload spec).
CDF_NAMES: tuple[str, ...] = ("websearch", "fb_hadoop")


@dataclass(frozen=True)
class FlowSizeCdf:
    """An empirical flow-size CDF: ``sizes`` (bytes, strictly increasing) against
    ``cum`` (fraction of flows at or below, strictly increasing from 0 to 1)."""

    name: str
    sizes: FloatArray
    cum: FloatArray
    source: str = ""

    def __post_init__(self) -> None:
        s, c = self.sizes, self.cum
        where = f"cdf {self.name!r}"
        if s.ndim != 1 or s.shape != c.shape or s.shape[0] < 2:
            raise ConfigError(f"{where}: needs at least 2 (size, cdf) points of equal length")
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(c))):
            raise ConfigError(f"{where}: sizes and cdf values must be finite")
        if s[0] < 0:
            raise ConfigError(f"{where}: sizes must be >= 0, got {s[0]!r}")
        if c[0] != 0.0 or c[-1] != 1.0:
            raise ConfigError(f"{where}: cdf must start at 0 and end at 100 %, got {c[0] * 100:g} .. {c[-1] * 100:g}")
        if np.any(np.diff(s) <= 0) or np.any(np.diff(c) <= 0):
            raise ConfigError(f"{where}: sizes and cdf values must both be strictly increasing")

    @property
    def mean_bytes(self) -> float:
        """Mean flow size of the piecewise-linear CDF (the trapezoid rule, exact for it)."""
        return float(np.sum(0.5 * (self.sizes[1:] + self.sizes[:-1]) * np.diff(self.cum)))

    def quantile(self, u: npt.ArrayLike) -> FloatArray:
        """Sizes at cumulative fractions ``u`` (0..1), linear between the points."""
        return np.asarray(np.interp(np.asarray(u, dtype=np.float64), self.cum, self.sizes), dtype=np.float64)

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        """``n`` flow sizes (whole bytes, at least 1) by inverse transform sampling."""
        return np.maximum(np.floor(self.quantile(rng.random(n))), 1.0)


def parse_cdf_points(points: Sequence[Sequence[float]], *, name: str, source: str = "") -> FlowSizeCdf:
    """``[[size_bytes, cumulative_percent], ...]`` (the HPCC repository's format) -> a CDF."""
    try:
        arr = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"cdf {name!r}: expected [[size, percent], ...], got {points!r:.80}") from None
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ConfigError(f"cdf {name!r}: expected [[size, percent], ...] pairs, got shape {arr.shape}")
    return FlowSizeCdf(name, arr[:, 0].copy(), arr[:, 1] / 100.0, source)


def parse_cdf_text(text: str, *, name: str, source: str = "") -> FlowSizeCdf:
    """A CDF file in the HPCC repository's text format: one ``SIZE PERCENT`` pair per line."""
    pts: list[list[float]] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            pts.append([float(parts[0]), float(parts[1])])
        except ValueError:
            raise ConfigError(f"{source or name}: line {i}: expected 'SIZE PERCENT', got {line.strip()!r}") from None
    return parse_cdf_points(pts, name=name, source=source)


def load_cdf(name_or_path: str, *, where: str = "cdf") -> FlowSizeCdf:
    """A shipped distribution by name (:data:`CDF_NAMES`) or a ``SIZE PERCENT`` text file."""
    key = name_or_path.strip().lower().replace("-", "_")
    if key in CDF_NAMES:
        data = json.loads(resources.files("fabricscope.sim.workload").joinpath(f"cdfs/{key}.json").read_text("utf-8"))
        return parse_cdf_points(data["points"], name=key, source=str(data.get("source", "")))
    p = Path(name_or_path)
    if not p.is_file():
        raise ConfigError(f"{where}: unknown distribution {name_or_path!r} (choose one of "
                          f"{', '.join(CDF_NAMES)}, or give a 'SIZE PERCENT' text file)")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {p}: {exc.strerror or exc}") from None
    return parse_cdf_text(text, name=p.stem, source=str(p))


def host_rates_bps(fabric: Fabric, nics: Sequence[str]) -> FloatArray:
    """Each NIC's uplink capacity (bits/s): the link rate its offered load is a fraction of."""
    ix = fabric.index
    up = ~ix.is_switch[ix.src] & ix.is_switch[ix.dst]
    rate = np.bincount(ix.src[up], weights=ix.capacity_bps[up], minlength=ix.n_nodes)
    return np.asarray([rate[ix.node_of[n]] for n in nics], dtype=np.float64)


def expected_flows(fabric: Fabric, cdf: FlowSizeCdf, *, load: float, duration_ns: float) -> float:
    """Mean number of flows :func:`poisson_workload` builds (every NIC a source)."""
    nics = [n.id for n in fabric.nics]
    rates = host_rates_bps(fabric, nics)
    return float(np.sum(rates * load * duration_ns * 1e-9 / (8.0 * cdf.mean_bytes)))


def poisson_workload(
    fabric: Fabric,
    cdf: FlowSizeCdf,
    *,
    load: float,
    duration_ns: float,
    seed: int | np.random.Generator = 0,
    nics: Sequence[str] | None = None,
    name: str | None = None,
) -> Workload:
    """Open-loop Poisson flows on ``fabric`` for ``duration_ns`` at ``load`` of each host's link.

    Every NIC of ``nics`` (default: all) is a source with arrival rate
    ``load x link rate / (8 x mean size)``; destinations are uniform over the other NICs of
    ``nics``, sizes drawn from ``cdf``. Flows are numbered in start-time order. The first
    arrivals come from the stationary process (no flow at exactly t = 0), as in HPCC's
    ``traffic_gen.py``.
    """
    if not (isinstance(load, int | float) and 0 < load <= 1):
        raise ConfigError(f"poisson: load: must be in (0, 1] (a fraction of the host link rate), got {load!r}")
    if not (math.isfinite(duration_ns) and duration_ns > 0):
        raise ConfigError(f"poisson: duration: must be > 0, got {duration_ns!r} ns")
    ids = [n.id for n in fabric.nics] if nics is None else list(nics)
    known = {n.id for n in fabric.nics}
    for x in ids:
        if x not in known:
            raise WorkloadError(f"poisson: nics: {x!r} is not a NIC of {fabric.name!r}")
    if len(ids) < 2:
        raise WorkloadError(f"poisson: needs at least 2 NICs, got {len(ids)}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    rates = host_rates_bps(fabric, ids)
    mean = cdf.mean_bytes
    srcs: list[np.ndarray] = []
    times: list[np.ndarray] = []
    for i, r in enumerate(rates):
        mean_gap = 8.0 * mean / (r * load) * 1e9  # ns
        lam = duration_ns / mean_gap
        t = np.cumsum(rng.exponential(mean_gap, size=int(lam + 6.0 * math.sqrt(lam) + 16)))
        while t[-1] <= duration_ns:  # rare: draw more until past the horizon
            t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(mean_gap, size=int(lam) + 16))])
        t = t[t <= duration_ns]
        srcs.append(np.full(t.shape[0], i, dtype=np.int64))
        times.append(t)
    src = np.concatenate(srcs)
    start = np.concatenate(times)
    n = src.shape[0]
    # Uniform over the other NICs: draw from n-1 slots and skip the source's own.
    dst = rng.integers(0, len(ids) - 1, size=n)
    dst = dst + (dst >= src)
    size = cdf.sample(rng, n)
    order = np.argsort(start, kind="stable")
    fl = FlowList()
    for k in order.tolist():
        fl.add(ids[int(src[k])], ids[int(dst[k])], float(size[k]), start_ns=round(float(start[k])), tag="poisson")
    if not len(fl):
        raise WorkloadError(f"poisson: no flow starts within {duration_ns:g} ns at load {load:g} "
                            f"(mean size {mean:.0f} B); give a longer duration")
    offered = float(size.sum()) * 8.0 / (float(rates.sum()) * duration_ns * 1e-9)
    return Workload(
        name or f"poisson-{cdf.name}-{load:g}",
        fl.flows(),
        meta={"pattern": "poisson", "cdf": cdf.name, "cdf_source": cdf.source, "load": load,
              "duration_ns": duration_ns, "mean_flow_bytes": mean, "offered_load": offered},
    )
