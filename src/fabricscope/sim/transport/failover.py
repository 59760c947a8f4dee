"""A link fails under running traffic: how long until each load balancer has the goodput back.

One run of the fluid transport engine per scheme, on the same flows: the link goes down at
``fail_at_ns`` (its queues and everything that reaches it are lost, silently), and each
scheme moves traffic off it when it can know:

========== ============================================== ==============================
scheme     routes before                                  re-routes
========== ============================================== ==============================
``ecmp``   one hashed path per flow                       the affected flows re-hash onto
                                                          one live path when routing has
                                                          reconverged (``converge_ns``)
``oblivious`` spraying over ``paths`` entropies           nothing until routing reconverges
                                                          (then spread over the survivors)
``reps``   the same entropies, recycled by the marks      by itself: an entropy whose packets
           and losses they see (``--lb reps``)            are lost is not recycled, one RTT
                                                          later (REPS, Bonato et al. 2024;
                                                          :func:`~fabricscope.sim.transport.kernel._reps`)
``ar``     spraying over every path (adaptive routing     at the switch whose own port went
           in steady state)                               down, ``local_detect_ns`` after;
                                                          the rest at reconvergence
========== ============================================== ==============================

The answer per scheme: the goodput of the flows that crossed the link, in bins, against
what they had before; the time from the failure until it is back at ``threshold`` (90 %)
of that and stays there. Pure: no I/O; time and the fabric are parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import _Engine
from fabricscope.sim.flows import Workload
from fabricscope.sim.loadbalance import PathTable, check_scheme
from fabricscope.sim.transport.config import TransportConfig
from fabricscope.sim.transport.fluid import FluidTransport

FloatArray = npt.NDArray[np.float64]
FAILOVER_SCHEMES: tuple[str, ...] = ("ecmp", "oblivious", "reps", "ar")
ECMP_EPSILON = 1e-6  # share an ECMP flow keeps on every other path, so that it can be re-hashed there


@dataclass(frozen=True)
class FailoverRun:
    """One scheme's run. Times are relative to the failure (us); goodput in Gb/s per bin."""

    scheme: str
    t_us: FloatArray
    affected_gbps: FloatArray
    total_gbps: FloatArray
    pre_affected_gbps: float
    pre_total_gbps: float
    n_affected: int
    reroute_us: tuple[float, ...]
    recovery_us: float | None  # None: not back at the threshold by the end; 0.0: never fell below it
    min_fraction: float  # lowest affected goodput after the failure / before
    end_fraction: float  # the same over the last tenth of the run: what the fabric has left

    def to_dict(self) -> dict[str, object]:
        return {"scheme": self.scheme, "n_affected": self.n_affected,
                "pre_affected_gbps": round(self.pre_affected_gbps, 2), "pre_total_gbps": round(self.pre_total_gbps, 2),
                "reroute_us": [round(x, 2) for x in self.reroute_us],
                "recovery_us": None if self.recovery_us is None else round(self.recovery_us, 2),
                "min_fraction": round(self.min_fraction, 4), "end_fraction": round(self.end_fraction, 4)}


def _table(fabric: Fabric, workload: Workload, scheme: str, cfg: TransportConfig, seed: int) -> PathTable:
    eng = _Engine(fabric, workload.flows, scheme=check_scheme(scheme), hash_config=None, faults=(), seed=seed,
                  flowlet_bytes=float("inf"), mtu_bytes=cfg.mtu_bytes, batch_rtol=1e-9)
    eng._route_all_static()
    assert eng.table is not None
    return eng.table


def _ecmp_on_spray(spray: PathTable, ecmp: PathTable) -> PathTable:
    """The spray table's rows with ECMP's path at weight 1 and the other paths at epsilon."""
    w = np.full(spray.weights.shape[0], ECMP_EPSILON)
    for i in range(spray.n_flows):
        a, b = int(spray.indptr[i]), int(spray.indptr[i + 1])
        mine = ecmp.edges[ecmp.indptr[i]:ecmp.indptr[i + 1]]
        w[a:b] = np.where(np.isin(spray.edges[a:b], mine), 1.0, ECMP_EPSILON)
    return replace(spray, weights=w)


def _recovery(t: FloatArray, frac: FloatArray, threshold: float) -> float | None:
    """First bin end after which the goodput stays at ``threshold`` or above to the end."""
    below = np.flatnonzero(frac < threshold)
    if below.shape[0] == 0:
        return 0.0
    k = int(below[-1]) + 1
    return float(t[k]) if k < t.shape[0] else None


def failover_run(
    fabric: Fabric,
    workload: Workload,
    *,
    scheme: str,
    link: str,
    fail_at_ns: float,
    until_ns: float,
    converge_ns: float,
    local_detect_ns: float = 1_000.0,
    paths: int = 128,
    config: TransportConfig | None = None,
    bin_ns: float = 5_000.0,
    pre_ns: float = 100_000.0,
    threshold: float = 0.9,
    seed: int = 0,
) -> FailoverRun:
    """Run ``workload`` (flows that outlast ``until_ns``) and fail ``link`` (``a|b``) at
    ``fail_at_ns``. ``converge_ns``: from the failure until routing has reconverged (every
    scheme re-routes then); ``local_detect_ns``: until a switch has taken its failed port out
    (adaptive routing)."""
    if scheme not in FAILOVER_SCHEMES:
        raise ConfigError(f"failover scheme: unknown {scheme!r}; choose one of {', '.join(FAILOVER_SCHEMES)}")
    if not 0 < pre_ns <= fail_at_ns < until_ns:
        raise ConfigError(f"failover: need 0 < pre ({pre_ns}) <= fail_at ({fail_at_ns}) < until ({until_ns})")
    if not converge_ns > 0 or not bin_ns > 0 or not 0 < threshold <= 1:
        raise ConfigError("failover: converge_ns and bin_ns must be > 0, threshold in (0, 1]")
    cfg = config or TransportConfig(cc="nscc")
    lb = "ecmp"
    if scheme in ("oblivious", "reps"):
        table = _table(fabric, workload, f"oblivious:paths={paths}", cfg, seed)
        lb = f"reps:paths={paths}" if scheme == "reps" else f"oblivious:paths={paths}"
    else:
        table = _table(fabric, workload, "spray", cfg, seed)
        if scheme == "ecmp":
            table = _ecmp_on_spray(table, _table(fabric, workload, "ecmp", cfg, seed))
    ft = FluidTransport(fabric, workload, config=cfg, lb=lb, paths=table, seed=seed)
    events: list[tuple[float, bool, bool, bool]] = []  # (time, local, pick, affected only)
    if scheme == "ar":
        events.append((fail_at_ns + local_detect_ns, True, False, False))
    events.append((fail_at_ns + converge_ns, False, scheme == "ecmp", True))
    events.sort()
    affected = np.zeros(ft.state.shape[0], dtype=bool)
    failed = False
    done: list[float] = []
    snaps: list[FloatArray] = []  # every flow's delivered bytes at each bin end
    t_bins: list[float] = []
    t = 0.0
    for k in range(1, math.ceil(until_ns / bin_ns) + 1):
        t_next = min(k * bin_ns, until_ns)
        stops = sorted({t_next, *([fail_at_ns] if not failed and fail_at_ns < t_next else []),
                        *[e[0] for e in events if t < e[0] < t_next]})
        for st in stops:
            ft.advance_to(st)
            if not failed and st >= fail_at_ns - 1e-9:
                edges = ft.fail_link(link)
                affected = ft.flows_through(edges)
                if not affected.any():
                    raise ConfigError(f"failover: no flow crosses {link}; choose a link the workload uses")
                failed = True
            for ev in events:
                if failed and ev[0] <= st + 1e-9 and ev[0] not in done:
                    ft.reroute(local=ev[1], pick=ev[2], flows=affected if ev[3] else None)
                    done.append(ev[0])
        if ft.finished:
            raise ConfigError("failover: the flows finished before the end of the run; give larger flows")
        snaps.append(ft.delivered.copy())
        t_bins.append(t_next)
        t = t_next
    tb = np.asarray(t_bins)
    width = np.diff(np.concatenate([[0.0], tb]))
    d = np.vstack(snaps)
    aff_cum = d[:, affected].sum(axis=1)
    tot_cum = d.sum(axis=1)
    aff_g = np.diff(np.concatenate([[0.0], aff_cum])) * 8 / width  # bytes / ns x 8 = Gb/s
    tot_g = np.diff(np.concatenate([[0.0], tot_cum])) * 8 / width
    pre = (tb > fail_at_ns - pre_ns + 1e-9) & (tb <= fail_at_ns + 1e-9)
    if not pre.any():
        raise ConfigError("failover: no bin before the failure; give a smaller bin_ns or a later fail_at_ns")
    pre_aff = float(aff_g[pre].mean())
    post = tb > fail_at_ns + 1e-9
    frac = aff_g[post] / max(pre_aff, 1e-12)
    rel = (tb[post] - fail_at_ns) / 1e3
    return FailoverRun(
        scheme=scheme, t_us=(tb - fail_at_ns) / 1e3, affected_gbps=aff_g, total_gbps=tot_g,
        pre_affected_gbps=pre_aff, pre_total_gbps=float(tot_g[pre].mean()), n_affected=int(affected.sum()),
        reroute_us=tuple((e - fail_at_ns) / 1e3 for e in done), recovery_us=_recovery(rel, frac, threshold),
        min_fraction=float(frac.min()) if frac.shape[0] else 1.0,
        end_fraction=float(frac[-max(frac.shape[0] // 10, 1):].mean()) if frac.shape[0] else 1.0,
    )
