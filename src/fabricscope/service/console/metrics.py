"""Prometheus exposition of the console: incidents, findings, supervisor, alerts, instruments.

:func:`render_metrics` is one pure function from a :class:`ConsoleState` (plus the caller's
HTTP counters and the alert sinks) to the bytes of the text exposition format 0.0.4
(https://prometheus.io/docs/instrumenting/exposition_formats/). It renders through
``prometheus_client``'s registry and metric families, so ``# TYPE`` lines, escaping and the
``_total`` suffix of counters follow the spec: counters are counters, gauges are gauges.

Cardinality is bounded whatever the fabric size (every series is listed, with its bound, in
``docs/console-metrics.md``): incidents by (severity, fault type) — both closed sets;
findings by (source, kind); probe loss only for pairs with loss > 0, the ``MAX_LOSS_PAIRS``
worst; straggler slowdown for the ``MAX_RANKS`` slowest ranks; optics ports and links
counted by grade / state, never per port.

Views are the JSON dicts the instruments publish with ``state.set_view`` (the bodies of
``/api/v1/probes/matrix``, ``/stragglers``, ``/optics``; ``links`` is a count per state). A
view that is absent adds no series; one that is malformed is skipped for that scrape with
one log line (a scrape never fails on one bad view).
"""

from __future__ import annotations

import heapq
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from fabricscope.model.errors import ConfigError
from fabricscope.service.console.alerts import DeliveryCounts
from fabricscope.service.console.state import SEVERITIES, ConsoleState, incident_kind

__all__ = ["CONTENT_TYPE", "MAX_LOSS_PAIRS", "MAX_RANKS", "console_families", "render_metrics"]

log = logging.getLogger(__name__)

#: The Content-Type of :func:`render_metrics`'s bytes (text format 0.0.4, which every
#: Prometheus 2.x and 3.x scrapes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: At most this many ``fabricscope_probe_loss_ratio`` series (the lossiest pairs).
MAX_LOSS_PAIRS = 1000
#: At most this many ``fabricscope_straggler_slowdown_ratio`` series (the slowest ranks).
MAX_RANKS = 64

_NAME_RX = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_warned: set[str] = set()


def _warn_once(view: str, exc: Exception) -> None:
    if view not in _warned:
        _warned.add(view)
        log.warning("metrics: view %r skipped (malformed: %s); later scrapes skip it quietly",
                    view, exc)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _state_families(state: ConsoleState) -> list[Metric]:
    c = state.counters
    snap = state.snapshot()
    out: list[Metric] = []
    # every (severity, kind) seen among retained incidents, 0 when none is open: a closed
    # incident turns its series to 0 instead of making it vanish (and go stale)
    _, items = state.incidents(limit=state.max_incidents)
    open_by = state.open_by()
    pairs = {(i.severity, incident_kind(i)) for i in items} | set(open_by)
    g = GaugeMetricFamily("fabricscope_incidents_open",
                          "Open incidents by severity and the top root cause's fault type",
                          labels=["severity", "kind"])
    for sev, kind in sorted(pairs, key=lambda p: (_sev_rank(p[0]), p[1])):
        g.add_metric([sev, kind], open_by.get((sev, kind), 0))
    out.append(g)
    out += [
        _counter("fabricscope_incidents_opened", "Incidents opened since start",
                 c.incidents_opened),
        _counter("fabricscope_incidents_closed", "Incidents closed since start",
                 c.incidents_closed),
        _counter("fabricscope_console_incidents_evicted",
                 f"Incidents dropped from memory (max {state.max_incidents} kept, closed first)",
                 c.incidents_evicted),
        _counter("fabricscope_console_findings_evicted",
                 f"Findings dropped from memory (max {state.max_findings} kept)",
                 c.findings_evicted),
        _gauge("fabricscope_console_incidents", "Incidents held in memory (open and closed)",
               snap["incidents"]),
        _gauge("fabricscope_console_findings", "Findings held in memory", snap["findings"]),
    ]
    f = CounterMetricFamily("fabricscope_findings", "Findings reported since start",
                            labels=["source", "kind"])
    for (source, kind), n in sorted(c.findings.items()):
        f.add_metric([source, kind], n)
    out.append(f)
    out += [
        _gauge("fabricscope_supervisor_sim_time_seconds",
               "The supervisor's clock (simulated seconds in twin mode)", state.sim_ns / 1e9),
        _gauge("fabricscope_supervisor_speed", "Simulated seconds per wall second (twin mode)",
               float(state.speed)),
        _counter("fabricscope_supervisor_segments", "Supervisor segments run (instruments)",
                 c.segments),
        _counter("fabricscope_supervisor_cpu_seconds", "CPU time spent by the supervisor",
                 c.supervisor_cpu_s),
        _counter("fabricscope_console_acks", "Incident acknowledgements by operators", c.acks),
        _counter("fabricscope_console_approvals", "Action approvals by operators", c.approvals),
        _gauge("fabricscope_console_uptime_seconds", "Seconds since the console started",
               max(0.0, float(snap["uptime_s"]))),
    ]
    return out


def _sev_rank(sev: str) -> int:
    return SEVERITIES.index(sev) if sev in SEVERITIES else len(SEVERITIES)


def _sink_families(sinks: Iterable[DeliveryCounts]) -> list[Metric]:
    sent = CounterMetricFamily("fabricscope_alerts_sent",
                               "Notifications the receiver accepted", labels=["receiver"])
    failed = CounterMetricFamily("fabricscope_alerts_failed",
                                 "Notifications given up after retries", labels=["receiver"])
    dropped = CounterMetricFamily("fabricscope_alerts_dropped",
                                  "Notifications dropped (queue full or after shutdown)",
                                  labels=["receiver"])
    for s in sinks:
        sent.add_metric([s.name], s.sent)
        failed.add_metric([s.name], s.failed)
        dropped.add_metric([s.name], s.dropped)
    return [sent, failed, dropped]


def _probe_families(view: Mapping[str, Any]) -> list[Metric]:
    nodes = [str(n) for n in view["nodes"]]
    loss = view["loss"]
    lossy: list[tuple[float, str, str]] = []
    for i, row in enumerate(loss):
        for j, v in enumerate(row):
            if v is not None and v > 0 and math.isfinite(v):
                lossy.append((float(v), nodes[i], nodes[j]))
    worst = heapq.nlargest(MAX_LOSS_PAIRS, lossy)
    g = GaugeMetricFamily("fabricscope_probe_loss_ratio",
                          f"Probe loss ratio per (src, dst) over the last window; only pairs "
                          f"with loss, the {MAX_LOSS_PAIRS} worst",
                          labels=["src", "dst", "group"])
    group = str(view.get("group", "nic"))
    for v, src, dst in sorted(worst, key=lambda t: (t[1], t[2])):
        g.add_metric([src, dst, group], v)
    return [
        g,
        _gauge("fabricscope_probe_lossy_pairs", "Probed pairs with loss > 0 in the last window",
               len(lossy)),
        _gauge("fabricscope_probe_pairs",
               "Probed pairs with a measurement in the last window",
               sum(1 for row in loss for v in row if v is not None)),
        _gauge("fabricscope_probe_window_seconds", "Length of the probe analysis window",
               float(view.get("window_s", 0.0))),
    ]


def _optics_families(view: Mapping[str, Any]) -> list[Metric]:
    g = GaugeMetricFamily("fabricscope_optics_ports", "Optical ports by health grade",
                          labels=["grade"])
    for grade, n in sorted(view["counts"].items()):
        g.add_metric([str(grade)], float(n))
    return [g]


def _straggler_families(view: Mapping[str, Any]) -> list[Metric]:
    windows = view["windows"]
    ranks = view.get("ranks") or []
    g = GaugeMetricFamily("fabricscope_straggler_slowdown_ratio",
                          f"Per-rank slowdown (iteration time / median) in the last window; "
                          f"the {MAX_RANKS} slowest ranks", labels=["rank", "gpu"])
    if windows:
        values = windows[-1]["values"]
        gpu = {int(r["rank"]): str(r.get("gpu", "")) for r in ranks}
        scored = [(float(v), k) for k, v in enumerate(values)
                  if v is not None and math.isfinite(v)]
        for v, k in sorted(heapq.nlargest(MAX_RANKS, scored), key=lambda t: t[1]):
            g.add_metric([str(k), gpu.get(k, "")], v)
    job = view.get("job") or {}
    return [g, _gauge("fabricscope_straggler_ranks", "Ranks of the observed job",
                      float(job.get("ranks", len(ranks))))]


def _links_families(view: Mapping[str, Any]) -> list[Metric]:
    counts = view.get("counts", view)
    g = GaugeMetricFamily("fabricscope_links", "Fabric links by state", labels=["state"])
    for st, n in sorted(counts.items()):
        if isinstance(n, int | float) and not isinstance(n, bool):
            g.add_metric([str(st)], float(n))
    return [g]


def _overlay_families(view: Mapping[str, Mapping[str, float]]) -> list[Metric]:
    top = GaugeMetricFamily("fabricscope_link_overlay_max",
                            "Largest per-link value of each overlay metric (utilization, "
                            "loss ratio, PFC pauses/s, optics grade code, state 1 = down)",
                            labels=["metric"])
    n = GaugeMetricFamily("fabricscope_link_overlay_links",
                          "Links with a non-zero value of each overlay metric",
                          labels=["metric"])
    for metric, values in sorted(view.items()):
        finite = [float(v) for v in values.values() if math.isfinite(v)]
        top.add_metric([str(metric)], max(finite, default=0.0))
        n.add_metric([str(metric)], len(finite))
    return [top, n]


_VIEWS = (("probes", _probe_families), ("optics", _optics_families),
          ("stragglers", _straggler_families), ("links", _links_families),
          ("overlay", _overlay_families))


_EXTRA_HELP = {
    "fabricscope_http_requests_total": "HTTP requests served by the console API",
    "fabricscope_http_login_failures_total": "HTTP requests refused for a missing or bad token",
    "fabricscope_sse_clients": "Clients connected to the live event stream (SSE)",
}


def _extra_families(extra: Mapping[str, float]) -> list[Metric]:
    out: list[Metric] = []
    for name, value in sorted(extra.items()):
        if not _NAME_RX.match(name):
            raise ConfigError(f"metrics: extra series name {name!r} is not a valid "
                              "Prometheus metric name")
        if name.endswith("_total"):
            out.append(_counter(name.removesuffix("_total"),
                                _EXTRA_HELP.get(name, "console counter"), value))
        else:
            out.append(_gauge(name, _EXTRA_HELP.get(name, "console gauge"), value))
    return out


def console_families(state: ConsoleState, extra: Mapping[str, float] | None = None, *,
                     sinks: Iterable[DeliveryCounts] = ()) -> list[Metric]:
    """The metric families :func:`render_metrics` renders (for a caller's own registry)."""
    out = _state_families(state) + _sink_families(sinks)
    for name, fn in _VIEWS:
        view = state.view(name)
        if view is None:
            continue
        try:
            out += fn(view)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            _warn_once(name, exc)
    if extra:
        out += _extra_families(extra)
    return out


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def render_metrics(state: ConsoleState, extra: Mapping[str, float] | None = None, *,
                   sinks: Iterable[DeliveryCounts] = ()) -> bytes:
    """The console's ``/metrics`` body (text format 0.0.4; serve it as :data:`CONTENT_TYPE`).

    ``extra`` adds the caller's own series, ``name -> value``: a name ending in ``_total`` is
    a counter, any other a gauge (the API passes ``fabricscope_http_requests_total``,
    ``fabricscope_http_login_failures_total`` and ``fabricscope_sse_clients``); an invalid
    name is a :class:`ConfigError`. ``sinks`` are the alert senders (each with ``name``,
    ``sent``, ``failed``, ``dropped``), exported as ``fabricscope_alerts_*_total{receiver}``.
    """
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(console_families(state, extra, sinks=sinks)))
    return generate_latest(reg)
