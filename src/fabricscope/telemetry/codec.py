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
import re
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Literal

from gnmi_pb import gnmi_pb2
from google.protobuf.message import DecodeError

from fabricscope.model.errors import TransportError
from fabricscope.model.records import TelemetryEvent
from fabricscope.telemetry.paths import Elem, GPath, PathSyntaxError, schema_name, tags_of

Value = int | float | str | bool
ValueEncoding = Literal["typed", "json_ietf"]

__all__ = [
    "Flattener",
    "TelemetryDecodeError",
    "ValueEncoding",
    "decode_value",
    "encode_notification",
    "encode_sync_response",
    "from_proto_path",
    "to_proto_path",
    "typed_value",
]


_BAD_NAME = re.compile(r"[/\[\]=]")


class TelemetryDecodeError(TransportError, ValueError):
    """A SubscribeResponse that cannot be decoded (truncated, mutated, invalid path or UTF-8),
    or one that carries a target-side ``error``: the one error :meth:`WireFlattener.flatten`
    raises for bad bytes. The collector counts and skips the message; the stream goes on."""


# Everything a hostile or truncated message can make the decoders raise: protobuf's own
# DecodeError, the fast path's struct/index errors on a value cut short, invalid UTF-8 in a
# name, nesting past protobuf's recursion limit, and invalid path elements.
_DECODE_FAILURES = (DecodeError, ValueError, IndexError, struct.error, UnicodeDecodeError, RecursionError,
                    OverflowError, KeyError, TypeError, PathSyntaxError)


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
        name = e.name
        if not name or _BAD_NAME.search(name):
            raise PathSyntaxError(f"{source}: elem[{i}].name: invalid {name!r}")
        if e.key:
            keys = tuple(sorted(e.key.items()))
            for k, _ in keys:
                if not k or _BAD_NAME.search(k):
                    raise PathSyntaxError(f"{source}: elem[{i}].key: invalid key name {k!r}")
            elems.append(Elem(name, keys))
        else:
            elems.append(Elem(name))
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


# ---------------------------------------------------------------- fast wire decoding
_DBL = struct.Struct("<d").unpack_from
_FLT = struct.Struct("<f").unpack_from


def _uvarint(buf: bytes, i: int) -> tuple[int, int]:
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    result = b & 0x7F
    shift = 7
    i += 1
    while True:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return result, i
        shift += 7


def _skip(buf: bytes, i: int, wt: int) -> int:
    if wt == 0:
        return _uvarint(buf, i)[1]
    if wt == 1:
        return i + 8
    if wt == 2:
        n, i = _uvarint(buf, i)
        return i + n
    if wt == 5:
        return i + 4
    raise ValueError(f"unsupported wire type {wt}")


def _typed(buf: bytes) -> Value:
    """Decode a serialized TypedValue; scalar kinds inline, the rest through protobuf."""
    if buf:
        tag = buf[0]
        if tag == 0x18:  # uint_val
            return _uvarint(buf, 1)[0]
        if tag == 0x71:  # double_val
            return float(_DBL(buf, 1)[0])
        if tag == 0x0A:  # string_val
            n, i = _uvarint(buf, 1)
            return buf[i : i + n].decode()
        if tag == 0x10:  # int_val (two's complement int64)
            v = _uvarint(buf, 1)[0]
            return v - (1 << 64) if v >= 1 << 63 else v
        if tag == 0x20:
            return bool(_uvarint(buf, 1)[0])
        if tag == 0x35:
            return float(_FLT(buf, 1)[0])
    return decode_value(gnmi_pb2.TypedValue.FromString(buf))


def _path_elems(pb: bytes) -> tuple[str, dict[str, str]] | None:
    """(schema name, tags) straight from a serialized Path with only ``elem`` fields; None
    when it holds anything else (origin, legacy elements) or names that need validation."""
    names: list[str] = []
    tags: dict[str, str] = {}
    i, n = 0, len(pb)
    while i < n:
        if pb[i] != 0x1A:  # elem
            return None
        ln, i = _uvarint(pb, i + 1)
        end = i + ln
        name = ""
        while i < end:
            key = pb[i]
            ln2, i = _uvarint(pb, i + 1)
            if key == 0x0A:
                name = pb[i : i + ln2].decode()
            elif key == 0x12:  # map entry {1: key, 2: value}
                e_end = i + ln2
                k = v = ""
                j = i
                while j < e_end:
                    kk = pb[j]
                    l3, j = _uvarint(pb, j + 1)
                    if kk == 0x0A:
                        k = pb[j : j + l3].decode()
                    elif kk == 0x12:
                        v = pb[j : j + l3].decode()
                    j += l3
                if not k or _BAD_NAME.search(k):
                    return None
                tags[f"{name}_{k}"] = v
            else:
                return None
            i += ln2
        if not name or _BAD_NAME.search(name):
            return None
        names.append(name)
    # names repeat across every port and device: intern them so the cache holds one copy
    return sys.intern("/" + "/".join(names)), tags


class WireFlattener:
    """Flatten raw ``SubscribeResponse`` bytes without building protobuf objects.

    Same output as :class:`Flattener` (tests check both against each other); the path cache
    is keyed by the path's own bytes, so a leaf costs a dict lookup after its first sample.
    Anything unusual (deletes, deprecated ``value`` fields, errors) falls back to protobuf.
    """

    def __init__(self, *, max_cache: int = 1_000_000) -> None:
        self._slow = Flattener(max_cache=max_cache)
        self._cache: dict[bytes, dict[bytes, tuple[str, dict[str, str]]]] = {}
        self.max_cache = max_cache
        self._n = 0
        self._targets: dict[bytes, str] = {}
        self._prefixes: dict[bytes, GPath] = {}

    def flatten(self, resp: bytes, *, default_target: str = "") -> tuple[list[TelemetryEvent], bool]:
        """(events, sync_response) of one serialized SubscribeResponse.

        Raises :class:`TelemetryDecodeError` (and nothing else) for malformed bytes or a
        target-side error message.
        """
        try:
            return self._flatten(resp, default_target)
        except TelemetryDecodeError:
            raise
        except _DECODE_FAILURES as exc:
            raise TelemetryDecodeError(f"malformed SubscribeResponse ({len(resp)} bytes): "
                                       f"{type(exc).__name__}: {exc}") from None

    def _flatten(self, resp: bytes, default_target: str) -> tuple[list[TelemetryEvent], bool]:
        if not resp or resp[0] != 0x0A:  # not an update notification
            msg = gnmi_pb2.SubscribeResponse.FromString(resp)
            if msg.HasField("error"):
                raise TelemetryDecodeError(f"target error: {msg.error.message}")
            if msg.HasField("update"):
                return self._slow.flatten(msg.update, default_target=default_target), False
            return [], msg.sync_response
        n, i = _uvarint(resp, 1)
        end = i + n
        ts = 0
        prefix = b""
        # Header fields (timestamp, prefix) come first from every serializer we know (fields
        # are written in number order); anything else goes the general way.
        while i < end and resp[i] in (0x08, 0x12):
            if resp[i] == 0x08:
                ts, i = _uvarint(resp, i + 1)
            else:
                ln, i = _uvarint(resp, i + 1)
                prefix = resp[i : i + ln]
                i += ln
        paths = self._cache.get(prefix)
        if paths is None:
            paths = self._cache[prefix] = {}
        target = self._target(prefix) or default_target
        out: list[TelemetryEvent] = []
        append = out.append
        ev = TelemetryEvent
        dbl = _DBL
        try:
            while i < end:
                if resp[i] != 0x22:  # not an update (delete, atomic...)
                    return self._general(resp, default_target)
                # update length: 1-2 byte varint inline
                ln = resp[i + 1]
                i += 2
                if ln >= 0x80:
                    x = resp[i]
                    if x >= 0x80:
                        return self._general(resp, default_target)
                    ln = (ln & 0x7F) | (x << 7)
                    i += 1
                nxt = i + ln
                # path (field 1), then val (field 3): what every target we know sends
                if resp[i] != 0x0A:
                    return self._general(resp, default_target)
                pl = resp[i + 1]
                i += 2
                if pl >= 0x80:
                    x = resp[i]
                    if x >= 0x80:
                        return self._general(resp, default_target)
                    pl = (pl & 0x7F) | (x << 7)
                    i += 1
                pb = resp[i : i + pl]
                i += pl
                if resp[i] != 0x1A or resp[i + 1] >= 0x80:
                    return self._general(resp, default_target)
                k = i + 2
                nt = paths.get(pb)
                if nt is None:
                    nt = self._leaf(prefix, pb)
                    paths[pb] = nt
                if resp[k] == 0x18:  # uint_val: the common case (counters), varint inline
                    k += 1
                    x = resp[k]
                    v = x & 0x7F
                    shift = 7
                    while x >= 0x80:
                        k += 1
                        x = resp[k]
                        v |= (x & 0x7F) << shift
                        shift += 7
                    append(ev(nt[0], ts, target, nt[1], v))
                elif resp[k] == 0x71:  # double_val (readings): 8 bytes little-endian, no slice
                    append(ev(nt[0], ts, target, nt[1], dbl(resp, k + 1)[0]))
                else:
                    append(ev(nt[0], ts, target, nt[1], _typed(resp[k : k + resp[i + 1]])))
                i = nxt
        except (IndexError, struct.error):
            # a field or value cut short: protobuf decides (and names the problem)
            return self._general(resp, default_target)
        self._n += len(out)
        if self._n > self.max_cache:
            self._n = 0
            if sum(len(v) for v in self._cache.values()) > self.max_cache:
                self._cache.clear()
        return out, False

    def _target(self, prefix: bytes) -> str:
        t = self._targets.get(prefix)
        if t is None:
            t = gnmi_pb2.Path.FromString(prefix).target
            self._targets[prefix] = t
        return t

    def _leaf(self, prefix: bytes, pb: bytes) -> tuple[str, dict[str, str]]:
        try:
            elems = _path_elems(pb)
        except (IndexError, ValueError, UnicodeDecodeError):
            elems = None
        if elems is not None:
            pre = self._prefixes.get(prefix)
            if pre is None:
                pre = from_proto_path(gnmi_pb2.Path.FromString(prefix), source="notification.prefix")
                self._prefixes[prefix] = pre
            if not pre.elems:
                return elems

        pre = self._prefixes.get(prefix)
        if pre is None:
            pre = from_proto_path(gnmi_pb2.Path.FromString(prefix), source="notification.prefix")
            self._prefixes[prefix] = pre
        full = GPath(pre.elems + from_proto_path(gnmi_pb2.Path.FromString(pb), source="update.path").elems,
                     pre.origin)
        return schema_name(full), tags_of(full)

    def _general(self, resp: bytes, default_target: str) -> tuple[list[TelemetryEvent], bool]:
        note = gnmi_pb2.SubscribeResponse.FromString(resp).update
        return self._slow.flatten(note, default_target=default_target), False


def event_paths(events: Sequence[TelemetryEvent]) -> list[str]:
    """Human-readable ``target name{tags}`` strings (CLI output)."""
    return [f"{e.target} {e.name}{dict(e.tags)}" for e in events]
