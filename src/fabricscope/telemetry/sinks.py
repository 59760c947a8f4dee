"""Collector outputs: DuckDB, Prometheus exposition over HTTP, JSON lines, and memory (tests).

Every sink has ``write(events, findings)`` and ``close()``; a write that fails raises
:class:`TransportError` and the collector keeps the batch and retries (store outages lose
nothing). The Prometheus exposition and its bounded HTTP server live in
:mod:`fabricscope.telemetry.prometheus` (bound to 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.prometheus import MetricSample, MetricsServer, MetricsState, metric_name

if TYPE_CHECKING:
    from fabricscope.store.rolling import RollingTelemetryStore
    from fabricscope.store.telemetry import TelemetryStore

__all__ = ["DuckDBSink", "JsonLinesSink", "MemorySink", "PrometheusSink", "Sink", "build_sink", "metric_name"]


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
    """Events and findings into DuckDB.

    ``roll_interval`` > 0 (the default, 60 s): rolling partitions that other processes can
    query while the collector runs (:func:`fabricscope.store.telemetry.open_readonly`,
    ``fabricscope gnmi query``), folded into ``path`` when no reader holds it and at close.
    0: one file held exclusively for the whole run (nobody else can open it meanwhile).
    """

    def __init__(self, path: str = "telemetry.duckdb", roll_interval: float = 60.0) -> None:
        if not isinstance(path, str):
            raise ConfigError(f"duckdb sink: path: expected a file path (a string), got {type(path).__name__}")
        from fabricscope.store.rolling import RollingTelemetryStore
        from fabricscope.store.telemetry import TelemetryStore

        self.store: TelemetryStore | RollingTelemetryStore
        if roll_interval > 0 and path != ":memory:":
            self.store = RollingTelemetryStore(path, roll_interval_s=roll_interval)
        else:
            self.store = TelemetryStore(path)

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        # One transaction: a retried batch is never stored twice.
        self.store.write_batch(events, findings)

    def close(self) -> None:
        self.store.close()


class JsonLinesSink:
    """One JSON object per line: ``{"ts_ns", "target", "name", "tags", "value"}`` or a finding."""

    def __init__(self, path: str = "-") -> None:
        if not isinstance(path, str):
            # open(2) would write into file descriptor 2
            raise ConfigError(f"jsonl sink: path: expected a file path (a string), got {type(path).__name__}")
        self._own = path != "-"
        self._fd = -1
        try:
            if self._own:
                # Unbuffered O_APPEND: a failed batch is cut back off the file (see write).
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fh: IO[str] = sys.stdout
        except OSError as exc:
            raise ConfigError(f"jsonl sink: path: cannot open {path!r}: {exc.strerror}") from exc

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        lines = [json.dumps({"ts_ns": e.ts_ns, "target": e.target, "name": e.name, "tags": dict(e.tags),
                             "value": e.value}) for e in events]
        lines += [json.dumps({"finding": f.kind, "subject": f.subject, "score": f.score, "window": list(f.window),
                              "evidence": list(f.evidence), "action": f.action}) for f in findings]
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        if not self._own:
            try:
                self._fh.write(text)
                self._fh.flush()
            except OSError as exc:
                raise TransportError(f"jsonl sink: write failed: {exc}") from exc
            return
        data = memoryview(text.encode())
        start = os.fstat(self._fd).st_size
        try:
            while data:
                n = os.write(self._fd, data)
                data = data[n:]
        except OSError as exc:
            # All or nothing: the retry writes the whole batch again, so the part that did
            # reach the file must go (else those lines would be stored twice).
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise TransportError(f"jsonl sink: write failed: {exc}") from exc

    def close(self) -> None:
        if self._own and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class PrometheusSink:
    """Latest value per series, finding counts and active findings on ``http://<listen>/metrics``.

    Binds 127.0.0.1 unless ``listen`` names another address. Counters are exported with
    TYPE ``counter`` (see :mod:`fabricscope.telemetry.prometheus` for the rule and bounds);
    ``self_metrics`` (or :meth:`set_self_metrics`) adds the collector's own health samples.
    """

    def __init__(self, listen: str = "127.0.0.1:9273", prefix: str = "gnmi", *,
                 counters: Sequence[str] = ("*/counters/*",), gauges: Sequence[str] = (),
                 max_series: int = 200_000, max_active_findings: int = 1_000, finding_ttl: float = 300.0,
                 self_metrics: Callable[[], Iterable[MetricSample]] | None = None,
                 max_connections: int = 256, read_timeout_s: float = 10.0) -> None:
        host, _, port = listen.rpartition(":")
        self.prefix = prefix
        self.state = MetricsState(prefix=prefix, counters=counters, gauges=gauges, max_series=max_series,
                                  max_active_findings=max_active_findings, finding_ttl_s=finding_ttl,
                                  self_metrics=self_metrics)
        self.server = MetricsServer(host.strip("[]") or "127.0.0.1", int(port), self.state.render,
                                    max_connections=max_connections, read_timeout_s=read_timeout_s)
        self.port = self.server.start()
        self.host = self.server.host

    def set_self_metrics(self, fn: Callable[[], Iterable[MetricSample]] | None) -> None:
        """Export ``fn()``'s samples as ``fabricscope_collector_*`` on every scrape."""
        self.state.self_metrics = fn

    def write(self, events: Sequence[TelemetryEvent], findings: Sequence[Finding]) -> None:
        self.state.update(events, findings)

    def close(self) -> None:
        self.server.close()


SINKS: dict[str, Callable[..., Sink]] = {
    "duckdb": DuckDBSink,
    "jsonl": JsonLinesSink,
    "prometheus": PrometheusSink,
    "memory": MemorySink,
}


def build_sink(stype: str, options: Mapping[str, Any], *,
               self_metrics: Callable[[], Iterable[MetricSample]] | None = None) -> Sink:
    """The sink of a validated :class:`~fabricscope.telemetry.config.SinkConfig`.

    ``self_metrics`` goes to the Prometheus sink (other sinks ignore it).
    """
    if stype == "remote_write":
        from fabricscope.telemetry.remote_write import build_remote_write_sink

        return build_remote_write_sink(options)
    cls = SINKS.get(stype)
    if cls is None:
        raise ConfigError(f"sinks: unknown sink {stype!r}; choose from {sorted([*SINKS, 'remote_write'])}")
    opts = {k.replace("-", "_"): v for k, v in options.items()}
    if stype == "prometheus" and self_metrics is not None:
        opts["self_metrics"] = self_metrics
    return cls(**opts)


def open_path(p: str) -> Path:
    return Path(p)
