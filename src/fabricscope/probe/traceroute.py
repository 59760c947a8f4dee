"""Paris-style traceroute (edge): the path of an exact 5-tuple, hop by hop, cached.

Paris traceroute (Augustin et al., IMC'06) keeps every header field the ECMP hash reads
identical across TTLs, so all TTL-limited probes follow the same path as the flow itself.
Here each probe is a UDP datagram from the flow's own source port to its own destination
port; routers answer ``ICMP time exceeded`` which a raw socket reads, matching the quoted
UDP header to the flow. With ``icmp_errors_use_inbound_ifaddr=1`` (set by the lab) the ICMP
source is the *ingress* interface of that router, which names the link the probe arrived on.
All flows of one TTL are sent together, so a round costs one timeout, not one per flow.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterable, Mapping

from fabricscope.fabric.inventory import Fabric
from fabricscope.model.errors import TransportError
from fabricscope.model.records import FiveTuple
from fabricscope.probe import wire

ICMP_TIME_EXCEEDED = 11
ICMP_UNREACHABLE = 3


def _parse_icmp(pkt: bytes) -> tuple[str, int, tuple[str, str, int, int]] | None:
    """(router address, icmp type, quoted (src ip, dst ip, sport, dport)) or None."""
    if len(pkt) < 20:
        return None
    ihl = (pkt[0] & 0x0F) * 4
    src = socket.inet_ntoa(pkt[12:16])
    icmp = pkt[ihl:]
    if len(icmp) < 8 + 20 + 8:
        return None
    typ = icmp[0]
    inner = icmp[8:]
    iihl = (inner[0] & 0x0F) * 4
    if inner[9] != 17 or len(inner) < iihl + 4:
        return None
    qs, qd = socket.inet_ntoa(inner[12:16]), socket.inet_ntoa(inner[16:20])
    sport, dport = struct.unpack_from("!HH", inner, iihl)
    return src, typ, (qs, qd, sport, dport)


def _udp_sender(src_ip: str) -> socket.socket:
    """A raw UDP socket bound to ``src_ip`` only: it sends the flow's exact UDP header
    without binding the flow's UDP port, which a running agent holds (a second socket bound
    with SO_REUSEADDR would steal the agent's probes and replies while tracing)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    except PermissionError as exc:
        raise TransportError("traceroute: sending raw UDP needs root (CAP_NET_RAW)") from exc
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # never read: keep its copy of inbound UDP small
    try:
        s.bind((src_ip, 0))
    except OSError as exc:
        s.close()
        raise TransportError(f"traceroute: cannot send from {src_ip}: {exc.strerror}") from exc
    return s


def _udp_datagram(sport: int, dport: int, payload: bytes) -> bytes:
    """UDP header + payload; checksum 0 ("none", allowed over IPv4; the ECMP hash ignores it)."""
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def trace(flows: Iterable[FiveTuple], *, max_ttl: int = 8, timeout_s: float = 1.0,
          stop_at: Mapping[str, set[str]] | None = None) -> dict[FiveTuple, list[str | None]]:
    """Hop addresses (None where a hop did not answer) of each flow, TTL 1..max_ttl.

    ``stop_at[dst_ip]``: addresses after which the flow is complete (its last router).
    Needs CAP_NET_RAW (root) for the ICMP socket.
    """
    todo = list(dict.fromkeys(flows))
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except PermissionError as exc:
        raise TransportError("traceroute: reading ICMP needs root (CAP_NET_RAW)") from exc
    socks: dict[str, socket.socket] = {}
    hops: dict[FiveTuple, list[str | None]] = {f: [] for f in todo}
    done: set[FiveTuple] = set()
    by_key = {(f.src_ip, f.dst_ip, f.src_port, f.dst_port): f for f in todo}
    payload = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 0, 0, 0))
    try:
        for ttl in range(1, max_ttl + 1):
            live = [f for f in todo if f not in done]
            if not live:
                break
            for f in live:
                s = socks.get(f.src_ip)
                if s is None:
                    s = _udp_sender(f.src_ip)
                    socks[f.src_ip] = s
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
                s.sendto(_udp_datagram(f.src_port, f.dst_port, payload), (f.dst_ip, 0))
                hops[f].append(None)
            deadline = time.monotonic() + timeout_s
            pending = set(live)
            while pending and (left := deadline - time.monotonic()) > 0:
                r, _, _ = select.select([raw], [], [], left)
                if not r:
                    break
                pkt = raw.recv(2048)
                parsed = _parse_icmp(pkt)
                if parsed is None:
                    continue
                router, typ, key = parsed
                hit = by_key.get(key)
                if hit is None or hit not in pending or typ not in (ICMP_TIME_EXCEEDED, ICMP_UNREACHABLE):
                    continue
                pending.discard(hit)
                hops[hit][-1] = router
                if typ == ICMP_UNREACHABLE or (stop_at and router in stop_at.get(hit.dst_ip, set())):
                    done.add(hit)
    finally:
        raw.close()
        for s in socks.values():
            s.close()
    return hops


def links_of(fabric: Fabric, flow: FiveTuple, hop_addrs: list[str | None],
             port_of_addr: Mapping[str, str]) -> list[str] | None:
    """Directed link ids of a traced flow, or None when a hop is missing or inconsistent.

    Each hop address is a router's ingress port (the link it came in on); the last link
    (leaf -> destination NIC) comes from the inventory.
    """
    src = fabric.nic_by_address.get(flow.src_ip)
    dst = fabric.nic_by_address.get(flow.dst_ip)
    if src is None or dst is None:
        return None
    peer = fabric.peer_port
    links: list[str] = []
    prev_dev = src.id
    for a in hop_addrs:
        if a is None:
            return None
        port = port_of_addr.get(a)
        if port is None:
            return None
        frm = peer[port]
        if frm.rsplit(":", 1)[0] != prev_dev:
            return None
        links.append(f"{frm}->{port}")
        prev_dev = port.rsplit(":", 1)[0]
    dst_port = fabric.ports_of[dst.id][0]
    leaf_port = peer[dst_port]
    if leaf_port.rsplit(":", 1)[0] != prev_dev:
        return None
    links.append(f"{leaf_port}->{dst_port}")
    return links


def path_cache(fabric: Fabric, flows: Iterable[FiveTuple], port_addr: Mapping[str, str], **kw: float) -> list[dict[str, object]]:
    """Trace ``flows`` and return path-cache entries (the JSON ``probe analyze --paths`` reads)."""
    port_of_addr = {a: p for p, a in port_addr.items()}
    # A flow is complete at the router port that faces... the destination's leaf: any
    # ingress port of that leaf.
    stop: dict[str, set[str]] = {}
    for n in fabric.nics:
        leaf = fabric.peer_port[fabric.ports_of[n.id][0]].rsplit(":", 1)[0]
        assert n.address is not None
        stop[n.address] = {a for p, a in port_addr.items() if p.rsplit(":", 1)[0] == leaf}
    fl = list(dict.fromkeys(flows))
    out: list[dict[str, object]] = []
    for _attempt in range(3):  # a busy host can miss an ICMP: retry the untraced flows
        if not fl:
            break
        hops = trace(fl, stop_at=stop, **kw)  # type: ignore[arg-type]
        missed = []
        for f in fl:
            links = links_of(fabric, f, hops[f], port_of_addr)
            if links is None:
                missed.append(f)
            else:
                out.append({"src_ip": f.src_ip, "dst_ip": f.dst_ip, "src_port": f.src_port,
                            "dst_port": f.dst_port, "links": links})
        fl = missed
    return out
