"""The bill of materials of a fabric: switches per tier, cables and optics per link class, cost, power.

Everything is counted from the inventory it is given (every cabled port, every link), never
from the builder's sizing formulas, so a hand-written or edited fabric is priced as built.
Prices and watts come from a :class:`~fabricscope.design.catalog.Catalog`.

Counting rules:

* a switch tier (``leaf``, ``spine``, ``core``) is priced as ``count`` switches of the model
  ``catalog.switch_for(radix, port speed of the tier)``; ``ports_used`` are its cabled
  ports, ``ports_free = count x model.radix - ports_used``;
* a link is classed by the roles at its ends (``host-leaf``, ``leaf-spine``,
  ``spine-core``; a NIC is ``host``); its reach class comes from the catalog's reach policy
  (a pair outside the three takes the reach of the listed pair with the same upper tier);
  an ``optic`` medium costs two transceivers and one fiber, a ``cable`` one assembly;
* a NIC port costs ``nic.port_price_usd x speed / nic.port_gbps`` (and watts likewise);
  GPU servers count only when ``nic.server_price_usd`` (or ``server_watts``) is set;
* ``switch_ports_used`` (every cabled switch port: one end of a host-leaf link, both of a
  switch-switch link) is the port figure of the rail-optimized vs fat-tree comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fabricscope.design.catalog import Catalog, SwitchModel
from fabricscope.fabric.inventory import TIER_OF_ROLE, Fabric
from fabricscope.model.errors import ConfigError

__all__ = ["LINK_CLASSES", "SWITCH_TIERS", "Bom", "LinkRow", "TierRow", "bill_of_materials",
           "link_class"]

SWITCH_TIERS: tuple[str, ...] = ("leaf", "spine", "core")
LINK_CLASSES: tuple[str, ...] = ("host-leaf", "leaf-spine", "spine-core")
#: Keys of ``Bom.cost_breakdown`` / ``Bom.watts_breakdown``.
BREAKDOWN: tuple[str, ...] = ("switches", "optics", "cables", "fiber", "nics", "servers")
_ROLE_NAME: Mapping[str, str] = {"nic": "host", "leaf": "leaf", "spine": "spine", "core": "core"}
_UPPER_PAIR: Mapping[str, str] = {"leaf": "host-leaf", "spine": "leaf-spine", "core": "spine-core"}


def link_class(role_a: str, role_b: str) -> str:
    """``"<lower>-<upper>"`` of a link between devices of roles ``role_a`` and ``role_b``
    (a NIC is ``host``): ``link_class("spine", "leaf") == "leaf-spine"``."""
    lo, hi = sorted((role_a, role_b), key=lambda r: TIER_OF_ROLE[r])
    return f"{_ROLE_NAME.get(lo, lo)}-{_ROLE_NAME.get(hi, hi)}"


@dataclass(frozen=True, slots=True)
class TierRow:
    """One switch tier: ``count`` switches of ``model``, and their ports."""

    role: str
    model: str
    radix: int
    port_gbps: float
    count: int
    ports_used: int
    ports_free: int
    cost_usd: float
    watts: float


@dataclass(frozen=True, slots=True)
class LinkRow:
    """The links of one class and speed, and what cabling them takes."""

    link_class: str
    gbps: float
    count: int
    reach: str
    medium: str
    kind: str
    transceivers: int
    cables: int
    fibers: int
    cost_usd: float
    watts: float


@dataclass(frozen=True)
class Bom:
    """Bill of materials of one fabric under one catalog (see the module docstring)."""

    fabric: str
    kind: str
    gpus: int
    radix: int
    tiers: tuple[TierRow, ...]
    links: tuple[LinkRow, ...]
    reach: Mapping[str, str]
    switch_ports_used: int
    switches: int
    transceivers: int
    cables: int
    fibers: int
    nic_ports: int
    cost_usd: float
    cost_breakdown: Mapping[str, float]
    watts: float
    watts_breakdown: Mapping[str, float]
    cost_per_gpu_usd: float
    watts_per_gpu: float

    def tier(self, role: str) -> TierRow | None:
        """The row of switch tier ``role`` (None when the fabric has none)."""
        return next((t for t in self.tiers if t.role == role), None)

    def link_count(self, cls: str) -> int:
        """Number of links of class ``cls`` (all speeds)."""
        return sum(r.count for r in self.links if r.link_class == cls)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (tiers and links as lists of objects)."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["tiers"] = [asdict(t) for t in self.tiers]
        out["links"] = [asdict(r) for r in self.links]
        for k in ("reach", "cost_breakdown", "watts_breakdown"):
            out[k] = dict(out[k])
        return out


def bill_of_materials(fabric: Fabric, catalog: Catalog, *, radix: int | None = None) -> Bom:
    """Count and price every switch, port, cable and optic of ``fabric``.

    ``radix`` (ports per switch) defaults to ``fabric.meta["radix"]``; a fabric without it
    (``leaf_spine_fabric``, ``fat_tree_fabric``, a hand-written inventory) uses the largest
    cabled port count of any switch rounded up to a catalog model. Raises
    :class:`ConfigError` when a switch cables more ports than its model has, or when the
    catalog lacks a model / medium the fabric needs. O(links), one pass.
    """
    role = {d.id: d.role for d in fabric.devices.values()}
    dev_of = {pid: p.device for pid, p in fabric.ports.items()}
    used: Counter[str] = Counter()
    tier_speed: dict[str, float] = {}
    groups: Counter[tuple[str, float]] = Counter()
    nic_ports: Counter[float] = Counter()
    for ln in fabric.links:
        da, db = dev_of[ln.a], dev_of[ln.b]
        ra, rb = role[da], role[db]
        gbps = ln.capacity_gbps
        groups[(link_class(ra, rb), gbps)] += 1
        for d, r in ((da, ra), (db, rb)):
            if r == "nic":
                nic_ports[gbps] += 1
            else:
                used[d] += 1
                if gbps > tier_speed.get(r, 0.0):
                    tier_speed[r] = gbps
    gpus = fabric.gpu_count
    if gpus <= 0:
        raise ConfigError(f"{fabric.name}: gpus: the fabric has no GPUs to price per GPU")
    r_all = _radix(fabric, catalog, radix, used, tier_speed)
    tiers: list[TierRow] = []
    for t in SWITCH_TIERS:
        devs = [d.id for d in fabric.switches if d.role == t]
        if not devs:
            continue
        model = catalog.switch_for(r_all, tier_speed.get(t, 0.0))
        _check_fit(fabric, t, devs, used, model)
        n_used = sum(used[d] for d in devs)
        tiers.append(TierRow(
            role=t, model=model.name, radix=model.radix, port_gbps=model.port_gbps,
            count=len(devs), ports_used=n_used, ports_free=len(devs) * model.radix - n_used,
            cost_usd=len(devs) * model.price_usd, watts=len(devs) * model.watts,
        ))
    reach = catalog.reach_for(fabric)
    cost = dict.fromkeys(BREAKDOWN, 0.0)
    watts = dict.fromkeys(BREAKDOWN, 0.0)
    links: list[LinkRow] = []
    for (cls, gbps), n in sorted(groups.items(), key=lambda kv: (_class_order(kv[0][0]), kv[0][1])):
        rc = reach.get(cls) or reach[_UPPER_PAIR.get(cls.split("-")[-1], "spine-core")]
        med = catalog.medium_for(rc, gbps)
        if med.kind == "optic":
            tx, cab, fib = 2 * n, 0, n
            c = tx * med.price_usd + fib * med.fiber_usd
            w = tx * med.watts
            cost["optics"] += tx * med.price_usd
            cost["fiber"] += fib * med.fiber_usd
            watts["optics"] += w
        else:
            tx, cab, fib = 0, n, 0
            c = cab * med.price_usd
            w = 2 * n * med.watts
            cost["cables"] += c
            watts["cables"] += w
        links.append(LinkRow(cls, gbps, n, rc, med.name, med.kind, tx, cab, fib, c, w))
    cost["switches"] = sum(t.cost_usd for t in tiers)
    watts["switches"] = sum(t.watts for t in tiers)
    nic = catalog.nic
    for gbps, n in nic_ports.items():
        cost["nics"] += n * nic.port_price_usd * gbps / nic.port_gbps
        watts["nics"] += n * nic.port_watts * gbps / nic.port_gbps
    cost["servers"] = len(fabric.hosts) * nic.server_price_usd
    watts["servers"] = len(fabric.hosts) * nic.server_watts
    total_c, total_w = sum(cost.values()), sum(watts.values())
    return Bom(
        fabric=fabric.name, kind=str(fabric.meta.get("kind", "")), gpus=gpus, radix=r_all,
        tiers=tuple(tiers), links=tuple(links), reach=reach,
        switch_ports_used=sum(t.ports_used for t in tiers),
        switches=sum(t.count for t in tiers),
        transceivers=sum(r.transceivers for r in links), cables=sum(r.cables for r in links),
        fibers=sum(r.fibers for r in links), nic_ports=sum(nic_ports.values()),
        cost_usd=total_c, cost_breakdown=cost, watts=total_w, watts_breakdown=watts,
        cost_per_gpu_usd=total_c / gpus, watts_per_gpu=total_w / gpus,
    )


def _class_order(cls: str) -> int:
    return LINK_CLASSES.index(cls) if cls in LINK_CLASSES else len(LINK_CLASSES)


def _radix(fabric: Fabric, catalog: Catalog, radix: int | None, used: Mapping[str, int],
           tier_speed: Mapping[str, float]) -> int:
    if radix is None:
        meta_r = fabric.meta.get("radix")
        if isinstance(meta_r, int) and not isinstance(meta_r, bool):
            radix = meta_r
    if radix is None:
        most = max(used.values(), default=1)
        return catalog.switch_for(most, max(tier_speed.values(), default=0.0)).radix
    if isinstance(radix, bool) or not isinstance(radix, int) or radix < 1:
        raise ConfigError(f"{fabric.name}: radix: must be an integer >= 1, got {radix!r}")
    return radix


def _check_fit(fabric: Fabric, tier: str, devs: list[str], used: Mapping[str, int],
               model: SwitchModel) -> None:
    worst = max(devs, key=lambda d: used.get(d, 0))
    if used.get(worst, 0) > model.radix:
        raise ConfigError(
            f"{fabric.name}: radix: {tier} {worst!r} cables {used[worst]} ports, more than the "
            f"{model.radix} of catalog model {model.name!r}; give a larger radix"
        )
