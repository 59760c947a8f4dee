"""The Prometheus sink: counter types, findings, bounded cardinality, and a server that
idle / half-sent connections cannot exhaust (real sockets, a real HTTP client, 127.0.0.1)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fabricscope.model.errors import TransportError
from fabricscope.model.records import Finding, TelemetryEvent
from fabricscope.telemetry.config import parse_config
from fabricscope.telemetry.prometheus import MetricsState
from fabricscope.telemetry.sinks import PrometheusSink, build_sink

NS = 1_000_000_000
OCT = "/interfaces/interface/state/counters/in-octets"
TEMP = "/components/component/state/temperature/instant"


def ev(name: str, t_s: float, value: object, target: str = "leaf-1", port: str = "eth1") -> TelemetryEvent:
    return TelemetryEvent(name, int(t_s * NS), target, {"interface_name": port}, value)  # type: ignore[arg-type]


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(r.read().decode())


def types(body: str) -> dict[str, str]:
    return {ln.split()[2]: ln.split()[3] for ln in body.splitlines() if ln.startswith("# TYPE ")}


def test_counters_are_counters_gauges_are_gauges_strings_are_skipped() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    try:
        assert sink.host == "127.0.0.1"
        sink.write([ev(OCT, 1, 10), ev(OCT, 2, 25), ev(TEMP, 2, 41.5),
                    ev("/interfaces/interface/state/oper-status", 2, "UP")], [])
        body = scrape(sink.port)
    finally:
        sink.close()
    t = types(body)
    assert t["gnmi_interfaces_interface_state_counters_in_octets_total"] == "counter"
    assert t["gnmi_components_component_state_temperature_instant"] == "gauge"
    assert 'gnmi_interfaces_interface_state_counters_in_octets_total{interface_name="eth1",target="leaf-1"} 25.0' in body
    assert "oper_status" not in body


def test_a_counter_rewritten_by_a_rate_processor_is_a_gauge(tmp_path: Path) -> None:
    cfg = parse_config({"targets": {"t": {"address": "127.0.0.1:1"}}, "subscriptions": {"s": {"paths": ["/a"]}},
                        "processors": [{"type": "rate", "names": ["*in-octets"]}],
                        "sinks": [{"type": "prometheus", "listen": "127.0.0.1:0"}]}, source="c.yaml")
    sink = build_sink(cfg.sinks[0].type, cfg.sinks[0].options)
    assert isinstance(sink, PrometheusSink)
    try:
        sink.write([ev(OCT, 1, 1e6), ev("/interfaces/interface/state/counters/in-errors", 1, 3)], [])
        t = types(scrape(sink.port))
    finally:
        sink.close()
    assert t["gnmi_interfaces_interface_state_counters_in_octets"] == "gauge"
    assert t["gnmi_interfaces_interface_state_counters_in_errors_total"] == "counter"


def test_findings_are_counted_and_active_ones_expire_by_data_time() -> None:
    st = MetricsState(finding_ttl_s=60)
    st.update([], [Finding("micro-burst", "leaf-1:eth1", 0.95, (1 * NS, 2 * NS)),
                   Finding("micro-burst", "leaf-1:eth1", 0.6, (3 * NS, 4 * NS)),
                   Finding("link-flap", "leaf-2:eth3", 0.3, (3 * NS, 5 * NS))])
    body = st.render().decode()
    assert types(body)["fabricscope_findings_total"] == "counter"
    assert 'fabricscope_findings_total{kind="micro-burst",severity="critical"} 1.0' in body
    assert 'fabricscope_findings_total{kind="micro-burst",severity="warning"} 1.0' in body
    assert 'fabricscope_findings_total{kind="link-flap",severity="info"} 1.0' in body
    assert 'fabricscope_finding_active{kind="micro-burst",subject="leaf-1:eth1"} 1.0' in body
    assert 'fabricscope_finding_score{kind="micro-burst",subject="leaf-1:eth1"} 0.6' in body
    # 61 s of data later (no wall clock involved) both are no longer active; the totals stay
    st.update([ev(OCT, 66, 1)], [])
    body = st.render().decode()
    assert "fabricscope_finding_active{" not in body
    assert 'fabricscope_findings_total{kind="micro-burst",severity="critical"} 1.0' in body


def test_cardinality_is_bounded_and_what_is_dropped_is_counted() -> None:
    st = MetricsState(max_series=5, max_active_findings=3)
    st.update([ev(OCT, 1, i, port=f"eth{i}") for i in range(8)],
              [Finding("gray-link", f"leaf-1:eth{i}", 0.7, (i * NS, (i + 1) * NS)) for i in range(10)])
    body = st.render().decode()
    assert body.count("gnmi_interfaces_interface_state_counters_in_octets_total{") == 5
    assert "fabricscope_exporter_series_dropped_total 3.0" in body
    active = [ln for ln in body.splitlines() if ln.startswith("fabricscope_finding_active{")]
    assert len(active) == 3 and all(f"eth{i}\"" in "".join(active) for i in (7, 8, 9))  # the newest kept
    assert "fabricscope_exporter_findings_evicted_total 7.0" in body
    # an existing series still updates at the cap
    st.update([ev(OCT, 2, 99, port="eth0")], [])
    assert 'interface_name="eth0",target="leaf-1"} 99.0' in st.render().decode()


def test_self_metrics_callable_is_exported_with_its_types() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    try:
        sink.set_self_metrics(lambda: [("reconnects", "counter", {"target": "twin"}, 3),
                                       ("buffer_fill_ratio", "gauge", {}, 0.5)])
        body = scrape(sink.port)
    finally:
        sink.close()
    t = types(body)
    assert t["fabricscope_collector_reconnects_total"] == "counter"
    assert t["fabricscope_collector_buffer_fill_ratio"] == "gauge"
    assert 'fabricscope_collector_reconnects_total{target="twin"} 3.0' in body


def _hold(port: int, n: int) -> list[socket.socket]:
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2 == 0:
            s.sendall(b"GET /metr")  # half a request line, then silence
        socks.append(s)
    return socks


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_100_idle_and_half_sent_connections_hold_no_threads_and_are_dropped() -> None:
    before = threading.active_count()
    sink = PrometheusSink("127.0.0.1:0", read_timeout_s=1.5)
    socks: list[socket.socket] = []
    try:
        sink.write([ev(OCT, 1, 10)], [])
        socks = _hold(sink.port, 100)
        deadline = time.monotonic() + 10
        while sink.server.open_connections < 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sink.server.open_connections == 100
        # one thread for the server, whatever the number of connections (the old server: 1 + 100)
        assert threading.active_count() <= before + 1
        assert "in_octets_total" in scrape(sink.port)  # a normal scrape still answers meanwhile
        # and the idle ones are closed by the server after the read timeout, not held forever
        for s in socks:
            s.settimeout(10)
            assert _closed_by_peer(s)
        assert sink.server.timed_out == 100
        assert sink.server.open_connections == 0
    finally:
        for s in socks:
            s.close()
        sink.close()
    assert threading.active_count() <= before


def test_connections_past_the_cap_are_refused_not_queued() -> None:
    sink = PrometheusSink("127.0.0.1:0", max_connections=10, read_timeout_s=30)
    socks: list[socket.socket] = []
    try:
        socks = _hold(sink.port, 10)
        deadline = time.monotonic() + 10
        while sink.server.open_connections < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        extra = socket.create_connection(("127.0.0.1", sink.port), timeout=10)
        assert _closed_by_peer(extra)
        extra.close()
        assert sink.server.rejected >= 1 and sink.server.open_connections == 10
        for s in socks:
            s.close()
        deadline = time.monotonic() + 10
        while sink.server.open_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scrape(sink.port)  # slots come back when clients go
    finally:
        for s in socks:
            s.close()
        sink.close()


def test_http_errors_are_answered_not_hung() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    try:
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/nope", timeout=10)
        assert ei.value.code == 404
        req = urllib.request.Request(f"http://127.0.0.1:{sink.port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(req, timeout=10)
        assert ei.value.code == 405
        with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 431")
    finally:
        sink.close()


def test_a_port_in_use_is_a_transport_error() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    try:
        with pytest.raises(TransportError, match=rf"cannot listen on 127.0.0.1:{sink.port}"):
            PrometheusSink(f"127.0.0.1:{sink.port}")
    finally:
        sink.close()


def test_the_collector_wires_its_self_metrics_into_a_configured_sink() -> None:
    from fabricscope.telemetry.collector import Collector

    cfg = parse_config({"targets": {"t": {"address": "127.0.0.1:1"}}, "subscriptions": {"s": {"paths": ["/a"]}},
                        "sinks": [{"type": "prometheus", "listen": "127.0.0.1:0"}]}, source="c.yaml")
    col = Collector(cfg)
    try:
        sink = col.sinks[0]
        assert isinstance(sink, PrometheusSink)
        t = types(scrape(sink.port))
    finally:
        col.close()
    assert t["fabricscope_collector_received_total"] == "counter"
    assert t["fabricscope_collector_buffer_fill_ratio"] == "gauge"


def test_a_failing_self_metrics_snapshot_does_not_fail_the_scrape() -> None:
    def boom() -> list[tuple[str, str, dict[str, str], float]]:
        raise RuntimeError("dictionary changed size during iteration")

    sink = PrometheusSink("127.0.0.1:0", self_metrics=boom)
    try:
        sink.write([ev(OCT, 1, 10)], [])
        body = scrape(sink.port)
    finally:
        sink.close()
    assert "in_octets_total" in body and "fabricscope_collector_" not in body
