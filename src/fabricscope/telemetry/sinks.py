"""Collector outputs: DuckDB, Prometheus exposition over HTTP, JSON lines, and memory (tests).

Every sink has ``write(events, findings)`` and ``close()``; a write that fails raises
:class:`TransportError` and the collector keeps the batch and retries (store outages lose
nothing). The Prometheus text is built by a pure function (:func:`exposition`) and served by
a tiny HTTP server bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Protocol

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent


class Sink(Protocol):
    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None: ...
    def close(self) -> None: ...


class MemorySink:
    """Keeps everything in lists; ``fail`` makes writes raise (to test outages)."""

    def __init__(self) -> None:
        self.events: list[TelemetryEvent] = []
        self.findings: list[Finding] = []
        self.fail = False

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        if self.fail:
            raise TransportError("memory sink: simulated outage")
        self.events.extend(events)
        self.findings.extend(findings)

    def close(self) -> None:
        pass


class DuckDBSink:
    def __init__(self, path: str = "telemetry.duckdb") -> None:
        from fabricscope.store.telemetry import TelemetryStore

        self.store = TelemetryStore(path)

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        self.store.write_events(events)
        self.store.write_findings(findings)

    def close(self) -> None:
        self.store.close()


class JsonLinesSink:
    """One JSON object per line: ``{"ts_ns", "target", "name", "tags", "value"}`` or a finding."""

    def __init__(self, path: str = "-") -> None:
        self._own = path != "-"
        try:
            self._fh: IO[str] = open(path, "a", encoding="utf-8") if self._own else sys.stdout  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"jsonl sink: path: cannot open {path!r}: {exc.strerror}") from exc

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        lines = [json.dumps({"ts_ns": e.ts_ns, "target": e.target, "name": e.name, "tags": dict(e.tags),
                             "value": e.value}) for e in events]
        lines += [json.dumps({"finding": f.kind, "subject": f.subject, "score": f.score, "window": list(f.window),
                              "evidence": list(f.evidence), "action": f.action}) for f in findings]
        if lines:
            try:
                self._fh.write("\n".join(lines) + "\n")
                self._fh.flush()
            except OSError as exc:
                raise TransportError(f"jsonl sink: write failed: {exc}") from exc

    def close(self) -> None:
        if self._own:
            self._fh.close()


_NAME_RX = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(path: str, prefix: str = "gnmi") -> str:
    """``/interfaces/interface/state/counters/in-octets`` -> ``gnmi_interfaces_interface_state_counters_in_octets``."""
    return prefix + "_" + _NAME_RX.sub("_", path.strip("/"))


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(series: Mapping[tuple[str, str, tuple[tuple[str, str], ...]], tuple[float, int]],
               *, prefix: str = "gnmi") -> bytes:
    """Prometheus text format 0.0.4 of the latest value per series (pure)."""
    by_metric: dict[str, list[str]] = {}
    for (name, target, tags), (value, ts_ns) in series.items():
        m = metric_name(name, prefix)
        labels = ",".join(f'{_NAME_RX.sub("_", k)}="{_esc(v)}"' for k, v in (("target", target), *tags))
        by_metric.setdefault(m, []).append(f"{m}{{{labels}}} {value!r} {ts_ns // 1_000_000}")
    out: list[str] = []
    for m in sorted(by_metric):
        out.append(f"# TYPE {m} gauge")
        out += sorted(by_metric[m])
    return ("\n".join(out) + "\n").encode()


class PrometheusSink:
    """Latest numeric value per series on ``http://<listen>/metrics`` (127.0.0.1 by default)."""

    def __init__(self, listen: str = "127.0.0.1:9273", prefix: str = "gnmi") -> None:
        host, _, port = listen.rpartition(":")
        self.prefix = prefix
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[float, int]] = {}
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                with sink._lock:
                    body = exposition(sink._series, prefix=sink.prefix)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        try:
            self._httpd = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
        except OSError as exc:
            raise TransportError(f"prometheus sink: cannot listen on {listen}: {exc.strerror}") from exc
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="prometheus-sink")
        self._thread.start()

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        with self._lock:
            for e in events:
                v = e.value
                if isinstance(v, bool) or not isinstance(v, int | float):
                    continue
                self._series[(e.name, e.target, tuple(sorted(e.tags.items())))] = (float(v), e.ts_ns)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


SINKS: dict[str, Callable[..., Sink]] = {
    "duckdb": DuckDBSink,
    "jsonl": JsonLinesSink,
    "prometheus": PrometheusSink,
    "memory": MemorySink,
}


def build_sink(stype: str, options: Mapping[str, Any]) -> Sink:
    cls = SINKS.get(stype)
    if cls is None:
        raise ConfigError(f"sinks: unknown sink {stype!r}; choose from {sorted(SINKS)}")
    opts = {k.replace("-", "_"): v for k, v in options.items() if k != "table"}
    return cls(**opts)


def open_path(p: str) -> Path:
    return Path(p)
