"""gNMI protobuf <-> fabricscope values: paths, typed values, and flattening into TelemetryEvent.

This is the one place protobuf objects are touched: the target encodes here, the collector
flattens each notification here once (gnmic's "event" format) and nothing inward sees protobuf.

The stream encoder writes the protobuf wire format directly (``encode_*``): a leaf's path is
serialized once per subscription and every sample only appends the value bytes, which is
what lets one Python process push >100k updates/s. ``tests/test_telemetry_codec.py`` checks it
against the official message classes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from typing import Literal

from gnmi_pb import gnmi_pb2

from fabricscope.model.records import TelemetryEvent
from fabricscope.telemetry.paths import Elem, GPath, PathSyntaxError, schema_name, tags_of

Value = int | float | str | bool
ValueEncoding = Literal["typed", "json_ietf"]

__all__ = [
    "Flattener",
    "ValueEncoding",
    "decode_value",
    "encode_notification",
    "encode_sync_response",
    "from_proto_path",
    "to_proto_path",
    "typed_value",
]


def to_proto_path(path: GPath, *, target: str = "") -> gnmi_pb2.Path:
    return gnmi_pb2.Path(
        origin=path.origin,
        target=target or path.target,
        elem=[gnmi_pb2.PathElem(name=e.name, key=dict(e.keys)) for e in path.elems],
    )


def from_proto_path(p: gnmi_pb2.Path, *, source: str = "path") -> GPath:
    """A proto path as a :class:`GPath`; legacy ``element`` strings are rejected."""
    if len(p.element) and not len(p.elem):
        raise PathSyntaxError(f"{source}: deprecated 'element' field is not supported; use 'elem'")
    elems = []
    for i, e in enumerate(p.elem):
        if not e.name or any(c in e.name for c in "/[]="):
            raise PathSyntaxError(f"{source}: elem[{i}].name: invalid {e.name!r}")
        for k in e.key:
            if not k or any(c in k for c in "/[]="):
                raise PathSyntaxError(f"{source}: elem[{i}].key: invalid key name {k!r}")
        elems.append(Elem(e.name, tuple(sorted(e.key.items()))))
    return GPath(tuple(elems), p.origin, p.target)


def typed_value(v: Value, encoding: ValueEncoding = "typed") -> gnmi_pb2.TypedValue:
    if encoding == "json_ietf":
        return gnmi_pb2.TypedValue(json_ietf_val=json.dumps(v).encode())
    if isinstance(v, bool):
        return gnmi_pb2.TypedValue(bool_val=v)
    if isinstance(v, int):
        return gnmi_pb2.TypedValue(uint_val=v) if v >= 0 else gnmi_pb2.TypedValue(int_val=v)
    if isinstance(v, float):
        return gnmi_pb2.TypedValue(double_val=v)
    return gnmi_pb2.TypedValue(string_val=str(v))


def decode_value(tv: gnmi_pb2.TypedValue) -> Value:
    """The Python value of a TypedValue (JSON values decoded; unknown kinds as text)."""
    which = tv.WhichOneof("value")
    if which is None:
        return ""
    v = getattr(tv, which)
    if which in ("json_val", "json_ietf_val"):
        try:
            d: object = json.loads(v)
        except ValueError:
            return str(v.decode(errors="replace"))
        if isinstance(d, int | float | str | bool):
            return d
        return json.dumps(d)
    if which == "bytes_val":
        return str(bytes(v).hex())
    if which == "decimal_val":
        return float(v.digits) / float(10**v.precision)
    if which in ("leaflist_val", "any_val"):
        return str(v)
    if isinstance(v, int | float | str | bool):
        return v
    return str(v)


# ---------------------------------------------------------------- wire-format encoding
def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(tag << 3 | 2) + _varint(len(payload)) + payload


_DOUBLE = struct.Struct("<d").pack
_UINT_TAG = _varint(3 << 3 | 0)
_INT_TAG = _varint(2 << 3 | 0)
_DOUBLE_TAG = _varint(14 << 3 | 1)
_BOOL_TRUE = _varint(4 << 3 | 0) + b"\x01"
_BOOL_FALSE = _varint(4 << 3 | 0) + b"\x00"


def _value_bytes(v: Value, encoding: ValueEncoding) -> bytes:
    """A serialized TypedValue."""
    if encoding == "json_ietf":
        return _ld(11, json.dumps(v).encode())
    if v is True:
        return _BOOL_TRUE
    if v is False:
        return _BOOL_FALSE
    if isinstance(v, int):
        return (_UINT_TAG if v >= 0 else _INT_TAG) + _varint(v)
    if isinstance(v, float):
        return _DOUBLE_TAG + _DOUBLE(v)
    return _ld(1, str(v).encode())


def path_bytes(path: GPath) -> bytes:
    """A serialized ``gnmi.Path`` (no target), for :func:`encode_notification`."""
    return bytes(to_proto_path(path).SerializeToString(deterministic=True))


def encode_notification(
    ts_ns: int,
    prefix: bytes,
    updates: Iterable[tuple[bytes, Value]],
    encoding: ValueEncoding = "typed",
) -> bytes:
    """A serialized ``SubscribeResponse{update: Notification}``.

    ``prefix`` is a serialized Path (see :func:`prefix_bytes`), each update a serialized path
    (from :func:`path_bytes`) and a value.
    """
    parts = [_varint(1 << 3 | 0), _varint(ts_ns), _ld(2, prefix)]
    for pb, v in updates:
        vb = _value_bytes(v, encoding)
        body = b"\n" + _varint(len(pb)) + pb + b"\x1a" + _varint(len(vb)) + vb
        parts.append(b'"' + _varint(len(body)) + body)  # field 4, wire type 2 = 0x22 = '"'
    note = b"".join(parts)
    return b"\n" + _varint(len(note)) + note


def prefix_bytes(target: str, origin: str = "") -> bytes:
    return bytes(gnmi_pb2.Path(target=target, origin=origin).SerializeToString())


def encode_sync_response() -> bytes:
    return bytes(gnmi_pb2.SubscribeResponse(sync_response=True).SerializeToString())


# ---------------------------------------------------------------- flattening
class Flattener:
    """Turns Notifications into :class:`TelemetryEvent` lists, caching path -> (name, tags).

    The cache key is the serialized path, so every distinct leaf is parsed once per process
    (bounded by ``max_cache`` entries, cleared when full).
    """

    def __init__(self, *, max_cache: int = 1_000_000) -> None:
        self._cache: dict[bytes, tuple[str, dict[str, str]]] = {}
        self._prefix: dict[bytes, tuple[str, tuple[Elem, ...], str]] = {}
        self.max_cache = max_cache

    def flatten(
        self, note: gnmi_pb2.Notification, *, default_target: str = ""
    ) -> list[TelemetryEvent]:
        pkey = note.prefix.SerializeToString()
        pre = self._prefix.get(pkey)
        if pre is None:
            pp = from_proto_path(note.prefix, source="notification.prefix")
            pre = (pp.target, pp.elems, pp.origin)
            self._prefix[pkey] = pre
        target = pre[0] or default_target
        ts = note.timestamp
        cache = self._cache
        out: list[TelemetryEvent] = []
        append = out.append
        for u in note.update:
            key = pkey + u.path.SerializeToString()
            nt = cache.get(key)
            if nt is None:
                if len(cache) >= self.max_cache:
                    cache.clear()
                full = GPath(pre[1] + from_proto_path(u.path, source="update.path").elems, pre[2])
                tags = tags_of(full)
                nt = (schema_name(full), tags)
                cache[key] = nt
            tv = u.val
            which = tv.WhichOneof("value")
            if which in ("uint_val", "double_val", "int_val", "string_val", "bool_val", "float_val"):
                val = getattr(tv, which)
            else:
                val = decode_value(tv)
            append(TelemetryEvent(nt[0], ts, target, nt[1], val))
        for d in note.delete:
            full = GPath(pre[1] + from_proto_path(d, source="delete.path").elems, pre[2])
            append(TelemetryEvent(schema_name(full), ts, target, {**tags_of(full), "deleted": "true"}, ""))
        return out


def event_paths(events: Sequence[TelemetryEvent]) -> list[str]:
    """Human-readable ``target name{tags}`` strings (CLI output)."""
    return [f"{e.target} {e.name}{dict(e.tags)}" for e in events]
