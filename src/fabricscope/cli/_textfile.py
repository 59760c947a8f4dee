"""Self-metrics of a process without an HTTP server: a Prometheus textfile.

node_exporter's textfile collector (``--collector.textfile.directory``) exports every
``*.prom`` file of a folder; ``prometheus_client.write_to_textfile`` writes one atomically
(temporary file + rename), so a scrape never reads half a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path


def write_textfile(path: Path, samples: Sequence[tuple[str, str, dict[str, str], float]], *,
                   help_text: str = "fabricscope self-metric") -> None:
    """Write ``(name, "counter" | "gauge", labels, value)`` samples to ``path`` (atomically).
    Counter names end in ``_total`` (the family is the name without it)."""
    from prometheus_client import CollectorRegistry, write_to_textfile
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

    class _Once:
        def collect(self) -> Iterable[Metric]:
            for name, kind, labels, value in samples:
                if kind == "counter":
                    c = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=list(labels))
                    c.add_metric(list(labels.values()), value)
                    yield c
                else:
                    g = GaugeMetricFamily(name, help_text, labels=list(labels))
                    g.add_metric(list(labels.values()), value)
                    yield g

    reg = CollectorRegistry()
    reg.register(_Once())
    write_to_textfile(str(path), reg)
