"""Decode OTLP JSON / JSON-lines trace files into one columnar span table.

Format: the OTLP/JSON encoding of ``ExportTraceServiceRequest`` (OpenTelemetry Protocol
specification, "JSON Protobuf Encoding", https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding)
and the file layout of the Collector's file exporter (https://opentelemetry.io/docs/specs/otel/protocol/file-exporter/):
one ``{"resourceSpans": [...]}`` object per line, a service's spans split over several lines.
The mapping rules applied: ``traceId`` / ``spanId`` / ``parentSpanId`` are hex strings (case-insensitive;
an absent or empty ``parentSpanId`` marks a root), 64-bit integers arrive as decimal strings or as
numbers, enums (``kind``, ``status.code``) as integers (their names are accepted too), field names are
lowerCamelCase, ``status`` is ``{}`` when unset. The pre-1.0 ``instrumentationLibrarySpans`` key is
read like ``scopeSpans``.

Two decoders give the same table: a pyarrow vectorized path for JSON lines (fast, used when every line
fits the schema) and a plain ``json`` walker for everything else (pretty-printed files, mixed types).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.model.errors import TraceFormatError

__all__ = [
    "KIND_CLIENT",
    "KIND_CONSUMER",
    "KIND_INTERNAL",
    "KIND_PRODUCER",
    "KIND_SERVER",
    "STATUS_ERROR",
    "SpanTable",
    "concat_tables",
    "parse_otlp_json",
    "read_spans",
    "spans_from_batches",
]

# SpanKind and Status.StatusCode of opentelemetry/proto/trace/v1/trace.proto
KIND_UNSPECIFIED, KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = 0, 1, 2, 3, 4, 5
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
_KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
               "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
# attributes that name the server instance a request went to (semconv: server.address, older net.peer.name)
_ENDPOINT_KEYS = ("server.address", "net.peer.name", "rpc.endpoint")
_OUT_TOKENS = "gen_ai.usage.output_tokens"
_TTFT = "gen_ai.server.time_to_first_token"  # seconds, the semconv GenAI metric name used as a span attribute


@dataclass(frozen=True)
class SpanTable:
    """Spans as parallel arrays (one row per span).

    ``trace_id`` (``S32``) / ``span_id`` / ``parent_id`` (``S16``) are lowercase hex bytes, ``b""`` for no
    parent; ``service`` / ``name`` / ``endpoint`` are int32 codes into ``services`` / ``names`` /
    ``endpoints`` (``endpoint`` is the ``service.instance.id`` of the span's resource or, on client spans,
    its ``server.address``; ``""`` when neither); ``out_tokens`` is ``gen_ai.usage.output_tokens``
    (-1 absent) and ``ttft_ns`` the time to first token (-1 absent).
    """

    trace_id: np.ndarray
    span_id: np.ndarray
    parent_id: np.ndarray
    service: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    status: np.ndarray
    endpoint: np.ndarray
    out_tokens: np.ndarray
    ttft_ns: np.ndarray
    services: tuple[str, ...]
    names: tuple[str, ...]
    endpoints: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])

    @property
    def duration_ns(self) -> np.ndarray:
        return np.asarray(self.end_ns - self.start_ns)


class _Interner:
    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def code(self, s: str) -> int:
        c = self.codes.get(s)
        if c is None:
            c = self.codes[s] = len(self.codes)
        return c

    def values(self) -> tuple[str, ...]:
        return tuple(self.codes)


def _hex_id(v: Any, width: int, where: str) -> bytes:
    if v is None or v == "":
        return b""
    if not isinstance(v, str):
        raise TraceFormatError(f"{where}: id {v!r} is not a string")
    s = v.lower()
    if len(s) == width:
        try:
            int(s, 16)
            return s.encode()
        except ValueError:
            pass
    try:  # proto3 canonical JSON writes bytes as base64; some exporters do despite the OTLP rule
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) * 2 == width:
        return raw.hex().encode()
    raise TraceFormatError(f"{where}: id {v!r} is neither {width} hex digits nor base64 of {width // 2} bytes")


def _int(v: Any, where: str, field: str) -> int:
    if isinstance(v, bool):
        raise TraceFormatError(f"{where}: {field} {v!r} is not an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise TraceFormatError(f"{where}: {field} {v!r} is not an integer")


def _enum(v: Any, names: Mapping[str, int], where: str, field: str) -> int:
    if v is None:
        return 0
    if isinstance(v, str) and v in names:
        return names[v]
    return _int(v, where, field)


def _any_value(v: Any) -> Any:
    if not isinstance(v, Mapping):
        return None
    for k in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if k in v:
            return v[k]
    return None


def _attrs(items: Any, keys: Iterable[str]) -> dict[str, Any]:
    want = set(keys)
    out: dict[str, Any] = {}
    if isinstance(items, list):
        for kv in items:
            if isinstance(kv, Mapping) and kv.get("key") in want:
                out[str(kv["key"])] = _any_value(kv.get("value"))
    return out


class _Builder:
    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k in (
            "trace_id", "span_id", "parent_id", "service", "name", "kind", "start_ns", "end_ns", "status",
            "endpoint", "out_tokens", "ttft_ns")}
        self.svc, self.nm, self.ep = _Interner(), _Interner(), _Interner()
        self.ep.code("")

    def add_request(self, doc: Any, where: str) -> None:
        if not isinstance(doc, Mapping) or "resourceSpans" not in doc:
            raise TraceFormatError(f"{where}: not an OTLP trace export (no 'resourceSpans' key)")
        rss = doc["resourceSpans"]
        if not isinstance(rss, list):
            raise TraceFormatError(f"{where}: resourceSpans is not a list")
        c = self.cols
        for i, rs in enumerate(rss):
            w = f"{where}: resourceSpans[{i}]"
            res = rs.get("resource") or {}
            ra = _attrs(res.get("attributes"), ("service.name", "service.instance.id"))
            svc = self.svc.code(str(ra.get("service.name") or "unknown_service"))
            inst = str(ra.get("service.instance.id") or "")
            for j, ss in enumerate(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()):
                for k, sp in enumerate(ss.get("spans") or ()):
                    ws = f"{w}.scopeSpans[{j}].spans[{k}]"
                    if not isinstance(sp, Mapping):
                        raise TraceFormatError(f"{ws}: not an object")
                    kind = _enum(sp.get("kind"), _KIND_NAMES, ws, "kind")
                    st = sp.get("status") or {}
                    a = _attrs(sp.get("attributes"), (*_ENDPOINT_KEYS, _OUT_TOKENS, _TTFT))
                    ep = inst
                    if kind == KIND_CLIENT or not ep:
                        ep = next((str(a[k2]) for k2 in _ENDPOINT_KEYS if a.get(k2)), ep)
                    start = _int(sp.get("startTimeUnixNano", 0), ws, "startTimeUnixNano")
                    end = _int(sp.get("endTimeUnixNano", 0), ws, "endTimeUnixNano")
                    if end < start:
                        raise TraceFormatError(f"{ws}: endTimeUnixNano {end} before startTimeUnixNano {start}")
                    c["trace_id"].append(_hex_id(sp.get("traceId"), 32, ws))
                    c["span_id"].append(_hex_id(sp.get("spanId"), 16, ws))
                    c["parent_id"].append(_hex_id(sp.get("parentSpanId"), 16, ws))
                    c["service"].append(svc)
                    c["name"].append(self.nm.code(str(sp.get("name", ""))))
                    c["kind"].append(kind)
                    c["start_ns"].append(start)
                    c["end_ns"].append(end)
                    c["status"].append(_enum(st.get("code") if isinstance(st, Mapping) else None,
                                             _STATUS_NAMES, ws, "status.code"))
                    c["endpoint"].append(self.ep.code(ep))
                    tok = a.get(_OUT_TOKENS)
                    c["out_tokens"].append(_int(tok, ws, _OUT_TOKENS) if tok is not None else -1)
                    tt = a.get(_TTFT)
                    c["ttft_ns"].append(int(float(tt) * 1e9) if tt is not None else -1)

    def table(self) -> SpanTable:
        c = self.cols
        return SpanTable(
            trace_id=np.array(c["trace_id"], dtype="S32"), span_id=np.array(c["span_id"], dtype="S16"),
            parent_id=np.array(c["parent_id"], dtype="S16"), service=np.array(c["service"], dtype=np.int32),
            name=np.array(c["name"], dtype=np.int32), kind=np.array(c["kind"], dtype=np.int8),
            start_ns=np.array(c["start_ns"], dtype=np.int64), end_ns=np.array(c["end_ns"], dtype=np.int64),
            status=np.array(c["status"], dtype=np.int8), endpoint=np.array(c["endpoint"], dtype=np.int32),
            out_tokens=np.array(c["out_tokens"], dtype=np.int64), ttft_ns=np.array(c["ttft_ns"], dtype=np.int64),
            services=self.svc.values(), names=self.nm.values(), endpoints=self.ep.values())


def spans_from_batches(batches: Iterable[Mapping[str, Any]], *, source: str = "<batches>") -> SpanTable:
    """Decode already-parsed OTLP JSON export requests (dicts with ``resourceSpans``) into a table."""
    b = _Builder()
    for i, doc in enumerate(batches):
        b.add_request(doc, f"{source}: batch {i + 1}")
    return b.table()


def parse_otlp_json(text: str, *, source: str = "<text>") -> SpanTable:
    """Decode OTLP JSON text: one export request (pretty-printed or not) or JSON lines of them."""
    b = _Builder()
    _add_text(b, text, source)
    return b.table()


def _add_text(b: _Builder, text: str, source: str) -> None:
    stripped = text.strip()
    if not stripped:
        return
    try:
        doc = json.loads(stripped)
    except json.JSONDecodeError:
        doc = None
    if doc is not None:
        b.add_request(doc, source)
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{source}: line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
        b.add_request(d, f"{source}: line {n}")


def concat_tables(tables: Sequence[SpanTable]) -> SpanTable:
    """One table from several, re-coding the categorical columns."""
    if len(tables) == 1:
        return tables[0]
    svc, nm, ep = _Interner(), _Interner(), _Interner()
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("service", "name", "endpoint")}
    for t in tables:
        for key, intern, vals in (("service", svc, t.services), ("name", nm, t.names), ("endpoint", ep, t.endpoints)):
            remap = np.array([intern.code(v) for v in vals] or [0], dtype=np.int32)
            cols[key].append(remap[getattr(t, key)])
    def cat(f: str) -> np.ndarray:
        return np.concatenate([getattr(t, f) for t in tables])
    return SpanTable(trace_id=cat("trace_id"), span_id=cat("span_id"), parent_id=cat("parent_id"),
                     service=np.concatenate(cols["service"]), name=np.concatenate(cols["name"]),
                     kind=cat("kind"), start_ns=cat("start_ns"), end_ns=cat("end_ns"), status=cat("status"),
                     endpoint=np.concatenate(cols["endpoint"]), out_tokens=cat("out_tokens"),
                     ttft_ns=cat("ttft_ns"), services=svc.values(), names=nm.values(), endpoints=ep.values())


def read_spans(paths: Sequence[str | Path], *, fast: bool = True) -> SpanTable:
    """Read OTLP JSON / JSON-lines files into one span table.

    Raises ``TraceFormatError`` naming the file and line for unreadable input, and when the files
    hold no span at all (no data is an error, never an empty answer).
    """
    if not paths:
        raise TraceFormatError("slo: no span files given")
    tables = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise TraceFormatError(f"{path}: no such file")
        t = _read_arrow(path) if fast else None
        if t is None:
            b = _Builder()
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(f"{path}: not UTF-8 text (byte {exc.start})") from None
            _add_text(b, text, str(path))
            t = b.table()
        tables.append(t)
    table = concat_tables(tables)
    if len(table) == 0:
        raise TraceFormatError(f"{', '.join(str(p) for p in paths)}: no spans found")
    return table


def _arrow_schema() -> Any:
    import pyarrow as pa

    value = pa.struct([("stringValue", pa.string()), ("intValue", pa.string()), ("doubleValue", pa.float64())])
    attrs = pa.list_(pa.struct([("key", pa.string()), ("value", value)]))
    span = pa.struct([("traceId", pa.string()), ("spanId", pa.string()), ("parentSpanId", pa.string()),
                      ("name", pa.string()), ("kind", pa.int64()), ("startTimeUnixNano", pa.string()),
                      ("endTimeUnixNano", pa.string()), ("status", pa.struct([("code", pa.int64())])),
                      ("attributes", attrs)])
    rs = pa.struct([("resource", pa.struct([("attributes", attrs)])),
                    ("scopeSpans", pa.list_(pa.struct([("spans", pa.list_(span))])))])
    return pa.schema([("resourceSpans", pa.list_(rs))])


_CHUNK_BYTES = 64 << 20  # text decoded per Arrow call: bounds memory, and each call parses on all cores
_BLOCK_BYTES = 8 << 20


def _line_chunks(fh: Any, chunk: int) -> Iterable[bytes]:
    """The file's bytes in pieces of about ``chunk`` bytes that end at a newline (the last at EOF)."""
    rest = b""
    while True:
        block = fh.read(chunk)
        if not block:
            if rest:
                yield rest
            return
        data = rest + block if rest else block
        nl = data.rfind(b"\n")
        if nl < 0:
            rest = data
            continue
        rest = data[nl + 1:]
        yield data[: nl + 1]


def _read_arrow(path: Path) -> SpanTable | None:
    """Vectorized decoding of JSON lines with pyarrow (Arrow's JSON reader, explicit schema).

    The file is decoded in chunks of whole lines (``_CHUNK_BYTES``), each by one multithreaded
    ``read_json`` call: Arrow's copy of the text is never whole in memory, and the blocks of a chunk
    parse in parallel (the streaming reader parses one block at a time: about 1.7x the CPU time).
    Returns None when the file does not fit that path (pretty-printed, numbers where the spec has
    strings, ``instrumentationLibrarySpans``, bad ids); the walker then decodes it or names the error.
    """
    import pyarrow as pa
    import pyarrow.json as pj

    opts = pj.ParseOptions(explicit_schema=_arrow_schema(), unexpected_field_behavior="ignore")
    ropts = pj.ReadOptions(block_size=_BLOCK_BYTES)
    b = _ArrowBuilder()

    def parse(part: bytes) -> Any:
        return pj.read_json(pa.BufferReader(part), read_options=ropts, parse_options=opts)

    # the next chunk parses (Arrow threads, no GIL) while this one is converted to columns
    with path.open("rb") as fh, ThreadPoolExecutor(max_workers=1, thread_name_prefix="otlp-json") as pool:
        pending = None
        try:
            for part in _line_chunks(fh, _CHUNK_BYTES):
                nxt = pool.submit(parse, part)
                if pending is not None and not all(b.add(c) for c in pending.result().column(0).chunks):
                    return None
                pending = nxt
            if pending is not None and not all(b.add(c) for c in pending.result().column(0).chunks):
                return None
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
            return None
        finally:
            if pending is not None:
                pending.cancel()
            # Arrow's allocator keeps freed chunk memory for reuse; the analysis allocates with
            # numpy's, so hand it back (about 1 GB at 10M spans)
            pa.default_memory_pool().release_unused()
    table = b.table()
    _trim_heap()
    return table


def _trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc ``malloc_trim``; a no-op elsewhere).

    The per-chunk column parts are a few MB each, below glibc's mmap threshold, so once they are
    joined their memory stays in the heap, free but resident: ~0.9 GB at 10M spans, counted again
    when the analysis allocates its own arrays.
    """
    import contextlib
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            ctypes.CDLL(None).malloc_trim(0)


def _fixed_bytes(arr: Any, width: int) -> np.ndarray:
    """A string array whose every value has ``width`` ASCII characters as a numpy ``S<width>`` array."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0]: offsets[-1]]
    return data.view(f"S{width}").copy()


class _ArrowBuilder:
    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []
        self.svc, self.nm, self.ep = _Interner(), _Interner(), _Interner()
        self.ep.code("")

    def _codes(self, arr: Any, intern: _Interner, default: str) -> np.ndarray:
        import pyarrow.compute as pc

        d = pc.dictionary_encode(pc.fill_null(arr, default)).combine_chunks() if hasattr(arr, "chunks") else \
            pc.dictionary_encode(pc.fill_null(arr, default))
        remap = np.array([intern.code(str(v)) for v in d.dictionary.to_pylist()] or [0], dtype=np.int32)
        return np.asarray(remap[d.indices.to_numpy(zero_copy_only=False)])

    def add(self, rs_list: Any) -> bool:
        import pyarrow as pa
        import pyarrow.compute as pc

        rs = pc.list_flatten(rs_list)
        scope_list = pc.struct_field(rs, "scopeSpans")
        scopes = pc.list_flatten(scope_list)
        scope_rs = pc.list_parent_indices(scope_list).to_numpy()
        span_list = pc.struct_field(scopes, "spans")
        spans = pc.list_flatten(span_list)
        n = len(spans)
        if n == 0:
            return True
        span_rs = scope_rs[pc.list_parent_indices(span_list).to_numpy()]
        rattrs = _Attrs(pc.struct_field(pc.struct_field(rs, "resource"), "attributes"))
        i, v = rattrs.get("service.name", "stringValue")
        names = np.full(len(rs), None, dtype=object)
        names[i] = v.to_numpy(zero_copy_only=False)
        svc_rs = self._codes(pa.array(names, type=pa.string()), self.svc, "unknown_service")
        i, v = rattrs.get("service.instance.id", "stringValue")
        inst = np.full(len(rs), None, dtype=object)
        inst[i] = v.to_numpy(zero_copy_only=False)
        ep_rs = self._codes(pa.array(inst, type=pa.string()), self.ep, "")
        ids = {}
        for f, w in (("traceId", 32), ("spanId", 16), ("parentSpanId", 16)):
            a = pc.struct_field(spans, f)
            if f == "parentSpanId":
                a = pc.if_else(pc.equal(pc.fill_null(pc.utf8_length(a), 0), 0), "\0" * 16, a)
            elif a.null_count:
                return False
            a = a.combine_chunks() if hasattr(a, "chunks") else a
            if not pc.all(pc.equal(pc.utf8_length(a), w)).as_py():
                return False
            fixed = _lower_hex(_fixed_bytes(a, w), allow_nul=f == "parentSpanId")
            if fixed is None:
                return False
            ids[f] = fixed
        start = pc.cast(pc.struct_field(spans, "startTimeUnixNano"), pa.int64()).to_numpy(zero_copy_only=False)
        end = pc.cast(pc.struct_field(spans, "endTimeUnixNano"), pa.int64()).to_numpy(zero_copy_only=False)
        if pc.struct_field(spans, "startTimeUnixNano").null_count or np.any(end < start):
            return False
        kind = pc.fill_null(pc.struct_field(spans, "kind"), 0).to_numpy().astype(np.int8)
        status = pc.fill_null(pc.struct_field(pc.struct_field(spans, "status"), "code"), 0).to_numpy().astype(np.int8)
        sattrs = _Attrs(pc.struct_field(spans, "attributes"))
        endpoint = ep_rs[span_rs]
        for key in reversed(_ENDPOINT_KEYS):
            i, v = sattrs.get(key, "stringValue")
            if len(i):
                codes = self._codes(v, self.ep, "")
                take = (kind[i] == KIND_CLIENT) | (endpoint[i] == 0)
                endpoint[i[take]] = codes[take]
        tokens = np.full(n, -1, dtype=np.int64)
        i, v = sattrs.get(_OUT_TOKENS, "intValue")
        tokens[i] = pc.cast(v, pa.int64()).to_numpy(zero_copy_only=False)
        ttft = np.full(n, -1, dtype=np.int64)
        i, v = sattrs.get(_TTFT, "doubleValue")
        ttft[i] = (v.to_numpy(zero_copy_only=False) * 1e9).astype(np.int64)
        self.parts.append({"trace_id": ids["traceId"], "span_id": ids["spanId"], "parent_id": ids["parentSpanId"],
                           "service": svc_rs[span_rs], "name": self._codes(pc.struct_field(spans, "name"), self.nm, ""),
                           "kind": kind, "start_ns": start, "end_ns": end, "status": status, "endpoint": endpoint,
                           "out_tokens": tokens, "ttft_ns": ttft})
        return True

    def table(self) -> SpanTable:
        def cat(f: str, dtype: Any) -> np.ndarray:
            # pop each column's parts as it is joined: the peak is the table plus one column's parts
            return np.concatenate([p.pop(f) for p in self.parts]) if self.parts else np.zeros(0, dtype=dtype)
        return SpanTable(trace_id=cat("trace_id", "S32"), span_id=cat("span_id", "S16"),
                         parent_id=cat("parent_id", "S16"), service=cat("service", np.int32),
                         name=cat("name", np.int32), kind=cat("kind", np.int8), start_ns=cat("start_ns", np.int64),
                         end_ns=cat("end_ns", np.int64), status=cat("status", np.int8),
                         endpoint=cat("endpoint", np.int32), out_tokens=cat("out_tokens", np.int64),
                         ttft_ns=cat("ttft_ns", np.int64), services=self.svc.values(), names=self.nm.values(),
                         endpoints=self.ep.values())


_HEX_OK = np.zeros(256, dtype=bool)
_HEX_OK[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = True


def _lower_hex(ids: np.ndarray, *, allow_nul: bool) -> np.ndarray | None:
    """Fixed-width id bytes lowercased in place; None when a byte is not a hex digit (or NUL where allowed)."""
    raw = ids.view(np.uint8)
    upper = (raw >= ord("A")) & (raw <= ord("F"))
    if upper.any():
        raw[upper] |= 0x20
    ok = _HEX_OK[raw]
    if allow_nul:
        ok |= raw == 0
    return ids if bool(ok.all()) else None


class _Attrs:
    """A list<struct<key, value>> attribute column flattened once, looked up by key many times."""

    def __init__(self, attrs: Any) -> None:
        import pyarrow.compute as pc

        self.flat = pc.list_flatten(attrs)
        self.parent = pc.list_parent_indices(attrs).to_numpy()
        d = pc.dictionary_encode(pc.struct_field(self.flat, "key"))
        d = d.combine_chunks() if hasattr(d, "chunks") else d
        self.keys = {k: i for i, k in enumerate(d.dictionary.to_pylist())}
        self.codes = d.indices.to_numpy(zero_copy_only=False)

    def get(self, key: str, kind: str) -> tuple[np.ndarray, Any]:
        """Row index and the ``kind`` field of the value of every attribute named ``key``."""
        import pyarrow.compute as pc

        code = self.keys.get(key)
        mask = self.codes == code if code is not None else np.zeros(len(self.codes), dtype=bool)
        vals = pc.struct_field(pc.struct_field(self.flat, "value"), kind).filter(pa_array(mask))
        return self.parent[mask], vals


def pa_array(mask: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.array(mask, type=pa.bool_())
