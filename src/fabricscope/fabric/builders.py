"""Topology builders: each returns a validated :class:`~fabricscope.fabric.inventory.Fabric`.

Naming: hosts ``host0042``, NICs ``host0042/nic3``, switches ``leaf-p1-r3-07`` style ids
(``p`` pod, ``r`` rail, ``l`` plane where they apply), ports ``eth<N>``, NIC ports ``p<N>``.
Addresses come from 198.18.0.0/15 (RFC 2544 benchmark range): NICs from 198.18.0.0/16 onward,
switch loopbacks from 198.19.255.255 downward.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

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


def leaf_spine_fabric(
    *,
    leaves: int,
    hosts_per_leaf: int,
    spines: int,
    links_per_spine: int = 1,
    nics_per_host: int = 1,
    host_gbps: float = 100.0,
    uplink_gbps: float | None = None,
    latency_ns: int = 1000,
    name: str | None = None,
) -> Fabric:
    """A 2-tier leaf-spine (folded Clos). Each leaf cables ``links_per_spine`` uplinks to
    every spine; oversubscription = (hosts_per_leaf * nics * host_gbps) /
    (spines * links_per_spine * uplink_gbps). Hosts have ``nics_per_host`` NICs/GPUs, all on
    the host's leaf.
    """
    src = "leaf_spine_fabric"
    for k, v in (("leaves", leaves), ("hosts_per_leaf", hosts_per_leaf), ("spines", spines),
                 ("links_per_spine", links_per_spine), ("nics_per_host", nics_per_host),
                 ("host_gbps", host_gbps)):
        _positive(k, v, src)
    up = host_gbps if uplink_gbps is None else uplink_gbps
    _positive("uplink_gbps", up, src)
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
        "host_gbps": host_gbps, "uplink_gbps": up,
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
) -> Fabric:
    """A 3-tier fat tree (ToR = leaf, aggregation = spine, core).

    k-ary (Al-Fares et al., SIGCOMM'08): ``k`` pods of k/2 ToRs and k/2 aggs, k/2 hosts per
    ToR, (k/2)^2 cores. htsim-style: give ``pods``, ``tors_per_pod``, ``aggs_per_pod``,
    ``hosts_per_tor`` and ``cores_per_plane``; aggregation switch ``j`` of every pod cables one
    link to each core of plane ``j`` (``aggs_per_pod`` planes). Every ToR cables one link to
    every agg in its pod. The 1024-host reference fabric of SIMULATION.md is
    ``pods=16, tors_per_pod=8, aggs_per_pod=8, hosts_per_tor=8, cores_per_plane=8``.
    """
    src = "fat_tree_fabric"
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
    b = FabricBuilder(name or f"fattree-{pods * tors_per_pod * hosts_per_tor}", latency_ns)
    cores = [[b.switch(f"core-l{j}-{c:02d}", "core", plane=j) for c in range(cores_per_plane)]
             for j in range(aggs_per_pod)]
    h = 0
    for p in range(pods):
        aggs = [b.switch(f"agg-p{p:02d}-{j:02d}", "spine", pod=p, plane=j) for j in range(aggs_per_pod)]
        for t in range(tors_per_pod):
            tor = b.switch(f"tor-p{p:02d}-{t:02d}", "leaf", pod=p)
            for _ in range(hosts_per_tor):
                hid = b.host(f"host{h:04d}", 1, pod=p)
                b.cable(b.nic(hid, 0, gpu=0, pod=p), tor, gbps, a_prefix="p")
                h += 1
            for a in aggs:
                b.cable(tor, a, gbps)
        for j, a in enumerate(aggs):
            for c in cores[j]:
                b.cable(a, c, gbps)
    return b.build({
        "kind": "fat-tree", "tiers": 3, "pods": pods, "tors_per_pod": tors_per_pod,
        "aggs_per_pod": aggs_per_pod, "hosts_per_tor": hosts_per_tor,
        "cores_per_plane": cores_per_plane, "gbps": gbps,
        "oversubscription": {
            "leaf": hosts_per_tor / aggs_per_pod,
            "spine": tors_per_pod / cores_per_plane,
        },
    })
