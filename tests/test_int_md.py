"""INT-MD header and metadata stack (INT spec v2.1, "INT-MD Metadata Header Format") as bytes."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.model import int_md
from fabricscope.model.int_md import IntFormatError, IntHop, IntMdHeader


def test_bytes_follow_the_spec_layout_word_by_word() -> None:
    # node ID + level-1 ports + hop latency: bits 0-2 of the bitmap (its three top bits)
    instr = 0xE000
    assert int_md.hop_words(instr) == 3
    hdr = IntMdHeader(instructions=instr, hop_ml=3, remaining_hop_count=5, domain_id=0x0102)
    stack = [IntHop(node_id=7, l1_ingress=1, l1_egress=2, hop_latency=1500),
             IntHop(node_id=3, l1_ingress=9, l1_egress=10, hop_latency=0)]
    raw = int_md.pack(hdr, stack)
    expect = bytes.fromhex(
        "20000305"  # Ver 2 | D E M 0 | reserved | Hop ML 3 | Remaining Hop Count 5
        "e0000102"  # Instruction Bitmap | Domain Specific ID
        "00000000"  # DS Instruction | DS Flags
        "00000007" "00010002" "000005dc"  # the most recent hop first
        "00000003" "0009000a" "00000000")
    assert raw == expect
    back_hdr, back = int_md.unpack(raw)
    assert back_hdr == hdr and back == stack


def test_every_baseline_field_round_trips_and_invalid_is_all_ones() -> None:
    instr = sum(1 << (15 - b) for b in range(9))  # bits 0-8
    assert int_md.hop_words(instr) == 12  # 4-byte fields, 8-byte timestamps and level-2 ports
    full = IntHop(node_id=0xDEADBEEF, l1_ingress=65, l1_egress=66, hop_latency=123_456, queue_id=3,
                  queue_occupancy=1_000_000, ingress_ts=1_764_806_400_000_000_123,
                  egress_ts=1_764_806_400_000_123_579, l2_ingress=70_000, l2_egress=80_000,
                  tx_utilization=950_000, buffer_id=1, buffer_occupancy=2_000_000)
    missing = IntHop(node_id=5)  # everything else unavailable: all ones on the wire
    hdr = IntMdHeader(instructions=instr, hop_ml=12, remaining_hop_count=0, exceeded_hop_count=True)
    raw = int_md.pack(hdr, [full, missing])
    assert len(raw) == 12 + 2 * 48
    assert raw[12 + 48 + 4:12 + 48 + 8] == b"\xff\xff\xff\xff"  # the second hop's level-1 ports
    h, (a, b) = int_md.unpack(raw)
    assert h.exceeded_hop_count and not h.discard and a == full and b == missing


def test_values_too_large_saturate_below_the_invalid_value() -> None:
    instr = 1 << (15 - int_md.QUEUE)
    raw = int_md.pack(IntMdHeader(instr, 1, 3), [IntHop(queue_id=3, queue_occupancy=1 << 30)])
    _, (h,) = int_md.unpack(raw)
    assert h.queue_occupancy == (1 << 24) - 2 and h.queue_id == 3


@pytest.mark.parametrize(("data", "says"), [
    (b"\x20\x00", "shorter than the 12-byte header"),
    (bytes.fromhex("10000105" "80000000" "00000000"), "version: 1"),
    (bytes.fromhex("20000105" "80000000" "00000000" "0000"), "not a whole number of 4-byte hops"),
    (bytes.fromhex("20000105" "c0000000" "00000000"), "hop_ml: 1 words, the instruction bitmap needs 2"),
])
def test_malformed_bytes_are_one_clear_error(data: bytes, says: str) -> None:
    with pytest.raises(IntFormatError, match=says):
        int_md.unpack(data)


def test_hostile_bytes_raise_only_the_format_error() -> None:
    """2,000 random buffers (seeded), some with a valid-looking first word: decoding either
    works or raises IntFormatError, nothing else."""
    rng = np.random.default_rng(7)
    ok = 0
    for k in range(2000):
        n = int(rng.integers(0, 80))
        data = bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        if k % 2 and n >= 12:
            data[0] = 0x20  # version 2
        try:
            int_md.unpack(bytes(data))
            ok += 1
        except IntFormatError:
            pass
    assert ok > 0  # some decode: the version-2 half reaches the stack checks


def test_writing_refuses_a_header_that_does_not_match_its_stack() -> None:
    with pytest.raises(IntFormatError, match="hop_ml: the instructions need 1 words"):
        int_md.pack(IntMdHeader(instructions=0x8000, hop_ml=2, remaining_hop_count=1), [])
    with pytest.raises(IntFormatError, match="remaining_hop_count"):
        int_md.pack(IntMdHeader(instructions=0x8000, hop_ml=1, remaining_hop_count=300), [])
