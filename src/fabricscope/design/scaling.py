"""Scaling efficiency: one training step of a DP x TP x PP job on a design, from the simulator.

A step is ``compute + TP (NVLink) + PP (activations) + exposed DP gradient sync``. Weak
scaling (a fixed per-GPU batch, Megatron-LM practice: Narayanan et al., SC'21): ``compute``
stays the same as GPUs grow, the data-parallel degree ``dp = gpus / (tp * pp)`` grows, and
what grows with it is the gradient all-reduce: ``2(dp-1)`` ring steps whose latency term
grows with ranks and hops, and whose bandwidth term is the slowest hop's fair share, which
ECMP collisions shrink (SIMULATION.md §2). "Adding GPUs adds no compute" is the limit where
the sync dominates.

The DP sync is a ring all-reduce per (stage, TP index), NCCL-style over the rail of its TP
index (PXN: a rank whose GPU sits on another rail hands its data over NVLink to the GPU of
rail ``t`` first): every ring hop between servers is a connection of ``qps`` flows (queue pairs on
distinct source ports, Gangidi et al., SIGCOMM'24), all rings at once. The flow engine
solves the max-min rates of one steady-state step (docs/design/workloads-ring-steady-state.md)
under ``ecmp`` or ``spray``; each ring then takes ``steps * (alpha + max over its hops of
(chunk / rate + path delay))`` (Thakur, Rabenseifner & Gropp, IJHPCA 2005, with the NIC
bandwidth replaced by the slowest hop's fair share). ``analytical_step`` is the same
alpha-beta model at the full NIC rate with no collisions, for scales beyond what is
simulated (100k+ GPUs): it is stated as such wherever it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError, WorkloadError
from fabricscope.sim.engine import steady_state_rates
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import Workload
from fabricscope.sim.workload.alphabeta import alpha_beta_time, path_latency_s
from fabricscope.sim.workload.build import FlowList, connection_port
from fabricscope.sim.workload.collectives import fabric_hops
from fabricscope.sim.workload.placement import Placement, place_ranks

_JOB_KEYS = (
    "name", "tp", "pp", "params_billion", "grad_bytes_per_param", "compute_s", "overlap",
    "tp_bytes", "nvlink_gbps", "pp_bytes", "microbatches", "alpha_us", "qps", "placement",
    "seed", "lb", "checkpoint_s", "restart_s",
)


@dataclass(frozen=True)
class JobShape:
    """A training job's shape and per-step costs (weak scaling: per-GPU work is constant).

    ``params_billion`` x ``grad_bytes_per_param`` is the gradient all-reduced per step,
    split over ``tp * pp`` shards; ``compute_s`` is one step's compute per GPU; ``overlap`` the
    fraction of it that can hide the DP sync (0: none, bucketed overlap makes it ~0.3-0.6);
    ``tp_bytes`` per rank per step over NVLink (``nvlink_gbps``); ``pp_bytes`` activations per
    micro-batch between stages; ``alpha_us`` per ring step (NCCL's per-step latency);
    ``placement`` ``in-order`` (servers in id order) or ``random`` (whole servers in a
    seeded random order: a fragmented cluster). ``checkpoint_s`` is the time to write one checkpoint (Young/Daly's delta) and
    ``restart_s`` the time from an interruption to training again (reschedule, load the
    checkpoint: Daly's R).
    """

    name: str = "job"
    tp: int = 8
    pp: int = 1
    params_billion: float = 70.0
    grad_bytes_per_param: float = 2.0
    compute_s: float = 2.0
    overlap: float = 0.0
    tp_bytes: float = 0.0
    nvlink_gbps: float = 3600.0
    pp_bytes: float = 0.0
    microbatches: int = 1
    alpha_us: float = 10.0
    qps: int = 4
    placement: str = "in-order"
    seed: int = 0
    lb: tuple[str, ...] = ("ecmp", "spray")
    checkpoint_s: float = 60.0
    restart_s: float = 600.0
    source: str = field(default="job", compare=False)

    def __post_init__(self) -> None:
        src = self.source
        for k in ("tp", "pp", "microbatches", "qps"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{src}: {k}: must be an integer >= 1, got {v!r}")
        for k in ("params_billion", "compute_s", "nvlink_gbps", "checkpoint_s"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"{src}: {k}: must be > 0, got {v!r}")
        for k in ("grad_bytes_per_param", "tp_bytes", "pp_bytes", "alpha_us", "restart_s"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{src}: {k}: must be >= 0, got {v!r}")
        if not 0 <= self.overlap <= 1:
            raise ConfigError(f"{src}: overlap: must be in [0, 1], got {self.overlap!r}")
        if self.placement not in ("in-order", "random"):
            raise ConfigError(f"{src}: placement: {self.placement!r}; choose in-order or random")
        for lb in self.lb:
            if lb not in ("ecmp", "spray"):
                raise ConfigError(f"{src}: lb: {lb!r}; choose from ecmp, spray")

    @property
    def grad_bytes(self) -> float:
        return self.params_billion * 1e9 * self.grad_bytes_per_param

    def dp_for(self, gpus: int) -> int:
        shard = self.tp * self.pp
        if gpus % shard:
            raise ConfigError(f"{self.source}: tp x pp = {shard} does not divide {gpus} GPUs")
        return gpus // shard


def job_from_mapping(data: object, *, source: str) -> JobShape:
    """A :class:`JobShape` from parsed YAML; unknown keys and bad values name the field."""
    if data is None:
        return JobShape(source=source)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of job fields, got {type(data).__name__}")
    kw: dict[str, Any] = {}
    for k, v in data.items():
        if k not in _JOB_KEYS:
            raise ConfigError(f"{source}: {k}: unknown job field (known: {', '.join(_JOB_KEYS)})")
        kw[str(k)] = tuple(v) if k == "lb" and isinstance(v, list) else v
    if isinstance(kw.get("lb"), str):
        kw["lb"] = tuple(s.strip() for s in str(kw["lb"]).split(","))
    try:
        return JobShape(source=source, **kw)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


#: Most spray-router cache entries (edge weights of a per-(switch, destination) DAG) a
#: simulated step may build: about 1.5 GB. Sprayed rings between random servers of a
#: 3-tier 32k-GPU fabric need ~3 x 10^8 (measured 24 GB and 7.6 min), so they are refused.
SPRAY_BUDGET_ENTRIES = 20_000_000


class SimulationTooLarge(WorkloadError):
    """A simulated step would need more memory than :data:`SPRAY_BUDGET_ENTRIES` allows."""


@dataclass(frozen=True)
class StepTime:
    """One step's time on a design at one scale, and where it went."""

    gpus: int
    lb: str
    dp: int
    compute_s: float
    tp_s: float
    pp_s: float
    dp_sync_s: float
    exposed_sync_s: float
    step_s: float
    slowest_hop_gbps: float
    simulated: bool
    fault: str = ""

    @property
    def efficiency(self) -> float:
        """Compute share of the step: 1.0 is perfect weak scaling."""
        return self.compute_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def comm_share(self) -> float:
        return 1.0 - self.efficiency

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "lb": self.lb, "dp": self.dp, "compute_s": self.compute_s,
            "tp_s": self.tp_s, "pp_s": self.pp_s, "dp_sync_s": self.dp_sync_s,
            "exposed_sync_s": self.exposed_sync_s, "step_s": self.step_s,
            "efficiency": self.efficiency, "comm_share": self.comm_share,
            "slowest_hop_gbps": self.slowest_hop_gbps, "simulated": self.simulated,
            "fault": self.fault,
        }


@dataclass(frozen=True)
class _Rings:
    workload: Workload
    groups: tuple[tuple[int, int], ...]  # per ring: flow id range
    qps: int
    n: int  # ranks per ring
    chunk_bytes: float  # per hop per step (all its QPs together)


def dp_rings(fabric: Fabric, job: JobShape, gpus: int, *, qps: int | None = None) -> _Rings:
    """Every DP ring's cross-server hops as ``qps`` concurrent flows each (one steady step).

    ``qps`` defaults to the job's; a sprayed connection needs one (per-packet spraying
    already spreads it over every path, so more QPs change nothing but the cost).
    """
    nq = job.qps if qps is None else qps
    dp = job.dp_for(gpus)
    if dp < 2:
        raise WorkloadError(f"{job.source}: dp = {dp}: no data-parallel sync to simulate")
    placement = _placement(fabric, gpus, job)
    chunk = job.grad_bytes / (job.tp * job.pp) / dp
    fl = FlowList()
    groups: list[tuple[int, int]] = []
    for p in range(job.pp):
        for t in range(job.tp):
            ranks = [t + job.tp * (d + dp * p) for d in range(dp)]
            sub: Placement = placement.subset(ranks)
            members = tuple(range(dp))
            lo = len(fl)
            tag = f"dp/p{p}/t{t}"
            # PXN (NCCL): a hop leaves and enters servers on the NICs of rail t, whatever
            # GPU the rank runs on (NVLink moves the data to that rail's GPU first).
            for _, s, d_, _ in fabric_hops(sub, members, channel=t, rail_aligned=True):
                for q in range(nq):
                    fl.add(s, d_, chunk / nq, tag=tag, src_port=connection_port(s, d_, tag, q))
            groups.append((lo, len(fl)))
    wl = Workload(name=f"dp-sync-{gpus}", flows=fl.flows(), collective="none",
                  n_ranks=gpus, size_bytes=chunk, meta={"steady_state": True})
    return _Rings(wl, tuple(groups), nq, dp, chunk)


def spray_cost(fabric: Fabric, workload: Workload, *, routing: Routing | None = None,
               samples: int = 4) -> tuple[int, int]:
    """Estimated (distinct (leaf, destination leaves) pairs, spray-cache entries) of a step.

    The spray router caches one DAG of edge weights per (first switch, destination
    attachment); flows inside one leaf need none. Entries are the pairs times the largest
    DAG among a few sampled pairs (every pair of a Clos has about the same DAG size).
    """
    lv = fabric.leaves_of_nic
    pairs: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}
    for fl in workload.flows:
        dst = lv.get(fl.dst, ())
        for leaf in lv.get(fl.src, ()):
            if leaf not in dst:
                pairs.setdefault((leaf, dst), (leaf, fl.dst))
    if not pairs:
        return 0, 0
    rt = routing if routing is not None else Routing(fabric)
    items = list(pairs.values())
    step = max(1, len(items) // samples)
    size = max(len(rt.spray_weights(a, b)) for a, b in items[::step][:samples])
    return len(pairs), len(pairs) * size


def _placement(fabric: Fabric, gpus: int, job: JobShape) -> Placement:
    """Ranks on GPU slots: servers in id order, or whole servers in a seeded random order.

    ``random`` is a fragmented cluster as schedulers make it: a job gets whole servers,
    scattered over the fabric, so TP groups stay inside a server and DP rings hop between
    servers anywhere (Gangidi et al., SIGCOMM'24 measured >30% slower training from it).
    """
    base = place_ranks(fabric, gpus, policy="in-order")
    if job.placement == "in-order":
        return base
    hosts = list(base.hosts)
    order = np.random.default_rng(job.seed).permutation(len(hosts))
    by_host = base.ranks_of_host
    ranks = [r for i in order for r in by_host[hosts[int(i)]]]
    sub = base.subset(ranks)
    return Placement(sub.slots, "random-servers", sub.rail_nics)


def _tp_pp_s(job: JobShape, nic_gbps: float) -> tuple[float, float]:
    tp_s = 0.0
    if job.tp > 1 and job.tp_bytes > 0:
        tp_s = alpha_beta_time("allreduce", job.tp, job.tp_bytes,
                               bandwidth_bps=job.nvlink_gbps * 1e9, alpha_s=job.alpha_us * 1e-6)
    pp_s = 0.0
    if job.pp > 1 and job.pp_bytes > 0:
        # 1F1B: every micro-batch's activations forward and gradients back, per stage boundary
        # on the critical path: 2 (pp - 1) transfers at the NIC rate.
        pp_s = 2 * (job.pp - 1) * (job.pp_bytes / job.tp * 8 / (nic_gbps * 1e9)
                                   + job.alpha_us * 1e-6)
    return tp_s, pp_s


def _nic_gbps(fabric: Fabric) -> float:
    nic = fabric.nics[0].id
    return float(sum(fabric.ports[p].speed_gbps for p in fabric.ports_of.get(nic, ())))


def simulated_step(
    fabric: Fabric,
    job: JobShape,
    *,
    lb: str = "ecmp",
    faults: Sequence[Fault] = (),
    fault_label: str = "",
    routing: Routing | None = None,
) -> StepTime:
    """One step of ``job`` on every GPU of ``fabric`` with the DP sync from the flow engine."""
    gpus = fabric.gpu_count
    rings = dp_rings(fabric, job, gpus, qps=1 if lb == "spray" else None)
    if lb == "spray":
        pairs, entries = spray_cost(fabric, rings.workload, routing=routing)
        if entries > SPRAY_BUDGET_ENTRIES:
            raise SimulationTooLarge(
                f"spray at {gpus} GPUs ({job.placement} placement): {pairs:,} sprayed "
                f"(switch, destination) pairs need ~{entries / 1e6:,.0f}M cached path weights "
                f"(budget {SPRAY_BUDGET_ENTRIES / 1e6:.0f}M, ~{entries * 80 / 2**30:.0f} GiB): "
                "not simulated; use in-order placement, a smaller scale, or --lb ecmp"
            )
    ss = steady_state_rates(fabric, rings.workload, lb=lb, faults=list(faults), seed=job.seed)
    lat = path_latency_s(fabric, rings.workload, routing=routing)
    rates = ss.rates_bps
    steps = 2 * (rings.n - 1)
    alpha = job.alpha_us * 1e-6
    worst = 0.0
    slowest = math.inf
    per_flow = rings.chunk_bytes / rings.qps * 8.0
    with np.errstate(divide="ignore"):
        t_flow = np.where(rates > 0, per_flow / np.maximum(rates, 1e-300), np.inf) + lat
    for lo, hi in rings.groups:
        if hi == lo:
            continue
        worst = max(worst, steps * (alpha + float(t_flow[lo:hi].max())))
        # a hop's rate: the sum over its QPs (hops are consecutive runs of qps flows)
        hop = rates[lo:hi].reshape(-1, rings.qps).sum(axis=1)
        slowest = min(slowest, float(hop.min()))
    compute = job.compute_s
    tp_s, pp_s = _tp_pp_s(job, _nic_gbps(fabric))
    exposed = max(0.0, worst - job.overlap * compute)
    return StepTime(
        gpus=gpus, lb=lb, dp=rings.n, compute_s=compute, tp_s=tp_s, pp_s=pp_s,
        dp_sync_s=worst, exposed_sync_s=exposed, step_s=compute + tp_s + pp_s + exposed,
        slowest_hop_gbps=slowest / 1e9 if math.isfinite(slowest) else 0.0, simulated=True,
        fault=fault_label,
    )


def analytical_step(
    job: JobShape, gpus: int, *, nic_gbps: float, tiers: int, hop_latency_s: float = 1e-6,
    mtu_bytes: int = 4096,
) -> StepTime:
    """The alpha-beta step at the full NIC rate, no collisions (an analytical bound).

    Per ring step: ``alpha`` + the path delay of a ``2 * tiers``-link path (propagation plus
    one MTU store-and-forward per switch). Used beyond the simulated scales; never a
    simulation result (``simulated`` is False).
    """
    dp = job.dp_for(gpus)
    n_links = 2 * tiers
    path = n_links * hop_latency_s + (n_links - 1) * mtu_bytes * 8 / (nic_gbps * 1e9)
    s = job.grad_bytes / (job.tp * job.pp)
    sync = 0.0
    if dp > 1:
        sync = 2 * (dp - 1) * (job.alpha_us * 1e-6 + path) + 2 * (dp - 1) / dp * s * 8 / (nic_gbps * 1e9)
    tp_s, pp_s = _tp_pp_s(job, nic_gbps)
    exposed = max(0.0, sync - job.overlap * job.compute_s)
    return StepTime(
        gpus=gpus, lb="analytical", dp=dp, compute_s=job.compute_s, tp_s=tp_s, pp_s=pp_s,
        dp_sync_s=sync, exposed_sync_s=exposed, step_s=job.compute_s + tp_s + pp_s + exposed,
        slowest_hop_gbps=nic_gbps, simulated=False,
    )


def device_down(fabric: Fabric, device: str) -> tuple[Fault, ...]:
    """``link-down`` faults on every cable of ``device`` (a failed switch, as routing sees it)."""
    return tuple(Fault("link-down", link.id) for link in fabric.links
                 if device in (port_device(link.a), port_device(link.b)))


def speedups(steps: Mapping[int, StepTime]) -> dict[int, float]:
    """Throughput speed-up of each scale over the smallest one (ideal: the GPU ratio)."""
    if not steps:
        return {}
    base = min(steps)
    t0 = steps[base].step_s
    return {g: (g / base) * (t0 / st.step_s) for g, st in sorted(steps.items())}
