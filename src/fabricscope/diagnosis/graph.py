"""The inventory as the diagnosis sees it: which resources a finding's subject implicates.

Findings name subjects in the instruments' own terms (a port, a direction ``a->b``, a NIC, a
GPU ``host/gpuN``, a credible set ``x | y``); root causes name resources of one kind (a cable,
a port, a switch, a NIC, a host, a GPU, a job). :class:`ResourceMap` maps one to the other
over the inventory graph, in two distances:

* ``self``: the resource the subject is part of or is (a direction's cable, a port's cable,
  a port's device, a GPU's NIC and host, a NIC's access cable);
* ``near``: one hop further (the devices at both ends of a port's cable, the leaves a NIC is
  cabled to, the cables of a switch's ports when a symptom is seen on the switch).

Pure: reads a :class:`~fabricscope.fabric.inventory.Fabric`, never the twin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fabricscope.fabric.inventory import Fabric, link_id, port_device

_GPU = re.compile(r"^(?P<host>.+)/gpu(?P<gpu>\d+)$")


class ResourceMap:
    """Subject -> resource ids of a kind, over one fabric (memoized per subject)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self._cache: dict[tuple[str, str, bool], tuple[str, ...]] = {}

    # -- subject parsing ---------------------------------------------------------------
    def ports_of_subject(self, subject: str) -> tuple[str, ...]:
        """The ports a subject names: both ends of a direction / cable, or the port itself."""
        f = self.fabric
        for sep in ("->", "|"):
            if sep in subject and " " not in subject:
                a, _, b = subject.partition(sep)
                return tuple(p for p in (a, b) if p in f.ports)
        if subject in f.ports:
            return (subject,)
        return ()

    def devices_of_subject(self, subject: str) -> tuple[str, ...]:
        """Devices a subject is on: the ends' devices of a link / port, or the device."""
        ports = self.ports_of_subject(subject)
        if ports:
            return tuple(dict.fromkeys(port_device(p) for p in ports))
        if subject in self.fabric.devices:
            return (subject,)
        m = _GPU.match(subject)
        if m and m["host"] in self.fabric.devices:
            return (m["host"],)
        return ()

    def members(self, subject: str) -> tuple[str, ...]:
        """The members of a credible set ``x | y | z`` (one member otherwise)."""
        if " | " in subject:
            return tuple(s.strip() for s in subject.split(" | ") if s.strip())
        return (subject,)

    def known(self, resource: str) -> bool:
        """Is ``resource`` an id the inventory knows (a cable, port, device or GPU)?"""
        f = self.fabric
        if resource in f.ports or resource in f.devices or resource in f.link_by_id:
            return True
        m = _GPU.match(resource)
        if m and m["host"] in f.devices:
            return int(m["gpu"]) < max(1, f.devices[m["host"]].gpus)
        return resource in ("fabric",) or resource.startswith("job")

    # -- resources -----------------------------------------------------------------------
    def resources(self, subject: str, kind: str, *, near: bool = False) -> tuple[str, ...]:
        """The resources of ``kind`` that ``subject`` implicates (``near``: one hop further)."""
        key = (subject, kind, near)
        hit = self._cache.get(key)
        if hit is None:
            out: list[str] = []
            for m in self.members(subject):
                out.extend(self._one(m, kind, near))
            hit = tuple(dict.fromkeys(out))
            self._cache[key] = hit
        return hit

    def _one(self, s: str, kind: str, near: bool) -> Iterable[str]:
        f = self.fabric
        if kind == "fabric":
            return ("fabric",)
        if kind == "job":
            return (s,) if s.startswith("job") or (s not in f.devices and not _GPU.match(s) \
                and not self.ports_of_subject(s)) else ()
        ports = self.ports_of_subject(s)
        if ports:
            return self._from_ports(ports, kind, near)
        m = _GPU.match(s)
        if m and m["host"] in f.devices:
            return self._from_gpu(m["host"], int(m["gpu"]), s, kind, near)
        d = f.devices.get(s)
        if d is None:
            return ()
        return self._from_device(s, kind, near)

    def _from_ports(self, ports: tuple[str, ...], kind: str, near: bool) -> list[str]:
        f = self.fabric
        out: list[str] = []
        if kind == "cable":
            for p in ports:
                link = f.link_of_port.get(p)
                if link is not None:
                    out.append(link.id)
                if near:
                    out.extend(_cables_of(f, port_device(p)))
        elif kind == "port":
            for p in ports:
                out.append(p)
                if near and p in f.peer_port:
                    out.append(f.peer_port[p])
        else:
            devs = [port_device(p) for p in ports]
            if near:
                devs += [port_device(f.peer_port[p]) for p in ports if p in f.peer_port]
            for d in dict.fromkeys(devs):
                out.extend(self._from_device(d, kind, False))
        return out

    def _from_gpu(self, host: str, gpu: int, s: str, kind: str, near: bool) -> list[str]:
        f = self.fabric
        if kind == "gpu":
            return [s]
        if kind == "host":
            return [host]
        try:
            nic = f.nic_of_gpu(host, gpu).id
        except Exception:  # an inventory without rails: no NIC per GPU
            return [host] if kind == "host" else []
        return self._from_device(nic, kind, near)

    def _from_device(self, d: str, kind: str, near: bool) -> list[str]:
        f = self.fabric
        dev = f.devices[d]
        role = dev.role
        if kind == "switch":
            if dev.is_switch:
                out = [d]
                if near:
                    out += [port_device(f.peer_port[p]) for p in f.ports_of.get(d, ())
                            if p in f.peer_port and f.devices[port_device(f.peer_port[p])].is_switch]
                return out
            if role == "nic":
                return list(f.leaves_of_nic.get(d, ()))
            if role == "host":
                return [lf for n in f.nics_of_host.get(d, ()) for lf in f.leaves_of_nic.get(n.id, ())]
            return []
        if kind == "nic":
            if role == "nic":
                return [d]
            if role == "host":
                return [n.id for n in f.nics_of_host.get(d, ())]
            return []
        if kind == "host":
            if role == "host":
                return [d]
            if role == "nic" and dev.host:
                return [dev.host]
            return []
        if kind == "gpu":
            if role == "nic" and dev.host is not None and dev.gpu is not None:
                return [f"{dev.host}/gpu{dev.gpu}"]
            if role == "host":
                return [f"{d}/gpu{g}" for g in range(dev.gpus)]
            return []
        if kind == "cable":
            if role == "nic" or near:
                return _cables_of(f, d)
            return []
        if kind == "port":
            return list(f.ports_of.get(d, ())) if role == "nic" or near else []
        return []


def _cables_of(f: Fabric, device: str) -> list[str]:
    return [link_id(p, f.peer_port[p]) for p in f.ports_of.get(device, ()) if p in f.peer_port]


def resource_kind(fabric: Fabric, resource: str) -> str:
    """The kind of a resource id (``cable``, ``port``, ``switch``, ``nic``, ``host``, ``gpu``,
    ``job`` or ``fabric``)."""
    if resource in fabric.link_by_id:
        return "cable"
    if resource in fabric.ports:
        return "port"
    d = fabric.devices.get(resource)
    if d is not None:
        return "switch" if d.is_switch else d.role
    if _GPU.match(resource):
        return "gpu"
    return "fabric" if resource == "fabric" else "job"
