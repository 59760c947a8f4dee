"""The collector's own health: per-stream state, rates, errors, buffer fill, sink latency.

Like gnmic's ``api-server`` metrics: :meth:`Collector.self_metrics` returns a plain dict (shape
in :func:`snapshot`) that a Prometheus exporter can turn into gauges and counters, and the
collector logs :func:`summary_line` of it every ``stats-interval``. Clocks come in as numbers
(no time source here), so the rate and rate-limit rules are testable without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabricscope.model.errors import TransportError

__all__ = ["RateLimitedLog", "SinkTiming", "StreamState", "metric_samples", "snapshot", "summary_line"]

# Stream states, in the order a stream moves through them.
CONNECTING, CONNECTED, STALE, RETRYING, STOPPED = "connecting", "connected", "stale", "retrying", "stopped"


@dataclass
class StreamState:
    """What :func:`snapshot` needs of one (connection, device, subscription) stream."""

    name: str
    state: str = CONNECTING
    updates: int = 0
    decode_errors: int = 0
    reconnects: int = 0
    stale: int = 0
    errors: int = 0
    last_error: str = ""


@dataclass
class SinkTiming:
    """Sink write latency (seconds) and errors since start."""

    writes: int = 0
    errors: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    last_s: float = 0.0

    def record(self, seconds: float) -> None:
        self.writes += 1
        self.total_s += seconds
        self.last_s = seconds
        self.max_s = max(self.max_s, seconds)


def write_sinks(indices: Iterable[int], write: Callable[[int], None],
                timing: SinkTiming) -> tuple[list[int], str]:
    """Call ``write(i)`` for each sink index, timing each; (indices that failed, first error).

    Any sink failure is retried by the caller, never fatal: one error message is kept.
    """
    failed: list[int] = []
    first = ""
    for i in indices:
        t0 = time.perf_counter()
        try:
            write(i)
        except Exception as exc:  # any sink failure is retried, never fatal
            failed.append(i)
            first = first or (str(exc) if isinstance(exc, TransportError) else f"{type(exc).__name__}: {exc}")
            timing.errors += 1
            continue
        timing.record(time.perf_counter() - t0)
    return failed, first


def snapshot(
    streams: Mapping[str, StreamState],
    *,
    received: int,
    written: int,
    spilled: int,
    buffer_events: int,
    buffer_max: int,
    buffer_high_water: int,
    sink: SinkTiming,
    updates_per_s: float,
) -> dict[str, Any]:
    """The self-metrics dict. Keys (all numbers are plain int/float):

    ``streams``: {stream: {state, updates, decode_errors, reconnects, stale, errors, last_error}};
    ``states``: {connected, stale, retrying, connecting, stopped: count};
    ``updates_per_s``, ``received``, ``written``, ``spilled``, ``decode_errors``, ``reconnects``;
    ``buffer``: {events, max_events, fill (0..1), high_water};
    ``sink``: {writes, errors, latency_last_s, latency_max_s, latency_mean_s}.
    """
    states = {s: 0 for s in (CONNECTED, STALE, RETRYING, CONNECTING, STOPPED)}
    for st in streams.values():
        states[st.state] = states.get(st.state, 0) + 1
    return {
        "streams": {k: {"state": v.state, "updates": v.updates, "decode_errors": v.decode_errors,
                        "reconnects": v.reconnects, "stale": v.stale, "errors": v.errors,
                        "last_error": v.last_error} for k, v in streams.items()},
        "states": states,
        "updates_per_s": updates_per_s,
        "received": received,
        "written": written,
        "spilled": spilled,
        "decode_errors": sum(v.decode_errors for v in streams.values()),
        "reconnects": sum(v.reconnects for v in streams.values()),
        "buffer": {"events": buffer_events, "max_events": buffer_max,
                   "fill": buffer_events / buffer_max if buffer_max else 0.0, "high_water": buffer_high_water},
        "sink": {"writes": sink.writes, "errors": sink.errors, "latency_last_s": sink.last_s,
                 "latency_max_s": sink.max_s, "latency_mean_s": sink.total_s / sink.writes if sink.writes else 0.0},
    }


def summary_line(m: Mapping[str, Any]) -> str:
    """One log line of a :func:`snapshot`."""
    s, b, k = m["states"], m["buffer"], m["sink"]
    return (f"collector: streams {s['connected']} connected, {s['stale']} stale, {s['retrying']} retrying, "
            f"{s['connecting']} connecting; {m['updates_per_s']:.0f} updates/s; received {m['received']}, "
            f"written {m['written']}, spilled {m['spilled']}; decode errors {m['decode_errors']}; "
            f"reconnects {m['reconnects']}; buffer {b['events']}/{b['max_events']} ({100 * b['fill']:.0f}%); "
            f"sink latency mean {1e3 * k['latency_mean_s']:.1f}ms max {1e3 * k['latency_max_s']:.1f}ms, "
            f"errors {k['errors']}")


@dataclass
class RateLimitedLog:
    """At most one log line per (subject, condition) per ``interval_s``; the rest are counted
    and reported with the next line ("... (and 41 more in 60s)")."""

    logger: logging.Logger
    interval_s: float = 60.0
    _last: dict[tuple[str, str], float] = field(default_factory=dict)
    _held: dict[tuple[str, str], int] = field(default_factory=dict)

    def log(self, level: int, subject: str, condition: str, message: str, now: float) -> bool:
        """Log ``message`` unless this (subject, condition) logged less than ``interval_s`` ago."""
        key = (subject, condition)
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        suffix = f" (and {held} more in the last {self.interval_s:.0f}s)" if held else ""
        self.logger.log(level, "%s%s", message, suffix)
        self._last[key] = now
        return True

    def reset(self, subject: str, condition: str) -> None:
        """Forget a condition (it cleared), so its next occurrence logs at once."""
        self._last.pop((subject, condition), None)
        self._held.pop((subject, condition), None)


def metric_samples(m: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, str], float]]:
    """A :func:`snapshot` as Prometheus samples ``(name, "counter" | "gauge", labels, value)``
    (the shape :class:`~fabricscope.telemetry.sinks.PrometheusSink` exports as
    ``fabricscope_collector_<name>``)."""
    out: list[tuple[str, str, Mapping[str, str], float]] = []
    for key, st in m["streams"].items():
        lab = {"stream": key}
        for state in (CONNECTED, STALE, RETRYING, CONNECTING, STOPPED):
            out.append(("stream_state", "gauge", {**lab, "state": state}, 1.0 if st["state"] == state else 0.0))
        out.append(("stream_stale", "gauge", lab, 1.0 if st["state"] == STALE else 0.0))
        out.append(("updates_total", "counter", lab, float(st["updates"])))
        out.append(("decode_errors_total", "counter", lab, float(st["decode_errors"])))
        out.append(("reconnects_total", "counter", lab, float(st["reconnects"])))
        out.append(("stale_total", "counter", lab, float(st["stale"])))
    out.append(("updates_per_second", "gauge", {}, float(m["updates_per_s"])))
    for k in ("received", "written", "spilled"):
        out.append((f"{k}_total", "counter", {}, float(m[k])))
    b, s = m["buffer"], m["sink"]
    out.append(("buffer_events", "gauge", {}, float(b["events"])))
    out.append(("buffer_fill_ratio", "gauge", {}, float(b["fill"])))
    out.append(("sink_writes_total", "counter", {}, float(s["writes"])))
    out.append(("sink_errors_total", "counter", {}, float(s["errors"])))
    out.append(("sink_latency_seconds_max", "gauge", {}, float(s["latency_max_s"])))
    out.append(("sink_latency_seconds_mean", "gauge", {}, float(s["latency_mean_s"])))
    return out
