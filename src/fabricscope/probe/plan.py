"""Controller-free probe plans: which peers each NIC probes, from which UDP source ports.

Every agent derives the *same* plan for every NIC from the inventory, a shared seed and the
epoch number, so no scheduler is needed (Pingmesh, Guo et al., SIGCOMM'15, uses a central
controller for this; NetNORAD and R-Pingmesh shard the mesh by topology, which we follow):

* the **ToR mesh**: every NIC that shares a leaf with this NIC;
* the **rail**: NICs on the same rail under the other leaves of the pod (a rotating sample,
  one peer per leaf per epoch by default);
* a rotating **cross-pod sample** of ``pod_peers`` NICs (in a single-pod fabric: NICs under
  other leaves, any rail, so spine links are probed even when each rail has one leaf).

ECMP coverage: a switch hashes the 5-tuple, so a probe flow with a random source port lands on
one of the ``n`` equal-cost paths with probability ``1/n`` (per-switch seeds make tiers
independent). Covering every path is the coupon collector problem; :func:`ports_for_coverage`
returns the least ``k`` with ``P(all n covered by k ports) >= target``, computed exactly by a
DP over the number of distinct paths seen. Source ports are drawn once per agent per epoch and
shared by all its peers (a peer uses the first ``k`` of them): different destination
addresses hash differently, so coverage per pair is unchanged while the agent binds only
``max k`` sockets. Plans are re-drawn every epoch (new ports, new rotating peers).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from fabricscope.fabric.inventory import Device, Fabric
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import FiveTuple

PROBE_PORT = 47910  # responder UDP port (not RoCE's 4791: probes must not look like RDMA)
PORT_LO, PORT_HI = 32768, 60999  # Linux default ephemeral range
#: Fewest source ports toward a cross-leaf peer probed at partial coverage (plan_probes).
MIN_PARTIAL_PORTS = 4


@lru_cache(maxsize=4096)
def coverage_probability(n_paths: int, k: int) -> float:
    """Exact probability that ``k`` uniform draws over ``n_paths`` paths hit all of them.

    DP over the number of distinct paths seen (no alternating sums, so it is numerically
    stable for any ``n``): from ``c`` seen, a draw finds a new one with probability
    ``(n - c) / n``.
    """
    if n_paths < 1 or k < 0:
        raise ValueError(f"coverage_probability: need n_paths >= 1 and k >= 0, got {n_paths}, {k}")
    n = n_paths
    dist = np.zeros(n + 1)
    dist[0] = 1.0
    new = (n - np.arange(n + 1)) / n
    for _ in range(k):
        moved = dist * new
        dist = dist - moved
        dist[1:] += moved[:-1]
    return float(dist[n])


@lru_cache(maxsize=4096)
def ports_for_coverage(n_paths: int, target: float = 0.99) -> int:
    """Least number of random source ports covering all ``n_paths`` ECMP paths w.p. >= target.

    Examples: 1 path -> 1, 2 -> 8, 4 -> 21, 8 -> 51, 16 -> 115 (target 0.99).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"ports_for_coverage: target must be in (0, 1), got {target}")
    if n_paths <= 1:
        return 1
    n = n_paths
    # Start from the lower bound n*H_n - n (the mean minus slack) and walk up; the union
    # bound n(1-1/n)^k <= 1-target gives an upper limit, so the walk is short.
    k = max(n, int(n * (np.log(n) - 1.0)))
    while coverage_probability(n, k) < target:
        k += 1
    return k


@dataclass(frozen=True, slots=True)
class Peer:
    """One peer of a plan and the source ports used towards it."""

    dst: str
    reason: str  # "tor" | "rail" | "pod"
    path_count: int
    src_ports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """What one NIC probes during one epoch."""

    src: str
    src_ip: str
    epoch: int
    peers: tuple[Peer, ...]
    budget_pps: float
    epoch_s: float
    coverage_target: float
    dst_port: int = PROBE_PORT

    @property
    def src_ports(self) -> tuple[int, ...]:
        """Every source port the agent must bind (the longest peer prefix)."""
        return max((p.src_ports for p in self.peers), key=len, default=())

    def flows(self, fabric: Fabric) -> list[tuple[str, FiveTuple]]:
        """(destination NIC, 5-tuple) of every probe flow, in a fixed order."""
        out: list[tuple[str, FiveTuple]] = []
        for p in self.peers:
            dip = fabric.devices[p.dst].address or p.dst
            out.extend((p.dst, FiveTuple(self.src_ip, dip, sp, self.dst_port, 17)) for sp in p.src_ports)
        return out

    @property
    def n_flows(self) -> int:
        return sum(len(p.src_ports) for p in self.peers)

    @property
    def probes_per_flow(self) -> float:
        """Probes each flow gets per epoch at the budget rate."""
        return self.budget_pps * self.epoch_s / max(1, self.n_flows)


def _rail(fabric: Fabric, nic: Device) -> int | None:
    if nic.rail is not None:
        return nic.rail
    leaves = fabric.leaves_of_nic[nic.id]
    for lf in leaves:
        r = fabric.devices[lf].rail
        if r is not None:
            return r
    return nic.gpu


def _pod(fabric: Fabric, nic: Device) -> int | None:
    if nic.pod is not None:
        return nic.pod
    for lf in fabric.leaves_of_nic[nic.id]:
        p = fabric.devices[lf].pod
        if p is not None:
            return p
    return fabric.devices[nic.host].pod if nic.host else None


@dataclass(frozen=True)
class _Layout:
    """Groupings of the inventory every plan needs (computed once per fabric)."""

    by_leaf: Mapping[tuple[str, ...], tuple[str, ...]]
    rail_pod: Mapping[tuple[int | None, int | None], Mapping[tuple[str, ...], tuple[str, ...]]]
    pod_of: Mapping[str, int | None]
    rail_of: Mapping[str, int | None]
    all_nics: tuple[str, ...]


_LAYOUTS: dict[int, tuple[Fabric, _Layout]] = {}


def _layout(fabric: Fabric) -> _Layout:
    hit = _LAYOUTS.get(id(fabric))
    if hit is not None and hit[0] is fabric:
        return hit[1]
    by_leaf: dict[tuple[str, ...], list[str]] = {}
    rail_pod: dict[tuple[int | None, int | None], dict[tuple[str, ...], list[str]]] = {}
    pod_of: dict[str, int | None] = {}
    rail_of: dict[str, int | None] = {}
    for n in fabric.nics:
        lv = fabric.leaves_of_nic[n.id]
        by_leaf.setdefault(lv, []).append(n.id)
        pod_of[n.id] = _pod(fabric, n)
        rail_of[n.id] = _rail(fabric, n)
        rail_pod.setdefault((rail_of[n.id], pod_of[n.id]), {}).setdefault(lv, []).append(n.id)
    lay = _Layout(
        by_leaf={k: tuple(v) for k, v in by_leaf.items()},
        rail_pod={k: {lv: tuple(ns) for lv, ns in v.items()} for k, v in rail_pod.items()},
        pod_of=pod_of,
        rail_of=rail_of,
        all_nics=tuple(n.id for n in fabric.nics),
    )
    if len(_LAYOUTS) > 8:
        _LAYOUTS.clear()
    _LAYOUTS[id(fabric)] = (fabric, lay)
    return lay


class PathCounter:
    """ECMP path counts between NICs, cached per pair of attachments (leaf sets)."""

    def __init__(self, fabric: Fabric, routing: Routing | None = None) -> None:
        self.fabric = fabric
        self.routing = routing or Routing(fabric)
        self._cache: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}

    def __call__(self, src: str, dst: str) -> int:
        key = (self.fabric.leaves_of_nic[src], self.fabric.leaves_of_nic[dst])
        hit = self._cache.get(key)
        if hit is None:
            hit = self.routing.path_count(src, dst)
            self._cache[key] = hit
        return hit


def _rng(seed: int, epoch: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, zlib.crc32(name.encode())])


def plan_probes(
    fabric: Fabric,
    src: str,
    *,
    seed: int,
    epoch: int = 0,
    budget_pps: float = 100.0,
    epoch_s: float = 30.0,
    coverage_target: float = 0.99,
    rail_peers_per_leaf: int = 1,
    pod_peers: int = 4,
    min_probes_per_flow: float = 2.0,
    path_counter: PathCounter | None = None,
    dst_port: int = PROBE_PORT,
) -> ProbePlan:
    """The probe plan of NIC ``src`` for ``epoch``: identical on every agent for equal inputs.

    The budget is respected by shrinking the rotating samples (cross-pod first, then the
    rail) until every flow gets at least ``min_probes_per_flow`` probes per epoch; the ToR
    mesh is never dropped. When no cross-leaf peer fits at ``coverage_target`` (a small
    budget, or thousands of end-to-end paths), the cross-pod sample is kept at partial
    coverage: with as many flows as the ToR mesh has (at least ``MIN_PARTIAL_PORTS`` per
    peer; fewer peers when the budget leaves less), split evenly. A pair then covers only
    part of its paths, but the fleet's random ports together cover the spine tier, which
    full-coverage-or-nothing left unprobed, and the ToR mesh keeps half the probes.
    """
    if src not in fabric.devices or fabric.devices[src].role != "nic":
        raise ConfigError(f"probe plan: --self {src!r} is not a NIC of inventory {fabric.name!r}")
    if budget_pps <= 0 or epoch_s <= 0:
        raise ConfigError(f"probe plan: budget_pps and epoch_s must be > 0, got {budget_pps}, {epoch_s}")
    lay = _layout(fabric)
    pc = path_counter or PathCounter(fabric)
    me = fabric.devices[src]
    rng = _rng(seed, epoch, src)
    my_leaves = fabric.leaves_of_nic[src]
    tor = [n for n in lay.by_leaf.get(my_leaves, ()) if n != src]
    my_rail, my_pod = lay.rail_of[src], lay.pod_of[src]
    rail: list[str] = []
    for lv, nics in sorted(lay.rail_pod.get((my_rail, my_pod), {}).items()):
        if lv == my_leaves or not nics:
            continue
        take = min(rail_peers_per_leaf, len(nics))
        rail.extend(nics[int(i)] for i in rng.choice(len(nics), size=take, replace=False))
    # Cross-pod sample; in a single pod, a sample of NICs under other leaves (any rail), so
    # that the spine tier is probed even when every rail has one leaf.
    others = [n for n in lay.all_nics if lay.pod_of[n] != my_pod] if my_pod is not None else []
    if not others:
        chosen = set(rail)
        others = [n for n in lay.all_nics
                  if fabric.leaves_of_nic[n] != my_leaves and n not in chosen]
    pod: list[str] = []
    if others and pod_peers > 0:
        pod = [others[int(i)] for i in rng.choice(len(others), size=min(pod_peers, len(others)), replace=False)]

    counts = {n: pc(src, n) for n in (*tor, *rail, *pod)}
    need = {n: ports_for_coverage(c, coverage_target) for n, c in counts.items()}
    max_flows = budget_pps * epoch_s / min_probes_per_flow

    def total(groups: list[list[str]]) -> int:
        return sum(need[n] for g in groups for n in g)

    sample = list(pod)
    while pod and total([tor, rail, pod]) > max_flows:
        pod.pop()
    while rail and total([tor, rail, pod]) > max_flows:
        rail.pop()
    if not rail and not pod and sample:
        # Nothing beyond the leaf fits at full coverage (a small budget, or many equal-cost
        # paths): probe the sample at partial coverage rather than not at all, or no probe
        # would ever cross a spine (the fleet's random ports cover the spine tier together).
        # It gets at most as many flows as the ToR mesh (or the least partial sample), so
        # the ToR mesh keeps at least half its probes, which its NIC and leaf verdicts need.
        spare = min(int(max_flows) - total([tor]),
                    max(total([tor]), len(sample) * MIN_PARTIAL_PORTS))
        if spare >= MIN_PARTIAL_PORTS:
            pod = sample[: min(len(sample), spare // MIN_PARTIAL_PORTS)]
            for n in pod:
                need[n] = min(need[n], spare // len(pod))
    kmax = max((need[n] for n in (*tor, *rail, *pod)), default=0)
    ports = tuple(int(p) for p in rng.choice(PORT_HI - PORT_LO + 1, size=kmax, replace=False) + PORT_LO)
    peers = tuple(
        Peer(n, reason, counts[n], ports[: need[n]])
        for reason, group in (("tor", tor), ("rail", rail), ("pod", pod))
        for n in group
    )
    return ProbePlan(src, me.address or src, epoch, peers, budget_pps, epoch_s,
                     coverage_target, dst_port)


def plan_mesh(fabric: Fabric, *, seed: int, epoch: int = 0, **kw: Any) -> dict[str, ProbePlan]:
    """The plans of every NIC (what the twin and the benchmarks run; agents run one each)."""
    pc = PathCounter(fabric)
    return {n.id: plan_probes(fabric, n.id, seed=seed, epoch=epoch, path_counter=pc, **kw)
            for n in fabric.nics}
