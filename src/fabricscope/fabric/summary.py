"""What a fabric is, in numbers: GPUs, switches by tier, links, bisection, oversubscription."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from fabricscope.fabric.inventory import Fabric, port_device

TIER_NAMES = ("nic", "leaf", "spine", "core")


def _tier_pair(a: int, b: int) -> str:
    lo, hi = sorted((a, b))
    return f"{TIER_NAMES[lo]}-{TIER_NAMES[hi]}"


def summarize(fabric: Fabric) -> dict[str, Any]:
    """A JSON-able summary of ``fabric`` (what ``fabricscope topo show`` prints).

    Keys: ``name``, ``kind`` (builder, or ``custom``), ``tiers``, ``gpus``, ``hosts``,
    ``nics``, ``nic_ports``, ``nic_gbps`` (per NIC, all its ports), ``switches`` (by role)
    and ``switches_total``, ``links`` and ``link_capacity_gbps`` (by tier pair, e.g.
    ``leaf-spine``), ``rails``, ``planes``, ``components``, ``bisection_gbps``,
    ``oversubscription`` (by tier) and ``meta`` (the builder parameters).

    **Bisection bandwidth** is the capacity (one direction) across the worst cut that splits
    the NICs in two equal halves. For a layered Clos (leaf-spine, fat tree, rail-optimized,
    multi-plane, dual-ToR, with any oversubscription) the worst balanced cut runs along
    pod/leaf boundaries and its capacity is ``B = min_t C_t / 2``, where ``C_t`` is the total
    capacity of the cables between tier ``t`` and tier ``t + 1`` (NIC-leaf, leaf-spine,
    spine-core): half the NICs can send at most half of every tier's upward capacity to the
    other half (Leiserson, "Fat-trees", IEEE ToC 1985; Al-Fares et al., SIGCOMM'08). So a
    non-blocking fabric of N NICs at r Gb/s has ``B = N r / 2`` and a leaf tier
    oversubscribed ``o:1`` gives ``N r / (2 o)``. Cables inside a tier (peer links) are not
    counted; a fabric in several pieces (``components > 1``, e.g. a rail-only network whose
    rails meet only inside the hosts) reports 0, since a cut between pieces carries nothing.
    For irregular hand-written fabrics the value is an upper bound.

    **Oversubscription** of tier ``t`` is ``C_{t-1} / C_t``: the capacity a tier's switches
    face downward over the capacity they have upward, aggregated over the tier (the top tier
    has none).
    """
    devs = fabric.devices
    roles = Counter(d.role for d in devs.values())
    switches = {r: roles.get(r, 0) for r in ("leaf", "spine", "core") if roles.get(r, 0)}
    tiers = max((devs[s].tier for s in devs if devs[s].is_switch), default=0)
    links: Counter[str] = Counter()
    cap: dict[str, float] = {}
    up_cap = [0.0] * 4  # C_t: capacity from tier t to tier t + 1
    nic_ports = 0
    nic_cap = 0.0
    for ln in fabric.links:
        ta, tb = devs[port_device(ln.a)].tier, devs[port_device(ln.b)].tier
        pair = _tier_pair(ta, tb)
        links[pair] += 1
        cap[pair] = cap.get(pair, 0.0) + ln.capacity_gbps
        lo, hi = sorted((ta, tb))
        if hi == lo + 1:
            up_cap[lo] += ln.capacity_gbps
        if lo == 0:
            nic_ports += 1
            nic_cap += ln.capacity_gbps
    nics = fabric.nics
    rails = sorted({n.rail for n in nics if n.rail is not None})
    planes = sorted({d.plane for d in fabric.by_role("leaf") if d.plane is not None})
    components = _components(fabric)
    present = [c for c in up_cap[:tiers] if c > 0]
    bisection = 0.0 if components > 1 or not present else min(present) / 2
    over: dict[str, float] = {}
    for t in range(1, tiers):
        if up_cap[t] > 0:
            over[TIER_NAMES[t]] = round(up_cap[t - 1] / up_cap[t], 6)
    return {
        "name": fabric.name,
        "kind": str(fabric.meta.get("kind", "custom")),
        "tiers": tiers,
        "gpus": fabric.gpu_count,
        "hosts": roles.get("host", 0),
        "nics": len(nics),
        "nic_ports": nic_ports,
        "nic_gbps": round(nic_cap / len(nics), 6) if nics else 0.0,
        "switches": switches,
        "switches_total": sum(switches.values()),
        "links": dict(sorted(links.items())),
        "links_total": len(fabric.links),
        "link_capacity_gbps": {k: round(v, 6) for k, v in sorted(cap.items())},
        "rails": len(rails),
        "planes": max(len(planes), 1),
        "components": components,
        "bisection_gbps": round(bisection, 6),
        "oversubscription": over,
        "meta": dict(fabric.meta),
    }


def _components(fabric: Fabric) -> int:
    """Connected pieces of the data plane (NICs and switches; hosts are not forwarding)."""
    ix = fabric.index
    if ix.n_nodes == 0:
        return 0
    g = csr_matrix((np.ones(ix.n_edges), (ix.src, ix.dst)), shape=(ix.n_nodes, ix.n_nodes))
    n, _ = connected_components(g, directed=False)
    return int(n)
