"""Records shared by the design modules (blast radius and failure rates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Failover = Literal["none", "fast-reroute", "dual-tor", "multi-plane"]
FAILOVERS: tuple[str, ...] = Failover.__args__  # type: ignore[attr-defined]

#: Component classes a design is made of. ``link:<a>-<b>`` is one cable between tiers
#: (``host-leaf`` is the NIC port's cable), with its optics, if any, counted on it.
COMPONENTS: tuple[str, ...] = (
    "gpu", "nic", "leaf", "spine", "core", "link:host-leaf", "link:leaf-spine", "link:spine-core",
)


@dataclass(frozen=True, slots=True)
class BlastRow:
    """What one failure of a ``component`` takes out, averaged over the ``count`` units.

    ``gpus_cut``: GPUs that lose every fabric path (their job stops). ``gpus_degraded``:
    GPUs that keep a path at reduced bandwidth; ``bandwidth_lost`` is the mean fraction of
    such a GPU's fabric bandwidth (NIC rate, or its share of the uplinks above it) that is
    gone until the repair. ``failover`` names the mechanism that keeps degraded GPUs
    connected (``none`` when nothing is degraded).
    """

    component: str
    count: int
    gpus_cut: float
    gpus_degraded: float
    bandwidth_lost: float
    failover: Failover


@dataclass(frozen=True, slots=True)
class FailureRate:
    """Failure rate of one unit of ``component`` (per hour) and its mean time to repair."""

    component: str
    per_hour: float
    mttr_h: float
    source: str
