"""Rank -> devices (GPU, NIC, access link, leaf) from the fabric inventory; candidate naming.

Without an inventory each rank is its own host and candidates are named by rank
(``rank 5``, ``rank 5 network``); with one, culprits are inventory ids (``host0003/gpu2``,
``host0003/nic2``, ``host0003/nic2:eth0|leaf-...:eth5``, ``leaf-...``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.model.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DeviceMap:
    """Per-rank device names. ``host[r]`` is None when unknown (then ranks stand alone).

    ``nic_link`` is the NIC's access cable (indistinguishable from the NIC from end-host
    timings: both cap that NIC's bandwidth), ``leaf`` the switch it is cabled to and
    ``spines_of_leaf`` the spine switches above each leaf (a transfer between two leaves
    crosses one of them).
    """

    gpu: Mapping[int, str]
    nic: Mapping[int, str]
    host: Mapping[int, str | None]
    nic_link: Mapping[int, str | None]
    leaf: Mapping[int, str | None]
    spines_of_leaf: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def gpu_of(self, rank: int) -> str:
        return self.gpu.get(rank, f"rank {rank}")

    def nic_of(self, rank: int) -> str:
        return self.nic.get(rank, f"rank {rank} network")

    def host_of(self, rank: int) -> str:
        h = self.host.get(rank)
        return h if h is not None else f"rank {rank}"


def rank_devices(
    fabric: Fabric, placement: Sequence[tuple[str, int]] | None = None, *, ranks: int | None = None
) -> DeviceMap:
    """Map ranks to inventory devices.

    ``placement[r] = (host_id, gpu_index)``; default: ranks fill hosts in id order, GPU 0..g-1
    on each (the usual ``torchrun`` order: local rank = GPU index).
    """
    if placement is None:
        placement = [(h.id, g) for h in fabric.hosts for g in range(h.gpus)]
        if ranks is not None:
            if ranks > len(placement):
                raise ConfigError(f"inventory {fabric.name}: {ranks} ranks but only "
                                  f"{len(placement)} GPUs")
            placement = placement[:ranks]
    gpu: dict[int, str] = {}
    nic: dict[int, str] = {}
    host: dict[int, str | None] = {}
    nic_link: dict[int, str | None] = {}
    leaf: dict[int, str | None] = {}
    link_of_port = fabric.link_of_port
    for r, (h, g) in enumerate(placement):
        if h not in fabric.nics_of_host:
            raise ConfigError(f"placement[{r}]: host {h!r} is not in inventory {fabric.name}")
        n = fabric.nic_of_gpu(h, g)
        gpu[r] = f"{h}/gpu{g}"
        nic[r] = n.id
        host[r] = h
        ports = fabric.ports_of.get(n.id, ())
        links = [link_of_port[p].id for p in ports if p in link_of_port]
        nic_link[r] = links[0] if len(links) == 1 else None
        leaves = fabric.leaves_of_nic.get(n.id, ())
        leaf[r] = leaves[0] if len(leaves) == 1 else None
    spines: dict[str, tuple[str, ...]] = {}
    for lf in sorted({x for x in leaf.values() if x}):
        up = {port_device(p) for p in fabric.neighbors_ports(lf)}
        spines[lf] = tuple(sorted(d for d in up if d in fabric.devices
                                  and fabric.devices[d].role == "spine"))
    return DeviceMap(gpu, nic, host, nic_link, leaf, spines)


def parse_placement(text: str, *, source: str = "<placement>") -> list[tuple[str, int]]:
    """Parse a placement JSON: ``{"ranks": [["host0000", 0], ["host0000", 1], ...]}``.

    The twin's ``truth.json`` (key ``placement``) and a bare list are accepted too.
    """
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and "ranks" not in obj and "placement" in obj:
            obj = {"ranks": obj["placement"]}
        rows = obj["ranks"] if isinstance(obj, dict) else obj
        return [(str(h), int(g)) for h, g in rows]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: placement must be {{\"ranks\": [[host, gpu], ...]}} "
                          f"({exc})") from exc
