"""The bus wire format: versioned, compact batches of records (pure; no sockets, no asyncio).

One NATS message carries one batch of one record kind (telemetry events, findings or probe
samples). The byte-by-byte layout is specified in ``docs/design/cluster-bus.md``; in short::

    b"FSB" version(u8=1) | kind(u8) flags(u8) reserved(u16=0) | [raw_len(u32) if zlib] body

and the body starts with a string table (every name, target, tag key/value and string value
once) followed by the records, columnar for events (fixed-width little-endian arrays packed
with :mod:`struct`), row-wise for the rarer findings and probe samples.

Decoding treats input as hostile: every count is checked against the bytes that remain before
anything is allocated, indices against the tables, the decompressed size against
:data:`MAX_BODY_BYTES`; any violation raises :class:`BatchFormatError` (a ``ValueError``) and
nothing else.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Sequence
from typing import Final

from fabricscope.model.errors import TraceFormatError
from fabricscope.model.records import Finding, FiveTuple, ProbeSample, TelemetryEvent

__all__ = [
    "KIND_EVENTS",
    "KIND_FINDINGS",
    "KIND_PROBES",
    "MAGIC",
    "MAX_BODY_BYTES",
    "MAX_RECORDS",
    "MAX_STRINGS",
    "VERSION",
    "BatchFormatError",
    "batch_id",
    "batch_kind",
    "decode_events",
    "decode_findings",
    "decode_probe_batch",
    "decode_probes",
    "encode_events",
    "encode_findings",
    "encode_probes",
    "subject_token",
]

MAGIC: Final = b"FSB"
VERSION: Final = 1
KIND_EVENTS: Final = 1
KIND_FINDINGS: Final = 2
KIND_PROBES: Final = 3
_KIND_NAMES: Final = {KIND_EVENTS: "events", KIND_FINDINGS: "findings", KIND_PROBES: "probes"}
FLAG_ZLIB: Final = 0x01

#: Decoding limits (hostile input never makes the decoder allocate more than these allow).
MAX_RECORDS: Final = 1 << 20
MAX_STRINGS: Final = 1 << 20
MAX_STRING_BYTES: Final = 1 << 20
MAX_BODY_BYTES: Final = 64 << 20

_HEADER = struct.Struct("<3sBBBH")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
# value kinds (events and finding details)
_V_I64, _V_U64, _V_F64, _V_STR, _V_FALSE, _V_TRUE, _V_BIGINT = range(7)
_VALID_KINDS = bytes(range(7))
_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_FINDING_ROW = struct.Struct("<IIdqqIH")
_PROBE_ROW = struct.Struct("<IIIIHHBBqqqqq")

Value = float | int | str | bool


class BatchFormatError(TraceFormatError, ValueError):
    """Bytes that are not a valid batch (or records that cannot be encoded); says where and why."""


# --------------------------------------------------------------------------- helpers


def subject_token(text: str) -> str:
    """``text`` as one NATS subject token: ``[A-Za-z0-9_-]`` kept, every other UTF-8 byte as ``%HH``.

    NATS subjects split on ``.`` and treat ``*``/``>`` as wildcards, so a target named
    ``leaf.1`` must not become two tokens. The mapping is injective; the empty string is ``%``.
    """
    if not text:
        return "%"
    out: list[str] = []
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch in "_-"):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def batch_id(payload: bytes) -> str:
    """The ``Nats-Msg-Id`` of a batch: BLAKE2b-128 of its bytes.

    Content-addressed, so a batch resent after a lost ack (or replayed by a restarted
    publisher) has the same id and JetStream's duplicate window drops it.
    """
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def _header(kind: int, body: bytes, compress: bool) -> bytes:
    if compress:
        return _HEADER.pack(MAGIC, VERSION, kind, FLAG_ZLIB, 0) + _U32.pack(len(body)) + zlib.compress(body, 1)
    return _HEADER.pack(MAGIC, VERSION, kind, 0, 0) + body


def batch_kind(data: bytes) -> str:
    """``"events"``, ``"findings"`` or ``"probes"``: the kind named by a batch header."""
    if len(data) < _HEADER.size:
        raise BatchFormatError(f"batch: {len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, kind, flags, reserved = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise BatchFormatError(f"batch: bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise BatchFormatError(f"batch: unsupported version {version} (this build reads {VERSION})")
    if kind not in _KIND_NAMES:
        raise BatchFormatError(f"batch: unknown record kind {kind}")
    if flags & ~FLAG_ZLIB or reserved:
        raise BatchFormatError(f"batch: unknown flags 0x{flags:02x} / reserved {reserved}")
    return _KIND_NAMES[kind]


def _body(data: bytes, want: int) -> bytes:
    kind = batch_kind(data)
    if _KIND_NAMES[want] != kind:
        raise BatchFormatError(f"batch: holds {kind}, expected {_KIND_NAMES[want]}")
    if not data[5] & FLAG_ZLIB:
        return bytes(data[_HEADER.size:])
    if len(data) < _HEADER.size + 4:
        raise BatchFormatError("batch: compressed batch without its length")
    (raw_len,) = _U32.unpack_from(data, _HEADER.size)
    if raw_len > MAX_BODY_BYTES:
        raise BatchFormatError(f"batch: body of {raw_len} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
    d = zlib.decompressobj()
    try:
        body = d.decompress(data[_HEADER.size + 4:], raw_len + 1)
    except zlib.error as exc:
        raise BatchFormatError(f"batch: corrupt zlib body: {exc}") from exc
    if len(body) != raw_len or not d.eof or d.unconsumed_tail or d.unused_data:
        raise BatchFormatError(f"batch: zlib body is not {raw_len} bytes followed by nothing")
    return body


class _Reader:
    """A bounds-checked cursor over a body; every read says what it was reading when it fails."""

    __slots__ = ("buf", "off")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.off = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.off + n > len(self.buf):
            raise BatchFormatError(f"batch: truncated at byte {self.off} reading {what} "
                                   f"({n} bytes needed, {len(self.buf) - self.off} left)")

    def count(self, what: str, limit: int, width: int) -> int:
        self.need(4, what)
        (n,) = _U32.unpack_from(self.buf, self.off)
        self.off += 4
        if n > limit:
            raise BatchFormatError(f"batch: {what} count {n} exceeds the limit {limit}")
        self.need(n * width, what)
        return int(n)

    def array(self, code: str, n: int, what: str) -> tuple[int, ...] | tuple[float, ...]:
        fmt = f"<{n}{code}"
        size = struct.calcsize(fmt)
        self.need(size, what)
        out = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return out

    def ints(self, code: str, n: int, what: str) -> tuple[int, ...]:
        return self.array(code, n, what)  # type: ignore[return-value]

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = self.buf[self.off:self.off + n]
        self.off += n
        return out

    def row(self, st: struct.Struct, what: str) -> tuple[int | float, ...]:
        self.need(st.size, what)
        out = st.unpack_from(self.buf, self.off)
        self.off += st.size
        return tuple(out)

    def end(self) -> None:
        if self.off != len(self.buf):
            raise BatchFormatError(f"batch: {len(self.buf) - self.off} trailing bytes after the records")


class _Strings:
    """The string table being built by an encoder: ``index(s)`` interns ``s``."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def index(self, s: str) -> int:
        ids = self.ids
        i = ids.get(s)
        if i is None:
            if type(s) is not str and not isinstance(s, str):
                raise BatchFormatError(f"batch: expected a string, got {type(s).__name__} {s!r}")
            i = ids[s] = len(ids)
        return i

    def pack(self) -> bytes:
        try:
            blobs = [s.encode() for s in self.ids]
        except UnicodeEncodeError as exc:
            raise BatchFormatError(f"batch: a string is not valid UTF-8: {exc}") from exc
        n = len(blobs)
        return _U32.pack(n) + struct.pack(f"<{n}I", *map(len, blobs)) + b"".join(blobs)


def _read_strings(r: _Reader) -> list[str]:
    n = r.count("string table", MAX_STRINGS, 4)
    lengths = r.ints("I", n, "string lengths")
    if n and max(lengths) > MAX_STRING_BYTES:
        raise BatchFormatError(f"batch: a string of {max(lengths)} bytes exceeds the limit {MAX_STRING_BYTES}")
    total = sum(lengths)
    blob = r.raw(total, "string bytes")
    out: list[str] = []
    off = 0
    try:
        for ln in lengths:
            out.append(blob[off:off + ln].decode())
            off += ln
    except UnicodeDecodeError as exc:
        raise BatchFormatError(f"batch: string {len(out)} is not valid UTF-8: {exc.reason}") from exc
    return out


def _check_idx(idx: Sequence[int], limit: int, what: str) -> None:
    if idx and max(idx) >= limit:
        raise BatchFormatError(f"batch: {what} index {max(idx)} out of range (table has {limit})")


def _encode_value(v: object, strings: _Strings, i64: list[int], u64: list[int], f64: list[float],
                  sidx: list[int]) -> int:
    t = type(v)
    if t is float:
        f64.append(v)  # type: ignore[arg-type]
        return _V_F64
    if t is bool:
        return _V_TRUE if v else _V_FALSE
    if t is str:
        sidx.append(strings.index(v))  # type: ignore[arg-type]
        return _V_STR
    if isinstance(v, bool):
        return _V_TRUE if v else _V_FALSE
    if isinstance(v, int):
        iv = int(v)
        if _I64_MIN <= iv <= _I64_MAX:
            i64.append(iv)
            return _V_I64
        if 0 <= iv <= _U64_MAX:
            u64.append(iv)
            return _V_U64
        sidx.append(strings.index(str(iv)))
        return _V_BIGINT
    if isinstance(v, float):
        f64.append(float(v))
        return _V_F64
    if isinstance(v, str):
        sidx.append(strings.index(str(v)))
        return _V_STR
    raise BatchFormatError(f"batch: value {v!r} of type {type(v).__name__} is not float/int/str/bool")


def _bigint(s: str) -> int:
    if not s or len(s) > 40 or not (s.isdigit() or (s[0] == "-" and s[1:].isdigit())) or not s.isascii():
        raise BatchFormatError(f"batch: big integer value {s[:50]!r} is not a decimal integer")
    return int(s)


def _pack(fmt: str, values: Sequence[int] | Sequence[float], what: str) -> bytes:
    try:
        return struct.pack(f"<{len(values)}{fmt}", *values)
    except struct.error as exc:
        raise BatchFormatError(f"batch: {what} out of range: {exc}") from exc


# --------------------------------------------------------------------------- events


def encode_events(events: Sequence[TelemetryEvent], *, compress: bool = False) -> bytes:
    """One batch of telemetry events (format: ``docs/design/cluster-bus.md``, kind 1).

    Strings and tag sets are stored once per batch, so a batch of one target's counters is
    ~30 bytes per event. ``compress`` zlib-compresses the body (level 1). Values keep their
    Python type (``int`` incl. uint64 counters, ``float``, ``str``, ``bool``); ``ts_ns`` must fit
    int64. Raises :class:`BatchFormatError` for a value that cannot be encoded.
    """
    if len(events) > MAX_RECORDS:
        raise BatchFormatError(f"batch: {len(events)} events exceed the limit {MAX_RECORDS} per batch")
    strings = _Strings()
    sindex = strings.index
    tagsets: dict[tuple[tuple[str, str], ...], int] = {}
    tag_memo: dict[int, int] = {}  # id(tags mapping) -> tag set; the events keep them alive
    pairs: list[int] = []
    pair_counts: list[int] = []
    names: list[int] = []
    targets: list[int] = []
    tsets: list[int] = []
    tss: list[int] = []
    kinds = bytearray()
    i64: list[int] = []
    u64: list[int] = []
    f64: list[float] = []
    sidx: list[int] = []
    for e in events:
        names.append(sindex(e.name))
        targets.append(sindex(e.target))
        tags = e.tags
        ti = tag_memo.get(id(tags))
        if ti is None:
            items = tuple(tags.items())
            ti = tagsets.get(items)
            if ti is None:
                ti = tagsets[items] = len(tagsets)
                pair_counts.append(len(items))
                for tk, tv in items:
                    pairs.append(sindex(tk))
                    pairs.append(sindex(tv))
            tag_memo[id(tags)] = ti
        tsets.append(ti)
        tss.append(e.ts_ns)
        val = e.value
        vt = type(val)
        if vt is float:
            kinds.append(_V_F64)
            f64.append(val)  # type: ignore[arg-type]
        elif vt is int and _I64_MIN <= val <= _I64_MAX:  # type: ignore[operator]
            kinds.append(_V_I64)
            i64.append(val)  # type: ignore[arg-type]
        else:
            kinds.append(_encode_value(val, strings, i64, u64, f64, sidx))
    n = len(names)
    body = b"".join((
        strings.pack(),
        _U32.pack(len(pair_counts)), _pack("H", pair_counts, "tags per event"), _pack("I", pairs, "tag"),
        _U32.pack(n), _pack("I", names, "name"), _pack("I", targets, "target"), _pack("I", tsets, "tag set"),
        _pack("q", tss, "ts_ns (int64)"), bytes(kinds),
        _pack("q", i64, "int"), _pack("Q", u64, "uint"), _pack("d", f64, "float"), _pack("I", sidx, "string value"),
    ))
    return _header(KIND_EVENTS, body, compress)


def decode_events(data: bytes) -> list[TelemetryEvent]:
    """The events of a batch made by :func:`encode_events`; :class:`BatchFormatError` if invalid.

    Events of one tag set share one ``tags`` dict (treat them as read-only, like the records).
    """
    r = _Reader(_body(data, KIND_EVENTS))
    strs = _read_strings(r)
    ns = len(strs)
    n_sets = r.count("tag sets", MAX_RECORDS, 2)
    counts = r.ints("H", n_sets, "tag set sizes")
    pairs = r.ints("I", 2 * sum(counts), "tags")
    _check_idx(pairs, ns, "tag string")
    tagsets: list[dict[str, str]] = []
    off = 0
    for c in counts:
        tagsets.append({strs[pairs[j]]: strs[pairs[j + 1]] for j in range(off, off + 2 * c, 2)})
        off += 2 * c
    n = r.count("events", MAX_RECORDS, 4 + 4 + 4 + 8 + 1)
    names = r.ints("I", n, "event names")
    targets = r.ints("I", n, "event targets")
    tsets = r.ints("I", n, "event tag sets")
    tss = r.ints("q", n, "event timestamps")
    kinds = r.raw(n, "value kinds")
    _check_idx(names, ns, "name")
    _check_idx(targets, ns, "target")
    _check_idx(tsets, len(tagsets), "tag set")
    if kinds.translate(None, _VALID_KINDS):
        raise BatchFormatError(f"batch: unknown value kind in {sorted(set(kinds) - set(_VALID_KINDS))}")
    i64 = iter(r.ints("q", kinds.count(_V_I64), "int values"))
    u64 = iter(r.ints("Q", kinds.count(_V_U64), "uint values"))
    f64 = iter(r.array("d", kinds.count(_V_F64), "float values"))
    sv = r.ints("I", kinds.count(_V_STR) + kinds.count(_V_BIGINT), "string values")
    _check_idx(sv, ns, "string value")
    r.end()
    svi = iter(sv)
    out: list[TelemetryEvent] = []
    append = out.append
    for i in range(n):
        k = kinds[i]
        value: Value
        if k == _V_F64:
            value = next(f64)
        elif k == _V_I64:
            value = next(i64)
        elif k == _V_STR:
            value = strs[next(svi)]
        elif k == _V_U64:
            value = next(u64)
        elif k == _V_BIGINT:
            value = _bigint(strs[next(svi)])
        else:
            value = k == _V_TRUE
        append(TelemetryEvent(strs[names[i]], tss[i], strs[targets[i]], tagsets[tsets[i]], value))
    return out


# --------------------------------------------------------------------------- findings


def _encode_typed(v: object, strings: _Strings) -> bytes:
    i64: list[int] = []
    u64: list[int] = []
    f64: list[float] = []
    sidx: list[int] = []
    k = _encode_value(v, strings, i64, u64, f64, sidx)
    if k == _V_I64:
        return bytes((k,)) + struct.pack("<q", i64[0])
    if k == _V_U64:
        return bytes((k,)) + struct.pack("<Q", u64[0])
    if k == _V_F64:
        return bytes((k,)) + struct.pack("<d", f64[0])
    if k in (_V_STR, _V_BIGINT):
        return bytes((k,)) + _U32.pack(sidx[0])
    return bytes((k,))


def _decode_typed(r: _Reader, strs: list[str]) -> Value:
    k = r.raw(1, "detail kind")[0]
    if k in (_V_I64, _V_U64, _V_F64):
        (v,) = r.row(struct.Struct("<" + "qQd"[k]), "detail value")
        return v
    if k in (_V_STR, _V_BIGINT):
        (i,) = r.ints("I", 1, "detail string")
        _check_idx((i,), len(strs), "detail string")
        return strs[i] if k == _V_STR else _bigint(strs[i])
    if k in (_V_FALSE, _V_TRUE):
        return k == _V_TRUE
    raise BatchFormatError(f"batch: unknown detail value kind {k}")


def encode_findings(findings: Sequence[Finding], *, compress: bool = False) -> bytes:
    """One batch of findings (kind 2, row-wise; see ``docs/design/cluster-bus.md``)."""
    if len(findings) > MAX_RECORDS:
        raise BatchFormatError(f"batch: {len(findings)} findings exceed the limit {MAX_RECORDS}")
    strings = _Strings()
    rows: list[bytes] = []
    for f in findings:
        if len(f.evidence) > 0xFFFF or len(f.details) > 0xFFFF:
            raise BatchFormatError(f"batch: finding {f.kind}/{f.subject} has more than 65535 evidence/details")
        try:
            head = _FINDING_ROW.pack(strings.index(f.kind), strings.index(f.subject), float(f.score),
                                     f.window[0], f.window[1], strings.index(f.action), len(f.evidence))
        except (struct.error, TypeError, IndexError) as exc:
            raise BatchFormatError(f"batch: finding {f.kind!r}/{f.subject!r}: {exc}") from exc
        parts = [head, struct.pack(f"<{len(f.evidence)}I", *(strings.index(e) for e in f.evidence)),
                 _U16.pack(len(f.details))]
        for key, val in f.details.items():
            parts.append(_U32.pack(strings.index(key)))
            parts.append(_encode_typed(val, strings))
        rows.append(b"".join(parts))
    body = strings.pack() + _U32.pack(len(rows)) + b"".join(rows)
    return _header(KIND_FINDINGS, body, compress)


def decode_findings(data: bytes) -> list[Finding]:
    """The findings of a batch made by :func:`encode_findings`; :class:`BatchFormatError` if invalid."""
    r = _Reader(_body(data, KIND_FINDINGS))
    strs = _read_strings(r)
    ns = len(strs)
    n = r.count("findings", MAX_RECORDS, _FINDING_ROW.size + 2)
    out: list[Finding] = []
    for _ in range(n):
        kind, subject, score, w0, w1, action, n_ev = r.row(_FINDING_ROW, "finding")
        ev = r.ints("I", int(n_ev), "finding evidence")
        (n_det,) = r.ints("H", 1, "finding details")
        _check_idx((int(kind), int(subject), int(action), *ev), ns, "finding string")
        details: dict[str, float | int | str] = {}
        for _ in range(n_det):
            (key,) = r.ints("I", 1, "detail key")
            _check_idx((key,), ns, "detail key")
            details[strs[key]] = _decode_typed(r, strs)
        out.append(Finding(strs[int(kind)], strs[int(subject)], float(score), (int(w0), int(w1)),
                           tuple(strs[i] for i in ev), strs[int(action)], details))
    r.end()
    return out


# --------------------------------------------------------------------------- probe samples


def encode_probes(samples: Sequence[ProbeSample], *, statuses: Sequence[int] | None = None,
                  compress: bool = False) -> bytes:
    """One batch of probe samples (kind 3: fixed 62-byte rows after the string table).

    ``statuses`` (optional, one per sample, 0-3: answered, request lost, reply lost, lost
    where unknown; the prober's classification) go in bits 3-4 of the ``present`` byte.
    """
    if len(samples) > MAX_RECORDS:
        raise BatchFormatError(f"batch: {len(samples)} probe samples exceed the limit {MAX_RECORDS}")
    if statuses is not None and len(statuses) != len(samples):
        raise BatchFormatError(f"batch: {len(statuses)} probe statuses for {len(samples)} samples")
    strings = _Strings()
    rows: list[bytes] = []
    for k, s in enumerate(samples):
        fl = s.flow
        opt = (s.t_resp_rx_ns, s.t_resp_tx_ns, s.t_recv_ns)
        present = sum(1 << i for i, t in enumerate(opt) if t is not None)
        if statuses is not None:
            code = statuses[k]
            if not 0 <= code <= 3:
                raise BatchFormatError(f"batch: probe {s.src}->{s.dst} seq {s.seq}: status {code} is not 0-3")
            present |= code << 3
        try:
            rows.append(_PROBE_ROW.pack(strings.index(s.src), strings.index(s.dst), strings.index(fl.src_ip),
                                        strings.index(fl.dst_ip), fl.src_port, fl.dst_port, fl.proto, present,
                                        s.seq, s.t_send_ns, *(0 if t is None else t for t in opt)))
        except struct.error as exc:
            raise BatchFormatError(f"batch: probe {s.src}->{s.dst} seq {s.seq}: {exc}") from exc
    body = strings.pack() + _U32.pack(len(rows)) + b"".join(rows)
    return _header(KIND_PROBES, body, compress)


def decode_probes(data: bytes) -> list[ProbeSample]:
    """The samples of a batch made by :func:`encode_probes`; :class:`BatchFormatError` if invalid."""
    return decode_probe_batch(data)[0]


def decode_probe_batch(data: bytes) -> tuple[list[ProbeSample], list[int]]:
    """The samples of a batch and their statuses (0-3; 0 for an answered probe and for a lost
    one whose publisher gave no status: the analysis then treats it as lost where unknown)."""
    r = _Reader(_body(data, KIND_PROBES))
    strs = _read_strings(r)
    n = r.count("probe samples", MAX_RECORDS, _PROBE_ROW.size)
    out: list[ProbeSample] = []
    codes: list[int] = []
    for _ in range(n):
        src, dst, sip, dip, sport, dport, proto, present, seq, t_send, rx, tx, recv = (
            int(x) for x in r.row(_PROBE_ROW, "probe sample"))
        _check_idx((src, dst, sip, dip), len(strs), "probe string")
        if present > 31:
            raise BatchFormatError(f"batch: probe presence bits 0x{present:02x} has unknown bits")
        rx_o, tx_o, recv_o = (t if present >> i & 1 else None for i, t in enumerate((rx, tx, recv)))
        out.append(ProbeSample(strs[src], strs[dst], FiveTuple(strs[sip], strs[dip], sport, dport, proto), seq,
                               t_send, rx_o, tx_o, recv_o))
        codes.append(present >> 3)
    r.end()
    return out, codes

