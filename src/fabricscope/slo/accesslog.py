"""Access logs with a latency field -> the span table (one server request per line, no chains).

Formats: JSON lines (field names configurable), the nginx ``combined`` format with a latency field
appended (``log_format ... $request_time``, seconds; nginx ``ngx_http_log_module`` docs) and Envoy's
default access-log format (``%DURATION%`` in ms after the byte counts; Envoy docs "Access logging",
default format string). A request is an error when its HTTP status is 5xx (or the JSON ``status``
field says so). Each line becomes a root SERVER span with its own synthetic trace id, so windows and
the rules apply; chains and localization need traces.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fabricscope.model.errors import ConfigError, TraceFormatError
from fabricscope.slo.otlp import KIND_SERVER, STATUS_ERROR, SpanTable, _Interner

__all__ = ["AccessLogFormat", "read_access_log"]

_UNITS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
_NGINX = re.compile(r'^(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<verb>\S+) (?P<path>\S+)[^"]*" '
                    r'(?P<status>\d{3}) \S+ "[^"]*" "[^"]*"(?P<rest>.*)$')
_ENVOY = re.compile(r'^\[(?P<time>[^\]]+)\] "(?P<verb>\S+) (?P<path>\S+)[^"]*" (?P<status>\d{3}|-) \S+ '
                    r'(?P<rx>\d+) (?P<tx>\d+) (?P<dur>\d+) \S+ "[^"]*" "[^"]*" "[^"]*" "(?P<authority>[^"]*)" '
                    r'"(?P<upstream>[^"]*)"')


@dataclass(frozen=True)
class AccessLogFormat:
    """How to read a log: ``kind`` ``json`` / ``nginx`` / ``envoy``; for JSON the field names; the latency unit.

    ``latency_field`` for nginx is the 0-based index among the whitespace-separated fields after the
    combined part (``-1``: the last one).
    """

    kind: str = "json"
    latency_field: str = "duration_ms"
    latency_unit: str = "ms"
    time_field: str = "time"
    service_field: str = "service"
    method_field: str = "method"
    status_field: str = "status"
    service: str = ""

    def check(self) -> None:
        if self.kind not in ("json", "nginx", "envoy"):
            raise ConfigError(f"access log: format {self.kind!r} is not json, nginx or envoy")
        if self.latency_unit not in _UNITS:
            raise ConfigError(f"access log: latency unit {self.latency_unit!r} is not one of {', '.join(_UNITS)}")


def _time_ns(v: Any, where: str) -> int:
    if isinstance(v, int | float) and not isinstance(v, bool):
        x = float(v)
        # epoch seconds, ms, us or ns told apart by magnitude (the years 2001-2286 in each unit)
        scale = 1e9 if x < 1e11 else 1e6 if x < 1e14 else 1e3 if x < 1e17 else 1.0
        return int(x * scale)
    if isinstance(v, str):
        for fmt in ("%d/%b/%Y:%H:%M:%S %z", None):
            try:
                dt = datetime.strptime(v, fmt) if fmt else datetime.fromisoformat(v.replace("Z", "+00:00"))
                return int(dt.timestamp() * 1e9)
            except ValueError:
                continue
    raise TraceFormatError(f"{where}: time {v!r} is neither epoch nor RFC 3339 / nginx time")


def read_access_log(path: str | Path, fmt: AccessLogFormat | None = None) -> SpanTable:
    """Read one access log; bad lines raise TraceFormatError naming file and line; no request -> error."""
    f = fmt or AccessLogFormat()
    f.check()
    p = Path(path)
    svc, nm, ep = _Interner(), _Interner(), _Interner()
    ep.code("")
    rows: list[tuple[int, int, int, int, int]] = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{p}: cannot read: {exc}") from None
    unit = _UNITS[f.latency_unit]
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{p}: line {n}"
        if f.kind == "json":
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(d, dict) or f.latency_field not in d:
                raise TraceFormatError(f"{where}: no latency field {f.latency_field!r}")
            lat = d[f.latency_field]
            service = str(d.get(f.service_field) or f.service or "unknown_service")
            method = str(d.get(f.method_field) or "")
            st = d.get(f.status_field, 200)
            err = st in ("error", "ERROR") or (isinstance(st, int | str) and str(st).isdigit() and int(st) >= 500)
            t0 = _time_ns(d.get(f.time_field), where)
        else:
            m = (_NGINX if f.kind == "nginx" else _ENVOY).match(line)
            if m is None:
                raise TraceFormatError(f"{where}: not an {f.kind} access-log line: {line[:80]!r}")
            method = f"{m['verb']} {m['path'].split('?')[0]}"
            err = m["status"].isdigit() and int(m["status"]) >= 500
            t0 = _time_ns(m["time"], where)
            if f.kind == "nginx":
                extra = m["rest"].split()
                try:
                    lat = extra[int(f.latency_field) if f.latency_field.lstrip("-").isdigit() else -1]
                except IndexError:
                    raise TraceFormatError(f"{where}: no latency field after the combined format") from None
                service = f.service or "nginx"
            else:
                lat = m["dur"]
                service = f.service or m["authority"] or "envoy"
        try:
            lat_ns = int(float(lat) * unit)
        except (TypeError, ValueError):
            raise TraceFormatError(f"{where}: latency {lat!r} is not a number") from None
        if lat_ns < 0:
            raise TraceFormatError(f"{where}: latency {lat!r} is negative")
        rows.append((svc.code(service), nm.code(method), t0, t0 + lat_ns, STATUS_ERROR if err else 0))
    if not rows:
        raise TraceFormatError(f"{p}: no requests found")
    a = np.array(rows, dtype=np.int64)
    k = len(rows)
    ids = np.array([f"{i + 1:032x}" for i in range(k)], dtype="S32")
    return SpanTable(trace_id=ids, span_id=np.array([x[16:] for x in ids], dtype="S16"),
                     parent_id=np.zeros(k, dtype="S16"), service=a[:, 0].astype(np.int32),
                     name=a[:, 1].astype(np.int32), kind=np.full(k, KIND_SERVER, dtype=np.int8),
                     start_ns=a[:, 2], end_ns=a[:, 3], status=a[:, 4].astype(np.int8),
                     endpoint=np.zeros(k, dtype=np.int32), out_tokens=np.full(k, -1, dtype=np.int64),
                     ttft_ns=np.full(k, -1, dtype=np.int64), services=svc.values(), names=nm.values(),
                     endpoints=ep.values())
