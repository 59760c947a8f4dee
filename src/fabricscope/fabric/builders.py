"""Topology builders: each returns a validated :class:`~fabricscope.fabric.inventory.Fabric`.

Naming: hosts ``host0042``, NICs ``host0042/nic3``, switches ``leaf-p1-r3-07`` style ids
(``p`` pod, ``r`` rail, ``l`` plane where they apply), ports ``eth<N>``, NIC ports ``p<N>``.
Addresses come from 198.18.0.0/15 (RFC 2544 benchmark range): NICs from 198.18.0.0/16 onward,
switch loopbacks from 198.19.255.255 downward.
"""

from __future__ import annotations

import ipaddress
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fabricscope.fabric.inventory import Device, Fabric, Link, Port, Role
from fabricscope.model.errors import InventoryError

_BASE = int(ipaddress.IPv4Address("198.18.0.0"))
_TOP = int(ipaddress.IPv4Address("198.19.255.255"))


@dataclass
class FabricBuilder:
    """Accumulates devices, ports and cables; assigns port names and addresses."""

    name: str
    default_latency_ns: int = 1000
    devices: list[Device] = field(default_factory=list)
    ports: list[Port] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    _next_port: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _nic_addr: int = 1
    _sw_addr: int = 0

    def switch(self, dev_id: str, role: Role, **kw: int | None) -> str:
        self._sw_addr += 1
        addr = _TOP - self._sw_addr
        if addr <= _BASE + self._nic_addr:
            raise InventoryError(f"{self.name}: fabric too large for 198.18.0.0/15 addressing")
        self.devices.append(
            Device(dev_id, role, address=str(ipaddress.IPv4Address(addr)), **kw)  # type: ignore[arg-type]
        )
        return dev_id

    def host(self, host_id: str, gpus: int, **kw: int | None) -> str:
        self.devices.append(Device(host_id, "host", gpus=gpus, **kw))  # type: ignore[arg-type]
        return host_id

    def nic(self, host_id: str, index: int, *, gpu: int | None, **kw: int | None) -> str:
        nid = f"{host_id}/nic{index}"
        addr = _BASE + self._nic_addr
        self._nic_addr += 1
        if (self._nic_addr & 0xFF) == 0:  # skip .0 addresses for readability
            self._nic_addr += 1
        self.devices.append(
            Device(
                nid, "nic", host=host_id, gpu=gpu,
                address=str(ipaddress.IPv4Address(addr)), **kw,  # type: ignore[arg-type]
            )
        )
        return nid

    def port(self, dev: str, speed_gbps: float, *, prefix: str = "eth") -> str:
        n = self._next_port[dev]
        self._next_port[dev] = n + 1
        name = f"{prefix}{n}" if prefix == "p" else f"{prefix}{n + 1}"
        p = Port(dev, name, speed_gbps)
        self.ports.append(p)
        return p.id

    def cable(
        self, a_dev: str, b_dev: str, gbps: float, *, latency_ns: int | None = None,
        a_prefix: str = "eth", b_prefix: str = "eth",
    ) -> None:
        pa = self.port(a_dev, gbps, prefix=a_prefix)
        pb = self.port(b_dev, gbps, prefix=b_prefix)
        lat = self.default_latency_ns if latency_ns is None else latency_ns
        self.links.append(Link(pa, pb, gbps, lat))

    def build(self, meta: Mapping[str, object]) -> Fabric:
        return Fabric.create(self.name, self.devices, self.ports, self.links, meta=meta)


def _positive(name: str, value: float, source: str) -> None:
    if not value > 0:
        raise InventoryError(f"{source}: {name}: must be > 0, got {value!r}")


def _integer(name: str, value: object, source: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InventoryError(f"{source}: {name}: must be an integer >= {minimum}, got {value!r}")
    return value


def _fits(source: str, what: str, radix: int, *, down: int, up: int, why: str) -> None:
    """Reject a switch that needs more ports than it has (the impossible-fabric check)."""
    if down + up > radix:
        need = f"{down} down" + (f" + {up} up" if up else "")
        raise InventoryError(
            f"{source}: radix: {why} needs {need} = {down + up} ports on a {radix}-port {what}"
        )


def leaf_spine_fabric(
    *,
    leaves: int = 8,
    hosts_per_leaf: int = 8,
    spines: int = 4,
    links_per_spine: int = 1,
    nics_per_host: int = 1,
    host_gbps: float = 100.0,
    uplink_gbps: float | None = None,
    latency_ns: int = 1000,
    name: str | None = None,
    radix: int | None = None,
) -> Fabric:
    """A 2-tier leaf-spine (folded Clos). Each leaf cables ``links_per_spine`` uplinks to
    every spine; oversubscription = (hosts_per_leaf * nics * host_gbps) /
    (spines * links_per_spine * uplink_gbps). Hosts have ``nics_per_host`` NICs/GPUs, all on
    the host's leaf. With ``radix`` (ports per switch), a leaf or spine that would need more
    ports is rejected. Default: 8 leaves x 8 hosts, 4 spines (2:1 at the leaf).

    >>> leaf_spine_fabric(leaves=8, hosts_per_leaf=8, spines=8).gpu_count
    64
    >>> leaf_spine_fabric().name
    'leafspine-8x8-s4'
    """
    src = "leaf_spine_fabric"
    for k, v in (("leaves", leaves), ("hosts_per_leaf", hosts_per_leaf), ("spines", spines),
                 ("links_per_spine", links_per_spine), ("nics_per_host", nics_per_host),
                 ("host_gbps", host_gbps)):
        _positive(k, v, src)
    up = host_gbps if uplink_gbps is None else uplink_gbps
    _positive("uplink_gbps", up, src)
    if radix is not None:
        _integer("radix", radix, src, minimum=2)
        down_ports = hosts_per_leaf * nics_per_host
        _fits(src, "leaf", radix, down=down_ports, up=spines * links_per_spine,
              why=f"hosts_per_leaf={hosts_per_leaf} x nics_per_host={nics_per_host}")
        _fits(src, "spine", radix, down=leaves * links_per_spine, up=0,
              why=f"leaves={leaves} x links_per_spine={links_per_spine}")
    b = FabricBuilder(name or f"leafspine-{leaves}x{hosts_per_leaf}-s{spines}", latency_ns)
    sp = [b.switch(f"spine-{s:02d}", "spine") for s in range(spines)]
    h = 0
    for li in range(leaves):
        leaf = b.switch(f"leaf-{li:03d}", "leaf")
        for _ in range(hosts_per_leaf):
            hid = b.host(f"host{h:04d}", nics_per_host)
            for n in range(nics_per_host):
                nic = b.nic(hid, n, gpu=n)
                b.cable(nic, leaf, host_gbps, a_prefix="p")
            h += 1
        for s in sp:
            for _ in range(links_per_spine):
                b.cable(leaf, s, up)
    down = hosts_per_leaf * nics_per_host * host_gbps
    return b.build({
        "kind": "leaf-spine", "tiers": 2, "leaves": leaves, "hosts_per_leaf": hosts_per_leaf,
        "spines": spines, "links_per_spine": links_per_spine, "nics_per_host": nics_per_host,
        "host_gbps": host_gbps, "uplink_gbps": up, "gpus_per_server": nics_per_host,
        "radix": radix, "layout": "standard",
        "oversubscription": {"leaf": down / (spines * links_per_spine * up)},
    })


def fat_tree_fabric(
    *,
    k: int | None = None,
    pods: int | None = None,
    tors_per_pod: int | None = None,
    aggs_per_pod: int | None = None,
    hosts_per_tor: int | None = None,
    cores_per_plane: int | None = None,
    gbps: float = 100.0,
    latency_ns: int = 1000,
    name: str | None = None,
    radix: int | None = None,
    nics_per_host: int = 1,
    links_per_core: int = 1,
) -> Fabric:
    """A 3-tier fat tree (ToR = leaf, aggregation = spine, core).

    k-ary (Al-Fares et al., SIGCOMM'08): ``k`` pods of k/2 ToRs and k/2 aggs, k/2 hosts per
    ToR, (k/2)^2 cores. htsim-style: give ``pods``, ``tors_per_pod``, ``aggs_per_pod``,
    ``hosts_per_tor`` and ``cores_per_plane``; aggregation switch ``j`` of every pod cables one
    link to each core of plane ``j`` (``aggs_per_pod`` planes). Every ToR cables one link to
    every agg in its pod. The 1024-host reference fabric of SIMULATION.md is
    ``pods=16, tors_per_pod=8, aggs_per_pod=8, hosts_per_tor=8, cores_per_plane=8``.
    With ``radix`` (ports per switch; a k-ary tree needs k), a switch that would need more
    ports is rejected. With no parameter at all: ``k=8`` (128 hosts).

    ``nics_per_host`` > 1 makes multi-GPU servers whose NICs all cable to the host's ToR (the
    standard, non-rail layout; a ToR then needs ``hosts_per_tor * nics_per_host`` down
    ports). ``links_per_core`` > 1 cables that many parallel links from each aggregation
    switch to each core of its plane (fewer, fuller cores for a fabric smaller than k^3/4).

    >>> fat_tree_fabric(k=4).gpu_count
    16
    >>> fat_tree_fabric().gpu_count
    128
    """
    src = "fat_tree_fabric"
    if k is None and (pods, tors_per_pod, aggs_per_pod, hosts_per_tor, cores_per_plane) == (None,) * 5:
        k = 8
    if k is not None:
        if k < 2 or k % 2:
            raise InventoryError(f"{src}: k: must be an even integer >= 2, got {k!r}")
        pods, tors_per_pod, aggs_per_pod, hosts_per_tor, cores_per_plane = k, k // 2, k // 2, k // 2, k // 2
    if None in (pods, tors_per_pod, aggs_per_pod, hosts_per_tor, cores_per_plane):
        raise InventoryError(
            f"{src}: give k, or all of pods, tors_per_pod, aggs_per_pod, hosts_per_tor, cores_per_plane"
        )
    assert pods and tors_per_pod and aggs_per_pod and hosts_per_tor and cores_per_plane
    for kk, v in (("pods", pods), ("tors_per_pod", tors_per_pod), ("aggs_per_pod", aggs_per_pod),
                  ("hosts_per_tor", hosts_per_tor), ("cores_per_plane", cores_per_plane)):
        _positive(kk, v, src)
    _integer("nics_per_host", nics_per_host, src)
    _integer("links_per_core", links_per_core, src)
    if radix is not None:
        _integer("radix", radix, src, minimum=2)
        _fits(src, "ToR", radix, down=hosts_per_tor * nics_per_host, up=aggs_per_pod,
              why=f"hosts_per_tor={hosts_per_tor} x nics_per_host={nics_per_host}")
        _fits(src, "aggregation switch", radix, down=tors_per_pod,
              up=cores_per_plane * links_per_core, why=f"tors_per_pod={tors_per_pod}")
        _fits(src, "core", radix, down=pods * links_per_core, up=0,
              why=f"pods={pods} x links_per_core={links_per_core}")
    b = FabricBuilder(name or f"fattree-{pods * tors_per_pod * hosts_per_tor}", latency_ns)
    cores = [[b.switch(f"core-l{j}-{c:02d}", "core", plane=j) for c in range(cores_per_plane)]
             for j in range(aggs_per_pod)]
    h = 0
    for p in range(pods):
        aggs = [b.switch(f"agg-p{p:02d}-{j:02d}", "spine", pod=p, plane=j) for j in range(aggs_per_pod)]
        for t in range(tors_per_pod):
            tor = b.switch(f"tor-p{p:02d}-{t:02d}", "leaf", pod=p)
            for _ in range(hosts_per_tor):
                hid = b.host(f"host{h:04d}", nics_per_host, pod=p)
                for n in range(nics_per_host):
                    b.cable(b.nic(hid, n, gpu=n, pod=p), tor, gbps, a_prefix="p")
                h += 1
            for a in aggs:
                b.cable(tor, a, gbps)
        for j, a in enumerate(aggs):
            for c in cores[j]:
                for _ in range(links_per_core):
                    b.cable(a, c, gbps)
    return b.build({
        "kind": "fat-tree", "tiers": 3, "pods": pods, "tors_per_pod": tors_per_pod,
        "aggs_per_pod": aggs_per_pod, "hosts_per_tor": hosts_per_tor,
        "cores_per_plane": cores_per_plane, "gbps": gbps, "gpus_per_server": nics_per_host,
        "links_per_core": links_per_core, "radix": radix, "layout": "standard",
        "oversubscription": {
            "leaf": hosts_per_tor * nics_per_host / aggs_per_pod,
            "spine": tors_per_pod / (cores_per_plane * links_per_core),
        },
    })


# ---------------------------------------------------------------------- rail-optimized family
SpineMode = Literal["shared", "per-plane", "per-rail"]
SPINE_MODES: tuple[SpineMode, ...] = ("shared", "per-plane", "per-rail")


def _largest_divisor(n: int, *, at_most: int) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` (>= 1)."""
    for d in range(min(n, max(at_most, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def _ceil(x: float) -> int:
    """Ceiling that forgives float noise (400/400*32 must be 32, not 33)."""
    return max(1, math.ceil(x - 1e-9))


def _w(n: int, minimum: int = 1) -> int:
    """Digits needed to print ``0 .. n-1`` (ids sort in numeric order)."""
    return max(minimum, len(str(max(n - 1, 0))))


@dataclass(frozen=True)
class _RailPlan:
    """The sizes a rail-optimized build settled on (all derived, all checked)."""

    tiers: int
    servers_per_leaf: int
    leaf_up: int
    pods: int
    servers_per_pod: int
    leaves_per_group: int  # leaves cabled to one spine group (a full pod)
    spines_per_group: int
    links_per_spine: int
    spine_up: int
    cores_per_group: int
    links_per_core: int


def _rail_plan(
    src: str, *, servers: int, rails: int, planes: int, homes: int, radix: int,
    port_gbps: float, up_gbps: float, servers_per_leaf: int | None, oversubscription: float,
    spines: int | None, spine_mode: SpineMode, pods: int | None, servers_per_pod: int | None,
    core_oversubscription: float,
) -> _RailPlan:
    # Leaf: one down port per server it serves (per rail, per plane, per home).
    def leaf_up_for(spl: int) -> int:
        return _ceil(spl * port_gbps / (oversubscription * up_gbps))

    if servers_per_leaf is None:
        spl = 0
        for s in range(min(servers, radix - 1), 0, -1):
            if s + leaf_up_for(s) <= radix:
                spl = s
                break
        if spl == 0:
            raise InventoryError(f"{src}: radix: a {radix}-port leaf cannot serve one server and an uplink")
    else:
        spl = _integer("servers_per_leaf", servers_per_leaf, src)
    leaf_up = leaf_up_for(spl)
    _fits(src, "leaf", radix, down=spl, up=leaf_up,
          why=f"servers_per_leaf={spl} at oversubscription={oversubscription}")
    # Leaves that share one spine group (per pod): which rails/planes/homes meet there.
    share_rails = rails if spine_mode != "per-rail" else 1
    share_planes = planes if spine_mode == "shared" else 1
    per_group_per_leafset = share_rails * share_planes * homes  # leaves per "leaf index"

    def spine_layout(leaves_in_group: int, spine_down: int) -> tuple[int, int]:
        if spines is not None:
            s = _integer("spines", spines, src)
            if leaf_up % s:
                raise InventoryError(
                    f"{src}: spines: {s} spines must divide the {leaf_up} uplinks of each leaf"
                )
            lps = leaf_up // s
        else:
            lps = _largest_divisor(leaf_up, at_most=spine_down // max(leaves_in_group, 1))
            s = leaf_up // lps
        what = "spine" if spine_down == radix else f"spine (its down ports; radix {radix})"
        _fits(src, what, spine_down, down=leaves_in_group * lps, up=0,
              why=(f"spines={s}: " if spines is not None else "")
              + f"{leaves_in_group} leaves x {lps} links")
        return s, lps

    three_tier = pods is not None or servers_per_pod is not None
    two_tier_leaves = -(-servers // spl) * per_group_per_leafset
    if not three_tier and two_tier_leaves <= radix:
        s, lps = spine_layout(two_tier_leaves, radix)
        return _RailPlan(2, spl, leaf_up, 1, servers, two_tier_leaves, s, lps, 0, 0, 0)
    # Three tiers: pods of 2-tier rail groups joined by cores; spines split down/up ports.
    spine_down = max(1, int(radix * core_oversubscription // (1 + core_oversubscription)))
    if servers_per_pod is None:
        if pods is not None:
            p = _integer("pods", pods, src)
            spp = -(-servers // p)
        else:
            max_leaves = spine_down // per_group_per_leafset
            if max_leaves < 1:
                raise InventoryError(
                    f"{src}: radix: {per_group_per_leafset} leaves per spine group exceed the "
                    f"{spine_down} down ports of a {radix}-port spine"
                )
            spp = max_leaves * spl
    else:
        spp = _integer("servers_per_pod", servers_per_pod, src)
    npods = -(-servers // spp)
    if servers_per_leaf is None and spl > spp:  # small pods: a leaf needs no more ports than that
        spl = spp
        leaf_up = leaf_up_for(spl)
    if pods is not None and npods != pods:
        raise InventoryError(f"{src}: pods: {servers} servers in pods of {spp} make {npods} pods, not {pods}")
    leaves_in_group = -(-min(spp, servers) // spl) * per_group_per_leafset
    s, lps = spine_layout(leaves_in_group, spine_down)
    down_links = leaves_in_group * lps
    spine_up = _ceil(down_links / core_oversubscription)
    _fits(src, "spine", radix, down=down_links, up=spine_up,
          why=f"{leaves_in_group} leaves x {lps} links at core_oversubscription={core_oversubscription}")
    groups_per_domain = npods * (rails if spine_mode == "per-rail" else 1)
    if groups_per_domain > radix:
        raise InventoryError(
            f"{src}: radix: {npods} pods need {groups_per_domain} ports on every {radix}-port "
            f"core (too large for 3 tiers; use larger switches or fewer servers)"
        )
    lpc = _largest_divisor(spine_up, at_most=radix // groups_per_domain)
    return _RailPlan(3, spl, leaf_up, npods, spp, leaves_in_group, s, lps, spine_up,
                     spine_up // lpc, lpc)


def _rail_clos(
    kind: str, *, servers: int, gpus_per_server: int, nic_gbps: float, radix: int,
    servers_per_leaf: int | None, oversubscription: float, uplink_gbps: float | None,
    spines: int | None, planes: int, spine_mode: SpineMode | None, homes: int,
    pods: int | None, servers_per_pod: int | None, core_oversubscription: float,
    latency_ns: int, name: str | None,
) -> Fabric:
    src = kind.replace("-", "_") + "_fabric"
    _integer("servers", servers, src)
    rails = _integer("gpus_per_server", gpus_per_server, src)
    _integer("planes", planes, src)
    _integer("radix", radix, src, minimum=2)
    for k, v in (("nic_gbps", nic_gbps), ("oversubscription", oversubscription),
                 ("core_oversubscription", core_oversubscription)):
        _positive(k, v, src)
    mode: SpineMode = spine_mode or ("shared" if planes == 1 else "per-plane")
    if mode not in SPINE_MODES:
        raise InventoryError(f"{src}: spine_mode: unknown {mode!r}; choose one of {', '.join(SPINE_MODES)}")
    port_gbps = nic_gbps / (planes * homes)
    up_gbps = port_gbps if uplink_gbps is None else uplink_gbps
    _positive("uplink_gbps", up_gbps, src)
    plan = _rail_plan(
        src, servers=servers, rails=rails, planes=planes, homes=homes, radix=radix,
        port_gbps=port_gbps, up_gbps=up_gbps, servers_per_leaf=servers_per_leaf,
        oversubscription=oversubscription, spines=spines, spine_mode=mode, pods=pods,
        servers_per_pod=servers_per_pod, core_oversubscription=core_oversubscription,
    )
    b = FabricBuilder(name or f"{kind}-{servers}x{rails}", latency_ns)
    wh, wp, wr = _w(servers, 4), _w(plan.pods), _w(rails)
    wl = _w(-(-plan.servers_per_pod // plan.servers_per_leaf), 2)
    side = ("a", "b") if homes == 2 else ("",)

    def leaf_id(pl: int, pod: int, rail: int, i: int, h: int) -> str:
        lp = f"l{pl}-" if planes > 1 else ""
        return f"leaf-{lp}p{pod:0{wp}d}-r{rail:0{wr}d}-{i:0{wl}d}{side[h]}"

    # Hosts and NICs first so NIC addresses follow host order.
    nic_ids: list[list[str]] = []
    for h in range(servers):
        pod = h // plan.servers_per_pod
        hid = b.host(f"host{h:0{wh}d}", rails, pod=pod)
        nic_ids.append([b.nic(hid, r, gpu=r, rail=r, pod=pod) for r in range(rails)])
    # Spine groups, keyed by (plane, pod, rail) with None where the group is shared.
    ws = _w(plan.spines_per_group, 2)
    spine_groups: dict[tuple[int | None, int, int | None], list[str]] = {}

    def group_key(pl: int, pod: int, rail: int) -> tuple[int | None, int, int | None]:
        return (None if mode == "shared" else pl, pod, rail if mode == "per-rail" else None)

    leaves: dict[tuple[int, int, int, int, int], str] = {}
    for pl in range(planes):
        for pod in range(plan.pods):
            in_pod = min(plan.servers_per_pod, servers - pod * plan.servers_per_pod)
            for rail in range(rails):
                key = group_key(pl, pod, rail)
                if key not in spine_groups:
                    gpl = "" if key[0] is None or planes == 1 else f"l{key[0]}-"
                    grl = "" if key[2] is None else f"r{key[2]:0{wr}d}-"
                    spine_groups[key] = [
                        b.switch(f"spine-{gpl}p{pod:0{wp}d}-{grl}{s:0{ws}d}", "spine", pod=pod,
                                 plane=key[0], rail=key[2])
                        for s in range(plan.spines_per_group)
                    ]
                for i in range(-(-in_pod // plan.servers_per_leaf)):
                    for hm in range(homes):
                        leaves[(pl, pod, rail, i, hm)] = b.switch(
                            leaf_id(pl, pod, rail, i, hm), "leaf", pod=pod,
                            plane=pl if planes > 1 else None, rail=rail,
                        )
    # NIC -> leaf: port p{pl*homes+hm} of NIC r goes to leaf (pl, pod, r, i, hm).
    for h in range(servers):
        pod, j = divmod(h, plan.servers_per_pod)
        i = j // plan.servers_per_leaf
        for r in range(rails):
            for pl in range(planes):
                for hm in range(homes):
                    b.cable(nic_ids[h][r], leaves[(pl, pod, r, i, hm)], port_gbps, a_prefix="p")
    # Leaf -> spines of its group.
    for (pl, pod, rail, _i, _hm), leaf in leaves.items():
        for s in spine_groups[group_key(pl, pod, rail)]:
            for _ in range(plan.links_per_spine):
                b.cable(leaf, s, up_gbps)
    n_cores = 0
    if plan.tiers == 3:
        # Spine j of every group in a core domain cables to the cores of core group j.
        wc = _w(plan.cores_per_group, 2)
        domains: dict[int | None, list[list[str]]] = {}
        for key, group in spine_groups.items():
            domains.setdefault(key[0], []).append(group)
        for dom, groups in domains.items():
            gpl = "" if dom is None or planes == 1 else f"l{dom}-"
            for j in range(plan.spines_per_group):
                cores = [b.switch(f"core-{gpl}{j:0{ws}d}-{c:0{wc}d}", "core",
                                  plane=dom) for c in range(plan.cores_per_group)]
                n_cores += len(cores)
                for group in groups:
                    for c in cores:
                        for _ in range(plan.links_per_core):
                            b.cable(group[j], c, up_gbps)
    over: dict[str, float] = {"leaf": plan.servers_per_leaf * port_gbps / (plan.leaf_up * up_gbps)}
    if plan.tiers == 3:
        over["spine"] = plan.leaves_per_group * plan.links_per_spine / plan.spine_up
    return b.build({
        "kind": kind, "tiers": plan.tiers, "servers": servers, "gpus_per_server": rails,
        "rails": rails, "planes": planes, "homes": homes, "nic_gbps": nic_gbps,
        "port_gbps": port_gbps, "uplink_gbps": up_gbps, "radix": radix,
        "servers_per_leaf": plan.servers_per_leaf, "leaf_uplinks": plan.leaf_up,
        "spine_mode": mode, "spines_per_group": plan.spines_per_group,
        "links_per_spine": plan.links_per_spine, "pods": plan.pods,
        "servers_per_pod": plan.servers_per_pod, "spine_uplinks": plan.spine_up,
        "cores_per_group": plan.cores_per_group, "links_per_core": plan.links_per_core,
        "cores": n_cores, "oversubscription": over,
    })


def rail_optimized_fabric(
    servers: int = 128,
    *,
    gpus_per_server: int = 8,
    nic_gbps: float = 400.0,
    radix: int = 64,
    servers_per_leaf: int | None = None,
    oversubscription: float = 1.0,
    uplink_gbps: float | None = None,
    spines: int | None = None,
    planes: int = 1,
    spine_mode: SpineMode | None = None,
    pods: int | None = None,
    servers_per_pod: int | None = None,
    core_oversubscription: float = 1.0,
    latency_ns: int = 1000,
    name: str | None = None,
) -> Fabric:
    """A rail-optimized Clos: GPU ``i`` of every server talks through NIC ``i`` on rail ``i``.

    Each rail has its own leaf group (``leaf-p0-r3-07``: pod 0, rail 3, leaf 7), so
    rail-aligned collectives (NCCL rings, PXN) stay one hop above the NIC; leaves of all rails
    share the spines of their pod (``spine_mode="shared"``), or only those of their plane
    (``"per-plane"``, default when ``planes > 1``) or rail (``"per-rail"``). This is the layout
    of NVIDIA's DGX SuperPOD reference architecture and Meta's RoCE training clusters
    (Gangidi et al., "RDMA over Ethernet for Distributed Training at Meta Scale", SIGCOMM'24).

    All switches have ``radix`` ports (default 64, e.g. 64 x 400G). A leaf serves
    ``servers_per_leaf`` servers (default: as many as fit with ``oversubscription`` =
    down:up bandwidth, i.e. radix/2 when non-blocking) and spreads its uplinks evenly over the
    spines of its group. When one spine tier cannot reach every leaf (more leaves than
    ``radix``) or when ``pods``/``servers_per_pod`` is given, the fabric gets a third tier:
    pods of ``servers_per_pod`` servers (default: as many as one pod's spines can reach, 128
    servers = 1,024 GPUs at radix 64), spines split ports down:up by
    ``core_oversubscription``, and spine ``j`` of every pod cables to core group ``j``
    (``core-05-03``), as in a k-ary fat tree (Al-Fares et al., SIGCOMM'08).

    Defaults: ``rail_optimized_fabric()`` = 128 servers x 8 = 1,024 GPUs, 2 tiers, 32 leaves,
    16 spines, non-blocking. ``rail_optimized_fabric(4096)`` = 32,768 GPUs in 32 pods of
    1,024, 3 tiers: 1,024 leaves, 1,024 spines, 512 cores (radix 64, non-blocking).

    ``planes > 1`` splits every NIC into ``planes`` ports of ``nic_gbps / planes`` each,
    port ``p<l>`` to a leaf of plane ``l`` (``leaf-l1-p0-r3-07``). Impossible fabrics (a
    leaf or spine needing more than ``radix`` ports) raise :class:`InventoryError` naming the
    parameter and the numbers.

    >>> f = rail_optimized_fabric(16)
    >>> f.gpu_count, f.meta["tiers"], f.leaves_of_nic["host0003/nic5"]
    (128, 2, ('leaf-p0-r5-00',))
    """
    return _rail_clos(
        "rail-optimized", servers=servers, gpus_per_server=gpus_per_server, nic_gbps=nic_gbps,
        radix=radix, servers_per_leaf=servers_per_leaf, oversubscription=oversubscription,
        uplink_gbps=uplink_gbps, spines=spines, planes=planes, spine_mode=spine_mode, homes=1,
        pods=pods, servers_per_pod=servers_per_pod,
        core_oversubscription=core_oversubscription, latency_ns=latency_ns, name=name,
    )


def multi_plane_fabric(
    servers: int = 128,
    *,
    planes: int = 2,
    gpus_per_server: int = 8,
    nic_gbps: float = 400.0,
    radix: int = 64,
    servers_per_leaf: int | None = None,
    oversubscription: float = 1.0,
    uplink_gbps: float | None = None,
    spines: int | None = None,
    pods: int | None = None,
    servers_per_pod: int | None = None,
    core_oversubscription: float = 1.0,
    latency_ns: int = 1000,
    name: str | None = None,
) -> Fabric:
    """A multi-plane rail-optimized fabric: each NIC is split over ``planes`` independent planes.

    NIC port ``p<l>`` (``nic_gbps / planes``) cables to a leaf of plane ``l``; planes share
    nothing above the NIC (per-plane leaves, spines and cores: ``leaf-l1-p0-r3-07``,
    ``spine-l1-p0-05``), so a failure stays in its plane and a multi-homed NIC hashes (or
    stripes) its flows over the planes. This is the multi-plane design of Alibaba HPN
    (Qian et al., SIGCOMM'24) and of 800G NICs split into 2 x 400G / 4 x 200G.

    >>> f = multi_plane_fabric(8, planes=2)
    >>> f.leaves_of_nic["host0000/nic0"]
    ('leaf-l0-p0-r0-00', 'leaf-l1-p0-r0-00')
    """
    _integer("planes", planes, "multi_plane_fabric", minimum=1)
    return _rail_clos(
        "multi-plane", servers=servers, gpus_per_server=gpus_per_server, nic_gbps=nic_gbps,
        radix=radix, servers_per_leaf=servers_per_leaf, oversubscription=oversubscription,
        uplink_gbps=uplink_gbps, spines=spines, planes=planes, spine_mode="per-plane",
        homes=1, pods=pods, servers_per_pod=servers_per_pod,
        core_oversubscription=core_oversubscription, latency_ns=latency_ns, name=name,
    )


def dual_tor_fabric(
    servers: int = 128,
    *,
    gpus_per_server: int = 8,
    nic_gbps: float = 400.0,
    radix: int = 64,
    servers_per_leaf: int | None = None,
    oversubscription: float = 1.0,
    uplink_gbps: float | None = None,
    spines: int | None = None,
    pods: int | None = None,
    servers_per_pod: int | None = None,
    core_oversubscription: float = 1.0,
    latency_ns: int = 1000,
    name: str | None = None,
) -> Fabric:
    """A rail-optimized fabric whose NICs are dual-homed to two ToRs (``...-07a``/``...-07b``).

    NIC port ``p0`` (``nic_gbps / 2``) cables to ToR ``a`` and ``p1`` to ToR ``b`` of the same
    rail and leaf index; both ToRs uplink to the same spines, so a ToR failure halves a NIC's
    bandwidth instead of cutting it off (Alibaba HPN, Qian et al., SIGCOMM'24).

    >>> dual_tor_fabric(8).leaves_of_nic["host0000/nic2"]
    ('leaf-p0-r2-00a', 'leaf-p0-r2-00b')
    """
    return _rail_clos(
        "dual-tor", servers=servers, gpus_per_server=gpus_per_server, nic_gbps=nic_gbps,
        radix=radix, servers_per_leaf=servers_per_leaf, oversubscription=oversubscription,
        uplink_gbps=uplink_gbps, spines=spines, planes=1, spine_mode="shared", homes=2,
        pods=pods, servers_per_pod=servers_per_pod,
        core_oversubscription=core_oversubscription, latency_ns=latency_ns, name=name,
    )
