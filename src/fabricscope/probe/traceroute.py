"""Paris-style traceroute (edge): the path of an exact 5-tuple, hop by hop, cached.

Paris traceroute (Augustin et al., IMC'06) keeps every header field the ECMP hash reads
identical across TTLs, so all TTL-limited probes follow the same path as the flow itself.
Here each probe is a UDP datagram from the flow's own source port to its own destination
port; routers answer ``ICMP time exceeded`` which a raw socket reads, matching the quoted
UDP header to the flow.

What the inventory already says is not probed: a hop whose previous device has a single
next hop toward the destination (a single-homed NIC's leaf, the destination's leaf behind
a spine, the last link to the NIC) is known, so only the real ECMP choices cost a probe.
That also makes the trace work where a leaf's host ports share one gateway address.

A reply's source address names either a router *port* (``icmp_errors_use_inbound_ifaddr``,
as the lab sets: the link the probe came in on) or only a *device* (a loopback, a shared
gateway address): see :class:`HopMap`. A device is enough when one link joins it to the
previous hop; otherwise the flow is reported ambiguous, never guessed.

Routers rate-limit ICMP (Linux by default: 1 error per second per destination after a burst
of 6, and 1,000/s with a burst of 50 per router; switch control planes often less), so
probes are paced per fan-out point with AIMD (:class:`_Pace`: on a timeout, down to the reply
rate just observed; up by about 1 probe/s per second of replies), silent hops are retried, and :class:`TraceResult` says
what was covered and why the rest was not.
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fabricscope.fabric.inventory import Fabric, port_device
from fabricscope.fabric.routing import Routing
from fabricscope.model.errors import TransportError
from fabricscope.model.records import FiveTuple
from fabricscope.probe import wire

ICMP_TIME_EXCEEDED = 11
ICMP_UNREACHABLE = 3
_Key = tuple[str, str, int, int]


def _parse_icmp(pkt: bytes) -> tuple[str, int, _Key] | None:
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
    without binding the flow's UDP port, which a running agent holds."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    except PermissionError as exc:
        raise TransportError("traceroute: sending raw UDP needs root (CAP_NET_RAW)") from exc
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # never read: keep its copy of inbound UDP small
    try:
        s.bind((src_ip, 0))
    except OSError as exc:
        s.close()
        raise TransportError(f"traceroute: cannot send from {src_ip}: {exc.strerror} "
                             "(is that address on this host?)") from exc
    s.setblocking(False)
    return s


def _udp_datagram(sport: int, dport: int, payload: bytes) -> bytes:
    """UDP header + payload; checksum 0 ("none", allowed over IPv4; the ECMP hash ignores it)."""
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


@dataclass(frozen=True)
class HopMap:
    """What a reply's source address names: a router port, or only a device."""

    port_of_addr: Mapping[str, str]
    device_of_addr: Mapping[str, str]

    @classmethod
    def build(cls, fabric: Fabric, port_addr: Mapping[str, str] | None = None) -> HopMap:
        """From router port addresses (``port id -> address``, e.g. the lab's ``ports.json``)
        and the inventory's device addresses (switch loopbacks). An address on several ports
        (a shared gateway) names their device, or nothing when they are on several devices."""
        ports: dict[str, set[str]] = collections.defaultdict(set)
        for port, addr in (port_addr or {}).items():
            ports[addr].add(port)
        port_of: dict[str, str] = {}
        dev_of: dict[str, str] = {}
        for addr, ps in ports.items():
            devs = {port_device(p) for p in ps}
            if len(ps) == 1:
                port_of[addr] = next(iter(ps))
            elif len(devs) == 1:
                dev_of[addr] = next(iter(devs))
        for d in fabric.switches:
            if d.address is not None and d.address not in port_of:
                dev_of.setdefault(d.address, d.id)
        return cls(port_of, dev_of)


def resolve_hop(fabric: Fabric, candidates: Iterable[int], addr: str, hops: HopMap) -> tuple[int | None, str]:
    """The edge (among ``candidates``, the ECMP next hops) a reply from ``addr`` proves was
    taken, else (None, why): ``unknown-address``, ``ambiguous`` or ``inconsistent``."""
    ix = fabric.index
    cand = tuple(candidates)
    port = hops.port_of_addr.get(addr)
    if port is not None:
        hit = [e for e in cand if ix.to_port[e] == port]
        return (hit[0], "") if hit else (None, "inconsistent")
    dev = hops.device_of_addr.get(addr)
    if dev is None:
        return None, "unknown-address"
    hit = [e for e in cand if ix.node_ids[int(ix.dst[e])] == dev]
    if len(hit) == 1:
        return hit[0], ""
    return None, "ambiguous" if hit else "inconsistent"


@dataclass
class TraceResult:
    """Directed link ids per traced flow, why each other flow is not traced, and the cost."""

    paths: dict[FiveTuple, list[str]] = field(default_factory=dict)
    failed: dict[FiveTuple, str] = field(default_factory=dict)
    probes_sent: int = 0
    replies: int = 0
    retries: int = 0
    send_errors: int = 0
    first_send_error: str = ""
    elapsed_s: float = 0.0

    @property
    def coverage(self) -> float:
        n = len(self.paths) + len(self.failed)
        return len(self.paths) / n if n else 0.0

    def summary(self) -> str:
        """One line: coverage, probes, and the reasons for what is missing."""
        n = len(self.paths) + len(self.failed)
        why = collections.Counter(r.split(":", 1)[0] for r in self.failed.values())
        miss = ", ".join(f"{k} {v}" for k, v in why.most_common()) or "none"
        err = (f"; {self.send_errors} sends refused by this host ({self.first_send_error})"
               if self.send_errors else "")
        return (f"traced {len(self.paths)}/{n} flows ({100 * self.coverage:.0f}% coverage) with "
                f"{self.probes_sent} probes ({self.retries} retries) in {self.elapsed_s:.1f} s; "
                f"not traced: {miss}{err}")


@dataclass
class _Walk:
    flow: FiveTuple
    node: int
    dst: int
    edges: list[int]
    attempts: int = 0  # probes that left, at this hop
    refused: int = 0  # sends this host refused, at this hop (a separate budget: no evidence on the hop)


class _Pace:
    """AIMD send rate of one fan-out point (the routers behind one device).

    On a timeout (at most once per timeout: one window's losses are one event) the rate drops
    to the lower of half and the reply rate just observed (what the routers really deliver,
    so it converges in a round or two instead of many halvings that burn retries); each reply
    adds ``1 / rate`` (about one probe/s more per second of success)."""

    def __init__(self, rate: float, lo: float, hi: float) -> None:
        self.rate, self.lo, self.hi = rate, lo, hi
        self.next_t = 0.0
        self.cut_t = -1e9
        self.queue: collections.deque[_Walk] = collections.deque()
        self.answers: collections.deque[float] = collections.deque()

    def loss(self, now: float, timeout: float) -> None:
        if now - self.cut_t < timeout:
            return
        window = 2 * timeout
        while self.answers and now - self.answers[0] > window:
            self.answers.popleft()
        self.rate = max(self.lo, min(self.rate / 2, len(self.answers) / window))
        self.cut_t = now

    def ok(self, now: float) -> None:
        self.answers.append(now)
        self.rate = min(self.hi, self.rate + 1.0 / self.rate)


def trace_paths(fabric: Fabric, flows: Iterable[FiveTuple], hops: HopMap, *, pps: float = 50.0,
                min_pps: float = 0.5, timeout_s: float = 1.0, retries: int = 8,
                deadline_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                ) -> TraceResult:
    """Trace each flow's path as directed link ids (see the module docstring).

    ``pps``: the most probes per second overall and per fan-out point (each point's
    rate adapts down to ``min_pps``); ``retries``: extra tries of a silent hop; stops at
    ``deadline_s``. Needs CAP_NET_RAW (root). Flows whose endpoints are not inventory NICs
    are reported ``not-in-inventory``.
    """
    ix = fabric.index
    routing = Routing(fabric)
    res = TraceResult()
    t0 = clock()
    walks: list[_Walk] = []
    for f in dict.fromkeys(flows):
        src, dst = fabric.nic_by_address.get(f.src_ip), fabric.nic_by_address.get(f.dst_ip)
        if src is None or dst is None:
            res.failed[f] = "not-in-inventory"
            continue
        walks.append(_Walk(f, ix.node_of[src.id], ix.node_of[dst.id], []))
    paces: dict[int, _Pace] = {}

    def advance(w: _Walk) -> None:
        """Follow known hops; queue the walk at its next ECMP choice, or finish it."""
        while True:
            cand = routing.next_hops(w.node, w.dst)
            if not cand:
                res.failed[w.flow] = f"no-route: from {ix.node_ids[w.node]}"
                return
            if len(cand) == 1:
                w.edges.append(cand[0])
                w.node = int(ix.dst[cand[0]])
                if w.node == w.dst:
                    res.paths[w.flow] = [ix.edge_id(e) for e in w.edges]
                    return
                continue
            w.attempts = w.refused = 0
            p = paces.get(w.node)
            if p is None:
                p = paces[w.node] = _Pace(pps, min_pps, pps)
            p.queue.append(w)
            return

    for w in walks:
        advance(w)
    if not paces:
        res.elapsed_s = clock() - t0
        return res
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except PermissionError as exc:
        raise TransportError("traceroute: reading ICMP needs root (CAP_NET_RAW)") from exc
    raw.setblocking(False)
    senders: dict[str, socket.socket] = {}
    payload = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 0, 0, 0))
    outstanding: dict[_Key, tuple[_Walk, float]] = {}
    in_flight: collections.deque[tuple[float, _Key]] = collections.deque()
    global_next = 0.0

    def give_up(w: _Walk, why: str) -> None:
        res.failed[w.flow] = f"{why}: after {ix.node_ids[w.node]} (ttl {len(w.edges) + 1})"

    try:
        while (any(p.queue for p in paces.values()) or outstanding):
            now = clock()
            if now - t0 > deadline_s:
                for w, _t in outstanding.values():
                    give_up(w, "deadline")
                for p in paces.values():
                    for w in p.queue:
                        give_up(w, "deadline")
                break
            while in_flight and now - in_flight[0][0] > timeout_s:  # silent hops
                _t, key = in_flight.popleft()
                hit = outstanding.pop(key, None)
                if hit is None:
                    continue
                w = hit[0]
                paces[w.node].loss(now, timeout_s)
                if w.attempts > retries:
                    give_up(w, "silent-hop")
                else:
                    res.retries += 1
                    paces[w.node].queue.append(w)
            for p in paces.values():  # send what the pacing allows
                if not p.queue or p.next_t > now or global_next > now:
                    continue
                w = p.queue.popleft()
                f = w.flow
                key = (f.src_ip, f.dst_ip, f.src_port, f.dst_port)
                sock = senders.get(f.src_ip)
                if sock is None:
                    sock = senders[f.src_ip] = _udp_sender(f.src_ip)
                p.next_t = now + 1.0 / p.rate
                global_next = now + 1.0 / pps
                try:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, len(w.edges) + 1)
                    sock.sendto(_udp_datagram(f.src_port, f.dst_port, payload), (f.dst_ip, 0))
                except OSError as exc:  # a local firewall (EPERM), no route, a full queue
                    res.send_errors += 1
                    res.first_send_error = res.first_send_error or f"{exc.strerror or exc}"
                    w.refused += 1
                    if w.refused > retries:
                        give_up(w, "send-refused")
                    else:
                        p.queue.append(w)
                    continue
                w.attempts += 1
                res.probes_sent += 1
                outstanding[key] = (w, now)
                in_flight.append((now, key))
            wake = [p.next_t for p in paces.values() if p.queue] + [global_next]
            if in_flight:
                wake.append(in_flight[0][0] + timeout_s)
            wait = max(0.0, min(min(wake) - clock(), 0.05))
            r, _, _ = select.select([raw], [], [], wait)
            while r:
                try:
                    pkt = raw.recv(2048)
                except BlockingIOError:
                    break
                parsed = _parse_icmp(pkt)
                r, _, _ = select.select([raw], [], [], 0)
                if parsed is None:
                    continue
                router, typ, key = parsed
                hit = outstanding.get(key)
                if hit is None or typ not in (ICMP_TIME_EXCEEDED, ICMP_UNREACHABLE):
                    continue
                del outstanding[key]
                w = hit[0]
                res.replies += 1
                paces[w.node].ok(clock())
                e, why = resolve_hop(fabric, routing.next_hops(w.node, w.dst), router, hops)
                if e is None:
                    give_up(w, f"{why} {router}")
                    continue
                w.edges.append(e)
                w.node = int(ix.dst[e])
                if w.node == w.dst:
                    res.paths[w.flow] = [ix.edge_id(x) for x in w.edges]
                else:
                    advance(w)
    finally:
        raw.close()
        for s in senders.values():
            s.close()
    res.elapsed_s = clock() - t0
    return res


def path_cache_entries(result: TraceResult) -> list[dict[str, object]]:
    """The JSON rows ``probe analyze --paths`` reads (one per traced flow)."""
    return [{"src_ip": f.src_ip, "dst_ip": f.dst_ip, "src_port": f.src_port, "dst_port": f.dst_port,
             "links": links} for f, links in result.paths.items()]


def local_ipv4_addresses() -> list[str]:
    """The IPv4 addresses on this host's (this namespace's) interfaces, from ``ip -o -4 addr``."""
    import shutil
    import subprocess

    ip = shutil.which("ip")
    if ip is None:
        raise TransportError("traceroute: cannot list this host's addresses (no `ip` command); give --self")
    try:
        out = subprocess.run([ip, "-o", "-4", "addr", "show"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise TransportError(f"traceroute: `ip -o -4 addr show` failed ({exc}); give --self") from None
    addrs = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addrs.append(parts[parts.index("inet") + 1].split("/", 1)[0])
    return addrs
