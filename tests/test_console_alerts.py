"""Incidents to a REAL Alertmanager (the Debian binary, API v2) and to a real HTTP webhook.

Alertmanager runs on 127.0.0.1 free ports with a one-receiver config, its own storage in
tmp_path and clustering off; the webhook receiver is ``http.server`` in a thread that records
what it is sent. No stand-in for the component under test.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fabricscope.diagnosis.model import Incident, RootCause
from fabricscope.diagnosis.serialize import incident_to_json
from fabricscope.fabric.catalog import build_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.service.console.alerts import (
    ALERTNAME,
    AlertmanagerSink,
    WebhookSink,
    postable_alert,
    validate_url,
)
from fabricscope.service.console.state import ConsoleState

NS = 1_000_000_000
AM_BIN = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
CONSOLE = "http://console.example:8765"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout_s: float = 10.0, every_s: float = 0.05) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(every_s)


def incident(id: str = "inc-0001", *, status: str = "open", severity: str = "warning",
             fault: str = "dirty-connector", resource: str = "leaf-p0-r0:eth3",
             p: float = 0.8, updated_s: float = 20.0) -> Incident:
    rc = RootCause(resource, fault, p, explains=("f-1",), evidence=("crc +412/s (f-1)",),
                   action="clean or replace the optic")
    return Incident(id=id, status=status, opened_ns=10 * NS, updated_ns=int(updated_s * NS),  # type: ignore[arg-type]
                    first_symptom_ns=9 * NS, detected_ns=10 * NS, root_causes=(rc,),
                    findings=("f-1",), severity=severity, root_cause_ns=11 * NS,
                    closed_ns=int(updated_s * NS) if status == "closed" else None,
                    title=f"{fault} on {resource}")


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if AM_BIN is None:
        pytest.skip("Alertmanager not installed: apt-get install prometheus-alertmanager")
    d = tmp_path_factory.mktemp("am")
    cfg = d / "alertmanager.yml"
    cfg.write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    port = free_port()
    proc = subprocess.Popen([AM_BIN, f"--config.file={cfg}", f"--storage.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address=", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=(d / "am.log").open("wb"))
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            assert proc.poll() is None, (d / "am.log").read_text()
            return False
    try:
        wait_for(ready, 20)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def am_alerts(url: str, incident_id: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as r:
        items = json.load(r)
    return [a for a in items if a["labels"].get("incident") == incident_id]


def parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def test_open_incident_fires_with_labels_and_link_and_resolves_when_closed(alertmanager: str) -> None:
    state = ConsoleState(build_fabric("rail-optimized", {"servers": 8}))
    base = time.time() - 100.0
    sink = AlertmanagerSink(alertmanager, console_url=CONSOLE, time_base_s=base,
                            fabric=state.fabric.name, resend_s=60.0)
    state.subscribe(sink)
    try:
        state.upsert_incident(incident("inc-am-1"))
        [a] = wait_for(lambda: am_alerts(alertmanager, "inc-am-1"))
        assert a["labels"] == {"alertname": ALERTNAME, "incident": "inc-am-1",
                               "severity": "warning", "fault": "dirty-connector",
                               "resource": "leaf-p0-r0:eth3", "fabric": state.fabric.name}
        assert a["generatorURL"] == f"{CONSOLE}/#/incident/inc-am-1"
        assert a["annotations"]["link"] == a["generatorURL"]
        assert a["annotations"]["summary"] == "dirty-connector on leaf-p0-r0:eth3"
        assert "p=0.80" in a["annotations"]["description"]
        assert a["annotations"]["action"] == "clean or replace the optic"
        assert a["status"]["state"] == "active"
        # opened at sim 10 s -> wall base + 10 s; firing for 4 resend intervals past now
        assert abs(parse_ts(a["startsAt"]) - (base + 10.0)) < 0.002
        assert parse_ts(a["endsAt"]) > time.time() + 200

        # a changed severity is posted at once, and the old label set is resolved with it
        state.upsert_incident(incident("inc-am-1", severity="critical", updated_s=30))
        wait_for(lambda: [x["labels"]["severity"] for x in am_alerts(alertmanager, "inc-am-1")]
                 == ["critical"])
        assert sink.wait_idle() and sink.sent == 2

        state.upsert_incident(incident("inc-am-1", status="closed", severity="critical",
                                       updated_s=40))
        wait_for(lambda: not am_alerts(alertmanager, "inc-am-1"))  # resolved: not active
        assert sink.wait_idle() and sink.sent == 3 and sink.failed == 0
    finally:
        report = sink.close(2.0)
    assert report.complete and report.undelivered == ()


def test_unchanged_upserts_post_once_and_resends_keep_it_firing(alertmanager: str) -> None:
    state = ConsoleState(build_fabric("rail-optimized", {"servers": 8}))
    sink = AlertmanagerSink(alertmanager, console_url=CONSOLE, time_base_s=time.time(),
                            resend_s=60.0)
    state.subscribe(sink)
    try:
        for k in range(8):  # refreshes: same status, severity, root cause
            state.upsert_incident(incident("inc-am-2", updated_s=20 + k, p=0.8 + k / 100))
            assert sink.wait_idle()  # each one given its chance to be (wrongly) posted
        wait_for(lambda: am_alerts(alertmanager, "inc-am-2"))
        assert sink.sent == 1
        # the newest annotations go out with the next resend, not with each refresh
        assert "p=0.80" in am_alerts(alertmanager, "inc-am-2")[0]["annotations"]["description"]
    finally:
        sink.close(2.0)

    # a short resend interval: endsAt is only 4 x 0.4 s ahead, so the alert stays active
    # past that only because the sink re-posts it
    fast = AlertmanagerSink(alertmanager, console_url=CONSOLE, time_base_s=time.time(),
                            resend_s=0.4)
    try:
        fast(("incident", incident("inc-am-3")))
        [first] = wait_for(lambda: am_alerts(alertmanager, "inc-am-3"))
        time.sleep(2.5)
        [later] = am_alerts(alertmanager, "inc-am-3")
        assert later["status"]["state"] == "active"
        assert parse_ts(later["endsAt"]) > parse_ts(first["endsAt"]) + 1.0
        # at least one resend (the endsAt above moved), at most one per interval (~1 + 2.5 / 0.4:
        # deduplicated in between); the lower bound is not 7 because a loaded machine runs late
        assert 2 <= fast.sent <= 9
    finally:
        fast.close(1.0)


def test_unreachable_alertmanager_is_counted_and_reported_at_close() -> None:
    sink = AlertmanagerSink(f"http://127.0.0.1:{free_port()}", console_url=CONSOLE,
                            retries=1, backoff_s=0.05, timeout_s=0.5)
    sink(("incident", incident("inc-x")))
    sink(("finding", object()))  # other events are ignored
    wait_for(lambda: sink.failed >= 1)
    report = sink.close(0.5)
    assert sink.sent == 0
    assert report.undelivered == ("inc-x",) and not report.complete
    sink(("incident", incident("inc-y")))  # after close: counted, not queued
    assert sink.dropped == 1


def test_postable_alert_never_starts_in_the_future() -> None:
    now = 1_000_000.0
    # a twin faster than real time: sim 10 s maps past now -> clamped to now
    a = postable_alert(incident(), console_url=CONSOLE, now_s=now, time_base_s=now - 5)
    assert parse_ts(a["startsAt"]) == pytest.approx(now, abs=1e-3)
    assert parse_ts(a["endsAt"]) == pytest.approx(now + 240, abs=1e-3)
    c = postable_alert(incident(status="closed", updated_s=50), console_url=CONSOLE,
                       now_s=now, time_base_s=now - 100)
    assert parse_ts(c["startsAt"]) == pytest.approx(now - 90, abs=1e-3)
    assert parse_ts(c["endsAt"]) == pytest.approx(now - 50, abs=1e-3)
    u = postable_alert(dataclasses.replace(incident(), root_causes=()), console_url=CONSOLE,
                       now_s=now)
    assert u["labels"]["fault"] == "unexplained" and u["labels"]["resource"] == "unknown"
    assert "fabric" not in u["labels"]


@pytest.mark.parametrize("url", ["ftp://host/x", "localhost:9093", "http://", "http://h:99999",
                                 "not a url"])
def test_bad_urls_name_the_flag(url: str) -> None:
    with pytest.raises(ConfigError, match="--alertmanager"):
        AlertmanagerSink(url, console_url=CONSOLE)
    with pytest.raises(ConfigError, match="--webhook"):
        WebhookSink(url, console_url=CONSOLE)


def test_validate_url_keeps_a_good_one() -> None:
    assert validate_url("https://am.example:9093/", "--alertmanager") == "https://am.example:9093"


# -- generic webhook against a real HTTP server --------------------------------------------

class Receiver:
    """An HTTP server in a thread that records POST bodies; ``codes`` are answered in turn
    (then 200), ``hold`` makes each request wait until it is set."""

    def __init__(self, codes: list[int] | None = None, delay_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.requests = 0
        self.codes = list(codes or [])
        self.delay_s = delay_s
        self.hold = threading.Event()
        self.hold.set()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.hold.wait(10)
                time.sleep(outer.delay_s)
                outer.requests += 1
                code = outer.codes.pop(0) if outer.codes else 200
                if code == 200:
                    outer.bodies.append(json.loads(body))
                    outer.headers.append(dict(self.headers))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(**kw: Any) -> Receiver:
        made.append(Receiver(**kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


def test_webhook_opened_updated_resolved_deduplicated(receiver: Callable[..., Receiver]) -> None:
    rx = receiver()
    state = ConsoleState(build_fabric("rail-optimized", {"servers": 8}))
    sink = WebhookSink(rx.url, console_url=CONSOLE)
    state.subscribe(sink)
    opened = incident("inc-w1", p=0.6)
    state.upsert_incident(opened)
    for k in range(10):  # refreshes: only updated_ns moves
        state.upsert_incident(dataclasses.replace(opened, updated_ns=opened.updated_ns + k))
    updated = incident("inc-w1", p=0.9, updated_s=30)
    state.upsert_incident(updated)
    state.upsert_incident(updated)
    closed = incident("inc-w1", p=0.9, status="closed", updated_s=40)
    state.upsert_incident(closed)
    state.upsert_incident(closed)
    assert sink.wait_idle()
    report = sink.close(2.0)
    assert [b["event"] for b in rx.bodies] == ["opened", "updated", "resolved"]
    assert [b["incident"] for b in rx.bodies] == [incident_to_json(i) for i in (opened, updated, closed)]
    assert {b["url"] for b in rx.bodies} == {f"{CONSOLE}/#/incident/inc-w1"}
    assert rx.headers[0]["Content-Type"] == "application/json"
    assert (sink.sent, sink.failed, sink.dropped) == (3, 0, 0) and report.complete


def test_webhook_reopened_incident_is_opened_again(receiver: Callable[..., Receiver]) -> None:
    rx = receiver()
    sink = WebhookSink(rx.url, console_url=CONSOLE)
    sink(("incident", incident("inc-w2")))
    sink(("incident", incident("inc-w2", status="closed", updated_s=30)))
    sink(("incident", incident("inc-w2", updated_s=50)))
    sink(("incident", incident("inc-never-open", status="closed")))  # nothing to resolve
    sink.close(2.0)
    assert [(b["event"], b["incident"]["id"]) for b in rx.bodies] == [
        ("opened", "inc-w2"), ("resolved", "inc-w2"), ("opened", "inc-w2")]


def test_webhook_failures_are_retried_counted_and_never_raise(
        receiver: Callable[..., Receiver], caplog: pytest.LogCaptureFixture) -> None:
    flaky = receiver(codes=[503])  # one 503, then 200: delivered on the retry
    sink = WebhookSink(flaky.url, console_url=CONSOLE, retries=2, backoff_s=0.05)
    sink(("incident", incident("inc-f1")))
    assert sink.wait_idle()
    assert (sink.sent, sink.failed, flaky.requests) == (1, 0, 2)
    sink.close(1.0)

    down = receiver(codes=[500] * 10)
    user_url = down.url.replace("http://", "http://ops:s3cret-pw@")
    sink = WebhookSink(user_url + "?token=q-secret", console_url=CONSOLE, retries=2,
                       backoff_s=0.05)
    with caplog.at_level(logging.WARNING, logger="fabricscope.service.console.alerts"):
        sink(("incident", incident("inc-f2")))
        assert sink.wait_idle()
        sink.close(1.0)
    assert (sink.sent, sink.failed, down.requests) == (0, 1, 3)
    assert "HTTP 500" in caplog.text
    assert "s3cret" not in caplog.text and "q-secret" not in caplog.text and "/hook" not in caplog.text
    # the user info became a Basic header (seen by a receiver that answers)
    ok = receiver()
    sink = WebhookSink(ok.url.replace("http://", "http://ops:s3cret-pw@"), console_url=CONSOLE)
    sink(("incident", incident("inc-f3")))
    sink.close(2.0)
    assert ok.headers[0]["Authorization"] == "Basic " + base64.b64encode(b"ops:s3cret-pw").decode()

    bad = receiver(codes=[400])  # a client error is not retried
    sink = WebhookSink(bad.url, console_url=CONSOLE, retries=3, backoff_s=0.05)
    sink(("incident", incident("inc-f4")))
    assert sink.wait_idle()
    sink.close(1.0)
    assert (sink.failed, bad.requests) == (1, 1)


def test_webhook_close_flushes_within_the_deadline_and_reports_the_rest(
        receiver: Callable[..., Receiver]) -> None:
    rx = receiver(delay_s=0.05)
    sink = WebhookSink(rx.url, console_url=CONSOLE)
    for k in range(6):
        sink(("incident", incident(f"inc-c{k}")))
    report = sink.close(5.0)
    assert report.complete and report.delivered >= 1 and sink.sent == 6 and len(rx.bodies) == 6

    slow = receiver(delay_s=0.4)
    sink = WebhookSink(slow.url, console_url=CONSOLE, timeout_s=2.0)
    for k in range(6):
        sink(("incident", incident(f"inc-s{k}")))
    t0 = time.monotonic()
    report = sink.close(0.6)
    assert time.monotonic() - t0 < 2.5
    assert report.undelivered  # named, not silently lost
    assert sink.sent + len(report.undelivered) == 6
    assert set(report.undelivered) <= {f"inc-s{k}" for k in range(6)}


def test_webhook_queue_is_bounded(receiver: Callable[..., Receiver]) -> None:
    rx = receiver()
    rx.hold.clear()  # the receiver blocks: nothing is delivered until released
    sink = WebhookSink(rx.url, console_url=CONSOLE, max_queue=2)
    for k in range(6):
        sink(("incident", incident(f"inc-q{k}")))
    assert sink.dropped >= 3  # 2 queued (+1 perhaps already in flight)
    rx.hold.set()
    sink.close(5.0)
    assert sink.sent + sink.dropped == 6 and sink.failed == 0
    assert len(rx.bodies) == sink.sent
