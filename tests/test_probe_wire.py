"""Probe wire format: Hypothesis round trips and rejection reasons."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.model.errors import TransportError
from fabricscope.probe import wire
from fuzzing import fuzz_settings

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
ts = st.integers(0, 2**63 - 1)


@given(st.sampled_from([wire.TYPE_REQUEST, wire.TYPE_REPLY]), u32, u64, ts, ts, ts,
       st.integers(0, 2**16 - 1), st.integers(0, 200), u32)
def test_round_trip(typ: int, session: int, seq: int, t0: int, t1: int, t2: int,
                    flags: int, pad: int, count: int) -> None:
    p = wire.ProbePacket(typ, session, seq, t0, t1, t2, flags, count)
    raw = wire.encode(p, size=wire.SIZE + pad)
    assert len(raw) == wire.SIZE + pad
    assert wire.decode(raw) == p


@given(u32, u64, ts, ts, ts, u32)
def test_reply_in_place_matches_object_reply(session: int, seq: int, t0: int, rx: int, tx: int,
                                             count: int) -> None:
    req = wire.ProbePacket(wire.TYPE_REQUEST, session, seq, t0)
    fast = wire.reply_in_place(wire.encode(req), rx, tx, count)
    assert wire.decode(fast) == req.reply(rx, tx, count)
    assert fast == wire.encode(req.reply(rx, tx, count))


@given(st.binary(max_size=100))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    try:
        p = wire.decode(data)
    except wire.MalformedPacket as exc:
        assert exc.reason in wire.REASONS
    else:
        assert data[:4] == wire.MAGIC and p.type in (1, 2)


def _good() -> bytearray:
    return bytearray(wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 7, 9, 11)))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:20], "short"),
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:4] + bytes([2]) + b[5:], "version"),
        (lambda b: b[:5] + bytes([9]) + b[6:], "type"),
        (lambda b: b[:24] + b"\xff" * 8 + b[32:], "timestamps"),
    ],
)
def test_rejection_reasons(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(wire.MalformedPacket) as ei:
        wire.decode(bytes(mutate(_good())))
    assert ei.value.reason == reason
    assert isinstance(ei.value, TransportError)


def test_reply_to_reply_rejected() -> None:
    rep = wire.encode(wire.ProbePacket(wire.TYPE_REPLY, 1, 1, 1, 2, 3))
    with pytest.raises(wire.MalformedPacket, match="type"):
        wire.reply_in_place(rep, 1, 2)


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="seq"):
        wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 0, -1, 0))
    with pytest.raises(ValueError, match="type"):
        wire.encode(wire.ProbePacket(5, 0, 0, 0))


def _check_decode(data: bytes) -> None:
    """The fuzz oracle: a packet or one documented rejection, never another exception; a
    decoded request always has a reply of the same length; oversize is never decoded."""
    try:
        p = wire.decode(data)
    except wire.MalformedPacket as exc:
        assert exc.reason in wire.REASONS, exc.reason
        if len(data) > wire.MAX_SIZE:
            assert exc.reason == "oversize"
        return
    assert wire.SIZE <= len(data) <= wire.MAX_SIZE
    assert data[:4] == wire.MAGIC and p.type in (wire.TYPE_REQUEST, wire.TYPE_REPLY)
    if p.is_request:
        out = wire.reply_in_place(data, 5, 6, 7)
        assert len(out) == len(data)
        assert wire.decode(out) == p.reply(5, 6, 7)
    else:
        with pytest.raises(wire.MalformedPacket):
            wire.reply_in_place(data, 5, 6, 7)


@fuzz_settings()
@given(st.binary(max_size=120), st.sampled_from([0, 0, 0, wire.MAX_SIZE - 100, wire.MAX_SIZE + 1]),
       st.integers(0, 120))
def test_fuzz_random_bytes(head: bytes, tail: int, jitter: int) -> None:
    # Random heads (most fail early) and, cheaply, lengths around MAX_SIZE: a random head
    # followed by padding, so the oversize boundary is crossed from both sides.
    _check_decode(head + bytes(max(0, tail - jitter)) if tail else head)


_packets = st.builds(
    wire.ProbePacket, st.sampled_from([wire.TYPE_REQUEST, wire.TYPE_REPLY]), u32, u64, ts, ts, ts,
    st.integers(0, 2**16 - 1), u32)


@fuzz_settings()
@given(_packets, st.sampled_from([0, 0, 1, 100, wire.MAX_SIZE - wire.SIZE]),
       st.lists(st.tuples(st.integers(0, wire.SIZE - 1), st.integers(0, 255)), max_size=3),
       st.integers(-wire.SIZE, 8))
def test_fuzz_mutated_valid_packets(p: wire.ProbePacket, pad: int, flips: list[tuple[int, int]],
                                    resize: int) -> None:
    raw = bytearray(wire.encode(p, size=wire.SIZE + pad))
    for pos, val in flips:
        raw[pos] = val
    if resize < 0:
        del raw[len(raw) + resize:]
    else:
        raw += bytes(resize)
    _check_decode(bytes(raw))


@pytest.mark.parametrize("size", [wire.MAX_SIZE + 1, 2 * wire.MAX_SIZE, 65_507])
def test_oversize_rejected_not_truncated(size: int) -> None:
    raw = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 1, 2, 3)) + bytes(size - wire.SIZE)
    with pytest.raises(wire.MalformedPacket) as ei:
        wire.decode(raw)
    assert ei.value.reason == "oversize"
    with pytest.raises(wire.MalformedPacket):
        wire.reply_in_place(raw, 1, 2)
    with pytest.raises(ValueError, match="size"):
        wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 1, 2, 3), size=size)
    # The largest legal probe (a jumbo frame's payload) is answered whole.
    big = wire.encode(wire.ProbePacket(wire.TYPE_REQUEST, 1, 2, 3), size=wire.MAX_SIZE)
    assert len(wire.reply_in_place(big, 1, 2)) == wire.MAX_SIZE
