"""Reader of the topology lines NCCL prints with ``NCCL_DEBUG=INFO``: rings, trees, NET devices.

Lines (NCCL 2.x ``src/graph/connect.cc``, ``src/transport/net_ib.cc``, ``src/init.cc``;
forms seen in nccl-tests issue logs)::

    host:1:1 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7
    host:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1
    host:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>
    host:1:1 [0] NCCL INFO Using network IB
    host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
    host:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 4000 - Init COMPLETE
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["NcclTopology", "parse_nccl_debug"]

_RING = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :((?:\s+-?\d+)+)\s*$")
_TREE = re.compile(r"NCCL INFO Trees((?:\s*\[\d+\]\s*\S+)+)")
_NET = re.compile(r"NCCL INFO NET/(\w+)\s*:\s*Using\s+(.*?)(?:;|$)")
_NET_DEV = re.compile(r"\[(\d+)\]([^\s;]+)")
_USING = re.compile(r"NCCL INFO Using network (\S+)")
_CONN = re.compile(
    r"NCCL INFO (?:Channel \d+/\d+|Ring \d+) : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\].*?via (\S+)")
_COMM = re.compile(r"NCCL INFO (?:ncclCommInitRank )?comm \S+ rank (\d+) nranks (\d+)(?: nnodes (\d+))?",
                   re.IGNORECASE)
_HOST = re.compile(r"^(?:\[\d+,\d+\]<\w+>:|\[\d+\])?\s*([^\s:]+):\d+:\d+ \[\d+\] NCCL INFO")


@dataclass(frozen=True)
class NcclTopology:
    """What the INFO lines say of the communicator.

    rings:      channel -> rank order (from rank 0's view; the first listing kept)
    trees:      the ``Trees`` strings as printed, per channel
    net_devices: NET devices (``mlx5_0:1/RoCE``) and their transport (IB, Socket, OFI...)
    network:    ``Using network`` value (IB, Socket, AWS Libfabric...)
    transports: count of connections per transport (P2P/IPC, SHM, NET/IB/0/GDRDMA...)
    nranks:     from ``comm ... nranks N`` (None: absent); nnodes from ``nNodes N``
    hosts:      hosts named by the line prefixes
    """

    rings: dict[int, tuple[int, ...]] = field(default_factory=dict)
    trees: dict[int, str] = field(default_factory=dict)
    net_devices: tuple[str, ...] = ()
    net_transport: str = ""
    network: str = ""
    transports: dict[str, int] = field(default_factory=dict)
    nranks: int | None = None
    nnodes: int | None = None
    hosts: tuple[str, ...] = ()

    @property
    def crosses_network(self) -> bool | None:
        """True when some connection goes through NET; None when no connection line is seen."""
        if not self.transports:
            return None
        return any(t.startswith("NET") or t.startswith("CollNet") for t in self.transports)


def parse_nccl_debug(text: str) -> NcclTopology:
    """Collect the ring / tree / NET lines of an ``NCCL_DEBUG=INFO`` log (other lines ignored)."""
    rings: dict[int, tuple[int, ...]] = {}
    trees: dict[int, str] = {}
    devs: list[str] = []
    net_transport = ""
    network = ""
    transports: Counter[str] = Counter()
    nranks: int | None = None
    nnodes: int | None = None
    hosts: dict[str, None] = {}
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        if (h := _HOST.match(line)):
            hosts.setdefault(h.group(1), None)
        if (m := _CONN.search(line)):
            transports[m.group(3)] += 1
        elif (m := _RING.search(line)):
            rings.setdefault(int(m.group(1)), tuple(int(x) for x in m.group(3).split()))
        elif (m := _TREE.search(line)):
            for ch, spec in re.findall(r"\[(\d+)\]\s*(\S+)", m.group(1)):
                trees.setdefault(int(ch), spec)
        elif (m := _NET.search(line)):
            net_transport = net_transport or m.group(1)
            for _, dev in _NET_DEV.findall(m.group(2)):
                if dev not in devs:
                    devs.append(dev)
        elif (m := _USING.search(line)):
            network = network or line[m.start(1):].strip()
        elif (m := _COMM.search(line)):
            nranks = int(m.group(2))
            if m.group(3):
                nnodes = int(m.group(3))
    return NcclTopology(rings=rings, trees=trees, net_devices=tuple(devs),
                        net_transport=net_transport, network=network,
                        transports=dict(transports), nranks=nranks, nnodes=nnodes,
                        hosts=tuple(hosts))
