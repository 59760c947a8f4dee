"""Rank placement: which GPU (host, index) and which NIC each rank of a job runs on.

Three policies:

``in-order``
    rank ``r`` takes the ``r``-th GPU slot, slots ordered by host id then GPU index (a
    scheduler handing out whole servers in order).
``random``
    ``n`` GPU slots drawn uniformly without replacement, in random rank order (a fragmented
    cluster; seeded).
``rail-aware``
    ``ranks_per_host`` ranks per server on hosts in id order; local rank ``l`` runs on GPU ``l``
    and so uses the NIC of rail ``l``: ring neighbours across servers stay on one rail.
    With ``ranks_per_host`` equal to the GPUs per server it coincides with ``in-order``.

A GPU without a NIC of its own (``Device.gpu`` unset) shares one: GPU ``i`` of a host with
``k`` NICs uses NIC ``i * k // gpus``. Ranks on the same host talk over NVLink, which is not
part of the fabric: the collectives never turn such a transfer into a fabric flow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import WorkloadError

PlacementPolicy = Literal["in-order", "random", "rail-aware"]
PLACEMENT_POLICIES: tuple[str, ...] = ("in-order", "random", "rail-aware")


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU of a host and the NIC that serves it."""

    host: str
    gpu: int
    nic: str


@dataclass(frozen=True)
class Placement:
    """Ranks ``0..n-1`` mapped to GPU slots; ``rail_nics[host]`` lists a host's NICs by GPU index."""

    slots: tuple[GpuSlot, ...]
    policy: str
    rail_nics: dict[str, tuple[str, ...]]

    @property
    def n_ranks(self) -> int:
        return len(self.slots)

    def host(self, rank: int) -> str:
        return self.slots[rank].host

    def nic(self, rank: int) -> str:
        return self.slots[rank].nic

    def gpu(self, rank: int) -> int:
        return self.slots[rank].gpu

    def rail_nic(self, host: str, rail: int) -> str:
        """The NIC of ``host`` on rail ``rail`` (modulo the host's NIC count)."""
        nics = self.rail_nics[host]
        return nics[rail % len(nics)]

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        """Hosts in the order of their lowest rank (NCCL's topology-aware ring order)."""
        return tuple(dict.fromkeys(s.host for s in self.slots))

    @cached_property
    def ranks_of_host(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for r, s in enumerate(self.slots):
            out.setdefault(s.host, []).append(r)
        return {h: tuple(rs) for h, rs in out.items()}

    def subset(self, ranks: Sequence[int]) -> Placement:
        """A placement of the given ranks, renumbered ``0..len(ranks)-1`` in that order."""
        return Placement(tuple(self.slots[r] for r in ranks), self.policy, self.rail_nics)


def gpu_slots(fabric: Fabric) -> tuple[tuple[GpuSlot, ...], dict[str, tuple[str, ...]]]:
    """Every GPU slot of ``fabric`` (host id order, then GPU index) and each host's NICs by GPU."""
    slots: list[GpuSlot] = []
    rail_nics: dict[str, tuple[str, ...]] = {}
    for h in fabric.hosts:
        nics = fabric.nics_of_host.get(h.id, ())
        if not nics:
            continue
        by_gpu = {n.gpu: n.id for n in nics if n.gpu is not None}
        gpus = h.gpus if h.gpus > 0 else len(nics)
        per_gpu = tuple(
            by_gpu.get(g, nics[g * len(nics) // gpus].id) for g in range(gpus)
        )
        rail_nics[h.id] = per_gpu
        slots.extend(GpuSlot(h.id, g, nic) for g, nic in enumerate(per_gpu))
    return tuple(slots), rail_nics


def place_ranks(
    fabric: Fabric,
    n_ranks: int | None = None,
    *,
    policy: str = "in-order",
    seed: int | np.random.Generator = 0,
    ranks_per_host: int | None = None,
) -> Placement:
    """Place ``n_ranks`` ranks (default: every GPU) on ``fabric`` with ``policy``.

    Raises :class:`WorkloadError` when the fabric has too few GPUs or the policy is unknown.
    """
    slots, rail_nics = gpu_slots(fabric)
    n = len(slots) if n_ranks is None else n_ranks
    if n < 1:
        raise WorkloadError(f"placement: ranks: must be >= 1, got {n}")
    if n > len(slots):
        raise WorkloadError(
            f"placement: ranks: {n} ranks do not fit on {fabric.name!r} ({len(slots)} GPUs)"
        )
    if policy == "in-order":
        chosen = slots[:n]
    elif policy == "random":
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        idx = rng.choice(len(slots), size=n, replace=False)
        chosen = tuple(slots[int(i)] for i in idx)
    elif policy == "rail-aware":
        chosen = _rail_aware(fabric, slots, n, ranks_per_host)
    else:
        raise WorkloadError(
            f"placement: policy: unknown {policy!r} (choose one of {', '.join(PLACEMENT_POLICIES)})"
        )
    return Placement(tuple(chosen), policy, rail_nics)


def _rail_aware(
    fabric: Fabric, slots: tuple[GpuSlot, ...], n: int, ranks_per_host: int | None
) -> tuple[GpuSlot, ...]:
    by_host: dict[str, list[GpuSlot]] = {}
    for s in slots:
        by_host.setdefault(s.host, []).append(s)
    if ranks_per_host is not None and ranks_per_host < 1:
        raise WorkloadError(f"placement: ranks_per_host: must be >= 1, got {ranks_per_host}")
    out: list[GpuSlot] = []
    for host_slots in by_host.values():
        k = len(host_slots) if ranks_per_host is None else min(ranks_per_host, len(host_slots))
        out.extend(host_slots[: min(k, n - len(out))])
        if len(out) == n:
            return tuple(out)
    raise WorkloadError(
        f"placement: ranks: {n} ranks at {ranks_per_host} per host do not fit on {fabric.name!r}"
    )
