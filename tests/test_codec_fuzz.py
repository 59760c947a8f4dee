"""Fuzz the raw notification decoder: bytes in -> events, or one TelemetryDecodeError.

Valid SubscribeResponse bytes (the fast encoder's and protobuf's own, with deletes, JSON
values, sync responses and target errors) are generated, then truncated, bit-flipped, spliced
or replaced by random bytes. ``WireFlattener.flatten`` must return events or raise
``TelemetryDecodeError``, never struct.error / IndexError / UnicodeDecodeError / RecursionError.
For unmutated input it must agree with the protobuf-based ``Flattener``.
"""

from __future__ import annotations

import random

from gnmi_pb import gnmi_pb2
from hypothesis import given
from hypothesis import strategies as st

from fabricscope.telemetry.codec import (
    Flattener,
    TelemetryDecodeError,
    WireFlattener,
    encode_notification,
    path_bytes,
    prefix_bytes,
    to_proto_path,
    typed_value,
)
from fabricscope.telemetry.paths import parse_path
from fuzzing import fuzz_settings

# A fixed pool of leaves (with keys, with characters that need escaping, long and short) keeps
# generation cheap so 10,000 examples run in seconds; the mutations do the exploring.
_PATHS = [
    "/a", "/interfaces/interface[name=eth1]/state/counters/in-octets",
    "/interfaces/interface[name=Ethernet1/1]/state/oper-status", "/qos/queue[id=3][q=x y]/state/depth",
    "/components/component[name=xcvr-\u00e9]/state/temperature/instant", "/" + "/".join(["x"] * 40),
]
_PATH_BYTES = [path_bytes(parse_path(p)) for p in _PATHS]
_VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.booleans(),
)


@st.composite
def valid_response(draw: st.DrawFn) -> bytes:
    """A well-formed SubscribeResponse in one of the shapes targets send."""
    kind = draw(st.sampled_from(["fast", "fast", "fast", "proto", "sync", "error", "delete"]))
    target = draw(st.sampled_from(["", "leaf-000", "spine-01"]))
    ts = draw(st.integers(min_value=0, max_value=2**63 - 1))
    if kind == "sync":
        return bytes(gnmi_pb2.SubscribeResponse(sync_response=True).SerializeToString())
    if kind == "error":
        return bytes(gnmi_pb2.SubscribeResponse(error=gnmi_pb2.Error(code=3, message="bad")).SerializeToString())
    idx = draw(st.lists(st.integers(min_value=0, max_value=len(_PATHS) - 1), min_size=1, max_size=5))
    values = draw(st.lists(_VALUES, min_size=len(idx), max_size=len(idx)))
    if kind == "fast":
        enc = draw(st.sampled_from(["typed", "json_ietf"]))
        return encode_notification(ts, prefix_bytes(target),
                                   [(_PATH_BYTES[i], v) for i, v in zip(idx, values, strict=True)], enc)
    note = gnmi_pb2.Notification(timestamp=ts, prefix=gnmi_pb2.Path(target=target))
    for i, v in zip(idx, values, strict=True):
        if kind == "delete":
            note.delete.append(to_proto_path(parse_path(_PATHS[i])))
        else:
            note.update.append(gnmi_pb2.Update(path=to_proto_path(parse_path(_PATHS[i])), val=typed_value(v)))
    return bytes(gnmi_pb2.SubscribeResponse(update=note).SerializeToString())


@st.composite
def mutated_response(draw: st.DrawFn) -> bytes:
    """A valid response with 1-4 mutations (truncate, bit flip, insert, delete, overwrite).

    The mutations come from one drawn seed (one draw instead of a dozen keeps 10,000 examples
    within seconds); the seed and the valid message are what Hypothesis reports on failure.
    """
    data = bytearray(draw(valid_response()))
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    for _ in range(rng.randint(1, 4)):
        if not data:
            break
        op = rng.choice(("truncate", "flip", "insert", "delete", "overwrite"))
        i = rng.randrange(len(data))
        if op == "truncate":
            data = data[:i]
        elif op == "flip":
            data[i] ^= 1 << rng.randrange(8)
        elif op == "insert":
            data[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == "delete":
            del data[i : i + rng.randint(1, 8)]
        else:
            data[i] = rng.randrange(256)
    return bytes(data)


def _decode(data: bytes) -> None:
    try:
        events, sync = WireFlattener().flatten(data, default_target="dflt")
    except TelemetryDecodeError:
        return
    assert isinstance(sync, bool)
    for e in events:
        assert isinstance(e.name, str) and isinstance(e.target, str)
        assert isinstance(e.value, int | float | str | bool)


@fuzz_settings()
@given(mutated_response())
def test_mutated_notification_gives_events_or_decode_error(data: bytes) -> None:
    _decode(data)


@fuzz_settings()
@given(st.one_of(st.binary(max_size=200), st.binary(max_size=8).map(lambda b: b"\x0a" + b)))
def test_random_bytes_give_events_or_decode_error(data: bytes) -> None:
    _decode(data)


@fuzz_settings(2000)
@given(valid_response())
def test_valid_notification_matches_protobuf_flattener(data: bytes) -> None:
    msg = gnmi_pb2.SubscribeResponse.FromString(data)
    if msg.HasField("error"):
        try:
            WireFlattener().flatten(data)
        except TelemetryDecodeError as exc:
            assert "target error" in str(exc)
            return
        raise AssertionError("a target error message must raise TelemetryDecodeError")
    events, sync = WireFlattener().flatten(data, default_target="dflt")
    assert sync == msg.sync_response
    expected = Flattener().flatten(msg.update, default_target="dflt") if msg.HasField("update") else []
    assert events == expected


def test_double_cut_short_is_a_decode_error_not_struct_error() -> None:
    """Issue 8 defect 1: a typed double value cut short raised struct.error."""
    whole = encode_notification(5, prefix_bytes("leaf-000"),
                                [(path_bytes(parse_path("/a/b")), 1.5)])
    # keep the framing lengths, drop the value's last 4 bytes (what a broken target sent)
    cut = whole[:-4]
    try:
        WireFlattener().flatten(cut)
    except TelemetryDecodeError as exc:
        assert "malformed" in str(exc)
    else:
        raise AssertionError("a truncated double must not decode")
