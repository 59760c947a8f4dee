"""The collective twin: expected busbw from the simulator, synthetic nccl-tests runs, slow-node plans.

Three computations, kept apart on purpose:

* :func:`expected_busbw` is the **closed form**: the alpha-beta ring time (Thakur,
  Rabenseifner & Gropp 2005; nccl-tests busbw, SIMULATION.md section 3) with ``B`` the
  slowest hop of one ring step from the flow engine's max-min rates at t = 0
  (:func:`~fabricscope.sim.engine.steady_state_rates`, one solve), the NVLink rate as a
  second bandwidth bound and ``steps x (alpha + path latency)`` as the latency term.
* :func:`twin_run` is the **measurement**: the full ring DAG
  (:func:`~fabricscope.sim.workload.collectives.ring_collective`, ``steps x hops x
  channels`` dependent flows) run to completion by the event-driven engine
  (:func:`~fabricscope.sim.engine.simulate`), with slow NICs / links as ``link-degraded``
  faults, the same NVLink floor and alpha, plus seeded run-to-run noise, printed in the
  nccl-tests output format. What differs from the closed form: chained steps (each waits for
  its predecessor's *arrival*: per-step store-and-forward, skew between hops), completion
  batching, and the noise. Both share the max-min solver and the routing, so agreement
  tests the lock-step assumption of the closed form, not the solver.
* :func:`run_plan_on_twin` runs a :mod:`fabricscope.collective.slownode` search end to end
  on a leaf-spine twin, each round's tests as concurrent flows in one steady-state solve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from fabricscope.collective.slownode import (
    SearchState,
    Verdict,
    analyze,
    new_search,
    plan,
    record,
)
from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.engine import simulate, steady_state_rates
from fabricscope.sim.faults import Fault
from fabricscope.sim.flows import FlowSpec, busbw_factor
from fabricscope.sim.workload.alphabeta import path_latency_s, ring_time_from_rates
from fabricscope.sim.workload.collectives import ring_collective, ring_steady_state, ring_steps
from fabricscope.sim.workload.placement import Placement, gpu_slots

Bound = Literal["nvlink", "network", "latency"]
_NAMES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "all_reduce_perf": "allreduce",
    "allgather": "allgather", "all_gather": "allgather", "all_gather_perf": "allgather",
    "reducescatter": "reducescatter", "reduce_scatter": "reducescatter",
    "reduce_scatter_perf": "reducescatter",
}
_PERF = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf",
         "reducescatter": "reduce_scatter_perf"}
#: NVLink 4 (H100): 450 GB/s per direction per GPU; NCCL reaches ~360 GB/s busbw in one node.
DEFAULT_NVLINK_GBS = 360.0
DEFAULT_ALPHA_US = 1.0
_REF_BYTES = float(2**30)


@dataclass(frozen=True, slots=True)
class ExpectedPoint:
    """Expected nccl-tests numbers for one message size (busbw in GB/s = 1e9 bytes/s)."""

    size_bytes: int
    time_us: float
    busbw_gbs: float
    bound: Bound


def collective_name(name: str) -> str:
    """``all_reduce_perf`` / ``all_reduce`` / ``allreduce`` -> ``allreduce`` (ring collectives)."""
    key = name.strip().lower()
    if key not in _NAMES:
        raise ConfigError(f"collective: {name!r} is not modelled (choose all_reduce, "
                          "all_gather or reduce_scatter)")
    return _NAMES[key]


def node_placement(fabric: Fabric, nodes: Sequence[str] | int, *,
                   gpus_per_node: int | None = None, policy: str = "in-order",
                   seed: int = 0) -> Placement:
    """Ranks on ``nodes`` (host ids, or the first ``n`` hosts): ``gpus_per_node`` each.

    ``in-order``: hosts in the given order, GPUs by index (NCCL's ring visits a node's ranks
    consecutively); ``random``: the same ranks in a seeded random order.
    """
    slots, rail_nics = gpu_slots(fabric)
    by_host: dict[str, list[int]] = {}
    for i, s in enumerate(slots):
        by_host.setdefault(s.host, []).append(i)
    hosts = list(by_host)[:nodes] if isinstance(nodes, int) else list(nodes)
    if isinstance(nodes, int) and len(hosts) < nodes:
        raise ConfigError(f"nodes: {nodes} requested, fabric {fabric.name!r} has {len(hosts)} hosts")
    chosen: list[int] = []
    for h in hosts:
        if h not in by_host:
            raise ConfigError(f"nodes: {h!r} is not a host with GPUs of fabric {fabric.name!r}")
        have = by_host[h]
        g = len(have) if gpus_per_node is None else gpus_per_node
        if not 1 <= g <= len(have):
            raise ConfigError(f"gpus_per_node: {g} on {h} (it has {len(have)} GPUs)")
        chosen.extend(have[:g])
    if policy == "random":
        order = np.random.default_rng(seed).permutation(len(chosen))
        chosen = [chosen[int(i)] for i in order]
    elif policy != "in-order":
        raise ConfigError(f"placement: unknown {policy!r} (choose in-order or random)")
    return Placement(tuple(slots[i] for i in chosen), policy, rail_nics)


def slow_faults(fabric: Fabric, slow: Mapping[str, float] | None) -> tuple[Fault, ...]:
    """``link-degraded`` faults for ``{subject: factor}``: a host (all its NICs), a NIC, or a
    cable ``a:p0|b:eth1``; ``factor`` in (0, 1] scales the rate (0.5 = half speed)."""
    if not slow:
        return ()
    links = {ln.id for ln in fabric.links}
    out: list[Fault] = []
    for subject, factor in slow.items():
        if not 0 < float(factor) <= 1:
            raise ConfigError(f"slow: {subject}: factor must be in (0, 1], got {factor!r}")
        if subject in links:
            cables = [subject]
        else:
            nics = ([n.id for n in fabric.nics_of_host.get(subject, ())]
                    or ([subject] if subject in fabric.ports_of and subject in
                        {n.id for n in fabric.nics} else []))
            if not nics:
                raise ConfigError(f"slow: {subject!r} is not a host, NIC or cable of "
                                  f"fabric {fabric.name!r}")
            cables = [fabric.link_of_port[p].id for nic in nics
                      for p in fabric.ports_of.get(nic, ()) if p in fabric.link_of_port]
        out.extend(Fault("link-degraded", c, params={"factor": float(factor)}) for c in cables)
    return tuple(out)


def expected_busbw(
    fabric: Fabric,
    collective: str,
    ranks: int,
    sizes_bytes: Sequence[float],
    *,
    gpus_per_node: int,
    placement: str = "in-order",
    nvlink_gbs: float = DEFAULT_NVLINK_GBS,
    alpha_us: float = DEFAULT_ALPHA_US,
    lb: str = "ecmp",
    faults: Sequence[Fault] = (),
    nodes: Sequence[str] | None = None,
    seed: int = 0,
) -> list[ExpectedPoint]:
    """Expected busbw of a ring ``collective`` of ``ranks`` ranks for each size (closed form).

    Assumes NCCL's ring over rails (one channel per NIC, rail-aligned hops, a node's ranks
    consecutive in the ring), ``gpus_per_node`` ranks per node on the first hosts (or on
    ``nodes``), no tree / NVLS algorithm. A ring step lasts as long as its slowest hop, a
    fabric hop (chunk / B + path latency) or an NVLink hop (chunk / NVLink rate), so
    ``time = steps x alpha + max(network term + steps x latency, NVLink term)``, each
    bandwidth term ``2(p-1)/p S / B`` for all-reduce; the network ``B`` is the slowest hop's
    max-min rate of one ring step (flow engine). ``bound``: the largest of the latency
    (``steps x (alpha + latency)``), network and NVLink terms.
    """
    coll = collective_name(collective)
    if ranks < 2 or gpus_per_node < 1 or ranks % gpus_per_node:
        raise ConfigError(f"expected busbw: ranks {ranks} must be >= 2 and a multiple of "
                          f"gpus_per_node {gpus_per_node}")
    if not nvlink_gbs > 0 or alpha_us < 0:
        raise ConfigError(f"expected busbw: nvlink_gbs {nvlink_gbs!r} must be > 0, alpha_us "
                          f"{alpha_us!r} >= 0")
    n_nodes = ranks // gpus_per_node
    pl = node_placement(fabric, list(nodes) if nodes is not None else n_nodes,
                        gpus_per_node=gpus_per_node, policy=placement, seed=seed)
    p = pl.n_ranks
    steps = ring_steps(coll, p)
    factor = busbw_factor("allreduce" if coll == "allreduce" else "allgather", p)
    t_net_ref = 0.0
    lat = 0.0
    if len(pl.hosts) > 1:
        wl = ring_steady_state(pl, _REF_BYTES, collective=coll)
        ss = steady_state_rates(fabric, wl, lb=lb, faults=faults, seed=seed)
        t_net_ref = ring_time_from_rates(wl, ss.rates_bps)
        lat = float(path_latency_s(fabric, wl).max())
    out: list[ExpectedPoint] = []
    for s in sizes_bytes:
        if not s >= 0:
            raise ConfigError(f"expected busbw: size {s!r} must be >= 0")
        if s == 0:  # nccl-tests prints a 0-byte row for some collectives: nothing moves
            out.append(ExpectedPoint(0, steps * alpha_us, 0.0, "latency"))
            continue
        t_net = t_net_ref * s / _REF_BYTES
        t_nvl = s * factor / (nvlink_gbs * 1e9)
        t_hop = steps * lat  # store-and-forward + propagation, paid once per step
        t = steps * alpha_us * 1e-6 + max(t_net + t_hop, t_nvl)
        t_lat = steps * alpha_us * 1e-6 + t_hop
        bound: Bound = ("latency" if t_lat >= max(t_net, t_nvl)
                        else "network" if t_net >= t_nvl else "nvlink")
        bw = s * factor / t / 1e9 if t > 0 else math.inf
        out.append(ExpectedPoint(int(s), t * 1e6, bw, bound))
    return out


@dataclass(frozen=True, slots=True)
class TwinRow:
    """One size of a twin run: out-of-place and in-place (time us, busbw GB/s)."""

    size_bytes: int
    time_us: tuple[float, float]
    algbw_gbs: tuple[float, float]
    busbw_gbs: tuple[float, float]


def twin_rows(
    fabric: Fabric,
    collective: str,
    nodes: Sequence[str] | int,
    sizes: Sequence[float],
    *,
    slow: Mapping[str, float] | None = None,
    seed: int = 0,
    gpus_per_node: int | None = None,
    noise_rel: float = 0.01,
    nvlink_gbs: float = DEFAULT_NVLINK_GBS,
    alpha_us: float = DEFAULT_ALPHA_US,
    lb: str = "ecmp",
) -> tuple[Placement, list[TwinRow]]:
    """The measured rows of :func:`twin_run` (event-driven engine + NVLink floor + noise)."""
    coll = collective_name(collective)
    if not 0 <= noise_rel < 0.5:
        raise ConfigError(f"twin run: noise_rel: must be in [0, 0.5), got {noise_rel!r}")
    pl = node_placement(fabric, nodes, gpus_per_node=gpus_per_node)
    if len(pl.hosts) < 2:
        raise ConfigError("twin run: nodes: need at least 2 nodes (one node is NVLink only)")
    faults = slow_faults(fabric, slow)
    p = pl.n_ranks
    steps = ring_steps(coll, p)
    factor = busbw_factor("allreduce" if coll == "allreduce" else "allgather", p)
    rng = np.random.default_rng(seed)
    rows: list[TwinRow] = []
    for s in sizes:
        if not s > 0:
            raise ConfigError(f"twin run: size {s!r} must be > 0")
        wl = ring_collective(pl, float(s), collective=coll)
        res = simulate(fabric, wl, lb=lb, faults=faults, seed=seed, record_utilization=False)
        t_fab = res.completion_ns / 1e9
        t_nvl = s * factor / (nvlink_gbs * 1e9)
        t0 = max(t_fab, t_nvl) + steps * alpha_us * 1e-6
        ts = tuple(t0 * (1.0 + abs(float(rng.normal(0.0, noise_rel)))) for _ in range(2))
        alg = tuple(s / t / 1e9 for t in ts)
        rows.append(TwinRow(int(s), (ts[0] * 1e6, ts[1] * 1e6), (alg[0], alg[1]),
                            (alg[0] * factor, alg[1] * factor)))
    return pl, rows


def twin_run(
    fabric: Fabric,
    collective: str,
    nodes: Sequence[str] | int,
    sizes: Sequence[float],
    *,
    slow: Mapping[str, float] | None = None,
    seed: int = 0,
    gpus_per_node: int | None = None,
    noise_rel: float = 0.01,
    nvlink_gbs: float = DEFAULT_NVLINK_GBS,
    alpha_us: float = DEFAULT_ALPHA_US,
    lb: str = "ecmp",
) -> str:
    """An nccl-tests style output of ``collective`` on ``nodes``, measured on the twin.

    Noise: each row's time is stretched by ``|N(0, noise_rel)|`` (interference only slows a
    run down), seeded. Format: NVIDIA/nccl-tests ``src/common.cu`` (header, ``# Using
    devices`` rank lines, the out-of-place / in-place table, ``# Avg bus bandwidth``: the
    mean busbw over every row and both placements, as nccl-tests computes it).
    """
    coll = collective_name(collective)
    pl, rows = twin_rows(fabric, coll, nodes, sizes, slow=slow, seed=seed,
                         gpus_per_node=gpus_per_node, noise_rel=noise_rel,
                         nvlink_gbs=nvlink_gbs, alpha_us=alpha_us, lb=lb)
    g = len(pl.ranks_of_host[pl.hosts[0]])
    lo, hi = int(min(sizes)), int(max(sizes))
    out = [f"# Collective test starting: {_PERF[coll]}",
           f"# nThread 1 nGpus {g} minBytes {lo} maxBytes {hi} step: 2(factor) warmup iters: 5 "
           "iters: 20 agg iters: 1 validation: 1 graph: 0",
           "#", "# Using devices"]
    for r, sl in enumerate(pl.slots):
        out.append(f"#  Rank {r:2d} Group  0 Pid {1000 + pl.hosts.index(sl.host):6d} on "
                   f"{sl.host:>10} device {sl.gpu:2d} [0000:{sl.gpu:02x}:00] fabricscope twin GPU")
    redop = "sum" if coll != "allgather" else "none"
    out += ["#",
            "#                                                              out-of-place"
            "                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw"
            " #wrong     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
            "            (us)  (GB/s)  (GB/s)       "]
    bws: list[float] = []
    for row in rows:
        count = row.size_bytes // 4
        cells = []
        for k in range(2):
            cells.append(f"{_fmt_time(row.time_us[k])} {row.algbw_gbs[k]:7.2f} "
                         f"{row.busbw_gbs[k]:7.2f} {0:6d}")
            bws.append(row.busbw_gbs[k])
        out.append(f"{row.size_bytes:12d}  {count:12d}     float  {redop:>6}      -1  "
                   + "  ".join(cells))
    out += ["# Out of bounds values : 0 OK",
            f"# Avg bus bandwidth    : {sum(bws) / len(bws):g} ", "#",
            f"# Collective test concluded: {_PERF[coll]}", "#", ""]
    return "\n".join(out)


def _fmt_time(us: float) -> str:
    if us >= 10000:
        return f"{us:8.0f}"
    if us >= 100:
        return f"{us:8.1f}"
    return f"{us:8.2f}"


# ------------------------------------------------------------------ slow-node plans
@dataclass(frozen=True)
class TwinSearch:
    """A slow-node search run on the twin, with the ground truth."""

    truth: tuple[str, ...]
    verdict: Verdict
    state: SearchState

    @property
    def rounds(self) -> int:
        return self.verdict.rounds

    @property
    def localized(self) -> tuple[str, ...]:
        return self.verdict.localized

    @property
    def correct(self) -> bool:
        """Exactly the slow nodes, nothing else suspected, nothing left open."""
        v = self.verdict
        return (set(v.localized) == set(self.truth) and not v.slow_pairs and not v.ambiguous
                and v.done)


@lru_cache(maxsize=4)
def search_fabric(n_nodes: int, hosts_per_leaf: int = 16, host_gbps: float = 400.0) -> Fabric:
    """A non-blocking leaf-spine of ``n_nodes`` single-NIC hosts (``host0000``...)."""
    if n_nodes < 3 or hosts_per_leaf < 1:
        raise ConfigError(f"twin search: n_nodes {n_nodes} must be >= 3")
    leaves = -(-n_nodes // hosts_per_leaf)
    return leaf_spine_fabric(leaves=leaves, hosts_per_leaf=min(hosts_per_leaf, n_nodes),
                             spines=min(hosts_per_leaf, n_nodes), host_gbps=host_gbps,
                             name=f"slownode-twin-{n_nodes}")


def round_busbw(fabric: Fabric, tests: Sequence[Sequence[str]], *, faults: Sequence[Fault],
                rng: np.random.Generator, noise_rel: float, lb: str = "ecmp") -> list[float]:
    """busbw (GB/s) of concurrent ring tests, one max-min solve for the whole round.

    Each test is a ring over its nodes' first NIC (a pair: both directions); its busbw is
    the slowest hop's rate (the ring's bandwidth term), stretched by seeded noise.
    """
    nic = {h: fabric.nics_of_host[h][0].id for t in tests for h in t}
    flows: list[FlowSpec] = []
    spans: list[tuple[int, int]] = []
    for t in tests:
        lo = len(flows)
        for i, h in enumerate(t):
            s, d = nic[h], nic[t[(i + 1) % len(t)]]
            flows.append(FlowSpec(len(flows), s, d, 1e6, tag=f"t{len(spans)}",
                                  src_port=49152 + (len(flows) * 7919) % 16384))
        spans.append((lo, len(flows)))
    ss = steady_state_rates(fabric, flows, lb=lb, faults=faults)
    out = []
    for lo, hi in spans:
        bw = float(ss.rates_bps[lo:hi].min()) / 8e9
        out.append(bw / (1.0 + abs(float(rng.normal(0.0, noise_rel)))))
    return out


def run_plan_on_twin(
    n_nodes: int,
    slow_nodes: Mapping[str, float],
    seed: int,
    *,
    scheme: str = "group",
    noise_rel: float = 0.015,
    max_rounds: int = 30,
    hosts_per_leaf: int = 16,
) -> TwinSearch:
    """Run the adaptive slow-node search on a leaf-spine twin with slow NICs (host -> factor).

    ``slow_nodes`` may also name cables (``a:p0|b:eth1``, see :func:`slow_faults`): those
    are not in the truth, so a search that blames a node for them is not ``correct``.

    Cheap path: per round one steady-state solve with every test's flows together (tests of
    a round share the fabric as they would in a real cluster); the slow NIC's cable is a
    ``link-degraded`` fault. Noise: ``|N(0, noise_rel)|`` per test, seeded.
    """
    fabric = search_fabric(n_nodes, hosts_per_leaf)
    hosts = [h.id for h in fabric.hosts][:n_nodes]
    faults = slow_faults(fabric, slow_nodes)  # checks every subject
    truth = tuple(sorted(h for h in slow_nodes if h in fabric.nics_of_host))
    rng = np.random.default_rng(seed)
    state = new_search(hosts, scheme=scheme)
    for _ in range(max_rounds):
        rnd = plan(state)
        if rnd is None:
            break
        bws = round_busbw(fabric, [t.nodes for t in rnd.tests], faults=faults, rng=rng,
                          noise_rel=noise_rel)
        state = record(state, rnd, {t.test_id: b for t, b in zip(rnd.tests, bws, strict=True)})
    return TwinSearch(truth, analyze(state), state)


def random_scenario(n_nodes: int, n_slow: int, seed: int, *,
                    factor_range: tuple[float, float] = (0.5, 0.85)) -> dict[str, float]:
    """``n_slow`` distinct random hosts with a rate factor uniform in ``factor_range``."""
    rng = np.random.default_rng(seed)
    idx = rng.choice(n_nodes, size=n_slow, replace=False)
    return {f"host{int(i):04d}": float(rng.uniform(*factor_range)) for i in idx}
