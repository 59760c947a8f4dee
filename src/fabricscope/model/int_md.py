"""INT-MD: the in-band network telemetry header and per-hop metadata stack, as bytes.

Follows the P4.org "In-band Network Telemetry (INT) Dataplane Specification", version 2.1
(2020-11-11), section "INT-MD Metadata Header Format": a 12-byte header

    Ver = 2 (4b) | D | E | M | Reserved (12b) | Hop ML (5b) | Remaining Hop Count (8b)
    Instruction Bitmap (16b) | Domain Specific ID (16b)
    DS Instruction (16b) | DS Flags (16b)

followed by the metadata stack: every INT hop pushes ``Hop ML`` x 4 bytes on top, so the most
recent hop comes first. A hop writes the metadata its instruction bits ask for, in bit order
(bit 0 is the bitmap's most significant bit), big-endian:

======  ==================================================  ======
bit     metadata                                            bytes
======  ==================================================  ======
0       node ID                                             4
1       level 1 ingress interface ID + egress interface ID  2 + 2
2       hop latency                                         4
3       queue ID + queue occupancy                          1 + 3
4       ingress timestamp                                   8
5       egress timestamp                                    8
6       level 2 ingress + egress interface ID               4 + 4
7       egress interface Tx utilization                     4
8       buffer ID + buffer occupancy                        1 + 3
9-14    reserved (all ones when set)                        4 each
15      checksum complement (last)                          4
======  ==================================================  ======

A value a hop cannot provide is all ones ("invalid"): :class:`IntHop` holds it as None. The
spec leaves units to each device model; the ones fabricscope's twin writes are in
:mod:`fabricscope.twin.transport_replay` (:data:`SEMANTICS`). Values too large for their
field saturate one below all ones, so that they never read as invalid.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

VERSION = 2
HEADER_BYTES = 12
NODE_ID, L1_PORTS, HOP_LATENCY, QUEUE, INGRESS_TS, EGRESS_TS, L2_PORTS, TX_UTIL, BUFFER = range(9)
CHECKSUM = 15
_WORDS = {b: (2 if b in (INGRESS_TS, EGRESS_TS, L2_PORTS) else 1) for b in range(16)}
#: What the twin asks for: node, level-1 ports, hop latency, queue, both timestamps, Tx
#: utilization (HPCC's per-hop queue length, timestamp and link load).
HPCC_INSTRUCTIONS = sum(1 << (15 - b) for b in (NODE_ID, L1_PORTS, HOP_LATENCY, QUEUE, INGRESS_TS,
                                                 EGRESS_TS, TX_UTIL))


class IntFormatError(ValueError):
    """Bytes that are not an INT-MD v2 header and stack (the message says which field)."""


@dataclass(frozen=True)
class IntHop:
    """One hop's metadata; None: not asked for by the instructions, or invalid (all ones)."""

    node_id: int | None = None
    l1_ingress: int | None = None
    l1_egress: int | None = None
    hop_latency: int | None = None
    queue_id: int | None = None
    queue_occupancy: int | None = None
    ingress_ts: int | None = None
    egress_ts: int | None = None
    l2_ingress: int | None = None
    l2_egress: int | None = None
    tx_utilization: int | None = None
    buffer_id: int | None = None
    buffer_occupancy: int | None = None


@dataclass(frozen=True)
class IntMdHeader:
    """The 12-byte INT-MD metadata header (``hop_ml`` in 4-byte words)."""

    instructions: int
    hop_ml: int
    remaining_hop_count: int
    discard: bool = False
    exceeded_hop_count: bool = False
    mtu_exceeded: bool = False
    domain_id: int = 0
    ds_instructions: int = 0
    ds_flags: int = 0
    version: int = VERSION


def hop_words(instructions: int) -> int:
    """Words (4 bytes) one hop writes for ``instructions`` (a 16-bit bitmap)."""
    if not 0 <= instructions < 1 << 16:
        raise IntFormatError(f"INT-MD: instruction bitmap: must be 16 bits, got {instructions:#x}")
    return sum(_WORDS[b] for b in range(16) if instructions >> (15 - b) & 1)


def _sat(v: int | None, bits: int) -> int:
    top = (1 << bits) - 1
    if v is None:
        return top
    return min(max(int(v), 0), top - 1)


def _val(v: int, bits: int) -> int | None:
    return None if v == (1 << bits) - 1 else v


def _pack_hop(h: IntHop, instructions: int) -> bytes:
    out = bytearray()
    for b in range(16):
        if not instructions >> (15 - b) & 1 or b == CHECKSUM:
            continue
        if b == NODE_ID:
            out += struct.pack(">I", _sat(h.node_id, 32))
        elif b == L1_PORTS:
            out += struct.pack(">HH", _sat(h.l1_ingress, 16), _sat(h.l1_egress, 16))
        elif b == HOP_LATENCY:
            out += struct.pack(">I", _sat(h.hop_latency, 32))
        elif b == QUEUE:
            out += struct.pack(">I", _sat(h.queue_id, 8) << 24 | _sat(h.queue_occupancy, 24))
        elif b == INGRESS_TS:
            out += struct.pack(">Q", _sat(h.ingress_ts, 64))
        elif b == EGRESS_TS:
            out += struct.pack(">Q", _sat(h.egress_ts, 64))
        elif b == L2_PORTS:
            out += struct.pack(">II", _sat(h.l2_ingress, 32), _sat(h.l2_egress, 32))
        elif b == TX_UTIL:
            out += struct.pack(">I", _sat(h.tx_utilization, 32))
        elif b == BUFFER:
            out += struct.pack(">I", _sat(h.buffer_id, 8) << 24 | _sat(h.buffer_occupancy, 24))
        else:  # reserved: the invalid value
            out += b"\xff\xff\xff\xff"
    if instructions & 1:  # checksum complement, last: not computed here
        out += b"\xff\xff\xff\xff"
    return bytes(out)


def pack(header: IntMdHeader, stack: Sequence[IntHop]) -> bytes:
    """Header and stack (``stack[0]``: the most recent hop) as bytes. ``header.hop_ml`` must be
    what the instructions need (no domain-specific metadata is written)."""
    need = hop_words(header.instructions)
    if header.hop_ml != need:
        raise IntFormatError(f"INT-MD: hop_ml: the instructions need {need} words, got {header.hop_ml}")
    if not 0 <= header.remaining_hop_count < 256:
        raise IntFormatError(f"INT-MD: remaining_hop_count: must be 0..255, got {header.remaining_hop_count}")
    if header.ds_instructions:
        raise IntFormatError("INT-MD: ds_instructions: domain-specific metadata is not written here")
    w0 = (header.version & 0xF) << 28 | int(header.discard) << 27 | int(header.exceeded_hop_count) << 26 \
        | int(header.mtu_exceeded) << 25 | (header.hop_ml & 0x1F) << 8 | header.remaining_hop_count
    head = struct.pack(">IHHHH", w0, header.instructions, header.domain_id & 0xFFFF,
                       header.ds_instructions & 0xFFFF, header.ds_flags & 0xFFFF)
    return head + b"".join(_pack_hop(h, header.instructions) for h in stack)


def _unpack_hop(buf: bytes, instructions: int) -> IntHop:
    f: dict[str, int | None] = {}
    o = 0
    for b in range(16):
        if not instructions >> (15 - b) & 1 or b == CHECKSUM:
            continue
        if b in (INGRESS_TS, EGRESS_TS):
            (v,) = struct.unpack_from(">Q", buf, o)
            f["ingress_ts" if b == INGRESS_TS else "egress_ts"] = _val(v, 64)
            o += 8
            continue
        if b == L2_PORTS:
            a, c = struct.unpack_from(">II", buf, o)
            f["l2_ingress"], f["l2_egress"] = _val(a, 32), _val(c, 32)
            o += 8
            continue
        (w,) = struct.unpack_from(">I", buf, o)
        o += 4
        if b == NODE_ID:
            f["node_id"] = _val(w, 32)
        elif b == L1_PORTS:
            f["l1_ingress"], f["l1_egress"] = _val(w >> 16, 16), _val(w & 0xFFFF, 16)
        elif b == HOP_LATENCY:
            f["hop_latency"] = _val(w, 32)
        elif b == QUEUE:
            f["queue_id"], f["queue_occupancy"] = _val(w >> 24, 8), _val(w & 0xFFFFFF, 24)
        elif b == TX_UTIL:
            f["tx_utilization"] = _val(w, 32)
        elif b == BUFFER:
            f["buffer_id"], f["buffer_occupancy"] = _val(w >> 24, 8), _val(w & 0xFFFFFF, 24)
    return IntHop(**f)


def unpack(data: bytes) -> tuple[IntMdHeader, list[IntHop]]:
    """Header and stack (most recent hop first) from bytes; :class:`IntFormatError` names the
    field when the bytes are not a version-2 INT-MD header with whole hops behind it."""
    if len(data) < HEADER_BYTES:
        raise IntFormatError(f"INT-MD: {len(data)} bytes: shorter than the {HEADER_BYTES}-byte header")
    w0, instr, dom, ds_i, ds_f = struct.unpack_from(">IHHHH", data, 0)
    hdr = IntMdHeader(instructions=instr, hop_ml=w0 >> 8 & 0x1F, remaining_hop_count=w0 & 0xFF,
                      discard=bool(w0 >> 27 & 1), exceeded_hop_count=bool(w0 >> 26 & 1),
                      mtu_exceeded=bool(w0 >> 25 & 1), domain_id=dom, ds_instructions=ds_i, ds_flags=ds_f,
                      version=w0 >> 28)
    if hdr.version != VERSION:
        raise IntFormatError(f"INT-MD: version: {hdr.version}, expected {VERSION}")
    base = hop_words(instr)
    if hdr.hop_ml < base or hdr.hop_ml == 0:
        raise IntFormatError(f"INT-MD: hop_ml: {hdr.hop_ml} words, the instruction bitmap needs {base}")
    size = 4 * hdr.hop_ml
    body = data[HEADER_BYTES:]
    if len(body) % size:
        raise IntFormatError(f"INT-MD: stack: {len(body)} bytes is not a whole number of {size}-byte hops")
    # domain-specific words (hop_ml above the baseline) come after the baseline metadata and
    # before the checksum complement; they are skipped
    return hdr, [_unpack_hop(body[k:k + size], instr) for k in range(0, len(body), size)]
