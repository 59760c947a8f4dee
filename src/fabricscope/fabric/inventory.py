"""The fabric inventory: devices, ports and links with stable ids, plus a compact index.

Ids follow ARCHITECTURE.md: hosts ``host0042``, NICs ``host0042/nic3``, switches
``leaf-p1-r3-07`` (any stable string), ports ``<device>:<name>`` (``leaf-p1-r3-07:eth12``),
links as the sorted port pair ``a:eth1|b:eth2``. A link is full duplex; each direction is a
*directed link* ``a:eth1->b:eth2`` with its own capacity, and is what the simulator, the
telemetry twin and the localizers talk about (a gray link usually drops in one direction).

Endpoints of traffic are NICs. A host owns GPUs and NICs; GPU ``i`` is served by the NIC whose
``gpu`` field is ``i`` (rail ``i`` in a rail-optimized fabric).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
import numpy.typing as npt

from fabricscope.model.errors import InventoryError

Role = Literal["host", "nic", "leaf", "spine", "core"]
ROLES: tuple[Role, ...] = ("host", "nic", "leaf", "spine", "core")
SWITCH_ROLES: frozenset[str] = frozenset({"leaf", "spine", "core"})
TIER_OF_ROLE: Mapping[str, int] = {"host": 0, "nic": 0, "leaf": 1, "spine": 2, "core": 3}


@dataclass(frozen=True, slots=True)
class Device:
    """A host, NIC or switch. Location fields are None where they do not apply."""

    id: str
    role: Role
    pod: int | None = None
    plane: int | None = None
    rail: int | None = None
    host: str | None = None  # NIC: the host that owns it
    gpu: int | None = None  # NIC: index of the GPU it serves
    gpus: int = 0  # host: number of GPUs
    address: str | None = None  # NIC: IPv4 address; switch: loopback

    @property
    def tier(self) -> int:
        return TIER_OF_ROLE[self.role]

    @property
    def is_switch(self) -> bool:
        return self.role in SWITCH_ROLES


@dataclass(frozen=True, slots=True)
class Port:
    """A physical port ``<device>:<name>``."""

    device: str
    name: str
    speed_gbps: float

    @property
    def id(self) -> str:
        return f"{self.device}:{self.name}"


@dataclass(frozen=True, slots=True)
class Link:
    """A full-duplex cable between two ports; ``a`` < ``b`` (port ids) so the id is stable."""

    a: str
    b: str
    capacity_gbps: float
    latency_ns: int = 1000

    @property
    def id(self) -> str:
        return link_id(self.a, self.b)


def link_id(port_a: str, port_b: str) -> str:
    """The stable id of the link between two ports: the sorted pair joined by ``|``."""
    lo, hi = sorted((port_a, port_b))
    return f"{lo}|{hi}"


def directed_link_id(from_port: str, to_port: str) -> str:
    """The id of one direction of a link: ``from_port->to_port``."""
    return f"{from_port}->{to_port}"


def port_device(port_id: str) -> str:
    """The device part of a port id (everything before the last ``:``)."""
    return port_id.rsplit(":", 1)[0]


@dataclass(frozen=True, slots=True)
class FabricIndex:
    """Dense integer view of a fabric for vectorized algorithms.

    Nodes are NICs and switches (hosts are not on the data path). Directed link ``e`` goes
    from node ``src[e]`` to node ``dst[e]``; ``link[e]`` is the index of its cable in
    ``Fabric.links`` and ``e ^ 1`` is the opposite direction (directions are stored in pairs:
    ``2*i`` is a->b, ``2*i+1`` is b->a).
    """

    node_ids: tuple[str, ...]
    node_of: Mapping[str, int]
    src: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    capacity_bps: npt.NDArray[np.float64]
    latency_ns: npt.NDArray[np.int64]
    from_port: tuple[str, ...]
    to_port: tuple[str, ...]
    tier: npt.NDArray[np.int64]  # per node
    is_switch: npt.NDArray[np.bool_]  # per node
    out_edges: tuple[tuple[int, ...], ...]  # per node, directed link indices, sorted by port id

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_edges(self) -> int:
        return int(self.src.shape[0])

    def edge_id(self, e: int) -> str:
        """The directed link id of edge ``e``."""
        return directed_link_id(self.from_port[e], self.to_port[e])


@dataclass(frozen=True)
class Fabric:
    """An immutable inventory. Build one with a builder or :func:`fabric_from_dict`.

    ``meta`` carries builder parameters (kind, tiers, oversubscription...) for summaries.
    Construct through :meth:`create`, which validates.
    """

    name: str
    devices: Mapping[str, Device]
    ports: Mapping[str, Port]
    links: tuple[Link, ...]
    meta: Mapping[str, object] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        name: str,
        devices: Iterable[Device],
        ports: Iterable[Port],
        links: Iterable[Link],
        *,
        meta: Mapping[str, object] | None = None,
        source: str = "<builder>",
    ) -> Fabric:
        """Validate and build. Errors name ``source``, the field and the value."""
        dev: dict[str, Device] = {}
        for d in devices:
            if d.id in dev:
                raise InventoryError(f"{source}: devices: duplicate id {d.id!r}")
            if d.role not in ROLES:
                raise InventoryError(f"{source}: devices[{d.id}].role: unknown role {d.role!r}")
            dev[d.id] = d
        prt: dict[str, Port] = {}
        for p in ports:
            if p.id in prt:
                raise InventoryError(f"{source}: ports: duplicate id {p.id!r}")
            if p.device not in dev:
                raise InventoryError(
                    f"{source}: ports[{p.id}].device: no device {p.device!r}"
                )
            if not p.speed_gbps > 0:
                raise InventoryError(
                    f"{source}: ports[{p.id}].speed_gbps: must be > 0, got {p.speed_gbps!r}"
                )
            prt[p.id] = p
        lnk: list[Link] = []
        used: dict[str, str] = {}
        for ln in links:
            a, b = sorted((ln.a, ln.b))
            ln = Link(a, b, ln.capacity_gbps, ln.latency_ns)
            for end in (a, b):
                if end not in prt:
                    raise InventoryError(f"{source}: links[{ln.id}]: no port {end!r}")
                if end in used:
                    raise InventoryError(
                        f"{source}: links[{ln.id}]: port {end!r} already used by link {used[end]!r}"
                    )
                used[end] = ln.id
            if a == b or port_device(a) == port_device(b):
                raise InventoryError(f"{source}: links[{ln.id}]: a link must join two devices")
            for end in (a, b):
                owner = dev[prt[end].device]
                if owner.role == "host":  # hosts reach the fabric through their NICs only
                    raise InventoryError(
                        f"{source}: links[{ln.id}]: port {end!r} is on {owner.id!r}, whose role is "
                        "'host'; a cable ends at a NIC or a switch (a switch relabelled as a host?)"
                    )
            if not ln.capacity_gbps > 0:
                raise InventoryError(
                    f"{source}: links[{ln.id}].capacity_gbps: must be > 0, got {ln.capacity_gbps!r}"
                )
            if ln.latency_ns < 0:
                raise InventoryError(
                    f"{source}: links[{ln.id}].latency_ns: must be >= 0, got {ln.latency_ns!r}"
                )
            lnk.append(ln)
        for d in dev.values():
            if d.role == "nic" and (
                d.host is None or d.host not in dev or dev[d.host].role != "host"
            ):
                raise InventoryError(
                    f"{source}: devices[{d.id}].host: NIC must name a host, got {d.host!r}"
                )
        fab = cls(name=name, devices=dev, ports=prt, links=tuple(lnk), meta=dict(meta or {}))
        fab._check_rails(source)
        return fab

    def _check_rails(self, source: str) -> None:
        # A NIC belongs to one rail: every leaf it reaches must carry the same rail tag.
        for nic in self.nics:
            rails = {
                self.devices[port_device(p)].rail
                for p in self.neighbors_ports(nic.id)
                if self.devices[port_device(p)].role == "leaf"
            }
            rails.discard(None)
            if len(rails) > 1:
                raise InventoryError(
                    f"{source}: devices[{nic.id}]: NIC on two rails {sorted(r for r in rails if r is not None)}"
                )
            if nic.rail is not None and rails and nic.rail not in rails:
                raise InventoryError(
                    f"{source}: devices[{nic.id}].rail: NIC says rail {nic.rail} but its leaf "
                    f"is on rail {next(iter(rails))}"
                )

    # ------------------------------------------------------------------ queries
    @cached_property
    def nics(self) -> tuple[Device, ...]:
        """Endpoints, in id order."""
        return tuple(sorted((d for d in self.devices.values() if d.role == "nic"), key=_id))

    @cached_property
    def hosts(self) -> tuple[Device, ...]:
        return tuple(sorted((d for d in self.devices.values() if d.role == "host"), key=_id))

    @cached_property
    def switches(self) -> tuple[Device, ...]:
        return tuple(sorted((d for d in self.devices.values() if d.is_switch), key=_id))

    def by_role(self, role: Role) -> tuple[Device, ...]:
        return tuple(sorted((d for d in self.devices.values() if d.role == role), key=_id))

    @cached_property
    def ports_of(self) -> Mapping[str, tuple[str, ...]]:
        """Port ids of each device, sorted."""
        out: dict[str, list[str]] = {d: [] for d in self.devices}
        for p in self.ports.values():
            out[p.device].append(p.id)
        return {d: tuple(sorted(ps)) for d, ps in out.items()}

    @cached_property
    def peer_port(self) -> Mapping[str, str]:
        """The port at the other end of each cabled port."""
        out: dict[str, str] = {}
        for ln in self.links:
            out[ln.a] = ln.b
            out[ln.b] = ln.a
        return out

    @cached_property
    def link_of_port(self) -> Mapping[str, Link]:
        out: dict[str, Link] = {}
        for ln in self.links:
            out[ln.a] = ln
            out[ln.b] = ln
        return out

    @cached_property
    def link_by_id(self) -> Mapping[str, Link]:
        return {ln.id: ln for ln in self.links}

    def neighbors_ports(self, device_id: str) -> tuple[str, ...]:
        """Peer ports of every cabled port of ``device_id``."""
        peer = self.peer_port
        return tuple(peer[p] for p in self.ports_of.get(device_id, ()) if p in peer)

    def nic_of_gpu(self, host_id: str, gpu: int) -> Device:
        """The NIC serving GPU ``gpu`` of ``host_id``."""
        for d in self.nics_of_host[host_id]:
            if d.gpu == gpu:
                return d
        raise InventoryError(f"{self.name}: host {host_id!r} has no NIC for GPU {gpu}")

    @cached_property
    def nics_of_host(self) -> Mapping[str, tuple[Device, ...]]:
        out: dict[str, list[Device]] = {h.id: [] for h in self.hosts}
        for n in self.nics:
            assert n.host is not None
            out[n.host].append(n)
        return {h: tuple(ns) for h, ns in out.items()}

    @cached_property
    def nic_by_address(self) -> Mapping[str, Device]:
        return {n.address: n for n in self.nics if n.address is not None}

    @cached_property
    def leaves_of_nic(self) -> Mapping[str, tuple[str, ...]]:
        """The switches each NIC is cabled to (one; P for multi-plane; 2 for dual-ToR)."""
        return {
            n.id: tuple(sorted({port_device(p) for p in self.neighbors_ports(n.id)}))
            for n in self.nics
        }

    @cached_property
    def gpu_count(self) -> int:
        return sum(h.gpus for h in self.hosts)

    @cached_property
    def index(self) -> FabricIndex:
        """The dense view (built once, cached)."""
        node_ids = tuple(d.id for d in self.nics) + tuple(d.id for d in self.switches)
        node_of = {n: i for i, n in enumerate(node_ids)}
        m = len(self.links)
        src = np.empty(2 * m, dtype=np.int64)
        dst = np.empty(2 * m, dtype=np.int64)
        cap = np.empty(2 * m, dtype=np.float64)
        lat = np.empty(2 * m, dtype=np.int64)
        fp: list[str] = []
        tp: list[str] = []
        for i, ln in enumerate(self.links):
            da, db = node_of[port_device(ln.a)], node_of[port_device(ln.b)]
            src[2 * i], dst[2 * i] = da, db
            src[2 * i + 1], dst[2 * i + 1] = db, da
            cap[2 * i] = cap[2 * i + 1] = ln.capacity_gbps * 1e9
            lat[2 * i] = lat[2 * i + 1] = ln.latency_ns
            fp += [ln.a, ln.b]
            tp += [ln.b, ln.a]
        out: list[list[int]] = [[] for _ in node_ids]
        for e in sorted(range(2 * m), key=lambda e: fp[e]):
            out[int(src[e])].append(e)
        tier = np.array([self.devices[n].tier for n in node_ids], dtype=np.int64)
        return FabricIndex(
            node_ids=node_ids,
            node_of=node_of,
            src=src,
            dst=dst,
            capacity_bps=cap,
            latency_ns=lat,
            from_port=tuple(fp),
            to_port=tuple(tp),
            tier=tier,
            is_switch=tier > 0,
            out_edges=tuple(tuple(o) for o in out),
        )

    def edge_index(self, directed_id: str) -> int:
        """Index of a directed link id ``a->b`` in :attr:`index`."""
        try:
            a, b = directed_id.split("->")
        except ValueError:
            raise InventoryError(f"{self.name}: not a directed link id: {directed_id!r}") from None
        ln = self.link_by_id.get(link_id(a, b))
        if ln is None:
            raise InventoryError(f"{self.name}: no link {directed_id!r}")
        i = self._link_pos[ln.id]
        return 2 * i + (0 if a == ln.a else 1)

    @cached_property
    def _link_pos(self) -> Mapping[str, int]:
        return {ln.id: i for i, ln in enumerate(self.links)}


def _id(d: Device) -> str:
    return d.id
