"""The console's /metrics: types and values parsed with prometheus_client's parser, bounded
cardinality, and a REAL Prometheus (the Debian binary) scraping the real console server
with a bearer token, queried over its HTTP API with PromQL."""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fabricscope.diagnosis.model import Incident, Observed, RootCause
from fabricscope.fabric.catalog import build_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.model.records import Finding
from fabricscope.service.console.metrics import (
    CONTENT_TYPE,
    MAX_LOSS_PAIRS,
    MAX_RANKS,
    render_metrics,
)
from fabricscope.service.console.state import ConsoleState

NS = 1_000_000_000
PROM_BIN = shutil.which("prometheus")
DASHBOARDS = Path(str(resources.files("fabricscope.api") / "dashboards"))


def incident(id: str, *, severity: str = "warning", fault: str | None = "dirty-connector",
             status: str = "open") -> Incident:
    rcs = (RootCause("leaf-p0-r0:eth3", fault, 0.8),) if fault else ()
    return Incident(id=id, status=status, opened_ns=NS, updated_ns=2 * NS,  # type: ignore[arg-type]
                    first_symptom_ns=NS, detected_ns=NS, root_causes=rcs, severity=severity,
                    closed_ns=2 * NS if status == "closed" else None)


def families(body: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(body: bytes, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in families(body).values()
            for s in f.samples if s.name == name}


@dataclasses.dataclass
class FakeSink:  # counters only: what render_metrics reads from a real sink
    name: str
    sent: int
    failed: int
    dropped: int


def populated_state() -> ConsoleState:
    state = ConsoleState(build_fabric("rail-optimized", {"servers": 8}))
    state.upsert_incident(incident("inc-1", severity="critical"))
    state.upsert_incident(incident("inc-2", severity="critical"))
    state.upsert_incident(incident("inc-3", fault="link-down"))
    state.upsert_incident(incident("inc-4", fault=None, severity="info"))
    state.upsert_incident(incident("inc-5", fault="pfc-storm"))
    state.upsert_incident(incident("inc-5", fault="pfc-storm", status="closed"))
    state.add_findings([Observed("telemetry", Finding("crc-increase", "leaf-p0-r0:eth3", 0.9,
                                                      (0, NS)), NS),
                        Observed("telemetry", Finding("crc-increase", "leaf-p0-r1:eth3", 0.9,
                                                      (0, NS)), NS),
                        Observed("probe", Finding("gray-link", "a|b", 0.7, (0, NS)), NS),
                        Observed("straggler", Finding("slow-rank", "rank3", 0.8, (0, NS)), NS),
                        Observed("optics", Finding("optic-degrading", "x:eth1", 0.6, (0, NS)),
                                 NS)])
    state.set_time(90 * NS)
    state.counters.segments = 9
    state.counters.supervisor_cpu_s = 4.5
    state.acknowledge("inc-1", "ops")
    nodes = [f"host{i:04d}/nic0" for i in range(4)]
    loss: list[list[float | None]] = [[None if i == j else 0.0 for j in range(4)]
                                      for i in range(4)]
    loss[0][1] = 0.25
    loss[2][3] = 0.01
    state.set_view("probes", {"window_s": 10.0, "group": "nic", "nodes": nodes, "loss": loss,
                              "rtt_us": [[None] * 4 for _ in range(4)]})
    state.set_view("optics", {"counts": {"good": 60, "degrading": 3, "failing": 1},
                              "ports": []})
    state.set_view("stragglers", {"job": {"ranks": 4, "iterations": 30},
                                  "ranks": [{"rank": r, "gpu": f"host0000/gpu{r}"}
                                            for r in range(4)],
                                  "windows": [{"t_ns": NS, "values": [1.0, 1.0, 1.0, 1.0]},
                                              {"t_ns": 2 * NS, "values": [1.0, 1.02, 1.9, 0.99]}],
                                  "findings": []})
    state.set_view("links", {"up": 120, "down": 1, "degraded": 2})
    state.set_view("overlay", {"utilization": {"l1": 0.5, "l2": 0.75}, "loss": {"l1": 0.01},
                               "pfc": {}, "optics": {"l3": 2}, "state": {"l4": 1}})
    return state


EXTRA = {"fabricscope_http_requests_total": 42.0, "fabricscope_http_login_failures_total": 3.0,
         "fabricscope_sse_clients": 2.0}


def test_every_series_has_the_right_type_and_value() -> None:
    state = populated_state()
    body = render_metrics(state, EXTRA, sinks=[FakeSink("alertmanager", 5, 1, 0),
                                               FakeSink("webhook", 2, 0, 4)])
    fam = families(body)
    counters = {"fabricscope_incidents_opened", "fabricscope_incidents_closed",
                "fabricscope_findings", "fabricscope_supervisor_segments",
                "fabricscope_supervisor_cpu_seconds", "fabricscope_console_acks",
                "fabricscope_console_approvals", "fabricscope_alerts_sent",
                "fabricscope_alerts_failed", "fabricscope_alerts_dropped",
                "fabricscope_http_requests", "fabricscope_http_login_failures"}
    gauges = {"fabricscope_incidents_open", "fabricscope_supervisor_sim_time_seconds",
              "fabricscope_console_uptime_seconds", "fabricscope_probe_loss_ratio",
              "fabricscope_optics_ports", "fabricscope_straggler_slowdown_ratio",
              "fabricscope_links", "fabricscope_sse_clients", "fabricscope_link_overlay_max"}
    for name in counters:
        assert fam[name].type == "counter", name
    for name in gauges:
        assert fam[name].type == "gauge", name
    text = body.decode()
    assert "# TYPE fabricscope_incidents_opened_total counter" in text
    assert "# TYPE fabricscope_incidents_open gauge" in text

    assert samples(body, "fabricscope_incidents_open") == {
        (("kind", "dirty-connector"), ("severity", "critical")): 2.0,
        (("kind", "link-down"), ("severity", "warning")): 1.0,
        (("kind", "unexplained"), ("severity", "info")): 1.0,
        (("kind", "pfc-storm"), ("severity", "warning")): 0.0,  # closed: 0, not gone
    }
    assert samples(body, "fabricscope_incidents_opened_total") == {(): 5.0}
    assert samples(body, "fabricscope_incidents_closed_total") == {(): 1.0}
    assert samples(body, "fabricscope_findings_total")[
        (("kind", "crc-increase"), ("source", "telemetry"))] == 2.0
    assert samples(body, "fabricscope_supervisor_sim_time_seconds") == {(): 90.0}
    assert samples(body, "fabricscope_supervisor_segments_total") == {(): 9.0}
    assert samples(body, "fabricscope_supervisor_cpu_seconds_total") == {(): 4.5}
    assert samples(body, "fabricscope_console_acks_total") == {(): 1.0}
    assert samples(body, "fabricscope_alerts_dropped_total") == {
        (("receiver", "alertmanager"),): 0.0, (("receiver", "webhook"),): 4.0}
    assert samples(body, "fabricscope_probe_loss_ratio") == {
        (("dst", "host0001/nic0"), ("group", "nic"), ("src", "host0000/nic0")): 0.25,
        (("dst", "host0003/nic0"), ("group", "nic"), ("src", "host0002/nic0")): 0.01}
    assert samples(body, "fabricscope_probe_lossy_pairs") == {(): 2.0}
    assert samples(body, "fabricscope_probe_pairs") == {(): 12.0}
    assert samples(body, "fabricscope_optics_ports")[(("grade", "failing"),)] == 1.0
    slow = samples(body, "fabricscope_straggler_slowdown_ratio")
    assert slow[(("gpu", "host0000/gpu2"), ("rank", "2"))] == 1.9 and len(slow) == 4
    assert samples(body, "fabricscope_links") == {
        (("state", "up"),): 120.0, (("state", "down"),): 1.0, (("state", "degraded"),): 2.0}
    assert samples(body, "fabricscope_link_overlay_max")[(("metric", "utilization"),)] == 0.75
    assert samples(body, "fabricscope_http_requests_total") == {(): 42.0}
    assert samples(body, "fabricscope_sse_clients") == {(): 2.0}
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_a_state_with_no_views_has_no_view_series() -> None:
    body = render_metrics(ConsoleState(build_fabric("rail-optimized", {"servers": 8})))
    fam = families(body)
    assert "fabricscope_incidents_open" in fam and not fam["fabricscope_incidents_open"].samples
    for name in ("fabricscope_probe_loss_ratio", "fabricscope_optics_ports",
                 "fabricscope_straggler_slowdown_ratio", "fabricscope_links"):
        assert name not in fam


def test_cardinality_is_bounded_to_the_worst_pairs_and_slowest_ranks() -> None:
    state = ConsoleState(build_fabric("rail-optimized", {"servers": 8}))
    n = 60  # 3,540 lossy pairs
    nodes = [f"n{i}" for i in range(n)]
    loss = [[None if i == j else (i * n + j) / (n * n) for j in range(n)] for i in range(n)]
    state.set_view("probes", {"window_s": 10.0, "group": "host", "nodes": nodes, "loss": loss,
                              "rtt_us": []})
    values = [1.0 + (r % 97) / 100 for r in range(500)]
    state.set_view("stragglers", {"job": {"ranks": 500, "iterations": 5},
                                  "ranks": [{"rank": r, "gpu": f"g{r}"} for r in range(500)],
                                  "windows": [{"t_ns": NS, "values": values}], "findings": []})
    body = render_metrics(state)
    lossy = samples(body, "fabricscope_probe_loss_ratio")
    assert len(lossy) == MAX_LOSS_PAIRS
    every = sorted((v for row in loss for v in row if v), reverse=True)
    assert min(lossy.values()) == every[MAX_LOSS_PAIRS - 1]  # the worst ones kept
    assert samples(body, "fabricscope_probe_lossy_pairs") == {(): float(n * (n - 1))}
    slow = samples(body, "fabricscope_straggler_slowdown_ratio")
    assert len(slow) == MAX_RANKS
    assert min(slow.values()) >= sorted(values, reverse=True)[MAX_RANKS - 1]


def test_a_malformed_view_is_skipped_and_a_bad_extra_name_is_an_error() -> None:
    state = populated_state()
    state.set_view("probes", {"nodes": ["a"]})  # no "loss"
    fam = families(render_metrics(state))
    assert "fabricscope_probe_loss_ratio" not in fam and "fabricscope_links" in fam
    with pytest.raises(ConfigError, match="bad-name"):
        render_metrics(state, {"bad-name": 1.0})


# -- a real Prometheus scraping the real console -------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.2)


def docs_scrape_config() -> dict[str, Any]:
    """The ``scrape_configs`` YAML block of docs/console-metrics.md."""
    text = (Path(__file__).parent.parent / "docs" / "console-metrics.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "scrape_configs" in b]
    cfg = yaml.safe_load(block)
    assert isinstance(cfg, dict)
    return cfg


def prom_get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]


def test_real_prometheus_scrapes_the_console_with_a_bearer_token(tmp_path: Path) -> None:
    if PROM_BIN is None:
        pytest.skip("Prometheus not installed: apt-get install prometheus")
    from fabricscope.api.app import ApiSettings, create_app
    from fabricscope.api.server import start_server

    token = secrets.token_urlsafe(24)
    state = populated_state()
    server = start_server(create_app(state, ApiSettings(token=token)))
    (tmp_path / "token").write_text(token)
    console = server.url.removeprefix("http://")
    # the scrape config of docs/console-metrics.md, as written there but for these values
    cfg = docs_scrape_config()
    [job] = cfg["scrape_configs"]
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    job["authorization"]["credentials_file"] = str(tmp_path / "token")
    job["static_configs"] = [{"targets": [console]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([PROM_BIN, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        def series() -> dict[tuple[str, str], float]:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                data = prom_get(base, "/api/v1/query", query="fabricscope_incidents_open")
            except OSError:
                return {}
            return {(r["metric"]["severity"], r["metric"]["kind"]): float(r["value"][1])
                    for r in data["result"]}
        got = wait_for(series, 30, "fabricscope_incidents_open in Prometheus")
        assert got == {("critical", "dirty-connector"): 2.0, ("warning", "link-down"): 1.0,
                       ("info", "unexplained"): 1.0, ("warning", "pfc-storm"): 0.0}
        [up] = prom_get(base, "/api/v1/query", query='up{job="fabricscope"}')["result"]
        assert up["value"][1] == "1"
        # the types Prometheus learned from the scrape
        meta = prom_get(base, "/api/v1/metadata")
        assert meta["fabricscope_incidents_opened_total"][0]["type"] == "counter"
        assert meta["fabricscope_incidents_open"][0]["type"] == "gauge"
        assert meta["fabricscope_http_requests_total"][0]["type"] == "counter"

        # live: the next scrapes see a change of the state
        state.upsert_incident(incident("inc-2", severity="critical", status="closed"))
        state.upsert_incident(incident("inc-6", severity="critical", fault="link-down"))
        wait_for(lambda: series().get(("critical", "dirty-connector")) == 1.0
                 and series().get(("critical", "link-down")) == 1.0, 15, "the change")
        q = 'sum by (severity) (fabricscope_incidents_open)'
        by_sev = {r["metric"]["severity"]: float(r["value"][1])
                  for r in prom_get(base, "/api/v1/query", query=q)["result"]}
        assert by_sev == {"critical": 2.0, "warning": 1.0, "info": 1.0}
        closed = prom_get(base, "/api/v1/query", query="fabricscope_incidents_closed_total")
        assert float(closed["result"][0]["value"][1]) == 2.0

        # every dashboard panel's query runs on the real engine and returns data
        wait_for(lambda: prom_get(base, "/api/v1/query",
                                  query='count_over_time(up{job="fabricscope"}[1m]) >= 3')
                 ["result"], 20, "three scrapes")
        empty = []
        for path in sorted(DASHBOARDS.glob("*.json")):
            for panel in json.loads(path.read_text())["panels"]:
                for t in panel["targets"]:
                    q = t["expr"].replace("$__rate_interval", "1m").replace("$job", ".*")
                    if not prom_get(base, "/api/v1/query", query=q)["result"] and \
                            "fabricscope_alerts_" not in q:  # no alert sink in this console
                        empty.append(f"{path.name}: {panel['title']}: {q}")
        assert not empty, "panels with no data:\n" + "\n".join(empty)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        server.stop()
