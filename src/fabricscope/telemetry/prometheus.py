"""Prometheus exposition of what the collector sees: telemetry series, findings, self-metrics.

Two parts:

* :class:`MetricsState` keeps the latest value per telemetry series (bounded: at most
  ``max_series``; new series past the cap are counted, not stored), counts findings by kind
  and severity, and keeps the set of *active* findings per (kind, subject) (bounded, expiring
  ``finding_ttl_s`` of data time after the finding's window ends). It renders the text
  format with ``prometheus_client`` (the reference client library), so TYPE lines, escaping
  and the ``_total`` suffix of counters follow the exposition-format spec
  (https://prometheus.io/docs/instrumenting/exposition_formats/).
* :class:`MetricsServer` serves it over HTTP from ONE thread running an asyncio loop. Every
  connection is a coroutine with a read deadline and a request-size cap, and the number of
  open connections is capped, so idle or half-sent requests cost a few KiB each and are
  dropped after ``read_timeout_s`` (``http.server``'s ThreadingHTTPServer, like
  ``prometheus_client.start_http_server``, holds one thread per connection with no timeout).

Counter or gauge: gNMI says nothing about a leaf's kind, so a series is a counter when its
path matches ``counters`` (default ``*/counters/*``, the OpenConfig convention) and no
``gauges`` pattern (the config adds the names a rate/delta/downsample processor rewrote).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent

__all__ = ["MetricSample", "MetricsServer", "MetricsState", "metric_name", "severity_of"]

log = logging.getLogger(__name__)

#: One self-metric sample: ``(name, "counter" | "gauge", labels, value)``; exported as
#: ``fabricscope_collector_<name>``.
MetricSample = tuple[str, str, Mapping[str, str], float]

_NAME_RX = re.compile(r"[^a-zA-Z0-9_]")
SeriesKey = tuple[str, str, tuple[tuple[str, str], ...]]


def metric_name(path: str, prefix: str = "gnmi") -> str:
    """``/interfaces/interface/state/counters/in-octets`` -> ``gnmi_interfaces_interface_state_counters_in_octets``."""
    return prefix + "_" + _NAME_RX.sub("_", path.strip("/"))


def _label(k: str) -> str:
    s = _NAME_RX.sub("_", k)
    return s if s and not s[0].isdigit() and not s.startswith("__") else "tag_" + s


def severity_of(f: Finding) -> str:
    """``details["severity"]`` when the detector gave one, else a band of the score.

    Bands: ``critical`` >= 0.9, ``warning`` >= 0.5, else ``info`` (a label for alert routing,
    not a new judgement: the score is the detector's confidence).
    """
    s = f.details.get("severity") if f.details else None
    if isinstance(s, str) and s:
        return s
    return "critical" if f.score >= 0.9 else "warning" if f.score >= 0.5 else "info"


def _globs(patterns: Sequence[str]) -> Callable[[str], bool]:
    if not patterns:
        return lambda _s: False
    rx = re.compile("|".join(fnmatch.translate(p) for p in patterns))
    return lambda s: rx.match(s) is not None


class MetricsState:
    """Bounded latest-value table + findings, rendered as Prometheus text (thread-safe)."""

    def __init__(self, *, prefix: str = "gnmi", counters: Sequence[str] = ("*/counters/*",),
                 gauges: Sequence[str] = (), max_series: int = 200_000, max_active_findings: int = 1_000,
                 finding_ttl_s: float = 300.0,
                 self_metrics: Callable[[], Iterable[MetricSample]] | None = None) -> None:
        self.prefix = prefix
        self.max_series = max_series
        self.max_active = max_active_findings
        self.ttl_ns = int(finding_ttl_s * 1e9)
        self.self_metrics = self_metrics
        self._is_counter_rx = _globs(counters)
        self._is_gauge_rx = _globs(gauges)
        self._kind: dict[str, str] = {}  # metric name -> "counter" | "gauge", first sight wins
        self._series: dict[SeriesKey, float] = {}
        self._findings_total: dict[tuple[str, str], int] = {}
        self._active: dict[tuple[str, str], tuple[int, float]] = {}  # (kind, subject) -> (end_ns, score)
        self._newest_ns = 0
        self.series_dropped = 0
        self.active_evicted = 0
        self._lock = threading.Lock()

    def is_counter(self, path: str) -> bool:
        return self._is_counter_rx(path) and not self._is_gauge_rx(path)

    def update(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        with self._lock:
            series = self._series
            for e in events:
                v = e.value
                if isinstance(v, bool) or not isinstance(v, int | float):
                    continue  # strings (oper-status) are not Prometheus samples
                key = (e.name, e.target, tuple(sorted(e.tags.items())))
                if key not in series and len(series) >= self.max_series:
                    self.series_dropped += 1
                    continue
                series[key] = float(v)
                if e.ts_ns > self._newest_ns:
                    self._newest_ns = e.ts_ns
            for f in findings:
                k = (f.kind, severity_of(f))
                self._findings_total[k] = self._findings_total.get(k, 0) + 1
                self._newest_ns = max(self._newest_ns, f.window[1])
                self._active[(f.kind, f.subject)] = (f.window[1], f.score)
            self._expire()

    def _expire(self) -> None:
        horizon = self._newest_ns - self.ttl_ns
        act = self._active
        for k in [k for k, (end, _) in act.items() if end < horizon]:
            del act[k]
        if len(act) > self.max_active:
            # keep the most recent: the oldest-ended findings are the least likely still true
            for k, _ in sorted(act.items(), key=lambda kv: kv[1][0])[: len(act) - self.max_active]:
                del act[k]
                self.active_evicted += 1

    # ------------------------------------------------------------------ rendering
    def families(self) -> list[Metric]:
        with self._lock:
            series = list(self._series.items())
            totals = dict(self._findings_total)
            active = dict(self._active)
            dropped, evicted = self.series_dropped, self.active_evicted
        fams: dict[str, Metric] = {}
        for (name, target, tags), value in series:
            m = metric_name(name, self.prefix)
            kind = self._kind.setdefault(m, "counter" if self.is_counter(name) else "gauge")
            fam = fams.get(m)
            labels = {"target": target}
            for k, v in tags:
                labels.setdefault(_label(k), v)
            if fam is None:
                doc = f"gNMI {name}"
                fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(m, doc, labels=list(labels))
                fams[m] = fam
            fam.add_sample(fam.name + ("_total" if kind == "counter" else ""), labels, value)
        out = list(fams.values())
        ft = CounterMetricFamily("fabricscope_findings", "Findings by kind and severity since start",
                                 labels=["kind", "severity"])
        for (kind, sev), n in sorted(totals.items()):
            ft.add_metric([kind, sev], n)
        fa = GaugeMetricFamily("fabricscope_finding_active",
                               "1 per (kind, subject) with a finding that ended within the TTL (data time)",
                               labels=["kind", "subject"])
        fs = GaugeMetricFamily("fabricscope_finding_score", "Score of the latest active finding",
                               labels=["kind", "subject"])
        for (kind, subject), (_, score) in sorted(active.items()):
            fa.add_metric([kind, subject], 1)
            fs.add_metric([kind, subject], score)
        out += [ft, fa, fs,
                CounterMetricFamily("fabricscope_exporter_series_dropped",
                                    f"Series not exported because max-series ({self.max_series}) was reached",
                                    value=dropped),
                CounterMetricFamily("fabricscope_exporter_findings_evicted",
                                    f"Active findings evicted because max-active-findings ({self.max_active}) "
                                    "was reached", value=evicted)]
        if self.self_metrics is not None:
            try:
                out += _self_families(self.self_metrics())
            except Exception:  # a foreign snapshot (read while the collector runs) must not cost the scrape
                log.warning("prometheus sink: collector self-metrics unavailable for this scrape", exc_info=True)
        return out

    def render(self) -> bytes:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Families(self.families))
        return generate_latest(reg)


def _self_families(samples: Iterable[MetricSample]) -> list[Metric]:
    fams: dict[str, Metric] = {}
    for name, kind, labels, value in samples:
        m = "fabricscope_collector_" + _NAME_RX.sub("_", name).removesuffix("_total")
        fam = fams.get(m)
        lab = {_label(k): str(v) for k, v in labels.items()}
        if fam is None:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam = fams[m] = cls(m, f"collector {name}", labels=list(lab))
        fam.add_sample(fam.name + ("_total" if kind == "counter" else ""), lab, float(value))
    return list(fams.values())


class _Families:
    def __init__(self, fn: Callable[[], list[Metric]]) -> None:
        self.collect = fn


class MetricsServer:
    """``GET /metrics`` from one asyncio thread: bounded connections, read deadline, size cap."""

    def __init__(self, host: str, port: int, render: Callable[[], bytes], *, max_connections: int = 256,
                 read_timeout_s: float = 10.0, max_request_bytes: int = 8192) -> None:
        self.host, self.port = host, port
        self.render = render
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.max_request_bytes = max_request_bytes
        self.served = 0
        self.rejected = 0
        self.timed_out = 0
        self._conns: set[asyncio.Task[Any]] = set()
        self._ready = threading.Event()
        self._error: OSError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="prometheus-sink")

    def start(self) -> int:
        """Bind and serve; returns the bound port. A bind failure is a :class:`TransportError`."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise TransportError(f"prometheus sink: cannot listen on {self.host}:{self.port}: "
                                 f"{self._error.strerror or self._error}")
        return self.port

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            server = await asyncio.start_server(self._handle, self.host, self.port, limit=self.max_request_bytes)
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._conns) >= self.max_connections:
            self.rejected += 1
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout_s)
            except TimeoutError:
                self.timed_out += 1
                return
            except asyncio.LimitOverrunError:
                await self._send(writer, 431, b"request header too large\n")
                return
            await self._answer(writer, head)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self._conns.discard(task)
            writer.transport.abort()

    async def _answer(self, writer: asyncio.StreamWriter, head: bytes) -> None:
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            await self._send(writer, 400, b"bad request\n")
            return
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            await self._send(writer, 405, b"only GET\n")
            return
        if target not in (b"/metrics", b"/"):
            await self._send(writer, 404, b"not found; try /metrics\n")
            return
        try:
            body = self.render()
        except Exception:  # a bug in rendering must not kill the server thread
            log.exception("prometheus sink: rendering failed")
            await self._send(writer, 500, b"internal error\n")
            return
        self.served += 1
        await self._send(writer, 200, body, head_only=method == b"HEAD",
                         ctype="text/plain; version=0.0.4; charset=utf-8")

    async def _send(self, writer: asyncio.StreamWriter, code: int, body: bytes, *, head_only: bool = False,
                    ctype: str = "text/plain; charset=utf-8") -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large", 500: "Internal Server Error"}[code]
        hdr = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n").encode()
        writer.write(hdr if head_only else hdr + body)
        # a client that never reads is dropped like one that never sends
        await asyncio.wait_for(writer.drain(), self.read_timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)
