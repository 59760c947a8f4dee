"""The bus batch encoding: round trips, the documented layout, and hostile bytes (pure, no server)."""

from __future__ import annotations

import contextlib
import math
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.cluster import encoding as enc
from fabricscope.cluster.encoding import (
    BatchFormatError,
    batch_id,
    batch_kind,
    decode_events,
    decode_findings,
    decode_probe_batch,
    decode_probes,
    encode_events,
    encode_findings,
    encode_probes,
    subject_token,
)
from fabricscope.model.errors import FabricscopeError
from fabricscope.model.records import Finding, FiveTuple, ProbeSample, TelemetryEvent
from fuzzing import fuzz_settings

I64 = st.integers(-(1 << 63), (1 << 63) - 1)
text = st.text(max_size=12)
values = st.one_of(
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.integers((1 << 63), (1 << 64) - 1),  # uint64 counters
    st.integers(min_value=1 << 64, max_value=1 << 100),  # beyond uint64: decimal string
    st.integers(max_value=-(1 << 63) - 1, min_value=-(1 << 100)),
    st.floats(allow_nan=False),
    st.booleans(),
    text,
)
events_st = st.lists(st.builds(TelemetryEvent, name=st.sampled_from(["/a/b/in-octets", "/a/oper-status", "x"]) | text,
                               ts_ns=I64, target=st.sampled_from(["leaf1", "spine.2", ""]) | text,
                               tags=st.dictionaries(text, text, max_size=3), value=values), max_size=40)
details_st = st.dictionaries(text, st.one_of(st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False), text,
                                             st.booleans()), max_size=3)
findings_st = st.lists(st.builds(Finding, kind=text, subject=text, score=st.floats(allow_nan=False),
                                 window=st.tuples(I64, I64), evidence=st.lists(text, max_size=3).map(tuple),
                                 action=text, details=details_st), max_size=10)
opt_ts = st.none() | I64
probes_st = st.lists(st.builds(ProbeSample, src=text, dst=text,
                               flow=st.builds(FiveTuple, text, text, st.integers(0, 65535), st.integers(0, 65535),
                                              st.integers(0, 255)),
                               seq=I64, t_send_ns=I64, t_resp_rx_ns=opt_ts, t_resp_tx_ns=opt_ts, t_recv_ns=opt_ts),
                     max_size=10)


def _same_type_values(a: list[TelemetryEvent], b: list[TelemetryEvent]) -> None:
    # == treats True == 1 and 1.0 == 1; the encoding must keep the Python type too
    assert [type(e.value) for e in a] == [type(e.value) for e in b]


@given(events_st, st.booleans())
@fuzz_settings(400)
def test_events_round_trip(events: list[TelemetryEvent], compress: bool) -> None:
    data = encode_events(events, compress=compress)
    back = decode_events(data)
    assert back == events
    _same_type_values(back, events)
    assert batch_kind(data) == "events"


@given(findings_st, st.booleans())
@fuzz_settings(300)
def test_findings_round_trip(findings: list[Finding], compress: bool) -> None:
    back = decode_findings(encode_findings(findings, compress=compress))
    assert back == findings
    assert [[type(v) for v in f.details.values()] for f in back] == \
        [[type(v) for v in f.details.values()] for f in findings]


@given(probes_st, st.booleans())
@fuzz_settings(300)
def test_probes_round_trip(samples: list[ProbeSample], compress: bool) -> None:
    assert decode_probes(encode_probes(samples, compress=compress)) == samples


@given(probes_st, st.data())
@fuzz_settings(200)
def test_probe_statuses_round_trip(samples: list[ProbeSample], data: st.DataObject) -> None:
    codes = data.draw(st.lists(st.integers(0, 3), min_size=len(samples), max_size=len(samples)))
    assert decode_probe_batch(encode_probes(samples, statuses=codes)) == (samples, codes)
    assert decode_probe_batch(encode_probes(samples)) == (samples, [0] * len(samples))


def test_probe_status_out_of_range_or_miscounted_is_a_clear_error() -> None:
    s = ProbeSample("a", "b", FiveTuple("198.18.0.1", "198.18.0.2", 1, 2, 17), 1, 10, None, None, None)
    with pytest.raises(BatchFormatError, match="status 4 is not 0-3"):
        encode_probes([s], statuses=[4])
    with pytest.raises(BatchFormatError, match="2 probe statuses for 1 samples"):
        encode_probes([s], statuses=[1, 2])


def test_nan_and_negative_zero_keep_their_bits() -> None:
    ev = [TelemetryEvent("n", 1, "t", {}, math.nan), TelemetryEvent("n", 2, "t", {}, -0.0)]
    back = decode_events(encode_events(ev))
    assert math.isnan(back[0].value)  # type: ignore[arg-type]
    assert math.copysign(1.0, back[1].value) == -1.0  # type: ignore[arg-type]


def test_layout_matches_the_documented_bytes() -> None:
    """docs/design/cluster-bus.md, "Batch encoding": one event, byte by byte."""
    data = encode_events([TelemetryEvent("n", 5, "t", {"k": "v"}, 7)], compress=False)
    expected = b"".join([
        b"FSB", bytes([1]), bytes([1]), bytes([0]), b"\x00\x00",  # magic, version, kind=events, flags, reserved
        struct.pack("<I", 4), struct.pack("<4I", 1, 1, 1, 1), b"ntkv",  # string table: n, t, k, v
        struct.pack("<I", 1), struct.pack("<H", 1), struct.pack("<2I", 2, 3),  # one tag set {k: v}
        struct.pack("<I", 1), struct.pack("<I", 0), struct.pack("<I", 1), struct.pack("<I", 0),  # name, target, tags
        struct.pack("<q", 5), bytes([0]),  # ts, value kind 0 = int64
        struct.pack("<q", 7),  # the int64 column
    ])
    assert data == expected
    z = encode_events([TelemetryEvent("n", 5, "t", {"k": "v"}, 7)], compress=True)
    assert z[:8] == b"FSB\x01\x01\x01\x00\x00"
    assert struct.unpack_from("<I", z, 8)[0] == len(expected) - 8
    assert zlib.decompress(z[12:]) == expected[8:]


def test_batch_id_is_content_addressed() -> None:
    a = encode_events([TelemetryEvent("n", 5, "t", {}, 7)])
    b = encode_events([TelemetryEvent("n", 6, "t", {}, 7)])
    assert batch_id(a) == batch_id(bytes(a)) and batch_id(a) != batch_id(b)
    assert len(batch_id(a)) == 32


def test_kind_mismatch_and_unencodable_values_are_clear_errors() -> None:
    data = encode_findings([])
    with pytest.raises(BatchFormatError, match="holds findings, expected events"):
        decode_events(data)
    with pytest.raises(BatchFormatError, match="not float/int/str/bool"):
        encode_events([TelemetryEvent("n", 1, "t", {}, [1, 2])])  # type: ignore[arg-type]
    with pytest.raises(BatchFormatError, match="ts_ns"):
        encode_events([TelemetryEvent("n", 1 << 64, "t", {}, 1)])
    with pytest.raises(BatchFormatError, match="expected a string"):
        encode_events([TelemetryEvent("n", 1, "t", {"k": 3}, 1)])  # type: ignore[dict-item]
    assert issubclass(BatchFormatError, ValueError) and issubclass(BatchFormatError, FabricscopeError)


def test_huge_counts_are_refused_before_allocating() -> None:
    head = b"FSB\x01\x01\x00\x00\x00"
    with pytest.raises(BatchFormatError, match="exceeds the limit"):
        decode_events(head + struct.pack("<I", 0xFFFFFFFF))
    with pytest.raises(BatchFormatError, match="truncated"):
        decode_events(head + struct.pack("<I", enc.MAX_STRINGS))  # 4 MiB of lengths claimed, none there
    bomb = zlib.compress(b"\x00" * (8 << 20))
    with pytest.raises(BatchFormatError, match="exceeds"):
        decode_events(b"FSB\x01\x01\x01\x00\x00" + struct.pack("<I", enc.MAX_BODY_BYTES + 1) + bomb)
    with pytest.raises(BatchFormatError, match="is not 16 bytes"):
        decode_events(b"FSB\x01\x01\x01\x00\x00" + struct.pack("<I", 16) + bomb)  # lies about its size


def _valid_batches() -> list[bytes]:
    vals: list[float | int | str | bool] = [1, 2.5, "UP", True, 1 << 63, 1 << 70, False, -3]
    ev = [TelemetryEvent(f"/p/{i % 3}", i, f"t{i % 2}", {"if": f"e{i % 4}"}, v) for i, v in enumerate(vals)]
    f = [Finding("k", "s", 0.5, (1, 2), ("e",), "a", {"x": 1, "y": "z", "w": 2.0})]
    p = [ProbeSample("a", "b", FiveTuple("1", "2", 3, 4), 1, 2, 3, None, 5)]
    return [encode_events(ev), encode_events(ev, compress=True), encode_findings(f), encode_probes(p)]


DECODERS = (decode_events, decode_findings, decode_probes)


@given(st.binary(max_size=300))
@fuzz_settings()
def test_random_bytes_raise_only_the_clear_error(data: bytes) -> None:
    for dec in DECODERS:
        with contextlib.suppress(BatchFormatError):
            dec(data)


@given(st.sampled_from(_valid_batches()), st.data())
@fuzz_settings(3000)
def test_mutated_batches_raise_only_the_clear_error(batch: bytes, data: st.DataObject) -> None:
    b = bytearray(batch)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(b)))
    for candidate in (bytes(b), bytes(b[:cut])):
        for dec in DECODERS:
            with contextlib.suppress(BatchFormatError):
                dec(candidate)


@given(st.text(max_size=20), st.text(max_size=20))
@fuzz_settings(2000)
def test_subject_token_is_one_injective_token(a: str, b: str) -> None:
    ta, tb = subject_token(a), subject_token(b)
    assert ta and all(c.isascii() and (c.isalnum() or c in "_-%") for c in ta)
    assert (ta == tb) == (a == b)


def test_subject_token_examples() -> None:
    assert subject_token("leaf-p1-r3-07") == "leaf-p1-r3-07"
    assert subject_token("spine.1") == "spine%2E1"
    assert subject_token("a>*") == "a%3E%2A"
    assert subject_token("") == "%"
