"""The probe packet wire format: encode and decode, rejecting foreign or malformed bytes.

Layout (network byte order, 48 bytes, documented in docs/probe.md)::

    offset size field
    0      4    magic        b"FSPB"
    4      1    version      1
    5      1    type         1 = request, 2 = reply
    6      2    flags        0 (reserved; a reply echoes the request's flags)
    8      4    session      random per prober run; replies echo it (stale replies are dropped)
    12     4    rx_count     in a reply: requests the responder has received on this flow
                                 (session, source address, source port), mod 2**32; 0 in a request
    16     8    seq          probe sequence number, per prober
    24     8    t_send_ns    prober clock when the request left (kernel timestamp if known)
    32     8    t_resp_rx_ns responder clock when the request arrived (0 in a request)
    40     8    t_resp_tx_ns responder clock when the reply left (0 in a request)

The responder copies the request, flips ``type`` to reply and fills its two timestamps, so
analysis can subtract the responder's processing time from the round trip (Pingmesh,
R-Pingmesh). ``rx_count`` works like TWAMP's reflector sequence number (RFC 5357): comparing it
with the number of requests sent on the flow tells the prober how many *requests* were lost,
so lost probes split into request-path and reply-path losses (one-way loss direction without
synchronized clocks). Padding beyond 48 bytes is allowed (to probe with larger packets) and
ignored, up to :data:`MAX_SIZE` (the UDP payload of a 9,000-byte jumbo frame): a larger datagram
is rejected as ``oversize`` — never truncated to a buffer and answered as if it were whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Final

from fabricscope.model.errors import TransportError

MAGIC: Final = b"FSPB"
VERSION: Final = 1
TYPE_REQUEST: Final = 1
TYPE_REPLY: Final = 2
HEADER: Final = struct.Struct("!4sBBHIIQqqq")
SIZE: Final = HEADER.size  # 48
MAX_SIZE: Final = 9000 - 20 - 8  # UDP payload of a 9,000-byte IPv4 jumbo frame
REASONS: Final = frozenset({"short", "oversize", "magic", "version", "type", "timestamps"})
_U64 = 2**64
_I64_MAX = 2**63 - 1


class MalformedPacket(TransportError):
    """Bytes that are not a valid probe packet; ``reason`` is a short stable code.

    Reasons (:data:`REASONS`): ``short`` (fewer than 48 bytes), ``oversize`` (more than
    :data:`MAX_SIZE` bytes), ``magic`` (foreign traffic), ``version`` (a newer or older format),
    ``type`` (unknown packet type, or a reply sent to a responder), ``timestamps`` (negative times).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"probe packet rejected ({reason}): {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ProbePacket:
    """One probe request or reply."""

    type: int
    session: int
    seq: int
    t_send_ns: int
    t_resp_rx_ns: int = 0
    t_resp_tx_ns: int = 0
    flags: int = 0
    rx_count: int = 0

    @property
    def is_request(self) -> bool:
        return self.type == TYPE_REQUEST

    def reply(self, t_resp_rx_ns: int, t_resp_tx_ns: int, rx_count: int = 0) -> ProbePacket:
        """The reply a responder sends for this request."""
        return replace(self, type=TYPE_REPLY, t_resp_rx_ns=t_resp_rx_ns,
                       t_resp_tx_ns=t_resp_tx_ns, rx_count=rx_count)


def encode(p: ProbePacket, *, size: int = SIZE) -> bytes:
    """The bytes of ``p``, zero-padded to ``size`` (48..MAX_SIZE). Fields out of range raise ValueError."""
    if size > MAX_SIZE:
        raise ValueError(f"probe packet size must be <= {MAX_SIZE} bytes, got {size}")
    if p.type not in (TYPE_REQUEST, TYPE_REPLY):
        raise ValueError(f"probe packet type must be 1 or 2, got {p.type}")
    for name, v, hi in (("session", p.session, 2**32), ("seq", p.seq, _U64),
                        ("flags", p.flags, 2**16), ("rx_count", p.rx_count, 2**32)):
        if not 0 <= v < hi:
            raise ValueError(f"probe packet {name} out of range: {v}")
    for name, v in (("t_send_ns", p.t_send_ns), ("t_resp_rx_ns", p.t_resp_rx_ns),
                    ("t_resp_tx_ns", p.t_resp_tx_ns)):
        if not 0 <= v <= _I64_MAX:
            raise ValueError(f"probe packet {name} out of range: {v}")
    raw = HEADER.pack(MAGIC, VERSION, p.type, p.flags, p.session, p.rx_count, p.seq,
                      p.t_send_ns, p.t_resp_rx_ns, p.t_resp_tx_ns)
    return raw + b"\0" * (size - SIZE) if size > SIZE else raw


def decode(data: bytes) -> ProbePacket:
    """Parse a probe packet; raise :class:`MalformedPacket` naming the reason otherwise."""
    if len(data) < SIZE:
        raise MalformedPacket("short", f"{len(data)} bytes < {SIZE}")
    if len(data) > MAX_SIZE:
        raise MalformedPacket("oversize", f"{len(data)} bytes > {MAX_SIZE}")
    magic, version, typ, flags, session, rx_count, seq, ts, rx, tx = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedPacket("magic", f"magic {magic!r} != {MAGIC!r}")
    if version != VERSION:
        raise MalformedPacket("version", f"version {version} != {VERSION}")
    if typ not in (TYPE_REQUEST, TYPE_REPLY):
        raise MalformedPacket("type", f"type {typ} unknown")
    if ts < 0 or rx < 0 or tx < 0:
        raise MalformedPacket("timestamps", f"negative timestamp in ({ts}, {rx}, {tx})")
    return ProbePacket(typ, session, seq, ts, rx, tx, flags, rx_count)


def reply_in_place(data: bytes, t_resp_rx_ns: int, t_resp_tx_ns: int, rx_count: int = 0) -> bytes:
    """The reply to a valid request ``data`` without building objects (the responder fast path).

    Raises :class:`MalformedPacket` when ``data`` is not a request.
    """
    p = decode(data)
    if not p.is_request:
        raise MalformedPacket("type", "a reply sent to a responder")
    return (data[:5] + bytes((TYPE_REPLY,)) + data[6:12] + struct.pack("!I", rx_count & 0xFFFFFFFF)
            + data[16:32] + struct.pack("!qq", t_resp_rx_ns, t_resp_tx_ns) + data[SIZE:])
